"""Spare mappings: released segments' mappings, kept while their files wait to be rewritten.

A released segment's file becomes a spare, and a reader soon writes the next segment into it
(``budget.py``). A process that gathered from the old segment can keep its mapping of the
file and use it for the new segment: the mapping is shared, so it shows the new contents,
and its page tables are still filled in. Mapping the file anew costs an ``mmap``, a page
fault per 64 KiB or so on first touch, and a ``munmap`` later: more than gathering the rows
themselves.

A spare mapping is found again by the file's inode. While the mapping exists the file does
too, even unlinked, so no other file can carry that inode number: an inode match is the same
file. But an unlinked file that is still mapped holds its memory, so a spare mapping whose
file is gone from the store (a writer removed the spare to make room) must be unmapped
promptly: :meth:`SpareMappings.sweep` does that, from the same directory listing the gatherer
makes anyway. How much may be kept is capped (count and bytes), so that memory held this way
between sweeps stays small.
"""

from __future__ import annotations

from .inodes import ByInode
from .region import Placed, Region


class SpareMappings(ByInode[Placed]):
    """Released segments' mappings in ``region``, by inode, oldest first."""

    def __init__(self, region: Region, max_count: int, max_bytes: int) -> None:
        super().__init__(max_count, max_bytes)
        self.region = region

    def _size(self, item: Placed) -> int:
        return item.length

    def _close(self, item: Placed) -> None:
        self.region.unmap(item)

    def keep(self, placed: Placed) -> None:
        """Keep ``placed`` (no array over it may be used any more); trims to the caps."""
        self._keep(placed.inode, placed)

    def take(self, inode: int, size: int) -> Placed | None:
        """The spare mapping of file ``inode`` if it can hold ``size`` bytes (it is no longer
        kept: the caller owns it); one too small is unmapped."""
        placed = self._pop(inode)
        if placed is None:
            return None
        if size > placed.length:
            self.region.unmap(placed)
            return None
        return placed

    def forget(self) -> None:
        """Forget everything kept without unmapping (the region itself is going away)."""
        self._maps.clear()
        self._bytes = 0
