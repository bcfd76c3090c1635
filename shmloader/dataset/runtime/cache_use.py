"""What ``cache=True`` kept and missed, seen from the readers' announcements.

A task whose segment has a cache key (``Ready.cache_key``) was decoded whole; the first time
its key comes it is new, and later it comes either from the cache (``from_cache``) or decoded
again, because the cache no longer held it: a budget too small to keep every decoded task
beside the ones being read. ``Stats`` reports both, and ``advice()`` the budget that would
keep them all.
"""

from __future__ import annotations


class CacheUse:
    """Keys of the tasks decoded so far, their segments' bytes in all, and the tasks decoded
    again. Called from the reader pool's thread only (one announcement at a time)."""

    def __init__(self) -> None:
        self._seen: set[int] = set()  # cache keys, as numbers (half the memory of strings)
        self.decoded_bytes = 0  # of every task decoded once: what keeping them all takes
        self.decoded_again = 0  # tasks decoded again after an earlier read of theirs

    def announced(self, key: str, nbytes: int, from_cache: bool) -> None:
        """A reader announced a task's segment with cache key ``key`` ("" none)."""
        if not key:
            return
        number = int(key, 16)
        if number not in self._seen:
            self._seen.add(number)
            self.decoded_bytes += nbytes
        elif not from_cache:
            self.decoded_again += 1
