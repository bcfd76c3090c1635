"""Mappings kept by file inode, least recently used first, capped by count and bytes.

Both kinds of kept mapping (a gatherer's read-only ones, ``spare_maps.py``; a writer's writable
ones, ``written.py``) rest on the same two facts. While a file is mapped it exists, even
unlinked, so no other file can carry its inode number: an inode match is the same file. And
a mapping of a file that left the store holds the file's memory, so :meth:`sweep` unmaps
those, given the inodes a listing of the store found.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Generic, TypeVar

T = TypeVar("T")


class ByInode(Generic[T]):
    """Kept mappings (of type ``T``) by inode; subclasses say how large one is and how to
    let it go (:meth:`_size`, :meth:`_close`)."""

    def __init__(self, max_count: int, max_bytes: int) -> None:
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._maps: OrderedDict[int, T] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._maps)

    @property
    def nbytes(self) -> int:
        """Bytes of files kept mapped (for files since removed: memory held)."""
        return self._bytes

    def _size(self, item: T) -> int:
        raise NotImplementedError

    def _close(self, item: T) -> None:
        raise NotImplementedError

    def _keep(self, inode: int, item: T) -> None:
        """Keep ``item`` as the mapping of file ``inode``; trims to the caps, oldest first."""
        self._drop(inode)  # an older mapping of the same file: one is enough
        self._maps[inode] = item
        self._bytes += self._size(item)
        while self._maps and (len(self._maps) > self.max_count or self._bytes > self.max_bytes):
            self._drop(next(iter(self._maps)))

    def _pop(self, inode: int) -> T | None:
        """The mapping of file ``inode``, no longer kept (the caller owns it), or None."""
        item = self._maps.pop(inode, None)
        if item is not None:
            self._bytes -= self._size(item)
        return item

    def sweep(self, live_inodes: Iterable[int]) -> int:
        """Unmap kept mappings whose files are gone from the store; how many were."""
        live = set(live_inodes)
        gone = [inode for inode in self._maps if inode not in live]
        for inode in gone:
            self._drop(inode)
        return len(gone)

    def clear(self) -> None:
        """Unmap everything kept."""
        for inode in list(self._maps):
            self._drop(inode)

    def _drop(self, inode: int) -> None:
        item = self._pop(inode)
        if item is not None:
            self._close(item)
