"""Decode functions for the dataset tests, in a module of their own.

Reader processes unpickle the source, and with it these functions, by module path
(``_decoders.decode``); keeping them out of the test modules means a reader imports only this
small file, not pytest and the tests.

A record's payload is ``struct "<qB"``: the record id (int64) and a flag; flag 1 marks a
record whose decode raises ("poison").
"""

from __future__ import annotations

import ctypes
import os
import struct
import subprocess
import time
from typing import Any

import numpy as np
import pyarrow as pa

from shmloader.sources import RecordFileSource
from shmloader.sources.base import ReadResult, Shard

PAYLOAD = struct.Struct("<qB")
SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("x", pa.float32())])
GOOD, POISON = 0, 1


def encode(record_id: int, flag: int = GOOD) -> bytes:
    return PAYLOAD.pack(record_id, flag)


def decode(payload: bytes) -> dict[str, Any]:
    """``id`` and ``x = 2 * id`` (so a test can check that columns stay aligned)."""
    record_id, flag = PAYLOAD.unpack(payload)
    if flag == POISON:
        raise ValueError(f"poison record {record_id}")
    return {"id": record_id, "x": np.float32(2 * record_id)}


def decode_with_payload(payload: bytes) -> dict[str, Any]:
    """As :func:`decode`, with the payload itself as a bytes column ``raw``."""
    return {**decode(payload), "raw": payload}


def decode_slow(payload: bytes) -> dict[str, Any]:
    """As :func:`decode`, 2 ms per record: a reader spends most of its time inside a lease."""
    time.sleep(0.002)
    return decode(payload)


def decode_or_crash(payload: bytes) -> dict[str, Any]:
    """As :func:`decode`, but a poison record kills the reader process (as a segfault in a
    native decoder would): no exception, no failure report, only a dead reader."""
    _, flag = PAYLOAD.unpack(payload)
    if flag == POISON:
        os._exit(3)
    return decode(payload)


def decode_or_segfault(payload: bytes) -> dict[str, Any]:
    """As :func:`decode`, but a poison record makes the reader read address 0, as a bug in a
    native decoder would: SIGSEGV kills it."""
    _, flag = PAYLOAD.unpack(payload)
    if flag == POISON:
        ctypes.string_at(0)
    return decode(payload)


HOLDERS_ENV = "SHMLOADER_TEST_HOLDERS"  # where decode_holding_fds notes its children's pids
_holder_started = False


def decode_holding_fds(payload: bytes) -> dict[str, Any]:
    """As :func:`decode`; first starts a child that inherits every open file of the reader,
    its pipe to the trainer among them, and outlives it (a decoder that runs a helper
    program would): a SIGKILLed reader then closes no pipe, and only a look at the process
    says it died. The child's pid goes into a file in ``$SHMLOADER_TEST_HOLDERS``."""
    global _holder_started
    if not _holder_started:
        _holder_started = True
        holder = subprocess.Popen(["sleep", "120"], close_fds=False)
        folder = os.environ[HOLDERS_ENV]
        with open(os.path.join(folder, str(holder.pid)), "w"):
            pass
    return decode(payload)


PADDED = 40_000  # bytes per record of the padded kind: 100 records fill two 2-MiB blocks


def encode_padded(record_id: int, flag: int = GOOD) -> bytes:
    """:func:`encode`'s record padded to :data:`PADDED` bytes."""
    return encode(record_id, flag).ljust(PADDED, b"\xab")


def decode_batch_padded(payloads: list[Any]) -> dict[str, np.ndarray]:
    """:func:`decode` for a list of padded records at once; raises if any is poison."""
    raw = np.frombuffer(b"".join(payloads), np.uint8).reshape(len(payloads), -1)
    ids = raw[:, :8].view(np.int64)[:, 0]  # a strided view of the joined records
    poison = raw[:, 8] == POISON
    if poison.any():
        raise ValueError(f"poison records {ids[poison].tolist()}")
    return {"id": ids, "x": (2 * ids).astype(np.float32)}


# ``x`` as a tensor type of shape (): one value per record, which a decode returns as a
# zero-dimensional array (numpy's scalar-as-array).
SCALAR_TENSOR_SCHEMA = pa.schema(
    [pa.field("id", pa.int64()), pa.field("x", pa.fixed_shape_tensor(pa.float32(), ()))]
)


def decode_scalar_tensor(payload: bytes) -> dict[str, Any]:
    """:func:`decode` with ``x`` a zero-dimensional float32 array."""
    record = decode(payload)
    return {"id": record["id"], "x": np.array(record["x"], dtype=np.float32)}


