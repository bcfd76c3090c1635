"""What a DataLoader worker holds of the dataset: a store handle, a ledger, cached views.

This is all that is pickled into spawned workers (a few strings); forked workers inherit it.
Views of a segment are made once per process and dropped as soon as the segment is released,
because an unlinked segment that is still mapped keeps holding memory.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Protocol

import numpy as np

from ...shm.region import Placed, Region
from ...shm.spare_maps import SpareMappings
from ...shm.store import StoreHandle, read_segment
from ..core.indices import SegmentRows, group_rows, is_sorted, slot_name
from ..core.ragged_form import LISTS, RaggedForm
from ..core.receipts import Receipt
from .gather import (
    BatchSegments,
    ColumnView,
    alloc_outputs,
    batch_segments,
    block_layout,
    gather,
    in_worker,
    segment_views,
)
from .ledger import LedgerWriter, ledger_dir
from .ring import BatchRing, RingBatch
from .slot_table import SlotTable
from .view_cache import ParsedViews


class GatherSink(Protocol):
    """Where the training process's own gathers are reported (``DataPlane.gathered``)."""

    def __call__(
        self, indices: np.ndarray, groups: list[SegmentRows] | None, *, receipt: Receipt
    ) -> None: ...


MAX_CACHED_SEGMENTS = 64
# Address space reserved for mapping segments (no memory: see shm/region.py). Segments in use
# fit in the budget; released ones stay mapped until the next sweep, hence the margin.
REGION_PER_BUDGET = 4
REGION_EXTRA = 1 << 30
# How often a worker looks for released segments to unmap: often enough that an unlinked
# segment's memory comes back promptly, rarely enough to cost nothing per batch.
SWEEP_SECONDS = 0.05
# Spare mappings (of released segments, kept for the files' next segments: shm/spare_maps.py):
# at most this many, and this share of the budget. Only where the training process gathers
# itself: a DataLoader worker unmaps them, so that its PSS stays that of the segments it reads
# (mapped pages count in the PSS of whoever maps them, though the files exist regardless).
SPARE_MAPS_MAX = 256
SPARE_MAPS_BUDGET_SHARE = 2  # half the budget
# Parsed segments whose views a new segment at the same place may use (view_cache.py): one per
# place in the region that segments are mapped at, so a few hundred cover any steady state.
PARSED_MAX = 256


