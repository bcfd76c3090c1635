"""CSVSource over real files: header, pinned types, ranges, quoted line breaks, errors, skips."""

from __future__ import annotations

import os
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pcsv
import pytest

from shmloader.errors import ConfigError, DataError, DecodeError
from shmloader.formats.index import sidecar_path
from shmloader.sources.csv import CSVSource

N = 257


def row(i: int) -> str:
    # Early rows look like integers in "score"; later ones have fractions: types must be pinned
    # from the first block and still hold (float column) everywhere.
    score = f"{i / 8}" if i % 3 else f"{i // 3}.0"
    return f'{i},"name, {i}",{score},2021-01-{i % 28 + 1:02d},{"true" if i % 2 else "false"}'


def write_csv(path: Path, n: int = N, *, header: bool = True, sep: str = ",") -> None:
    lines = ["id,name,score,day,flag"] if header else []
    for i in range(n):
        lines.append(row(i))
        if i % 9 == 0:
            lines.append("")
    text = "\n" + "\r\n".join(lines) + "\n"
    path.write_text(text.replace(",", sep) if sep != "," else text, encoding="utf-8")


def expected(path: Path, start: int, stop: int) -> list[dict[str, Any]]:
    table = pcsv.read_csv(
        path, convert_options=pcsv.ConvertOptions(column_types={"day": pa.string()})
    )
    return table.slice(start, stop - start).to_pylist()


def fill(row: dict[str, Any]) -> Mapping[str, Any]:
    return {"id": row["id"], "score": -1.0 if row["score"] is None else row["score"]}


@pytest.fixture
def data(tmp_path: Path) -> Path:
    p = tmp_path / "a.csv"
    write_csv(p)
    return p


def test_plan_types_and_every_range(data: Path) -> None:
    src = CSVSource(str(data))
    (shard,) = src.plan()
    assert shard.num_records == N
    assert src.schema == pa.schema(
        [("id", pa.int64()), ("name", pa.string()), ("score", pa.float64()),
         ("day", pa.string()), ("flag", pa.bool_())]
    )  # fmt: skip
    for start, stop in [(0, N), (0, 1), (N - 1, N), (4, 4), (9, 10), (10, 200)]:
        batch = src.read(shard, start, stop)
        assert batch.schema.equals(src.schema)
        assert batch.to_pylist() == expected(data, start, stop)


def test_header_false_and_other_delimiter(tmp_path: Path) -> None:
    p = tmp_path / "b.tsv"
    write_csv(p, 20, header=False, sep="\t")
    src = CSVSource(str(p), delimiter="\t", header=False)
    shard = src.plan()[0]
    assert shard.num_records == 20
    assert src.schema.names == ["f0", "f1", "f2", "f3", "f4"]
    assert src.read(shard, 19, 20).to_pylist()[0]["f1"] == "name\t 19"  # quoted tab


def test_quoted_line_break_is_refused_with_advice(tmp_path: Path) -> None:
    p = tmp_path / "q.csv"
    p.write_text('a,b\n1,"x"\n2,"two\nlines"\n3,z\n', encoding="utf-8")
    with pytest.raises(DataError, match="shmloader convert") as info:
        CSVSource(str(p)).plan()
    assert (info.value.path, info.value.index, info.value.offset) == (str(p), 1, 10)


def test_bad_rows_are_named_and_skipped(tmp_path: Path) -> None:
    p = tmp_path / "bad.csv"
    lines = ["id,score"] + [f"{i},{i / 2}" for i in range(40)]
    lines[1 + 13] = "13,1.5,extra"  # too many fields
    lines[1 + 20] = "20,abc"  # not a number
    lines[1 + 30] = "30,"  # empty: columns hold no nulls
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    offset13 = sum(len(line) + 1 for line in lines[:14])
    src = CSVSource(str(p))
    shard = src.plan()[0]
    assert src.read(shard, 0, 13).num_rows == 13
    with pytest.raises(DecodeError) as info:
        src.read(shard, 10, 40)
    assert (info.value.path, info.value.index, info.value.offset) == (str(p), 13, offset13)
    assert "Expected 2 columns" in str(info.value)
    result = CSVSource(str(p), on_error="skip").read_result(shard, 0, 40)
    assert [s.index for s in result.skipped] == [13, 20, 30]
    assert "'score' is empty" in result.skipped[2].error
    assert result.batch.column("id").to_pylist() == [i for i in range(40) if i not in (13, 20, 30)]


def test_a_row_that_is_not_utf8_is_named_or_skipped(tmp_path: Path) -> None:
    """pyarrow.csv checks UTF-8 when converting to string (a column inferred as binary for
    such bytes is pinned to string), so the bad row is isolated like any other."""
    p = tmp_path / "bad.csv"
    lines = [b"id,name"] + [f"{i},r{i} \u00e9".encode() for i in range(10)]
    lines[1 + 4] = b"4,\xff\xfe"
    p.write_bytes(b"\n".join(lines) + b"\n")
    offset = sum(len(line) + 1 for line in lines[:5])
    src = CSVSource(str(p))
    shard = src.plan()[0]
    with pytest.raises(DecodeError, match="invalid UTF8") as info:
        src.read(shard, 0, 10)
    assert (info.value.path, info.value.index, info.value.offset) == (str(p), 4, offset)
    result = CSVSource(str(p), on_error="skip").read_result(shard, 0, 10)
    assert [(s.index, s.offset) for s in result.skipped] == [(4, offset)]
    assert result.batch.column("id").to_pylist() == [i for i in range(10) if i != 4]
    result.batch.validate(full=True)


