"""A data error reaches the training loop as the class docs/troubleshooting.md names.

Real readers, a real embedded master: each error is raised in a reader and must arrive in the
loop as itself (``except shmloader.DecodeError`` catches it), with file and record, the user's
own exception chained, after one try when a retry cannot help (was: TaskQuarantinedError after
``max_retries`` identical retries and a warning each, no cause). What a retry can fix (I/O)
is still retried; when the retries run out, TaskQuarantinedError chains the last error.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _dataset_helpers import data_loader, shm_entries, write_dataset
from _decoders import PAYLOAD

import shmloader

RECORD = 16 + PAYLOAD.size  # framing (length, its CRC, payload CRC) plus the payload


def _epoch(
    tmp_path: Path,
    decode: Callable[[bytes], dict[str, Any]],
    loader: str = "shmloader",
    num_workers: int = 0,
    **options: Any,
) -> list[int]:
    """One epoch of the records in tmp_path/data; the ids the loop got before it raised."""
    (tmp_path / "shm").mkdir(exist_ok=True)
    src = shmloader.RecordFileSource(str(tmp_path / "data" / "*.tfrecord"), decode=decode)
    settings: dict[str, Any] = {
        "num_readers": 2,
        "records_per_task": 100,
        "epochs": 1,
        "max_retries": 3,
        "shm_dir": str(tmp_path / "shm"),
        **options,
    }
    got: list[int] = []
    try:
        with shmloader.SharedTaskDataset(src, **settings) as ds:
            for batch in data_loader(ds, loader, 32, num_workers):
                got += batch["id"].tolist()
    finally:
        assert shm_entries(tmp_path / "shm") == []
    return got


def _poisoned(bad: int) -> Callable[[bytes], dict[str, Any]]:
    def decode(payload: bytes) -> dict[str, Any]:
        record_id, _ = struct.unpack("<qB", payload)
        if record_id == bad:
            raise KeyError(f"no label for record {record_id}")
        return {"id": record_id}

    return decode


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("loader", "num_workers"), [("shmloader", 0), ("torch", 0), ("torch", 2)])
def test_a_decode_error_is_caught_as_decode_error_with_its_cause(
    tmp_path: Path, loader: str, num_workers: int, caplog: pytest.LogCaptureFixture
) -> None:
    write_dataset(tmp_path / "data", [300, 300])
    caught: shmloader.DecodeError | None = None
    with caplog.at_level(logging.WARNING, logger="shmloader"):
        try:
            _epoch(tmp_path, _poisoned(437), loader, num_workers)
        except shmloader.DecodeError as exc:
            caught = exc
    assert caught is not None
    assert caught.path == str(tmp_path / "data" / "part-00001.tfrecord")
    assert caught.index == 137 and caught.offset == 137 * RECORD
    assert isinstance(caught.__cause__, KeyError)
    assert "no label for record 437" in str(caught.__cause__)
    notes = "\n".join(caught.__cause__.__notes__)
    assert "test_errors_in_the_loop.py" in notes and "in decode" in notes  # the user's line
    assert "Raised in reader" in "\n".join(caught.__notes__)
    assert not [r for r in caplog.records if "failed task" in r.getMessage()]  # said once


def _wrong_shape(payload: bytes) -> dict[str, Any]:
    record_id, _ = struct.unpack("<qB", payload)
    return {"id": record_id, "x": np.zeros(3 if record_id == 250 else 2, np.float32)}


@pytest.mark.timeout(120)
def test_a_record_of_another_shape_is_a_schema_mismatch(tmp_path: Path) -> None:
    write_dataset(tmp_path / "data", [300])
    with pytest.raises(shmloader.SchemaMismatchError, match="shape") as info:
        _epoch(tmp_path, _wrong_shape)
    assert info.value.index == 250 and "column 'x'" in str(info.value)


def _ids(payload: bytes) -> dict[str, Any]:
    return {"id": struct.unpack("<qB", payload)[0]}


@pytest.mark.timeout(120)
def test_a_damaged_record_is_a_corrupt_record_error(tmp_path: Path) -> None:
    write_dataset(tmp_path / "data", [300])
    path = tmp_path / "data" / "part-00000.tfrecord"
    data = bytearray(path.read_bytes())
    data[160 * RECORD + 12] ^= 0xFF  # a payload byte of record 160: its CRC no longer fits
    path.write_bytes(bytes(data))
    with pytest.raises(shmloader.CorruptRecordError) as info:
        _epoch(tmp_path, _ids)
    assert info.value.path == str(path)
    assert info.value.offset == 160 * RECORD


@pytest.mark.timeout(120)
def test_a_task_larger_than_the_budget_is_a_shm_space_error(tmp_path: Path) -> None:
    write_dataset(tmp_path / "data", [300])
    with pytest.raises(shmloader.ShmSpaceError, match="cannot fit in shm_budget") as info:
        _epoch(tmp_path, _ids, shm_budget="1KiB")
    assert info.value.never_fits
    assert "reading task" in "\n".join(info.value.__notes__)  # which task, which file


class _FlakyDisk:
    """A source of the user's own whose reads of one range fail with an I/O error."""

    def __init__(self, n: int) -> None:
        self.n = n

    def plan(self) -> list[shmloader.Shard]:
        return [shmloader.Shard("disk", self.n)]

    def read_result(self, shard: shmloader.Shard, start: int, stop: int) -> Any:
        import pyarrow as pa

        if start == 100:
            raise ConnectionResetError("the storage server hung up")
        return shmloader.ReadResult(pa.record_batch({"id": np.arange(start, stop)}))

    def read(self, shard: shmloader.Shard, start: int, stop: int) -> Any:
        return self.read_result(shard, start, stop).batch


@pytest.mark.timeout(120)
def test_io_errors_are_retried_then_quarantined_with_the_last_cause(tmp_path: Path) -> None:
    (tmp_path / "shm").mkdir()
    with shmloader.SharedTaskDataset(
        _FlakyDisk(300),
        num_readers=2,
        records_per_task=100,
        epochs=1,
        max_retries=2,
        shm_dir=str(tmp_path / "shm"),
    ) as ds:
        with pytest.raises(shmloader.TaskQuarantinedError) as info:
            for _batch in shmloader.DataLoader(ds, batch_size=32):
                pass
        assert ds.stats().task_failures == 3  # the first try and max_retries=2 retries
    message = str(info.value)
    assert "records 100..200" in message and "the training loop stops here" in message
    assert message.count("(raised at") == 1, message  # where the user's read raised, once
    cause = info.value.__cause__
    assert isinstance(cause, shmloader.DataError) and "records [100, 200)" in str(cause)
    assert isinstance(cause.__cause__, ConnectionResetError)
    assert shm_entries(tmp_path / "shm") == []
