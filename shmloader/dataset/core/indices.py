"""Sample indices: ``slot << ROW_BITS | row``, and the segment name of a slot.

``slot`` names the segment (the trainer numbers segments as they arrive), ``row`` the row in it.
Plain ints keep the index lists that cross processes small and cheap to pickle; the gather, the
sampler and the book all read them, so they are defined here, below all three.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ...errors import ConfigError

ROW_BITS = 32
ROW_MASK = (1 << ROW_BITS) - 1


def encode_indices(slot: int, rows: np.ndarray) -> np.ndarray:
    """Sample indices of ``rows`` of segment ``slot`` (int64)."""
    return (np.int64(slot) << ROW_BITS) | rows.astype(np.int64, copy=False)


def split_indices(indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(slots, rows) of sample indices, as int64 arrays."""
    idx = np.asarray(indices, dtype=np.int64)
    return idx >> ROW_BITS, idx & ROW_MASK


def slot_name(slot: int) -> str:
    """The segment name of a slot: a valid store segment name derived from the number alone."""
    return f"seg-{slot:032x}"


class SegmentRows(NamedTuple):
    """The rows of one segment in a batch: ``rows`` go to output positions ``[start, stop)``."""

    slot: int
    rows: np.ndarray
    start: int
    stop: int
    max_row: int


def group_by_segment(indices: Sequence[int] | np.ndarray) -> list[SegmentRows]:
    """Sample indices grouped by segment, each group in index-list order (a stable sort)."""
    return group_rows(indices)[0]


def group_rows(indices: Sequence[int] | np.ndarray) -> tuple[list[SegmentRows], np.ndarray]:
    """:func:`group_by_segment`, and the rows of all groups in output order (one array).

    A sorted index list (what ``shmloader.DataLoader`` hands over) is grouped already: its
    groups are found from where the slot changes, with no sort.
    """
    idx = np.asarray(indices, dtype=np.int64)
    n = len(idx)
    if n == 0:
        raise ConfigError("cannot gather an empty batch")
    if is_sorted(idx):
        return _sorted_groups(idx)
    slots, rows = split_indices(idx)
    lo, hi = int(slots.min()), int(slots.max())
    if lo == hi:
        return [SegmentRows(lo, rows, 0, n, int(rows.max()))], rows
    key = slots - lo
    if hi - lo < 1 << 16:
        key = key.astype(np.uint16)  # numpy sorts 16-bit keys stably by radix sort: faster
    order = np.argsort(key, kind="stable")
    rows = rows[order]
    counts = np.bincount(key, minlength=hi - lo + 1)
    present = np.flatnonzero(counts)
    stops = np.cumsum(counts[present])
    starts = stops - counts[present]
    maxima = np.maximum.reduceat(rows, starts)
    groups = [
        SegmentRows(lo + k, rows[a:b], a, b, m)
        for k, a, b, m in zip(
            present.tolist(), starts.tolist(), stops.tolist(), maxima.tolist(), strict=True
        )
    ]
    return groups, rows


def is_sorted(idx: np.ndarray) -> bool:
    """Whether sample indices are in ascending order (what shmloader.DataLoader hands over)."""
    return len(idx) == 1 or bool((idx[1:] >= idx[:-1]).all())


def _sorted_groups(idx: np.ndarray) -> tuple[list[SegmentRows], np.ndarray]:
    n = len(idx)
    lo, hi = int(idx[0]) >> ROW_BITS, int(idx[-1]) >> ROW_BITS
    rows = idx & ROW_MASK
    if lo == hi:
        return [SegmentRows(lo, rows, 0, n, int(rows[-1]))], rows
    if hi - lo <= n:  # where each slot begins: one binary search for all of them
        bounds = [0, *np.searchsorted(idx, np.arange(lo + 1, hi + 1) << ROW_BITS).tolist(), n]
        slots: list[int] | range = range(lo, hi + 1)
    else:  # slots far apart: look for where the slot changes instead
        cut = np.flatnonzero(np.diff(idx >> ROW_BITS)) + 1
        bounds = [0, *cut.tolist(), n]
        slots = (idx[bounds[:-1]] >> ROW_BITS).tolist()
    # Sorted, so each group's last row is its largest. Built with tuple.__new__: a batch has
    # a group per segment, and the NamedTuple's own __new__ is a Python call each.
    return [
        _new_rows(SegmentRows, (slot, rows[a:b], a, b, int(rows[b - 1])))
        for slot, a, b in zip(slots, bounds[:-1], bounds[1:], strict=True)
        if b > a
    ], rows


_new_rows = tuple.__new__