def test_decode_sees_typed_rows_and_fills_defaults(tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    p.write_text("id,score\n1,0.5\n2,\n3,7\n", encoding="utf-8")
    src = CSVSource(str(p), decode=fill)
    assert src.read(src.plan()[0], 0, 3).to_pylist() == [
        {"id": 1, "score": 0.5},
        {"id": 2, "score": -1.0},
        {"id": 3, "score": 7.0},
    ]


def test_projection_and_schema_pin_types(data: Path) -> None:
    src = CSVSource(str(data), columns=["score", "id"])
    shard = src.plan()[0]
    assert src.read(shard, 1, 3).to_pylist() == [
        {"score": r["score"], "id": r["id"]} for r in expected(data, 1, 3)
    ]
    schema = pa.schema([("id", pa.int32()), ("score", pa.float32())])
    batch = CSVSource(str(data), schema=schema).read(shard, 0, 5)
    assert batch.schema.equals(schema)
    with pytest.raises(ConfigError):
        CSVSource(str(data), schema=pa.schema([("id", pa.list_(pa.int8()))]))


def test_files_with_other_column_order_share_one_schema(tmp_path: Path) -> None:
    (tmp_path / "1.csv").write_text("a,b\n1,x\n2,y\n", encoding="utf-8")
    (tmp_path / "2.csv").write_text("b,a\nz,3\n", encoding="utf-8")
    (tmp_path / "3.csv").write_text("a\n4\n", encoding="utf-8")
    src = CSVSource(str(tmp_path / "*.csv"))
    _, s2, s3 = src.plan()
    assert src.read(s2, 0, 1).to_pylist() == [{"a": 3, "b": "z"}]
    with pytest.raises(DataError, match="no column"):
        src.read(s3, 0, 1)


def test_index_reuse_staleness_and_pickling(data: Path) -> None:
    src = CSVSource(str(data))
    src.plan()
    index = Path(sidecar_path(str(data), "csv"))
    before = index.stat().st_mtime_ns
    assert CSVSource(str(data)).plan()[0].num_records == N
    assert index.stat().st_mtime_ns == before
    _ = src.schema
    clone = pickle.loads(pickle.dumps(src))
    shard = src.plan()[0]
    assert clone.read(shard, 100, 180).equals(src.read(shard, 100, 180))
    with data.open("a", encoding="utf-8") as f:
        f.write(row(N) + "\n")
    os.utime(data, ns=(before + 10**9, before + 10**9))
    fresh = CSVSource(str(data))
    assert fresh.plan()[0].num_records == N + 1
    assert CSVSource(str(data), header=False).plan()[0].num_records == N + 2


def test_header_only_and_empty_files(tmp_path: Path) -> None:
    (tmp_path / "h.csv").write_text("a,b\n", encoding="utf-8")
    (tmp_path / "e.csv").write_text("", encoding="utf-8")
    src = CSVSource(str(tmp_path / "*.csv"))
    assert [s.num_records for s in src.plan()] == [0, 0]
    with pytest.raises(ConfigError, match="no records"):
        _ = src.schema


def test_lone_carriage_returns_are_refused_not_read_as_a_header(tmp_path: Path) -> None:
    """pyarrow.csv ends a row at a lone '\\r' (old Mac line ends), the line index only at
    '\\n': such a file was one long header line, planned as 0 records and never read."""
    (tmp_path / "a.csv").write_text("id,name\n1,x\n2,y\n", encoding="utf-8")
    (tmp_path / "b.csv").write_bytes(b"id,name\r3,z\r4,w\r")
    with pytest.raises(DataError, match="not followed by") as info:
        CSVSource(str(tmp_path / "*.csv")).plan()
    assert str(tmp_path / "b.csv") in str(info.value)
    (tmp_path / "b.csv").write_bytes(b"id,name\r3,z\n4,w\n")  # a row in the header line
    src = CSVSource(str(tmp_path / "b.csv"))
    (shard,) = src.plan()
    with pytest.raises(DataError, match="header line holds 1 more row"):
        src.read(shard, 0, shard.num_records)
    (tmp_path / "b.csv").write_bytes(b"id,name\n3,z\r5,v\n4,w\n")  # two rows in one line
    src = CSVSource(str(tmp_path / "b.csv"))
    (shard,) = src.plan()
    with pytest.raises(DecodeError, match="parsed into 2 rows; it holds a '\\\\r'"):
        src.read(shard, 0, shard.num_records)
    (tmp_path / "h.csv").write_bytes(b"id,name")  # a header without a line end is fine
    assert [s.num_records for s in CSVSource(str(tmp_path / "h.csv")).plan()] == [0]