def decode_batch_scalar_tensor(payloads: list[Any]) -> dict[str, np.ndarray]:
    """:func:`decode` for a list of records at once (``x`` one value per record)."""
    ids = np.array([PAYLOAD.unpack(p)[0] for p in payloads], dtype=np.int64)
    return {"id": ids, "x": (2 * ids).astype(np.float32)}


class DroppingSource(RecordFileSource):
    """A source of the user's own whose ``read`` loses the last record of the task holding
    record ``DROP_AT`` without reporting it (no ``SkippedRecord``), as a buggy source or a
    file rewritten shorter after planning would: readers must refuse such a task, not deliver
    it short."""

    DROP_AT = 250

    def _read(self, shard: Shard, start: int, stop: int) -> ReadResult:
        result = super()._read(shard, start, stop)
        if start <= self.DROP_AT < stop:
            return ReadResult(result.batch.slice(0, stop - start - 1), result.skipped)
        return result


class RetypingSource(RecordFileSource):
    """A source of the user's own whose task holding record ``RETYPE_AT`` gives its columns
    another form than every other task: ``change`` "dtype" makes ``x`` float64 (float32
    elsewhere), "shape" makes it a (2,) tensor, "columns" adds a column. Readers deliver such a
    task as it is; the trainer must refuse it, naming it, rather than hand out batches of
    another dtype or shape. "fails": reading that task raises a ValueError of the source's
    own (the loop's error must say where it was raised). "unwrapped" returns its batch
    instead of a ReadResult, "table" a ReadResult of a pyarrow.Table: mistakes that failed
    with an AttributeError about shmloader's internals."""

    RETYPE_AT = 250

    def __init__(self, *args: Any, change: str = "dtype", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.change = change

    def _read(self, shard: Shard, start: int, stop: int) -> ReadResult:
        result = super()._read(shard, start, stop)
        if not start <= self.RETYPE_AT < stop:
            return result
        if self.change == "fails":
            raise ValueError("this task cannot be read")
        if self.change == "unwrapped":  # the batch itself, not a ReadResult
            return result.batch  # type: ignore[return-value]
        if self.change == "table":
            return ReadResult(pa.Table.from_batches([result.batch]))  # type: ignore[arg-type]
        batch = result.batch
        ids = batch.column("id")
        x = batch.column("x").to_numpy()
        if self.change == "dtype":
            other = pa.record_batch({"id": ids, "x": x.astype(np.float64)})
        elif self.change == "shape":
            pairs = pa.FixedSizeListArray.from_arrays(np.repeat(x, 2), 2)
            other = pa.record_batch({"id": ids, "x": pairs})
        else:
            other = pa.record_batch({"id": ids, "x": x, "extra": x})
        return ReadResult(other, result.skipped)


DECODED_ENV = "SHMLOADER_TEST_DECODED"  # where decode_counted notes each record it decodes


def decode_counted(payload: bytes) -> dict[str, Any]:
    """As :func:`decode`, noting the record's id in the file ``$SHMLOADER_TEST_DECODED`` (one
    line per decode, appended whole): what a test of the cache counts to see what was read."""
    record = decode(payload)
    with open(os.environ[DECODED_ENV], "a") as f:
        f.write(f"{record['id']}\n")
    return record


def decode_augmented(payload: bytes) -> dict[str, Any]:
    """As :func:`decode`, with ``x`` drawn from ``shmloader.task_rng()``: other records each
    epoch, which ``cache=True`` must not keep."""
    import shmloader

    record = decode(payload)
    return {"id": record["id"], "x": np.float32(shmloader.task_rng().random())}


def decode_padded(payload: bytes) -> dict[str, Any]:
    """:func:`decode` of a padded record, with the whole payload as a ``pad`` column
    (:data:`PADDED` bytes a row: tasks of 100 records weigh 4 MB in shared memory)."""
    record_id, _ = PAYLOAD.unpack_from(payload)
    return {
        "id": record_id,
        "x": np.float32(2 * record_id),
        "pad": np.frombuffer(payload, np.uint8),
    }


GATE_ENV = "SHMLOADER_TEST_GATE"  # a folder: decode_gated waits there (see below)


def decode_gated(payload: bytes) -> dict[str, Any]:
    """As :func:`decode`; a record whose id is 900 or more waits, the first time, until the
    file ``go`` is in the folder ``$SHMLOADER_TEST_GATE``, after making the file ``waiting``
    there: a test acts while a reader is inside that task, and no task after it started."""
    record = decode(payload)
    gate = os.environ[GATE_ENV]
    go = os.path.join(gate, "go")
    if record["id"] >= 900 and not os.path.exists(go):
        open(os.path.join(gate, "waiting"), "w").close()
        while not os.path.exists(go):
            time.sleep(0.005)
    return record
