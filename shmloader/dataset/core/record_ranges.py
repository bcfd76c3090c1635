"""Rows of a segment as record ranges: what a world-size-independent checkpoint stores.

A unit is records ``[start, stop)`` of a task; row ``r`` of its segment is record ``start + r``
unless the source skipped bad records (``on_error="skip"``): then rows are the records left,
in order. Record ranges, unlike positions in one rank's queue, mean the same thing to a job
with any number of trainers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ...errors import ShmloaderError
from ...master.tasks import merge_ranges

if TYPE_CHECKING:
    from .tasks import ReadyTask

Ranges = dict[int, list[tuple[int, int]]]


def row_records(start: int, stop: int, skipped: Sequence[int], num_rows: int) -> np.ndarray:
    """Record number of each row of a unit's segment."""
    records = np.arange(start, stop, dtype=np.int64)
    if skipped:
        records = np.setdiff1d(records, np.asarray(skipped, dtype=np.int64))
    if len(records) != num_rows:
        raise ShmloaderError(
            f"a segment of records {start}..{stop} has {num_rows} rows, but {len(records)} "
            f"records were not skipped: cannot tell which record a row is"
        )
    return records


def rows_in(ranges: Sequence[tuple[int, int]], task: ReadyTask) -> np.ndarray:
    """Rows of ``task``'s segment whose records lie in ``ranges``."""
    records = row_records(*task.records(), task.skipped, task.num_rows)
    inside = np.zeros(len(records), dtype=bool)
    for a, b in ranges:
        inside |= (records >= a) & (records < b)
    return np.flatnonzero(inside)


def to_ranges(records: np.ndarray) -> list[tuple[int, int]]:
    """Sorted record numbers as ``[start, stop)`` runs."""
    if not len(records):
        return []
    breaks = np.flatnonzero(np.diff(records) != 1) + 1
    firsts = np.concatenate(([0], breaks))
    lasts = np.concatenate((breaks, [len(records)]))
    return [(int(records[a]), int(records[b - 1]) + 1) for a, b in zip(firsts, lasts, strict=True)]


def union(parts: Iterable[Mapping[int, Iterable[Sequence[int]]]]) -> Ranges:
    """Task id -> ranges, joined over ``parts``."""
    collected: dict[int, list[Sequence[int]]] = {}
    for part in parts:
        for task, ranges in part.items():
            collected.setdefault(int(task), []).extend(ranges)
    return {t: merge_ranges(r) for t, r in sorted(collected.items())}


def count(ranges: Mapping[int, Iterable[tuple[int, int]]]) -> int:
    return sum(b - a for rs in ranges.values() for a, b in rs)
