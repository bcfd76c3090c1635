"""One reserved range of address space that segment files are mapped into, side by side.

A batch draws its rows from several segments. Mapped one by one, every segment is an array of
its own, and a batch costs a ``numpy.take`` per segment and column plus the Python around
each. Mapped into one region, row ``r`` of a column of any segment lies at ``base + k *
row_bytes`` for one integer ``k`` (segments are placed at offsets aligned to the row size), so
a view of the whole region with that row size reaches every segment, and a batch is one
``take`` per column (``dataset/gather.py``).

The region is reserved ``PROT_NONE`` (address space only: no memory, no commit charge), and
each segment is mapped over its part with ``MAP_FIXED``; unmapping maps ``PROT_NONE`` back over
it, so the range stays ours and nothing else is ever placed inside it. Callers must only read
rows of segments that are mapped: the gather checks each batch's rows against its segments'
lengths before it takes. Linux only (the flags below are Linux's); :meth:`Region.create`
returns None elsewhere or when the reservation is refused (``ulimit -v``), and callers then
map segments one by one.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import os
import sys
import weakref
from typing import NamedTuple

import numpy as np
import pyarrow as pa

PAGE = mmap.PAGESIZE
_PROT_NONE = 0
_MAP_FIXED = 0x10
_MAP_NORESERVE = 0x4000
_MAP_FAILED = ctypes.c_void_p(-1).value
# Row sizes whose alignment would waste more than this per segment use the per-segment path.
MAX_ALIGN = 1 << 20


class Placed(NamedTuple):
    """Where a file was mapped: byte offset in the region, mapped length, its bytes, and
    the file's inode (while mapped, the file exists, so no other file can have it)."""

    offset: int
    length: int
    buffer: pa.Buffer
    inode: int


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.restype = ctypes.c_int
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


_LIBC = _libc()


def _reserve(libc: ctypes.CDLL, address: int | None, length: int) -> int | None:
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE
    if address is not None:
        flags |= _MAP_FIXED
    got = libc.mmap(address, length, _PROT_NONE, flags, -1, 0)
    return None if got in (None, _MAP_FAILED) else int(got)


