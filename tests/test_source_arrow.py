"""ArrowSource over real IPC files, IPC streams and a hand-built save_to_disk folder."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from shmloader.errors import ConfigError, DataError
from shmloader.sources import ArrowSource, Shard, column_to_numpy, tensor_type


def _table(n: int, first: int = 0) -> pa.Table:
    ids = np.arange(first, first + n, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "emb": pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 4).astype("f4")), 4),
            "text": pa.array([f"t{i}" for i in ids]),
        }
    )


def _write(path: Path, table: pa.Table, chunks: list[int], *, stream: bool) -> None:
    """Write ``table`` as batches of the given sizes (zero-row batches included)."""
    with pa.OSFile(str(path), "wb") as sink:
        writer = (pa.ipc.new_stream if stream else pa.ipc.new_file)(sink, table.schema)
        row = 0
        for size in chunks:
            writer.write_batch(
                table.slice(row, size).combine_chunks().to_batches()[0]
                if size
                else pa.RecordBatch.from_pylist([], schema=table.schema)
            )
            row += size
        assert row == table.num_rows
        writer.close()


CHUNKS = [10, 0, 7, 13, 1]  # 31 rows


@pytest.mark.parametrize("stream", [False, True], ids=["file", "stream"])
def test_plan_counts_and_every_range_matches(tmp_path: Path, stream: bool) -> None:
    table = _table(31)
    _write(tmp_path / "d.arrow", table, CHUNKS, stream=stream)
    source = ArrowSource(str(tmp_path / "d.arrow"))
    (shard,) = source.plan()
    assert shard == Shard(str(tmp_path / "d.arrow"), 31)
    bounds = [0, 1, 9, 10, 11, 16, 17, 18, 29, 30, 31]
    for start in bounds:
        for stop in [b for b in bounds if b >= start]:
            batch = source.read(shard, start, stop)
            assert batch.num_rows == stop - start
            assert pa.Table.from_batches([batch]).equals(table.slice(start, stop - start))


def test_memory_mapped_single_batch_reads_do_not_copy(tmp_path: Path) -> None:
    _write(tmp_path / "d.arrow", _table(20), [20], stream=False)
    source = ArrowSource(str(tmp_path / "d.arrow"), tensors={"emb": (2, 2)})
    batch = source.read(source.plan()[0], 5, 15)
    emb = column_to_numpy(batch.column("emb"))
    assert emb.shape == (10, 2, 2) and not emb.flags.writeable
    np.testing.assert_array_equal(emb[:, 0, 0], np.arange(5, 15))
    maps = Path("/proc/self/maps")
    if maps.exists():  # the values live in the file's mapping, not in a copy
        spans = [
            [int(x, 16) for x in line.split()[0].split("-")]
            for line in maps.read_text().splitlines()
            if line.endswith(str(tmp_path / "d.arrow"))
        ]
        assert any(lo <= emb.ctypes.data < hi for lo, hi in spans)


def _hf_folder(root: Path, tables: list[pa.Table]) -> Path:
    """The layout Dataset.save_to_disk writes: IPC streams + state.json + dataset_info.json."""
    root.mkdir()
    n = len(tables)
    names = [f"data-{i:05d}-of-{n:05d}.arrow" for i in range(n)]
    for name, table in zip(names, tables, strict=True):
        _write(root / name, table, [table.num_rows], stream=True)
    state: dict[str, object] = {
        "_data_files": [{"filename": name} for name in names],
        "_fingerprint": "0123456789abcdef",
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": "train",
    }
    (root / "state.json").write_text(json.dumps(state))
    (root / "dataset_info.json").write_text(json.dumps({"features": {}, "splits": {}}))
    return root


def test_save_to_disk_folder_gives_its_data_files_as_shards(tmp_path: Path) -> None:
    tables = [_table(12, 0), _table(5, 12), _table(9, 17)]
    folder = _hf_folder(tmp_path / "ds", tables)
    source = ArrowSource(str(folder), columns=["id", "emb"])
    plan = source.plan()
    assert plan == [
        Shard(str(folder / f"data-{i:05d}-of-00003.arrow"), t.num_rows)
        for i, t in enumerate(tables)
    ]
    got = [source.read(s, 0, s.num_records).column("id").to_pylist() for s in plan]
    assert [i for ids in got for i in ids] == list(range(26))
    assert source.read(plan[2], 3, 6).schema.names == ["id", "emb"]


def test_folder_and_file_lists_are_ordered_and_deduplicated(tmp_path: Path) -> None:
    folder = _hf_folder(tmp_path / "b_ds", [_table(2), _table(3)])
    _write(tmp_path / "a.arrow", _table(4), [4], stream=False)
    source = ArrowSource([str(folder), str(tmp_path / "a.arrow"), str(tmp_path / "a.arrow")])
    assert [s.num_records for s in source.plan()] == [4, 2, 3]


def test_folders_that_are_not_one_split_are_refused(tmp_path: Path) -> None:
    (tmp_path / "dd").mkdir()
    (tmp_path / "dd" / "dataset_dict.json").write_text('{"splits": ["train"]}')
    with pytest.raises(ConfigError, match=r"DatasetDict.*dd/train"):
        ArrowSource(str(tmp_path / "dd"))
    (tmp_path / "plain").mkdir()
    with pytest.raises(ConfigError, match=r"without state\.json"):
        ArrowSource(str(tmp_path / "plain"))
    bad = _hf_folder(tmp_path / "bad", [_table(1)])
    (bad / "state.json").write_text(json.dumps({"_data_files": [{"filename": "../x.arrow"}]}))
    with pytest.raises(DataError, match="outside the folder"):
        ArrowSource(str(bad))


def test_unknown_columns_and_non_arrow_files(tmp_path: Path) -> None:
    _write(tmp_path / "d.arrow", _table(3), [3], stream=True)
    with pytest.raises(ConfigError, match=r"d\.arrow: no column\(s\) 'x'; available columns: id"):
        ArrowSource(str(tmp_path / "d.arrow"), columns=["x"]).plan()
    (tmp_path / "junk.arrow").write_bytes(b"\x00" * 64)
    with pytest.raises(DataError, match=r"junk\.arrow.*neither an Arrow IPC file"):
        ArrowSource(str(tmp_path / "junk.arrow")).plan()


def test_pickled_source_reads_the_same(tmp_path: Path) -> None:
    _write(tmp_path / "s.arrow", _table(31), CHUNKS, stream=True)
    _write(tmp_path / "f.arrow", _table(31), CHUNKS, stream=False)
    source = ArrowSource(str(tmp_path / "*.arrow"), tensors={"emb": [4]})
    plan = source.plan()
    clone = pickle.loads(pickle.dumps(source))
    for shard in plan:
        a, b = source.read(shard, 8, 20), clone.read(shard, 8, 20)
        assert a.equals(b) and a.schema.field("emb").type == tensor_type(np.float32, (4,))


def test_rows_are_counted_without_count_rows_too(tmp_path: Path) -> None:
    """pyarrow before ``RecordBatchFileReader.count_rows`` (the package takes pyarrow 19):
    the plan counts the rows from the batches instead."""
    from shmloader.sources.arrow import _count_rows

    path = tmp_path / "f.arrow"
    batches = [pa.record_batch([pa.array(range(n), pa.int64())], names=["x"]) for n in (3, 0, 5)]
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, batches[0].schema) as w:
        for b in batches:
            w.write_batch(b)

    class Older:  # a reader of such a pyarrow: the same, without count_rows
        def __init__(self, reader: pa.ipc.RecordBatchFileReader) -> None:
            self.num_record_batches = reader.num_record_batches
            self.get_batch = reader.get_batch

    with pa.memory_map(str(path)) as source:
        reader = pa.ipc.open_file(source)
        assert _count_rows(reader) == _count_rows(Older(reader)) == 8  # type: ignore[arg-type]
