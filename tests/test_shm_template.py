"""Fixed-width columns are written by a learned layout, byte for byte as pyarrow writes them."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from shmloader.shm import SegmentStore
from shmloader.shm.template import _SkippingSink, ipc_skipping_values, zeros_like
from shmloader.sources.columns import BatchBuilder, FixedColumns, tensor_type
from shmloader.sources.row_arrays import RowArrays

SCHEMAS = {
    "image and label": pa.schema(
        [pa.field("image", tensor_type(np.uint8, (3, 4, 5))), pa.field("label", pa.int64())]
    ),
    "vector": pa.schema([pa.field("x", pa.list_(pa.float32(), 8))]),
    "scalars": pa.schema(
        [
            pa.field("a", pa.float64()),
            pa.field("b", pa.int32()),
            pa.field("c", pa.uint16()),
            pa.field("d", pa.float16()),
        ]
    ),
}


def joined_columns(schema: pa.Schema, rows: int, seed: int) -> dict[str, np.ndarray]:
    """Columns as a ``decode_batch`` makes them: strided views of one buffer of records."""
    rng = np.random.default_rng(seed)
    dtypes, shapes = [], []
    for f in schema:
        t = f.type
        if isinstance(t, pa.FixedShapeTensorType):
            dtypes.append(np.dtype(t.value_type.to_pandas_dtype()))
            shapes.append(tuple(t.shape))
        elif pa.types.is_fixed_size_list(t):
            dtypes.append(np.dtype(t.value_type.to_pandas_dtype()))
            shapes.append((t.list_size,))
        else:
            dtypes.append(np.dtype(t.to_pandas_dtype()))
            shapes.append(())
    widths = [d.itemsize * int(np.prod(s)) for d, s in zip(dtypes, shapes, strict=True)]
    values = [  # small whole numbers: no NaN among random float bits, so equals() holds
        rng.integers(0, 100, (rows, int(np.prod(s)))).astype(d).view(np.uint8)
        for d, s in zip(dtypes, shapes, strict=True)
    ]
    raw = np.concatenate(values, axis=1)
    out, at = {}, 0
    for f, d, s, w in zip(schema, dtypes, shapes, widths, strict=True):
        out[f.name] = raw[:, at : at + w].view(d).reshape(rows, *s)
        at += w
    return out


def file_bytes(store: SegmentStore, name: str) -> bytes:
    with open(os.path.join(store.path, name), "rb") as f:
        return f.read()


def pyarrow_file(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
@pytest.mark.parametrize("rows", [1, 7, 100])
def test_files_written_by_layout_equal_pyarrows(tmp_path: Path, kind: str, rows: int) -> None:
    builder = BatchBuilder(SCHEMAS[kind])
    with SegmentStore.create("8MiB", base_dir=tmp_path) as store:
        writer = store.handle()
        for seed in range(3):  # the first is written the ordinary way and teaches the layout
            fixed = builder.fixed_columns(joined_columns(builder.schema, rows, seed), rows)
            assert isinstance(fixed, FixedColumns)
            info = writer.write(fixed)
            assert info is not None and info.num_rows == rows
            expected = pyarrow_file(fixed.to_batch())
            assert info.nbytes == len(expected)
            assert file_bytes(store, info.name) == expected
            assert store.open(info.name).equals(fixed.to_batch())
            if seed == 0:  # the next goes into this file, old bytes and all; the last, a new one
                store.release(info.name)
        assert writer.layouts.used == 2


def test_a_layout_is_for_one_schema_and_row_count(tmp_path: Path) -> None:
    schema = SCHEMAS["image and label"]
    tagged = schema.with_metadata({"source": "elsewhere"})
    with SegmentStore.create("8MiB", base_dir=tmp_path) as store:
        writer = store.handle()
        written = []
        for s, rows in ((schema, 10), (schema, 10), (schema, 11), (tagged, 10), (tagged, 10)):
            builder = BatchBuilder(s)
            fixed = builder.fixed_columns(joined_columns(s, rows, seed=rows), rows)
            assert fixed is not None
            info = writer.write(fixed)
            assert info is not None
            assert file_bytes(store, info.name) == pyarrow_file(fixed.to_batch())
            written.append(writer.layouts.used)
        # by layout: the second (same schema and rows) and the last (same metadata too)
        assert written == [0, 1, 1, 1, 2]


def test_what_is_not_fixed_width_as_is_goes_the_ordinary_way() -> None:
    schema = pa.schema(
        [pa.field("image", tensor_type(np.uint8, (2, 2))), pa.field("label", pa.int64())]
    )
    builder = BatchBuilder(schema)
    good = {"image": np.zeros((3, 2, 2), np.uint8), "label": np.arange(3)}
    assert builder.fixed_columns(good, 3) is not None
    cases = [
        {**good, "label": np.arange(3, dtype=np.int32)},  # needs a cast
        {**good, "image": np.zeros((3, 4), np.uint8)},  # another row shape
        {**good, "label": np.arange(4)},  # another row count
        {"image": good["image"]},  # a column missing
        {**good, "extra": np.arange(3)},  # a column too many
        {**good, "label": [0, 1, 2]},  # not an array
    ]
    for columns in cases:
        assert builder.fixed_columns(columns, 3) is None
    assert (
        builder.fixed_columns({"image": good["image"][:0], "label": good["label"][:0]}, 0) is None
    )
    flags = BatchBuilder(pa.schema([pa.field("flag", pa.bool_())]))
    assert flags.fixed_columns({"flag": np.ones(3, bool)}, 3) is None  # Arrow packs bits
    lists = BatchBuilder(pa.schema([pa.field("v", pa.list_(pa.float32()))]))
    assert lists.fixed_columns({"v": np.ones((3, 2), np.float32)}, 3) is None


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_a_layout_is_learned_from_a_file_whose_zeros_were_stepped_over(name: str) -> None:
    schema = SCHEMAS[name]
    builder = BatchBuilder(schema)
    like = builder.fixed_columns(joined_columns(schema, 10, seed=1), 10)
    assert like is not None
    zeros = zeros_like(like.arrays, 5000)
    batch = FixedColumns(builder, 5000, tuple(zeros)).to_batch()
    expected = pyarrow_file(batch)
    scratch = ipc_skipping_values(batch, zeros, len(expected))
    assert bytes(scratch) == expected  # the zeros read as zeros, every other byte in place
    sink = _SkippingSink(mmap.mmap(-1, len(expected)), zeros)
    with pa.ipc.new_file(pa.PythonFile(sink, mode="w"), batch.schema) as writer:
        writer.write_batch(batch)
    assert sink.pos == len(expected)
    assert sink.skipped == sum(z.nbytes for z in zeros)  # every value stepped over


def test_a_file_longer_than_computed_is_refused() -> None:
    builder = BatchBuilder(SCHEMAS["image and label"])
    like = builder.fixed_columns(joined_columns(builder.schema, 10, seed=1), 10)
    assert like is not None
    zeros = zeros_like(like.arrays, 100)
    batch = FixedColumns(builder, 100, tuple(zeros)).to_batch()
    size = len(pyarrow_file(batch))
    with pytest.raises(RuntimeError, match="runs past"):
        ipc_skipping_values(batch, zeros, size - 8)


def _rss_shmem_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssShmem:"):
            return int(line.split()[1])
    pytest.skip("no RssShmem in /proc/self/status")


def test_zeros_take_no_memory_even_when_read() -> None:
    # Shared anonymous pages that are read get memory of their own; private ones stay the
    # kernel's zero page.
    (zeros,) = zeros_like([np.zeros((1, 1 << 20), np.uint8)], 64)
    before = _rss_shmem_kib()
    assert not zeros.any()  # reads all 64 MiB
    assert _rss_shmem_kib() - before < 8 << 10


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
@pytest.mark.parametrize("rows", [1, 7, 100])
def test_per_record_rows_are_stacked_into_place_as_pyarrow_writes_them(
    tmp_path: Path, kind: str, rows: int
) -> None:
    # What a per-record decode gives (one mapping per record): the tensor columns stay a list
    # of rows (RowArrays) that the writer stacks straight into the segment.
    builder = BatchBuilder(SCHEMAS[kind])
    with SegmentStore.create("8MiB", base_dir=tmp_path) as store:
        writer = store.handle()
        for seed in range(3):  # the first teaches the layout, the others go in by it
            columns = joined_columns(builder.schema, rows, seed)
            records = [{k: v[i].copy() for k, v in columns.items()} for i in range(rows)]
            for record in records:  # scalars as numpy scalars of the column's type
                record.update({k: v[()] for k, v in record.items() if v.ndim == 0})
            fixed = builder.fixed_records(records)
            assert isinstance(fixed, FixedColumns)
            if any(a.ndim > 1 for a in columns.values()):
                assert any(isinstance(a, RowArrays) for a in fixed.arrays)
            expected = builder.from_records(records)
            info = writer.write(fixed)
            assert info is not None and info.num_rows == rows
            assert file_bytes(store, info.name) == pyarrow_file(expected)
            assert store.open(info.name).equals(expected)
            assert fixed.to_batch().equals(expected)


def test_records_of_another_form_are_not_fixed() -> None:
    builder = BatchBuilder(SCHEMAS["image and label"])
    good = {"image": np.zeros((3, 4, 5), np.uint8), "label": 1}
    assert builder.fixed_records([good, good]) is not None
    for bad in (
        {"image": np.zeros((3, 4, 5), np.int16), "label": 1},  # another dtype
        {"image": np.zeros((3, 4, 6), np.uint8), "label": 1},  # another shape
        {"image": np.zeros((3, 4, 5), np.uint8), "label": 1.5},  # a float label
        {"image": np.zeros((3, 4, 5), np.uint8)},  # a column missing
    ):
        assert builder.fixed_records([good, bad]) is None
    assert builder.fixed_records([]) is None
    assert BatchBuilder(pa.schema([pa.field("b", pa.bool_())])).fixed_records([{"b": True}]) is None


@pytest.mark.parametrize(
    "other",
    [pa.string(), pa.binary(), pa.list_(pa.float32()), pa.bool_(), tensor_type(np.bool_, (2,))],
)
def test_a_schema_with_a_column_never_fixed_skips_the_attempt(other: pa.DataType) -> None:
    # fixed_records gathered and checked every record's values (one more pass over them)
    # before finding a column that can never be handed over as it is; the schema says so.
    builder = BatchBuilder(
        pa.schema(
            [("image", tensor_type(np.uint8, (3, 4, 5))), ("label", pa.int64()), ("o", other)]
        )
    )
    good = {"image": np.zeros((3, 4, 5), np.uint8), "label": 1, "o": None}
    assert builder.fixed_records(_NoPass([good, good])) is None
    # The same records, in a schema that may be fixed: that pass is made.
    fixable = BatchBuilder(
        pa.schema([("image", tensor_type(np.uint8, (3, 4, 5))), ("label", pa.int64())])
    )
    with pytest.raises(AssertionError, match="went over the records"):
        fixable.fixed_records(_NoPass([{"image": good["image"], "label": 1}] * 2))


class _NoPass(Sequence[Any]):
    """Records that may be counted, but fail any pass over them."""

    def __init__(self, records: list[Any]) -> None:
        self.count = len(records)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: Any) -> Any:
        raise AssertionError("went over the records")

    def __iter__(self) -> Iterator[Any]:
        raise AssertionError("went over the records")


def test_row_arrays_as_an_array_copy_only_when_allowed() -> None:
    rows = RowArrays([np.full((2, 3), i, np.int16) for i in range(4)], np.dtype(np.int16), (2, 3))
    expected = np.repeat(np.arange(4, dtype=np.int16), 6).reshape(4, 2, 3)
    assert np.array_equal(np.asarray(rows), expected)
    assert np.array(rows, dtype=np.float32).dtype == np.float32
    # numpy 2's __array__ protocol: copy=False asks for no copy, and stacking is one.
    with pytest.raises(ValueError):
        np.asarray(rows, copy=False)
