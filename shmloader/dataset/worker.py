"""What a DataLoader worker holds of the dataset: a store handle, a ledger, cached views.

This is all that is pickled into spawned workers (a few strings); forked workers inherit it.
Views of a segment are made once per process and dropped as soon as the segment is released,
because an unlinked segment that is still mapped keeps holding memory.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from .gather import ColumnView, gather, segment_views, split_indices
from .ledger import LedgerWriter, ledger_dir
from .plane import slot_name

MAX_CACHED_SEGMENTS = 64
# How often a worker looks for released segments to unmap: often enough that an unlinked
# segment's memory comes back promptly, rarely enough to cost nothing per batch.
SWEEP_SECONDS = 0.05


class Gatherer:
    def __init__(self, store: object, columns: Sequence[str]) -> None:
        self.store = store  # StoreHandle: picklable, never deletes the store
        self.columns = list(columns)
        self._ledger = LedgerWriter(ledger_dir(self._store_path()))
        self._views: OrderedDict[int, dict[str, ColumnView]] = OrderedDict()
        self._next_sweep = 0.0

    def _store_path(self) -> str:
        return str(self.store.path)  # type: ignore[attr-defined]

    def __getstate__(self) -> dict[str, object]:
        return {"store": self.store, "columns": self.columns}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(state["store"], state["columns"])  # type: ignore[misc]

    def views(self, slot: int) -> dict[str, ColumnView]:
        cached = self._views.get(slot)
        if cached is not None:
            self._views.move_to_end(slot)
            return cached
        batch = self.store.open(slot_name(slot))  # type: ignore[attr-defined]
        views = segment_views(batch)
        self._views[slot] = views
        return views

    def gather(self, indices: Sequence[int] | np.ndarray) -> dict[str, object]:
        idx = np.asarray(indices, dtype=np.int64)
        out = gather(self.views, idx, self.columns)
        # Only after the copy: from now on the trainer may release these rows' segments.
        self._ledger.record(idx)
        now = time.monotonic()
        if now >= self._next_sweep or len(self._views) > MAX_CACHED_SEGMENTS:
            self._forget_released(set(np.unique(split_indices(idx)[0]).tolist()))
            self._next_sweep = now + SWEEP_SECONDS
        return out

    def _forget_released(self, in_use: set[int]) -> None:
        """Drop views of released segments (one directory listing, not a stat per segment)."""
        try:
            present = set(os.listdir(self._store_path()))
        except FileNotFoundError:
            present = set()
        for slot in list(self._views):
            if slot in in_use:
                continue
            name = slot_name(slot)
            if name not in present or len(self._views) > MAX_CACHED_SEGMENTS:
                del self._views[slot]
                self.store.drop(name)  # type: ignore[attr-defined]
