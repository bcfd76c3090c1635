"""The record a reader is decoding, kept where its pool can read it after the reader died.

A decode that kills its reader (a crash in native code, ``os._exit``) raises nothing that could
name the record. The pool knows the task from the reader's ``Started`` message; the record is
here: a file of two int64 in the store's folder, ``reading.<reader index>``, mapped by the
reader, which stores the lease and then each record's index before decoding it (a store to
shared memory, no system call). The pool reads it once the reader is gone.

Only tasks that failed before (a lease's ``attempt`` above 1) are watched: a call per record
costs more than decoding them all in one ``map``, and a first death names the task's records,
the next one (the retry) the record. A file of a slot's earlier reader is used again.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from collections.abc import Iterator

from ..sources._decoding import watching_records

PREFIX = "reading."
SLOT = struct.Struct("=qq")  # the lease, the record being decoded (-1: none yet)


def position_path(folder: str, index: int) -> str:
    """Where reader slot ``index`` of a store in ``folder`` keeps its position."""
    return os.path.join(folder, f"{PREFIX}{index}")


class RecordPosition:
    """The writing end, in the reader: opened on the first task watched."""

    def __init__(self, folder: str, index: int) -> None:
        self._path = position_path(folder, index)
        self._view: memoryview | None = None

    @contextlib.contextmanager
    def watching(self, lease_id: int) -> Iterator[None]:
        """Within the block, each record decoded (sources/_decoding.py) is noted for
        ``lease_id``. A position that cannot be kept (the store's folder is gone) is not: it
        only names a record after a death, and must never fail the task."""
        view = self._open()
        if view is None:
            yield
            return
        view[0], view[1] = lease_id, -1

        def at(index: int) -> None:
            view[1] = index

        with watching_records(at):
            yield

    def _open(self) -> memoryview | None:
        if self._view is None:
            try:
                fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError:
                return None
            try:
                os.ftruncate(fd, SLOT.size)
                self._view = memoryview(mmap.mmap(fd, SLOT.size)).cast("q")
            except OSError:
                return None
            finally:
                os.close(fd)
        return self._view


def last_record(folder: str, index: int, lease_id: int) -> int | None:
    """The record reader slot ``index`` was decoding for ``lease_id`` when it died; None where
    it noted none for that lease (a first try, or not a per-record decode)."""
    try:
        with open(position_path(folder, index), "rb") as f:
            data = f.read(SLOT.size)
    except OSError:
        return None
    if len(data) < SLOT.size:
        return None
    lease, record = SLOT.unpack(data)
    return record if lease == lease_id and record >= 0 else None
