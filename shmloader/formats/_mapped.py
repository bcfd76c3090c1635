"""Range reads of an uncompressed local record file through a memory mapping.

A reader reads a task's records in blocks of a few MiB. With ``read(2)`` the kernel first
copies each block out of the page cache into a new buffer, and only then are its frames
checked and its payloads sliced, decoded and copied into shared memory. Mapped, the block is
the page cache's own pages: the CRCs are computed over them, ``views=True`` payloads are
``memoryview`` slices of them, and ``views=False`` payloads are ``bytes`` copied straight out
of them, so every byte is copied once less (``benchmarks/bench_reader_steps.py`` measures a
reader's steps).

One mapping covers one range read (a task's records); it lives while any view of it does,
like the blocks read before did, and unmaps when the last one goes. The pages of blocks read
are let go as the reader moves on (``MADV_DONTNEED``, a few MiB at a time): a file mapping's
pages stay in the page cache, and a view still in use reads them back from there, but the
reader no longer counts a whole task of the file in its resident memory (on 12 KB images with
tasks of 4096 records, 50 MiB per reader). A file that shrinks
while it is mapped would make a read past its new end a SIGBUS instead of an error: the range
mapped is cut to the size the file has when it is opened, and a reader killed that way is
restarted by its pool, whose retry of the task then says that the file ends before where its
index says (docs/sources.md). Files that cannot be mapped (another file system, an empty
file, a special file) are read with ``read(2)`` as before.
"""

from __future__ import annotations

import mmap
import os

from .. import _fs
from ._compression import ByteSource, Progress

_GRAIN = mmap.ALLOCATIONGRANULARITY
_DROP_PAGES_EVERY = 4 << 20  # bytes of pages read before they are let go, in one call


class MappedSource(ByteSource):
    """Bytes ``[start, end)`` of a local file, mapped read-only; ``position`` moves on."""

    def __init__(self, mapping: mmap.mmap, base: int, start: int, progress: Progress | None):
        self._mapping: mmap.mmap | None = mapping
        self._view: memoryview | None = memoryview(mapping)  # mapping[i] is file byte base + i
        self._base = base
        self._progress = progress
        self.position = start
        self._kept_from = 0  # mapping offset of the first page not let go

    @classmethod
    def open(
        cls, path: str, start: int, end: int, progress: Progress | None = None
    ) -> MappedSource | None:
        """The source, or None when the range cannot be mapped (read it with ``read(2)``)."""
        local = _fs.local_path(path)
        if local is None or end <= start:
            return None
        try:
            fd = os.open(local, os.O_RDONLY)
        except OSError:
            return None  # opening it the usual way says what is wrong, naming the file
        try:
            size = os.fstat(fd).st_size
            base = start - start % _GRAIN
            length = min(end, size) - base
            if length <= start - base:  # nothing of the range is in the file
                return None
            try:
                mapping = mmap.mmap(fd, length, access=mmap.ACCESS_READ, offset=base)
            except (OSError, ValueError):
                return None  # not mappable (a special file, a file system without mmap)
        finally:
            os.close(fd)  # the mapping keeps its own reference to the file
        if hasattr(mapping, "madvise"):
            # Page-cache misses are then read ahead in large pieces, as read(2) would.
            mapping.madvise(mmap.MADV_WILLNEED)
        return cls(mapping, base, start, progress)

    def view(self, n: int) -> memoryview:
        """The next ``n`` bytes (fewer only at the end of the mapped range), not copied."""
        if self._view is None:
            raise ValueError("read from a closed source")
        at = self.position - self._base
        self._drop_pages_before(at)
        out = self._view[at : at + n]
        self.position += len(out)
        if self._progress is not None and out:
            self._progress(len(out))
        return out

    def _drop_pages_before(self, at: int) -> None:
        """Drop this process's mapping of the pages before offset ``at`` (blocks already
        read): shared file pages, so nothing is lost, a later touch maps them again."""
        end = at - at % mmap.PAGESIZE
        if end - self._kept_from < _DROP_PAGES_EVERY or self._mapping is None:
            return
        if hasattr(self._mapping, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            self._mapping.madvise(mmap.MADV_DONTNEED, self._kept_from, end - self._kept_from)
        self._kept_from = end

    def mapped_at(self) -> tuple[mmap.mmap, int] | None:
        """The mapping and where the next view starts in it: ``bytes`` copies of records are
        sliced straight out of the mapping (``mapping[a:b]``: one step), not out of a view and
        then copied (two)."""
        if self._mapping is None:
            return None
        return self._mapping, self.position - self._base

    def read(self, n: int) -> bytes:
        return self.view(n).tobytes()

    def close(self) -> None:
        # Not ``mapping.close()``: views handed out may still be in use; the mapping goes
        # with the last of them.
        self._view = self._mapping = None
