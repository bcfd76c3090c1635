"""A writer's mappings of the segment files it wrote, kept to write later segments into.

Spares come back: a released segment's file is taken over by the next writer (``budget.py``),
and with equal-sized tasks the few files that circulate are soon ones a reader has written
before. Written through ``write(2)``, every segment costs a copy into the page cache's pages
one call at a time; through a mapping whose page tables are already filled in, it is one
``memcpy``. A fresh mapping (``MAP_POPULATE``, then ``munmap``) costs about what ``write(2)``
does, and every later write into the same file through it costs less.

Two hazards come with writing through a mapping, and both are handled here:

- **SIGBUS instead of ENOSPC.** A store into a tmpfs page that cannot be allocated kills the
  process with SIGBUS. So every page of the file is allocated before the first store: a file
  whose ``st_blocks`` cover its size has all its pages (a spare was written whole, and
  truncating it only drops pages past the new end); otherwise ``posix_fallocate`` allocates
  them, and a full filesystem says ENOSPC there. Only the writer that reserved a file changes
  its size, so no page can vanish while it writes.
- **Memory held by removed files.** A kept mapping of a file that left the store (a writer
  removed the spare to make room) holds the file's memory. :meth:`WrittenMappings.sweep`
  unmaps those, from a listing of the store that the writer makes before and after each
  segment: a removed file stays mapped at most until this writer's next segment begins.

A kept mapping is found by the file's inode: while it is mapped the file exists, even
unlinked, so no other file can carry that inode number.
"""

from __future__ import annotations

import mmap
import os

import pyarrow as pa

from .inodes import ByInode

PAGE = mmap.PAGESIZE
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux: fill the page tables in one call


class WrittenMappings(ByInode[mmap.mmap]):
    """Writable mappings of files this process wrote, by inode, least recently used first."""

    def __init__(self, max_count: int, max_bytes: int) -> None:
        super().__init__(max_count, max_bytes)
        self.reused = 0  # how many writes found their file mapped (for tests and benchmarks)

    def _size(self, item: mmap.mmap) -> int:
        return len(item)

    def _close(self, item: mmap.mmap) -> None:
        item.close()

    def mapping(self, fd: int, nbytes: int) -> tuple[int, mmap.mmap]:
        """``(inode, a writable mapping of at least nbytes)`` of the file open as ``fd``, whose
        size is ``nbytes`` and every page of it allocated. It is no longer kept: hand it back
        with :meth:`keep` once written, or close it."""
        info = os.fstat(fd)
        if info.st_blocks * 512 < -(-nbytes // PAGE) * PAGE:
            _allocate(fd, nbytes)  # OSError(ENOSPC) if the filesystem is full
        kept = self._pop(info.st_ino)
        if kept is not None:
            if len(kept) >= nbytes:
                self.reused += 1
                return info.st_ino, kept
            kept.close()
        flags = mmap.MAP_SHARED | _POPULATE
        return info.st_ino, mmap.mmap(fd, nbytes, flags=flags)

    def keep(self, inode: int, mapping: mmap.mmap) -> None:
        """Keep ``mapping`` of file ``inode`` for the next write into it; trims to the caps."""
        self._keep(inode, mapping)


def _allocate(fd: int, nbytes: int) -> None:
    """Give the file's first ``nbytes`` bytes pages of their own."""
    if hasattr(os, "posix_fallocate"):
        os.posix_fallocate(fd, 0, nbytes)
        return
    zeros = bytes(1 << 20)  # where there is no fallocate (macOS): write the pages once
    for offset in range(0, nbytes, len(zeros)):
        os.pwrite(fd, zeros[: min(len(zeros), nbytes - offset)], offset)


def write_ipc_into(mapping: mmap.mmap, batch: pa.RecordBatch, nbytes: int) -> int:
    """Write ``batch`` as an Arrow IPC file at the start of ``mapping``; the bytes written.

    The sink is a fixed-size view of the first ``nbytes`` bytes: a write past them raises
    instead of storing past the end of the file (which would be SIGBUS).
    """
    sink = pa.FixedSizeBufferWriter(pa.py_buffer(memoryview(mapping)[:nbytes]))  # stays mutable
    with pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)
    written = int(sink.tell())
    sink.close()
    return written
