"""Batches from DataLoader workers through slots of a file, instead of torch's transport.

torch sends a worker's batch to the training process as shared storages: a new shared-memory
file per batch, its pages faulted in on both sides, its file descriptor handed over through a
fresh connection to the worker: for images, many times the cost of the gather itself. Under
``shmloader.DataLoader`` a worker instead gathers the dense columns straight into a free slot
of a file of its own in the dataset's store (mapped once), and returns a :class:`RingBatch`: a
few numbers and the other columns. The training process copies the slot out into fresh
tensors (one ``memcpy``) and marks it free.

A slot is busy from the worker's claim until the training process has copied it: a
:class:`RingBatch` is a few numbers on the worker's side only. Unpickled in the training
process (torch's pinning thread included), it *is* the copy: :func:`arrived` copies the slot
out into fresh tensors, frees the slot and returns the batch as a dict, so no ring object ever
reaches the loop, a wrapper (accelerate's ``prepare``, a DataLoader subclass) or torch's
pinning thread. Batches torch discards unread (a loop that breaks off) were either copied as
they arrived or never left their worker, whose ring goes with it. When no slot is free or a
batch does not fit, the worker falls back to torch's transport: never a wait. The first byte
of each slot's flag is written by the claimer (1) and by the copier (0) only, after the copy;
the batch itself travels through torch's queue (a pipe), which orders the worker's writes
before the copy. The training process unlinks a ring file when it first maps it, so the
file's memory goes with the last mapping: the worker's when it exits, the loader's when it
drops it.
"""

from __future__ import annotations

import mmap
import os
import secrets
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..core.batch import Batch
from .gather import block_layout

RING_PREFIX = "ring-"
_HEADER = 4096  # slot flags, one byte each; slots start page-aligned after it
MAX_RING_SLOTS = 64  # more would only hold memory: torch keeps fewer batches in flight
# The training process's maps of its workers' ring files, by path (see mapped / forget).
_MAPPED: dict[str, mmap.mmap] = {}


@dataclass(frozen=True)
class RingColumn:
    """Where one dense column of a batch lies in its slot."""

    offset: int
    shape: tuple[int, ...]
    dtype: str


@dataclass
class RingBatch:
    """A batch a worker left in slot ``slot`` of ring file ``path`` (picklable, small): what a
    worker returns. It is never unpickled as itself: :meth:`__reduce__` makes the training
    process's copy of it the batch (:func:`arrived`)."""

    path: str
    slot: int
    slot_bytes: int
    columns: dict[str, Any] = field(default_factory=dict)  # RingColumn or the value itself

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return arrived, (self.path, self.slot, self.slot_bytes, self.columns)


def arrived(path: str, slot: int, slot_bytes: int, columns: dict[str, Any]) -> Batch:
    """The batch in ``slot`` of ring ``path``, copied out into tensors; the slot is free again
    (also when the copy fails: the batch is lost either way, and the error says why)."""
    mm = mapped(path)
    if mm is None:
        raise FileNotFoundError(f"batch ring {path} is gone (its worker exited?)")
    base = _HEADER + slot * slot_bytes
    out = Batch()
    try:
        for name, column in columns.items():
            if not isinstance(column, RingColumn):
                out[name] = column
                continue
            dtype = np.dtype(column.dtype)
            source = np.ndarray(column.shape, dtype, buffer=mm, offset=base + column.offset)
            out[name] = torch.from_numpy(source.copy())
    finally:
        mm[slot] = 0
    return out


def mapped(path: str) -> mmap.mmap | None:
    """This process's map of ring file ``path``, made on first use (None if the file is
    gone). The file is unlinked once mapped here: its memory goes with the last mapping, the
    worker's when it exits, this process's at :func:`forget`."""
    mm = _MAPPED.get(path)
    if mm is None:
        try:
            mm = _map(path)
        except FileNotFoundError:
            return None
        _MAPPED[path] = mm
        os.unlink(path)
    return mm


def mapped_rings(directory: str | None = None) -> list[str]:
    """The ring files this process has mapped (of the store ``directory``, or of any): their
    memory stays while they are mapped here, up to :func:`forget`."""
    return [p for p in _MAPPED if directory is None or os.path.dirname(p) == directory]


def busy_slots(path: str) -> list[int]:
    """The slots of ring ``path``, mapped here, that are busy: claimed by the worker and not
    yet copied out. A slot left busy by a batch that never arrives is lost to the ring, and
    its batches fall back to torch's transport once none is free."""
    mm = _MAPPED[path]
    return [slot for slot, flag in enumerate(mm[:_HEADER]) if flag]


def forget(directory: str) -> None:
    """Unmap the rings of ``directory`` (a store) mapped here: its workers are gone."""
    for path in [p for p in _MAPPED if os.path.dirname(p) == directory]:
        _MAPPED.pop(path).close()


class BatchRing:
    """A worker's slots (created on its first batch, sized for it with room to spare)."""

    def __init__(self, path: str, slots: int, slot_bytes: int) -> None:
        self.path = path
        self.slots = slots
        self.slot_bytes = slot_bytes
        self._mm = _map(path)

    @classmethod
    def create(cls, directory: str, slots: int, batch_bytes: int) -> BatchRing:
        slot_bytes = -(-max(batch_bytes + batch_bytes // 4, 1) // mmap.PAGESIZE) * mmap.PAGESIZE
        if not 0 < slots <= MAX_RING_SLOTS:
            raise ValueError(f"1 to {MAX_RING_SLOTS} slots, got {slots}")
        name = f"{RING_PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
        path = os.path.join(directory, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, _HEADER + slots * slot_bytes)
        finally:
            os.close(fd)
        return cls(path, slots, slot_bytes)

    def claim(self, nbytes: int) -> int | None:
        """A free slot for ``nbytes``, now busy; None if the batch does not fit or none is."""
        if nbytes > self.slot_bytes:
            return None
        for slot in range(self.slots):
            if self._mm[slot] == 0:
                self._mm[slot] = 1
                return slot
        return None

    def alloc(self, slot: int, specs: list[tuple[tuple[int, ...], np.dtype]]) -> list[Any]:
        """``(RingColumn, numpy view)`` per spec: where the gather writes each column."""
        base = _HEADER + slot * self.slot_bytes
        offsets, _ = block_layout(specs)
        return [
            (
                RingColumn(offset, tuple(shape), dtype.str),
                np.ndarray(shape, dtype, buffer=self._mm, offset=base + offset),
            )
            for (shape, dtype), offset in zip(specs, offsets, strict=True)
        ]

    def release(self, slot: int) -> None:
        """Give back a slot that was claimed but not filled (the gather failed)."""
        self._mm[slot] = 0


def _map(path: str) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        return mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
