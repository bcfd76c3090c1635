"""ParquetSource over real Parquet files: footer-only plans, row-group reads, tensors."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shmloader.errors import ConfigError, DataError, SchemaMismatchError
from shmloader.sources import ParquetSource, Shard, column_to_numpy, tensor_type


def _table(n: int, first: int = 0) -> pa.Table:
    ids = np.arange(first, first + n, dtype=np.int64)
    x = (np.repeat(ids, 6).reshape(n, 2, 3) + np.arange(6).reshape(2, 3)).astype(np.float32)
    tensor = pa.ExtensionArray.from_storage(
        tensor_type(np.float32, (2, 3)),
        pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 6),
    )
    return pa.table(
        {
            "id": ids,
            "x": tensor,
            "vec": pa.array([[float(i), -float(i)] for i in ids], pa.list_(pa.float64())),
            "name": pa.array([f"row-{i}" for i in ids]),
        }
    )


@pytest.fixture
def files(tmp_path: Path) -> list[tuple[str, pa.Table]]:
    out = []
    for name, n, first, group in (("b.parquet", 45, 0, 10), ("a.parquet", 7, 100, 3)):
        table = _table(n, first)
        pq.write_table(table, tmp_path / name, row_group_size=group)
        out.append((str(tmp_path / name), table))
    pq.write_table(_table(0), tmp_path / "c.parquet")
    out.append((str(tmp_path / "c.parquet"), _table(0)))
    return sorted(out, key=lambda item: item[0])


def test_plan_counts_and_every_range_matches_the_table(
    tmp_path: Path, files: list[tuple[str, pa.Table]]
) -> None:
    source = ParquetSource(str(tmp_path / "*.parquet"))
    plan = source.plan()
    assert plan == [Shard(p, t.num_rows) for p, t in files]
    for shard, (_, table) in zip(plan, files, strict=True):
        n = shard.num_records
        bounds = sorted({0, 1, 3, 9, 10, 11, 20, n - 1, n} & set(range(n + 1)))
        for start in bounds:
            for stop in [b for b in bounds if b >= start]:
                batch = source.read(shard, start, stop)
                expected = table.slice(start, stop - start)
                assert batch.num_rows == stop - start
                assert pa.Table.from_batches([batch]).equals(expected.combine_chunks())


def test_pyarrow_written_tensors_come_back_as_tensors(files: list[tuple[str, pa.Table]]) -> None:
    path, table = files[1]
    source = ParquetSource(path)
    batch = source.read(source.plan()[0], 12, 25)
    assert batch.schema.field("x").type == tensor_type(np.float32, (2, 3))
    expected = column_to_numpy(table.column("x").combine_chunks())[12:25]
    np.testing.assert_array_equal(column_to_numpy(batch.column("x")), expected)


def test_reads_only_the_overlapping_row_groups(
    files: list[tuple[str, pa.Table]], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = files[1]  # 45 rows in groups of 10
    seen: list[Any] = []
    original = pq.ParquetFile.read_row_groups

    def spy(self: pq.ParquetFile, row_groups: Any, *args: Any, **kwargs: Any) -> pa.Table:
        seen.append((list(row_groups), kwargs.get("columns")))
        return original(self, row_groups, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", spy)
    source = ParquetSource(path, columns=["id", "x"])
    shard = source.plan()
    assert seen == []  # the plan reads footers only
    batch = source.read(shard[0], 15, 31)
    assert seen == [([1, 2, 3], ["id", "x"])]
    assert batch.schema.names == ["id", "x"]
    assert batch.column("id").to_pylist() == list(range(15, 31))
    source.read(shard[0], 20, 20)
    assert len(seen) == 1  # an empty range reads no data


def test_list_columns_from_other_writers_become_tensors_when_declared(tmp_path: Path) -> None:
    n = 12
    flat = pa.array([[float(i)] * 6 for i in range(n)], pa.list_(pa.float32()))
    path = tmp_path / "spark.parquet"
    pq.write_table(pa.table({"x": flat, "id": np.arange(n)}), path, store_schema=False)
    plain = ParquetSource(str(path))
    assert pa.types.is_list(plain.read(plain.plan()[0], 0, 2).schema.field("x").type)
    source = ParquetSource(str(path), tensors={"x": (2, 3)})
    batch = source.read(source.plan()[0], 3, 9)
    assert batch.schema.field("x").type == tensor_type(np.float32, (2, 3))
    np.testing.assert_array_equal(column_to_numpy(batch.column("x"))[:, 1, 2], range(3, 9))
    empty = source.read(source.plan()[0], 5, 5)
    assert empty.schema.field("x").type == tensor_type(np.float32, (2, 3))


def test_declared_tensor_with_a_wrong_row_names_file_and_row(tmp_path: Path) -> None:
    rows = [[1.0, 2.0]] * 10
    rows[7] = [1.0]
    path = tmp_path / "ragged.parquet"
    pq.write_table(pa.table({"v": pa.array(rows, pa.list_(pa.float32()))}), path, row_group_size=4)
    source = ParquetSource(str(path), tensors={"v": (2,)})
    shard = source.plan()[0]
    assert source.read(shard, 0, 7).num_rows == 7
    with pytest.raises(SchemaMismatchError) as info:
        source.read(shard, 5, 10)
    assert (info.value.path, info.value.index) == (str(path), 7)
    assert f"{path}, record 7: column 'v': a list of 1 values" in str(info.value)


def test_unknown_columns_name_the_file_and_what_it_has(files: list[tuple[str, pa.Table]]) -> None:
    path, _ = files[0]
    with pytest.raises(ConfigError, match=rf"{path}: no column\(s\) 'nope'.*id, x, vec, name"):
        ParquetSource(path, columns=["id", "nope"]).plan()
    with pytest.raises(ConfigError, match="not in columns"):
        ParquetSource(path, columns=["id"], tensors={"vec": (2,)})
    with pytest.raises(ConfigError, match="list of names"):
        ParquetSource(path, columns="id")


def test_pickled_source_reads_the_same(files: list[tuple[str, pa.Table]]) -> None:
    source = ParquetSource([p for p, _ in files], columns=["name", "vec"], tensors={"vec": [2]})
    shard = source.plan()[1]
    blob = pickle.dumps(source)
    assert len(blob) < 2000
    clone = pickle.loads(blob)
    assert clone.read(shard, 4, 30).equals(source.read(shard, 4, 30))
    assert clone.read(shard, 4, 30).schema.field("vec").type == tensor_type(np.float64, (2,))


def test_a_file_that_is_not_parquet_is_a_data_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=rf"{path}.*not a readable Parquet file"):
        ParquetSource(str(path)).plan()


@pytest.mark.parametrize(
    ("column", "row"),
    [
        (pa.array([float(i) if i != 57 else None for i in range(100)]), 57),
        (
            pa.array(
                [[i, i] if i != 70 else [i, None] for i in range(100)], pa.list_(pa.int64(), 2)
            ),
            70,
        ),
        (
            pa.array(
                [[i] * (i % 3) + ([None] if i == 41 else []) for i in range(100)],
                pa.list_(pa.int64()),
            ),
            41,
        ),
    ],
    ids=["number", "in-a-fixed-size-list", "in-a-list-of-numbers"],
)
def test_a_null_where_a_tensor_stands_names_file_row_and_column(
    tmp_path: Path, column: pa.Array, row: int
) -> None:
    path = str(tmp_path / "n.parquet")
    pq.write_table(pa.table({"id": list(range(100)), "x": column}), path, row_group_size=30)
    src = ParquetSource(path)
    (shard,) = src.plan()
    assert src.read(shard, 0, row).num_rows == row  # the rows before it are fine
    with pytest.raises(DataError, match="column 'x' holds a null") as caught:
        src.read(shard, row - 5, 100)
    assert (caught.value.path, caught.value.index) == (path, row)


def test_nulls_where_lists_and_strings_stand_are_kept(tmp_path: Path) -> None:
    path = str(tmp_path / "k.parquet")
    table = pa.table(
        {
            "words": pa.array(["a", None, "c"]),
            "tokens": pa.array([[1], None, [2, 3]], pa.list_(pa.int64())),
        }
    )
    pq.write_table(table, path)
    src = ParquetSource(path)
    assert src.read(src.plan()[0], 0, 3).to_pydict() == table.to_pydict()


def test_plan_checks_every_files_columns_and_types(tmp_path: Path) -> None:
    a, b = str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64()), "v": [[1.0], [2.0]]}), a)
    pq.write_table(pa.table({"id": pa.array([3], pa.int32()), "v": [[3.0]]}), b)
    with pytest.raises(ConfigError, match=f"column 'id' is int32 in {b} but int64 in {a}"):
        ParquetSource([a, b]).plan()
    assert ParquetSource([a, b], columns=["v"]).plan()[1].num_records == 1
    with pytest.raises(ConfigError, match="tensors names column 'w', which it does not have"):
        ParquetSource(a, tensors={"w": (1,)}).plan()
    pq.write_table(pa.table({"id": pa.array([3], pa.int64())}), b)
    with pytest.raises(ConfigError, match="pick common ones with columns="):
        ParquetSource([a, b]).plan()


def test_plan_lets_types_that_gather_alike_agree(tmp_path: Path) -> None:
    # Another writer's string type, and a tensor declared from lists nested another way.
    a, b = str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")
    flat = pa.array([[float(i)] * 6 for i in range(3)], pa.list_(pa.float32()))
    nested = pa.array([[[1.0] * 3] * 2 for _ in range(3)], pa.list_(pa.list_(pa.float32())))
    pq.write_table(pa.table({"x": flat, "s": pa.array(["a"] * 3, pa.string())}), a)
    pq.write_table(pa.table({"x": nested, "s": pa.array(["b"] * 3, pa.large_string())}), b)
    src = ParquetSource([a, b], tensors={"x": (2, 3)})
    assert [s.num_records for s in src.plan()] == [3, 3]
    assert {str(src.read(s, 0, 3).schema.field("x").type) for s in src.plan()} == {
        str(tensor_type(np.float32, (2, 3)))
    }


def test_a_column_of_only_nulls_where_others_give_a_tensor_is_refused_by_plan(
    tmp_path: Path,
) -> None:
    a, b, c = (str(tmp_path / f"{n}.parquet") for n in "abc")
    pq.write_table(pa.table({"x": pa.array([1.0, 2.0], pa.float32())}), a)
    pq.write_table(pa.table({"x": pa.array([None] * 4)}), b)  # type null, 4 rows
    pq.write_table(pa.table({"x": pa.array([], pa.null())}), c)  # empty: harmless
    assert len(ParquetSource([a, c]).plan()) == 2
    with pytest.raises(ConfigError, match=f"column 'x' holds only nulls in {b}"):
        ParquetSource([b, a]).plan()
