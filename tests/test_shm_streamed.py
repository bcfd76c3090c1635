"""Columns decoded a block at a time are written into a segment as they come, byte for byte
as pyarrow writes the whole batch; fewer rows, or a block that is not fixed-width, still
give the right segment; a block that raises leaves nothing behind."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from test_shm_template import SCHEMAS, file_bytes, joined_columns, pyarrow_file

from shmloader.shm import SegmentStore
from shmloader.shm.names import parse_temp_name
from shmloader.shm.template import zeros_like
from shmloader.sources.columns import BatchBuilder, FixedColumns
from shmloader.sources.streamed import Chunk, StreamedColumns

SCHEMA = SCHEMAS["image and label"]
BUILDER = BatchBuilder(SCHEMA)


def fixed(rows: int, seed: int) -> FixedColumns:
    columns = BUILDER.fixed_columns(joined_columns(SCHEMA, rows, seed), rows)
    assert columns is not None
    return columns


def stream(chunks: list[Chunk], planned: int) -> StreamedColumns:
    return StreamedColumns(BUILDER, planned, iter(chunks), [])


def whole(chunks: list[Chunk]) -> pa.RecordBatch:
    return pa.concat_batches([c if isinstance(c, pa.RecordBatch) else c.to_batch() for c in chunks])


def teach(writer: object, rows: int) -> None:
    """Write one stream of ``rows`` rows, which teaches the writer the layout of that size."""
    info = writer.write(stream([fixed(rows, 99)], rows))  # type: ignore[attr-defined]
    assert info is not None


@pytest.mark.parametrize("sizes", [[100], [30, 30, 40], [1] * 10 + [90]])
def test_chunks_are_written_in_place_byte_for_byte(tmp_path: Path, sizes: list[int]) -> None:
    with SegmentStore.create("8MiB", base_dir=tmp_path) as store:
        writer = store.handle()
        for seed in range(3):  # the first is collected and written whole: it teaches the layout
            chunks: list[Chunk] = [fixed(n, seed * 10 + i) for i, n in enumerate(sizes)]
            info = writer.write(stream(chunks, 100))
            assert info is not None and info.num_rows == 100
            assert file_bytes(store, info.name) == pyarrow_file(whole(chunks))
        assert writer.layouts.used == 2
        assert store.in_use() == 3 * info.nbytes


@pytest.mark.parametrize("taught", [True, False])
def test_each_chunk_is_decoded_after_the_segment_is_reserved(tmp_path: Path, taught: bool) -> None:
    # The first of its size too: a file of zeros teaches the layout, then the chunks go in.
    with SegmentStore.create("8MiB", base_dir=tmp_path) as store:
        writer = store.handle()
        if taught:
            teach(writer, 20)
        unsealed_when_decoded: list[int] = []

        def decoded() -> Iterator[Chunk]:
            for seed in range(4):
                names = os.listdir(store.path)
                unsealed_when_decoded.append(sum(parse_temp_name(n) is not None for n in names))
                yield fixed(5, seed)

        info = writer.write(StreamedColumns(BUILDER, 20, decoded(), []))
        assert info is not None and writer.layouts.used == int(taught)
        assert unsealed_when_decoded[1:] == [1, 1, 1]  # written as they came, into one file
        assert unsealed_when_decoded[0] == int(taught)  # untaught: the first shows the dtypes
        chunks: list[Chunk] = [fixed(5, seed) for seed in range(4)]
        assert file_bytes(store, info.name) == pyarrow_file(whole(chunks))


def test_zeros_that_teach_a_layout_are_zeros_of_the_columns_shapes() -> None:
    arrays = fixed(3, 1).arrays
    zeros = zeros_like(arrays, 1000)
    for zero, array in zip(zeros, arrays, strict=True):
        assert zero.dtype == array.dtype and zero.shape == (1000, *array.shape[1:])
        assert not zero.any()


def test_fewer_rows_than_planned_are_written_as_a_batch_of_their_own(tmp_path: Path) -> None:
    # Records skipped: 70 of the 100 rows the segment was sized for.
    with SegmentStore.create("8MiB", base_dir=tmp_path) as store:
        writer = store.handle()
        teach(writer, 100)
        chunks: list[Chunk] = [fixed(30, 1), fixed(40, 2)]
        info = writer.write(stream(chunks, 100))
        assert info is not None and info.num_rows == 70
        assert file_bytes(store, info.name) == pyarrow_file(whole(chunks))
        assert store.in_use() == sum(store.segments().values())  # no reservation left over


def test_a_chunk_that_is_not_fixed_width_sends_what_came_the_ordinary_way(
    tmp_path: Path,
) -> None:
    with SegmentStore.create("8MiB", base_dir=tmp_path) as store:
        writer = store.handle()
        teach(writer, 100)
        chunks: list[Chunk] = [fixed(30, 1), fixed(30, 2).to_batch(), fixed(40, 3)]
        info = writer.write(stream(chunks, 100))
        assert info is not None and info.num_rows == 100
        assert file_bytes(store, info.name) == pyarrow_file(whole(chunks))
        # More rows than planned (a source that miscounted) are not written past the place.
        more: list[Chunk] = [fixed(60, 4), fixed(60, 5)]
        info = writer.write(stream(more, 100))
        assert info is not None and info.num_rows == 120
        assert file_bytes(store, info.name) == pyarrow_file(whole(more))


def test_a_chunk_that_raises_leaves_nothing_and_the_writer_goes_on(tmp_path: Path) -> None:
    with SegmentStore.create("8MiB", base_dir=tmp_path) as store:
        writer = store.handle()
        teach(writer, 20)
        before = store.segments()

        def failing() -> Iterator[Chunk]:
            yield fixed(10, 1)
            raise ValueError("record 17 of part-3.tfrecord is corrupt")

        with pytest.raises(ValueError, match="record 17"):
            writer.write(StreamedColumns(BUILDER, 20, failing(), []))
        assert store.segments() == before
        assert store.in_use() == sum(before.values())  # the reservation was given back
        assert not [n for n in os.listdir(store.path) if parse_temp_name(n) is not None]
        chunks: list[Chunk] = [fixed(10, 2), fixed(10, 3)]
        info = writer.write(stream(chunks, 20))
        assert info is not None
        assert file_bytes(store, info.name) == pyarrow_file(whole(chunks))


def test_collect_and_assemble_keep_row_order(tmp_path: Path) -> None:
    chunks: list[Chunk] = [fixed(3, 1), fixed(4, 2).to_batch(), BUILDER.empty(), fixed(2, 3)]
    assert stream(chunks, 9).to_batch().equals(whole([c for c in chunks if c.num_rows]))
    only_fixed = stream([fixed(3, 1), fixed(4, 2)], 7).collect()
    assert isinstance(only_fixed, FixedColumns) and only_fixed.num_rows == 7
    head = fixed(3, 1)
    copied = [np.array(a) for a in head.arrays]
    joined = stream([], 5).assemble(3, copied, [fixed(2, 2)])
    assert isinstance(joined, FixedColumns)
    assert joined.to_batch().equals(whole([head, fixed(2, 2)]))
    assert stream([], 4).collect().equals(BUILDER.empty())


def test_without_a_layout_the_chunks_go_the_ordinary_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Should pyarrow ever lay fixed-width columns out so that no layout can be learned.
    monkeypatch.setattr("shmloader.shm.store.learn_from_zeros", lambda *args: None)
    with SegmentStore.create("8MiB", base_dir=tmp_path) as store:
        writer = store.handle()
        chunks: list[Chunk] = [fixed(30, 1), fixed(70, 2)]
        info = writer.write(stream(chunks, 100))
        assert info is not None and info.num_rows == 100
        assert file_bytes(store, info.name) == pyarrow_file(whole(chunks))
        assert writer.layouts.used == 0
        assert store.in_use() == sum(store.segments().values())  # no reservation left over
