"""The decode-to-batch path every record source shares: the same failure reads the same.

One logical dataset (records ``{"y": i}``) is written as a TFRecord file, a JSON Lines file and
a WebDataset tar, and each source decodes it with the same picky function. Whatever fails, the
error (raise) or SkippedRecord (skip) must say the same thing in the same shape, differing
only in file, byte offset and WebDataset's sample key.
"""

from __future__ import annotations

import io
import json
import pickle
import tarfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from shmloader.errors import DecodeError, SchemaMismatchError
from shmloader.formats.tfrecord import RecordFile, write_records
from shmloader.sources import RecordFileSource, column_to_numpy
from shmloader.sources._decoding import At, Locations
from shmloader.sources.jsonl import JSONLSource
from shmloader.sources.webdataset import WebDatasetSource

N = 12
LABELS = list(range(N))
CURSED = {4, 9}  # decode raises
ODD_SHAPE = {6}  # decodes, but to a value that does not fit the inferred schema


def picky(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    y = obj["y"]
    if y in CURSED:
        raise ValueError(f"label {y} is cursed")
    return {"y": np.full((3, 1) if y in ODD_SHAPE else 2, y, np.int64)}


def from_payload(payload: bytes) -> Mapping[str, Any]:
    return picky(json.loads(payload))


def from_sample(sample: dict[str, Any]) -> Mapping[str, Any]:
    return picky(json.loads(sample["json"]))


def line(i: int) -> bytes:
    return json.dumps({"y": i}).encode()


def sample_key(i: int) -> str:
    return f"s/{i:03d}"


Make = Callable[[str], Any]
Offsets = Callable[[str], list[int]]


def _records(tmp: Path, labels: list[int]) -> tuple[str, Make, Offsets]:
    path = str(tmp / "d.tfrecord")
    write_records(path, [line(y) for y in labels])

    def make(on_error: str) -> Any:
        return RecordFileSource(path, decode=from_payload, on_error=on_error)

    return path, make, lambda p: RecordFile(p).offsets.tolist()


def _jsonl(tmp: Path, labels: list[int]) -> tuple[str, Make, Offsets]:
    path = tmp / "d.jsonl"
    path.write_bytes(b"".join(line(y) + b"\n" for y in labels))

    def make(on_error: str) -> Any:
        return JSONLSource(str(path), decode=picky, on_error=on_error)

    return str(path), make, lambda p: JSONLSource(p).offsets(p).tolist()


def _webdataset(tmp: Path, labels: list[int]) -> tuple[str, Make, Offsets]:
    path = tmp / "d.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for i, y in enumerate(labels):
            info = tarfile.TarInfo(f"{sample_key(i)}.json")
            info.size = len(line(y))
            tar.addfile(info, io.BytesIO(line(y)))

    def make(on_error: str) -> Any:
        return WebDatasetSource(str(path), decode=from_sample, on_error=on_error)

    return str(path), make, lambda p: WebDatasetSource(p).offsets(p).tolist()


KINDS = {"records": _records, "jsonl": _jsonl, "webdataset": _webdataset}


def note(kind: str, i: int) -> str:
    return f" (sample key {sample_key(i)!r})" if kind == "webdataset" else ""


@pytest.fixture(params=list(KINDS))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_a_failing_decode_reads_the_same_in_every_source(tmp_path: Path, kind: str) -> None:
    path, make, offsets = KINDS[kind](tmp_path, LABELS)
    off = offsets(path)
    source = make("raise")
    shard = source.plan()[0]
    with pytest.raises(DecodeError) as info:
        source.read(shard, 0, 6)  # record 4 raises; nothing before it is wrong
    err = info.value
    assert type(err) is DecodeError
    assert (err.path, err.index, err.offset) == (path, 4, off[4])
    assert str(err) == (
        f"{path}, record 4, byte offset {off[4]}: decode failed: ValueError: label 4 is cursed"
        + note(kind, 4)
        + '. To leave such records out, give the source on_error="skip": each is logged and '
        "counted (ds.stats().records_skipped), and its epoch is shorter by it"
    )
    assert isinstance(err.__cause__, ValueError)
    assert pickle.loads(pickle.dumps(err)).args == err.args  # the fix said once in the trainer


def test_a_record_that_does_not_fit_is_named_the_same_way(tmp_path: Path, kind: str) -> None:
    path, make, offsets = KINDS[kind](tmp_path, LABELS)
    off = offsets(path)
    source = make("raise")
    with pytest.raises(SchemaMismatchError) as info:
        source.read(source.plan()[0], 5, 8)
    err = info.value
    assert (err.path, err.index, err.offset) == (path, 6, off[6])
    assert str(err).startswith(f"{path}, record 6, byte offset {off[6]}: column 'y'")
    assert err.reason.endswith(note(kind, 6))
    # The fix, last: the schema was inferred, so the whole schema to give (and the skip).
    assert str(err).endswith(f"{note(kind, 6)}. {err.fix}")
    assert "schema=pa.schema([" in err.fix and 'on_error="skip"' in err.fix


def test_an_earlier_misfit_is_reported_before_a_later_failing_decode(
    tmp_path: Path, kind: str
) -> None:
    """Raise mode names the first bad record in file order, whatever went wrong with it."""
    _, make, _ = KINDS[kind](tmp_path, LABELS)
    source = make("raise")
    with pytest.raises(SchemaMismatchError) as info:
        source.read(source.plan()[0], 5, 12)  # 6 does not fit, 9 raises
    assert info.value.index == 6


def test_skip_reports_the_same_records_with_the_same_reasons(tmp_path: Path) -> None:
    seen: dict[str, list[tuple[int, str]]] = {}
    for kind, setup in KINDS.items():
        path, make, offsets = setup(tmp_path, LABELS)
        off = offsets(path)
        source = make("skip")
        result = source.read_result(source.plan()[0], 0, N)
        assert [s.path for s in result.skipped] == [path] * 3
        assert [s.offset for s in result.skipped] == [off[s.index] for s in result.skipped]
        good = [i for i in range(N) if i not in CURSED | ODD_SHAPE]
        np.testing.assert_array_equal(
            column_to_numpy(result.batch.column("y"))[:, 0], np.array(good, np.int64)
        )
        seen[kind] = [(s.index, s.error.removesuffix(note(kind, s.index))) for s in result.skipped]
        assert [s.error for s in result.skipped] == [e + note(kind, i) for i, e in seen[kind]]
    assert seen["records"] == seen["jsonl"] == seen["webdataset"]
    assert [i for i, _ in seen["records"]] == [4, 6, 9]
    assert seen["records"][0][1] == "decode failed: ValueError: label 4 is cursed"


def test_schema_inference_failure_reads_the_same(tmp_path: Path, kind: str) -> None:
    path, make, _ = KINDS[kind](tmp_path, [4] * N)  # every record is cursed
    with pytest.raises(DecodeError) as info:
        _ = make("skip").schema
    assert str(info.value) == (
        f"cannot infer a schema: the first {N} records all failed to decode; first failure: "
        f"{path}, record 0, byte offset 0: ValueError('label 4 is cursed'); pass schema= or "
        "fix the data"
    )


def _failing_in_bulk(payloads: list[bytes]) -> Mapping[str, Any]:
    """A decode_batch that fails on more than one record at a time, never on one alone."""
    if len(payloads) > 1:
        raise MemoryError("too many at once")
    return {"y": np.array([json.loads(p)["y"] for p in payloads], np.int64)}


def test_decode_batch_failing_only_in_bulk(tmp_path: Path) -> None:
    path, _, offsets = _records(tmp_path, LABELS)
    strict = RecordFileSource(path, decode_batch=_failing_in_bulk)
    shard = strict.plan()[0]
    with pytest.raises(DecodeError, match=r"records \[2, 7\] but on none of them alone") as info:
        strict.read(shard, 2, 8)
    assert (info.value.index, info.value.offset) == (2, offsets(path)[2])
    assert isinstance(info.value.__cause__, MemoryError)
    lenient = RecordFileSource(path, decode_batch=_failing_in_bulk, on_error="skip")
    result = lenient.read_result(shard, 2, 8)
    assert result.skipped == ()
    assert result.batch.column("y").to_pylist() == [2, 3, 4, 5, 6, 7]
    assert result.batch.schema == pa.schema([("y", pa.int64())])


def test_locations_make_at_only_on_access() -> None:
    where = Locations([3, 4, 7], [0, 10, 40])
    assert len(where) == 3
    assert where[1] == At(4, 10) and where[-1] == At(7, 40)
    assert list(where[1:]) == [At(4, 10), At(7, 40)]
    with pytest.raises(IndexError):
        where[3]
