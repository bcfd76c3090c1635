"""JSONLSource over real files: line index, ranges, fast vs reference path, errors, skips."""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from shmloader.errors import ConfigError, DecodeError, SchemaMismatchError
from shmloader.formats.index import sidecar_path
from shmloader.sources import Source
from shmloader.sources._lines import scan_lines
from shmloader.sources.jsonl import JSONLSource

N = 300


def record(i: int) -> dict[str, Any]:
    return {"id": i, "x": [i / 4, -i, 0.1 * i], "name": f"r{i} \u00e9", "ok": i % 2 == 0}


def write_jsonl(path: Path, n: int = N, *, blanks: bool = True, last_newline: bool = True) -> None:
    parts = []
    for i in range(n):
        parts.append(json.dumps(record(i)) + ("\r\n" if i % 5 == 0 else "\n"))
        if blanks and i % 7 == 0:
            parts.append(["\n", "   \n", "\t\r\n"][i % 3])
    text = "".join(parts)
    if not last_newline:
        text = text.rstrip("\r\n")
    path.write_text(("\n \n" if blanks else "") + text, encoding="utf-8")


def identity(obj: dict[str, Any]) -> Mapping[str, Any]:
    return obj


def with_sum(obj: dict[str, Any]) -> Mapping[str, Any]:
    if obj["id"] % 11 == 3:
        raise ValueError("eleven")
    return {"id": obj["id"], "s": np.float32(sum(obj["x"]))}


@pytest.fixture
def data(tmp_path: Path) -> Path:
    p = tmp_path / "a.jsonl"
    write_jsonl(p)
    return p


def expected(start: int, stop: int) -> list[dict[str, Any]]:
    return [record(i) for i in range(start, stop)]


def test_plan_counts_and_every_range_round_trips(data: Path) -> None:
    src = JSONLSource(str(data))
    assert isinstance(src, Source)
    (shard,) = src.plan()
    assert shard.num_records == N
    assert str(src.schema.field("x").type) == str(pa.fixed_shape_tensor(pa.float64(), (3,)))
    for start, stop in [(0, N), (0, 1), (N - 1, N), (5, 5), (13, 77), (77, 300), (150, 151)]:
        batch = src.read(shard, start, stop)
        assert batch.schema.equals(src.schema)
        assert batch.to_pylist() == expected(start, stop)
    rows = []
    for start in range(0, N, 64):
        rows += src.read(shard, start, min(N, start + 64)).to_pylist()
    assert rows == expected(0, N)


def test_no_trailing_newline_and_no_blanks(tmp_path: Path) -> None:
    p = tmp_path / "b.jsonl"
    write_jsonl(p, 10, blanks=False, last_newline=False)
    src = JSONLSource(str(p))
    assert src.plan()[0].num_records == 10
    assert src.read(src.plan()[0], 8, 10).to_pylist() == expected(8, 10)


def test_fast_path_equals_reference_path(data: Path) -> None:
    fast = JSONLSource(str(data))
    slow = JSONLSource(str(data), decode=identity)
    shard = fast.plan()[0]
    assert fast.read(shard, 3, 200).equals(slow.read(shard, 3, 200))


def test_scan_lines_agrees_with_python_at_any_block_size(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    alphabet = np.frombuffer(b'ab "\n\n \r\t', dtype=np.uint8)
    for trial in range(30):
        raw = alphabet[rng.integers(0, len(alphabet), size=int(rng.integers(0, 80)))].tobytes()
        p = tmp_path / f"t{trial}.txt"
        p.write_bytes(raw)
        want, pos = [], 0
        for line in raw.split(b"\n"):
            if line.strip(b" \t\r"):
                want.append(pos)
            pos += len(line) + 1
        want.append(len(raw))
        for block in (1, 2, 3, 7, 1 << 20):
            got = scan_lines(str(p), blank=b" \t\r", block_size=block)
            assert got.tolist() == want, (raw, block)


def test_index_is_reused_and_rebuilt_when_stale(data: Path) -> None:
    JSONLSource(str(data)).plan()
    index = Path(sidecar_path(str(data), "jsonl"))
    assert index.exists()
    before = index.stat().st_mtime_ns
    assert JSONLSource(str(data)).plan()[0].num_records == N
    assert index.stat().st_mtime_ns == before
    with data.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record(N)) + "\n")
    os.utime(data, ns=(before + 10**9, before + 10**9))
    src = JSONLSource(str(data))
    assert src.plan()[0].num_records == N + 1
    assert src.read(src.plan()[0], N - 1, N + 1).to_pylist() == expected(N - 1, N + 1)


