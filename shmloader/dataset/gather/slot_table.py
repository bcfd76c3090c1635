"""Gathering a sorted batch over the segments of the batch before it, without grouping.

The batches of one shuffle window read the same few segments. Once a batch over them has been
gathered (:func:`~shmloader.dataset.gather.gather`, which groups its rows by segment), a
:class:`SlotTable` holds where each of those segments' rows lie in the gather region, by slot.
A sorted batch whose rows all lie in those segments then needs no groups: the region row of
every sample of every column is one lookup and one add, and each column is one ``take``:
less work per batch than going through the groups.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from ...shm.region import Region
from ..core.batch import Batch
from ..core.indices import ROW_BITS
from .gather import BatchSegments, SegmentViews, alloc_outputs, in_region, take_positions


class SlotTable:
    """Region row of the first row of each column of the segments of ``slots``, by slot."""

    def __init__(self, slots: Sequence[int], known: BatchSegments):
        first = cast(SegmentViews, known.views[0])
        assert known.firsts is not None  # see SlotTable.of
        self.slots = set(slots)
        self.lo = min(slots)
        span = max(slots) - self.lo + 1
        at = np.asarray(slots, dtype=np.int64) - self.lo
        # Kept in the sample indices' own terms (``slot << ROW_BITS | row``), so that a
        # sample's region row is its index plus its slot's offset, and its bound one compare:
        # no masking out of rows and no fancy indexing (``take`` costs less).
        starts = (np.arange(span, dtype=np.int64) + self.lo) << ROW_BITS
        firsts = np.zeros((len(first.layout), span), dtype=np.int64)
        firsts[:, at] = known.firsts
        self.offsets = firsts - starts  # region row of sample ``i`` of slot ``s``: i + this
        # End of each slot's indices; its start for a slot between them that the table does
        # not hold, so that no index of it is in range and the batch goes through the groups.
        self.limits = starts.copy()
        self.limits[at] += [cast(SegmentViews, v).num_rows for v in known.views]
        self.layout = first.layout

    @classmethod
    def of(
        cls,
        slots: Sequence[int],
        known: BatchSegments,
        columns: Sequence[str],
        region: Region | None,
    ) -> SlotTable | None:
        """A table for these segments, if every column asked for is dense and placed in the
        region alike in all of them (what the region's one-take path of ``gather`` needs)."""
        if region is None or not known.alike or known.firsts is None or not slots:
            return None
        if not in_region(known.views[0], columns):
            return None
        return cls(slots, known)

    def positions(self, idx: np.ndarray) -> np.ndarray | None:
        """Region rows ``(columns, len(idx))`` of sorted sample indices ``idx``; None if a
        sample lies outside the table's segments (the groups then say which, or serve it)."""
        at = idx >> ROW_BITS
        at -= self.lo
        if at[0] < 0 or at[-1] >= len(self.limits):
            return None
        if not bool((idx < self.limits.take(at)).all()):
            return None
        positions: np.ndarray = self.offsets.take(at, axis=1)
        positions += idx
        return positions

    def gather(
        self,
        region: Region,
        positions: np.ndarray,
        alloc: Callable[[list[tuple[tuple[int, ...], np.dtype]]], Sequence[Any]] | None = None,
    ) -> Batch:
        """The batch of the samples at ``positions``: one ``take`` per column."""
        n = positions.shape[1]
        specs = [((n, *row_shape), dtype) for _name, dtype, row_shape, _residue in self.layout]
        outputs = (alloc or alloc_outputs)(specs)
        take_positions(region, self.layout, positions, outputs)
        out = Batch()
        for (name, *_), (value, _target) in zip(self.layout, outputs, strict=True):
            out[name] = value
        return out