class Region:
    """A reservation of ``size`` bytes of address space and the files mapped into it."""

    def __init__(self, libc: ctypes.CDLL, base: int, size: int) -> None:
        self._libc = libc
        self.base = base
        self.size = size
        self.align = PAGE  # placement alignment; raised to fit the row sizes of the columns
        self._free: list[tuple[int, int]] = [(0, size)]  # sorted (offset, length) extents
        self._views: dict[tuple[np.dtype, tuple[int, ...], int], np.ndarray] = {}
        self._memory = memoryview((ctypes.c_uint8 * size).from_address(base))
        self._finalizer = weakref.finalize(self, libc.munmap, base, size)

    @classmethod
    def create(cls, size: int) -> Region | None:
        """Reserve ``size`` bytes (rounded up to pages), or None where regions do not work."""
        if _LIBC is None or size <= 0:
            return None
        size = -(-size // PAGE) * PAGE
        base = _reserve(_LIBC, None, size)
        return None if base is None else cls(_LIBC, base, size)

    def fit_rows(self, row_bytes: int) -> None:
        """Place later files so that rows of ``row_bytes`` line up across them (if cheap)."""
        want = math.lcm(self.align, row_bytes)
        if want <= MAX_ALIGN:
            self.align = want

    def map_file(self, fd: int, length: int, inode: int | None = None) -> Placed | None:
        """Map ``length`` bytes of open file ``fd`` read-only; None if no room is left.

        ``inode``: the file's, if the caller has it from an ``fstat`` already."""
        span = -(-max(length, 1) // PAGE) * PAGE
        offset = self._allocate(span)
        if offset is None:
            return None
        address = self.base + offset
        got = self._libc.mmap(address, span, mmap.PROT_READ, mmap.MAP_SHARED | _MAP_FIXED, fd, 0)
        if got != address:
            errno = ctypes.get_errno()
            self._release(offset, span)
            raise OSError(errno, f"mapping a segment into the gather region: {os.strerror(errno)}")
        # ``base=self``: a buffer keeps the region (and so the reservation) alive.
        buffer = pa.foreign_buffer(address, length, base=self)
        return Placed(offset, span, buffer, os.fstat(fd).st_ino if inode is None else inode)

    def adopt(self, placed: Placed, length: int) -> Placed:
        """The same mapping, for the file's new contents of ``length`` bytes (no syscall).

        For a file rewritten in place (a spare segment written again): the mapping is
        shared, so it shows what was written, and its page tables are still filled in,
        where a new mapping would fault every page in again. ``length`` must fit in it.
        """
        if length > placed.length:
            raise ValueError(f"{length} bytes do not fit in a mapping of {placed.length}")
        address = self.base + placed.offset
        buffer = pa.foreign_buffer(address, length, base=self)
        return Placed(placed.offset, placed.length, buffer, placed.inode)

    def unmap(self, placed: Placed) -> None:
        """Give the file's pages back; its part of the region is reserved again, not freed.

        Every array over ``placed.buffer`` must be gone: reading one afterwards faults.
        """
        if _reserve(self._libc, self.base + placed.offset, placed.length) is None:
            errno = ctypes.get_errno()
            raise OSError(errno, f"unmapping a segment of the gather region: {os.strerror(errno)}")
        self._release(placed.offset, placed.length)

    def rows(self, dtype: np.dtype, row_shape: tuple[int, ...], residue: int) -> np.ndarray:
        """A read-only view of the whole region as rows of ``dtype`` x ``row_shape`` whose row 0
        starts at byte ``residue``; only rows inside mapped files may be read."""
        key = (dtype, row_shape, residue)
        view = self._views.get(key)
        if view is None:
            row_bytes = dtype.itemsize * math.prod(row_shape)
            count = (self.size - residue) // row_bytes
            view = np.ndarray((count, *row_shape), dtype, buffer=self._memory, offset=residue)
            view.flags.writeable = False
            self._views[key] = view
        return view

    def close(self) -> None:
        """Unmap everything at once; arrays over the region must be gone."""
        self._views.clear()
        self._finalizer()

    @property
    def closed(self) -> bool:
        """Whether the reservation was given back (:meth:`close`, or the region collected):
        no file is mapped in it any more, and its address range may be anyone's."""
        return not self._finalizer.alive

    @property
    def free_extents(self) -> list[tuple[int, int]]:
        """The unused parts of the region, ``(offset, length)`` in bytes, in order: the largest
        file that fits is the longest one, and how many there are says how fragmented the
        region is (unmapped neighbours merge, so a region with nothing mapped is one)."""
        return list(self._free)

    # -- first-fit allocation over sorted free extents ----------------------------------
    def _allocate(self, span: int) -> int | None:
        for i, (start, length) in enumerate(self._free):
            at = -(-start // self.align) * self.align
            end = at + span
            if end > start + length:
                continue
            pieces = [(start, at - start), (end, start + length - end)]
            self._free[i : i + 1] = [p for p in pieces if p[1] > 0]
            return at
        return None

    def _release(self, offset: int, span: int) -> None:
        free = self._free
        i = 0
        while i < len(free) and free[i][0] < offset:
            i += 1
        free.insert(i, (offset, span))
        # Merge with the neighbours so large files still fit after many small ones.
        if i + 1 < len(free) and offset + span == free[i + 1][0]:
            free[i] = (offset, span + free[i + 1][1])
            del free[i + 1]
        if i > 0 and free[i - 1][0] + free[i - 1][1] == offset:
            free[i - 1] = (free[i - 1][0], free[i - 1][1] + free[i][1])
            del free[i]