def test_glob_skips_sidecar_indexes_and_plans_files_in_order(tmp_path: Path) -> None:
    for name, n in (("b.jsonl", 4), ("a.jsonl", 6)):
        write_jsonl(tmp_path / name, n)
    JSONLSource(str(tmp_path / "*.jsonl")).plan()
    src = JSONLSource(str(tmp_path / "*"))
    assert [(Path(s.path).name, s.num_records) for s in src.plan()] == [
        ("a.jsonl", 6),
        ("b.jsonl", 4),
    ]


def _bad_file(
    tmp_path: Path, bad: bytes = b'{"id": 4, "x": [1, 2, 3], "name": "r4",'
) -> tuple[Path, int]:
    """Ten records, the fifth (index 4) replaced by ``bad`` (by default a line cut short).

    Written as UTF-8, not ``\\u`` escapes, so the fast path's UTF-8 check has text to check.
    """
    p = tmp_path / "bad.jsonl"
    lines = [json.dumps(record(i), ensure_ascii=False).encode() for i in range(10)]
    lines[4] = bad
    p.write_bytes(b"\n".join(lines) + b"\n")
    offset = sum(len(line) + 1 for line in lines[:4])
    return p, offset


def test_bad_line_names_file_record_and_offset(tmp_path: Path) -> None:
    p, offset = _bad_file(tmp_path)
    src = JSONLSource(str(p))
    shard = src.plan()[0]
    assert src.read(shard, 0, 4).num_rows == 4
    with pytest.raises(DecodeError) as info:
        src.read(shard, 2, 8)
    err = info.value
    assert (err.path, err.index, err.offset) == (str(p), 4, offset)
    assert "invalid JSON" in str(err) and str(p) in str(err) and "record 4" in str(err)


def test_skip_mode_counts_each_bad_record(tmp_path: Path) -> None:
    p, offset = _bad_file(tmp_path)
    src = JSONLSource(str(p), on_error="skip")
    result = src.read_result(src.plan()[0], 0, 10)
    assert [r["id"] for r in result.batch.to_pylist()] == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    assert [(s.index, s.offset) for s in result.skipped] == [(4, offset)]


_TAIL = b', "x": [1, 2, 3], "ok": true}'
_NOT_TEXT: dict[str, tuple[bytes, list[str] | None, str]] = {
    # the line: bytes json.loads refuses; surrogates (UTF-8-encoded or escaped) parse to a
    # str that has no UTF-8 form, which the column refuses
    "invalid UTF-8 in a value": (b'{"id": 4, "name": "\xff\xfe"' + _TAIL, None, "invalid JSON"),
    "an encoded surrogate": (b'{"id": 4, "name": "\xed\xa0\x80"' + _TAIL, None, "column 'name'"),
    "an escaped surrogate": (b'{"id": 4, "name": "\\ud800"' + _TAIL, None, "column 'name'"),
    "invalid UTF-8 in a key left out": (
        b'{"id": 4, "name": "r4", "\xff": 1}',
        ["id", "name"],
        "invalid JSON",
    ),
}