class Gatherer:
    def __init__(
        self, store: StoreHandle, columns: Sequence[str], ragged: RaggedForm = LISTS
    ) -> None:
        self.store = store  # StoreHandle: picklable, never deletes the store
        self.columns = list(columns)
        self.ragged = ragged  # how batches hold variable-length lists (ragged.py)
        # Slots of a batch ring per DataLoader worker (ring.py); 0: torch's transport.
        self._ring_slots = 0
        self._ring: BatchRing | None = None
        self._ring_pid = -1
        self._ledger = LedgerWriter(ledger_dir(self._store_path()))
        # Views by slot, oldest first (slots arrive in order and are used a window at a
        # time, so the first opened are the first done with: no LRU upkeep per lookup).
        self._views: dict[int, dict[str, ColumnView]] = {}
        self._next_sweep = 0.0
        self._sink: GatherSink | None = None
        self._sink_pid = -1
        self._region: Region | None = None
        self._no_region = False
        self._placed: dict[int, Placed] = {}
        self._spare_maps: SpareMappings | None = None
        self._parsed = ParsedViews(PARSED_MAX)
        # The last batch's slots and segments (the batches of a shuffle window share them),
        # and their SlotTable if they have one; forgotten whenever a view is dropped.
        self._last: tuple[list[int], BatchSegments] | None = None
        self._table: SlotTable | None = None

    def use_ring(self, ring_slots: int) -> None:
        """In a worker of ``shmloader.DataLoader`` (its ``worker_init_fn``): hand batches over
        through a ring of ``ring_slots`` slots (0: torch's transport)."""
        self._ring_slots = ring_slots

    def report_to(self, sink: GatherSink) -> None:
        """In the trainer, hand gathered indices to ``sink`` (the data plane) directly.

        Only in the process that calls this: forked workers inherit the sink but see another
        pid, and spawned ones never receive it, so workers keep writing the ledger.
        """
        self._sink = sink
        self._sink_pid = os.getpid()

    def _store_path(self) -> str:
        return str(self.store.path)

    def __getstate__(self) -> dict[str, object]:
        return {
            "store": self.store,
            "columns": self.columns,
        }

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(state["store"], state["columns"])  # type: ignore[misc]

    def views(self, slot: int) -> dict[str, ColumnView]:
        cached = self._views.get(slot)
        if cached is not None:
            return cached
        region = self._region_here()
        views = self._open_in_region(slot, region) if region is not None else None
        if views is None:  # no region here, or no room in it: a mapping of its own
            views = segment_views(self.store.open(slot_name(slot)))
        self._views[slot] = views
        return views

    @property
    def region(self) -> Region | None:
        """The region segments are mapped into (None where there is none)."""
        return self._region_here()

    @property
    def in_region(self) -> Mapping[int, Placed]:
        """Where each segment mapped into the region lies, by slot (read-only): what this
        process maps, which its PSS counts as it reads them; empty once closed."""
        return MappingProxyType(self._placed)

    @property
    def spare_mappings(self) -> SpareMappings | None:
        """Spare mappings: released segments' mappings kept for their files' next segments
        (``shm/spare_maps.py``; none in a DataLoader worker, which unmaps them); None before the
        region is made or where there is none."""
        return self._spare_maps

    @property
    def parses_spared(self) -> int:
        """How many segment opens here were spared parsing the file: one parsed before at the
        same place in the region, with the same metadata, lent its views (``view_cache.py``).
        Opening is as costly as gathering thousands of rows; this says how often it was not."""
        return self._parsed.hits

    def _region_here(self) -> Region | None:
        """The gather region, made on first use. A forked worker goes on with its copy of the
        parent's: fork() copies the mappings and the bookkeeping of them alike."""
        if self._region is None and not self._no_region:
            budget = int(self.store.budget)
            self._region = Region.create(REGION_PER_BUDGET * budget + REGION_EXTRA)
            self._no_region = self._region is None
            if self._region is not None:
                self._spare_maps = SpareMappings(
                    self._region, SPARE_MAPS_MAX, budget // SPARE_MAPS_BUDGET_SHARE
                )
        return self._region

    def _open_in_region(self, slot: int, region: Region) -> dict[str, ColumnView] | None:
        name = slot_name(slot)
        # None when the region is full (of released segments the next sweep unmaps; not
        # swept here: segments of the batch being gathered must stay mapped). Spare mappings
        # are used by nothing, so they go first.
        spare = self._spare_maps
        placed = self.store.place_in(name, region, spare.take if spare else None)
        if placed is None and spare:
            spare.clear()
            placed = self.store.place_in(name, region)
        if placed is None:
            return None
        views = self._parsed.find(placed)
        if views is None:
            try:
                batch = read_segment(placed.buffer)
            except BaseException:
                region.unmap(placed)
                raise
            views = segment_views(batch, region)
            align = region.align
            for view in views.values():
                if view.dense is not None and view.dense.ndim:
                    region.fit_rows(view.dense.strides[0])
            if region.align != align:  # the first segment: place it again, aligned for its rows
                del views, batch
                region.unmap(placed)
                return self._open_in_region(slot, region)
            self._parsed.remember(placed, batch, views)
        self._placed[slot] = placed
        return views

    def close(self) -> None:
        """Unmap every segment mapped here (the trainer's gatherer, when the dataset closes)."""
        self._last = self._table = None
        self._views.clear()
        self._placed.clear()
        self._parsed.clear()
        if self._spare_maps is not None:
            self._spare_maps.forget()  # unmapped with the whole region just below
        self.store.drop_all()
        if self._region is not None:
            self._region.close()
            self._region = None

    def gather(
        self,
        indices: Sequence[int] | np.ndarray,
        *,
        ring: bool = False,
        receipt: Receipt = Receipt.GATHER,
    ) -> dict[str, object] | RingBatch:
        """The batch of ``indices``: a dict of tensors, or with ``ring`` in a DataLoader worker
        of ``shmloader.DataLoader``, a :class:`RingBatch` the training process copies out.

        ``receipt``: how the rows are reported consumed (delivery.py): as gathered (reported so,
        here or through the ledger), once torch's requests say the loop received them (reported
        gathered), or by ``shmloader.DataLoader``'s loop as it hands the batch over (nothing
        to report: a worker writes no ledger)."""
        idx = np.asarray(indices, dtype=np.int64)
        into = _RingAlloc(self) if ring and self._ring_slots and in_worker() else None
        table, region = self._table, self._region
        positions = None
        if table is not None and region is not None and len(idx) and is_sorted(idx):
            positions = table.positions(idx)  # a sorted batch over the last batch's segments
        grouped: list[SegmentRows] | None = None
        try:
            if positions is not None:
                assert table is not None and region is not None
                out: dict[str, object] = table.gather(region, positions, into)
            else:
                out, grouped = self._gather_grouped(idx, into)
        except BaseException:
            if into is not None:
                into.give_back()
            raise
        # Only after the copy: from now on the trainer may release these rows' segments.
        if self._sink is not None and self._sink_pid == os.getpid():
            self._sink(idx, grouped, receipt=receipt)  # None: the plane groups them itself
        elif receipt is not Receipt.LOOP:
            self._ledger.record(idx, consumed=receipt is Receipt.GATHER)
        now = time.monotonic()
        if now >= self._next_sweep or len(self._views) > MAX_CACHED_SEGMENTS:
            if grouped is not None:
                in_use = {g.slot for g in grouped}
            else:
                assert table is not None  # the batch went through it
                in_use = table.slots
            self._forget_released(in_use)
            self._next_sweep = now + SWEEP_SECONDS
        if into is not None and into.ring is not None and into.slot is not None:
            return RingBatch(into.ring.path, into.slot, into.ring.slot_bytes, out)
        return out

    def _gather_grouped(
        self, idx: np.ndarray, into: _RingAlloc | None
    ) -> tuple[dict[str, object], list[SegmentRows]]:
        """The batch through the rows grouped by segment (any batch), and the groups; makes
        the SlotTable of a new set of segments for the batches after it."""
        grouped = group_rows(idx)
        slots = [g.slot for g in grouped[0]]
        last = self._last
        if last is None or last[0] != slots:
            last = self._last = (slots, batch_segments(self.views, slots))
            self._table = SlotTable.of(slots, last[1], self.columns, self._region)
        region = self._region_here()
        batch = gather(self.views, idx, self.columns, region, grouped, into, last[1], self.ragged)
        return batch, grouped[0]

    def _ring_for(self, nbytes: int) -> BatchRing | None:
        """This worker's ring, made for batches of about ``nbytes`` on first use."""
        if self._ring_pid != os.getpid():  # a forked child: its own ring, not the parent's
            self._ring, self._ring_pid = None, os.getpid()
            try:
                self._ring = BatchRing.create(self._store_path(), self._ring_slots, nbytes)
            except OSError:
                self._ring = None  # no room in /dev/shm: torch's transport, as before
        return self._ring

    def _forget_released(self, in_use: set[int]) -> None:
        """Drop views of released segments (one directory listing, not a stat per segment);
        keep their mappings for the files' next segments while the files exist."""
        try:
            entries = list(os.scandir(self._store_path()))
        except FileNotFoundError:
            entries = []
        present = {entry.name for entry in entries}
        for slot in list(self._views):
            if slot in in_use:
                continue
            name = slot_name(slot)
            if name not in present or len(self._views) > MAX_CACHED_SEGMENTS:
                del self._views[slot]
                self._last = self._table = None
                placed = self._placed.pop(slot, None)
                if placed is not None and self._spare_maps is not None and not in_worker():
                    self._spare_maps.keep(placed)  # its views are gone (just above)
                elif placed is not None and self._region is not None:
                    self._region.unmap(placed)
                else:
                    self.store.drop(name)
        if self._spare_maps:
            self._spare_maps.sweep(entry.inode() for entry in entries)


class _RingAlloc:
    """The gather's allocator in a worker: a ring slot if one is free, else torch's storage."""

    def __init__(self, gatherer: Gatherer) -> None:
        self.gatherer = gatherer
        self.ring: BatchRing | None = None
        self.slot: int | None = None

    def __call__(self, specs: list[tuple[tuple[int, ...], np.dtype]]) -> Sequence[object]:
        _, nbytes = block_layout(specs)
        ring = self.gatherer._ring_for(nbytes)
        slot = ring.claim(nbytes) if ring is not None else None
        if ring is None or slot is None:
            return alloc_outputs(specs)
        self.ring, self.slot = ring, slot
        return ring.alloc(slot, specs)

    def give_back(self) -> None:
        if self.ring is not None and self.slot is not None:
            self.ring.release(self.slot)