@pytest.mark.parametrize("case", list(_NOT_TEXT))
def test_a_line_that_is_not_utf8_text_is_named_or_skipped(tmp_path: Path, case: str) -> None:
    """The pyarrow.json fast path copies string bytes unchecked; such a range must take the
    json.loads path, which names (or skips) just that line and keeps the others."""
    bad, columns, needle = _NOT_TEXT[case]
    p, offset = _bad_file(tmp_path, bad)
    src = JSONLSource(str(p), columns=columns)
    shard = src.plan()[0]
    with pytest.raises(DecodeError) as info:
        src.read(shard, 0, 10)
    err = info.value
    assert (err.path, err.index, err.offset) == (str(p), 4, offset)
    assert needle in err.reason and "'utf-8' codec" in err.reason
    result = JSONLSource(str(p), columns=columns, on_error="skip").read_result(shard, 0, 10)
    assert [(s.path, s.index, s.offset) for s in result.skipped] == [(str(p), 4, offset)]
    good = [i for i in range(10) if i != 4]
    assert result.batch.column("id").to_pylist() == good
    assert result.batch.column("name").to_pylist() == [record(i)["name"] for i in good]
    result.batch.validate(full=True)


def test_values_that_do_not_fit_the_schema(tmp_path: Path) -> None:
    p = tmp_path / "c.jsonl"
    rows: list[Any] = [record(i) for i in range(6)]
    rows[1]["x"] = [[1.0, 2.0]]  # other shape (a 1-D length that varies would be a list column)
    rows[2]["name"] = None  # null
    del rows[3]["ok"]  # missing key
    rows[4]["extra"] = 1  # unexpected key
    rows[5] = [1, 2]  # not an object
    p.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    src = JSONLSource(str(p))
    shard = src.plan()[0]
    with pytest.raises(SchemaMismatchError) as info:
        src.read(shard, 0, 6)
    assert info.value.index == 1
    result = JSONLSource(str(p), on_error="skip").read_result(shard, 0, 6)
    assert result.batch.num_rows == 1
    reasons = {s.index: s.error for s in result.skipped}
    assert sorted(reasons) == [1, 2, 3, 4, 5]
    assert "None" in reasons[2] and "'ok'" in reasons[3] and "'extra'" in reasons[4]
    assert "object" in reasons[5]


def test_columns_projection_and_explicit_schema(tmp_path: Path, data: Path) -> None:
    src = JSONLSource(str(data), columns=["name", "id"])
    shard = src.plan()[0]
    assert src.read(shard, 10, 12).to_pylist() == [
        {"name": record(i)["name"], "id": i} for i in (10, 11)
    ]
    schema = pa.schema([("id", pa.int32()), ("x", pa.list_(pa.float32()))])
    typed = JSONLSource(str(data), schema=schema)
    batch = typed.read(shard, 0, 3)
    assert batch.schema.equals(schema)
    assert batch.column("x").to_pylist()[1] == pytest.approx([0.25, -1.0, 0.1])
    with pytest.raises(ConfigError):
        JSONLSource(str(data), columns=["id"], schema=schema)


def test_decode_hook_errors_and_skips(data: Path) -> None:
    src = JSONLSource(str(data), decode=with_sum)
    shard = src.plan()[0]
    with pytest.raises(DecodeError, match="eleven") as info:
        src.read(shard, 0, 20)
    assert info.value.index == 3
    result = JSONLSource(str(data), decode=with_sum, on_error="skip").read_result(shard, 0, 20)
    assert [s.index for s in result.skipped] == [3, 14]
    assert result.batch.column("s").type == pa.float32()
    assert result.batch.num_rows == 18


def test_pickled_source_reads_the_same(data: Path) -> None:
    src = JSONLSource(str(data), decode=identity)
    shard = src.plan()[0]
    _ = src.schema
    clone = pickle.loads(pickle.dumps(src))
    assert clone.plan() == src.plan()
    assert clone.read(shard, 50, 90).equals(src.read(shard, 50, 90))


def test_unknown_shard_and_bad_range_are_refused(tmp_path: Path, data: Path) -> None:
    other = tmp_path / "other.jsonl"
    write_jsonl(other, 3)
    src = JSONLSource(str(data))
    with pytest.raises(ConfigError):
        src.read(JSONLSource(str(other)).plan()[0], 0, 1)
    with pytest.raises(ConfigError):
        src.read(src.plan()[0], 0, N + 1)
