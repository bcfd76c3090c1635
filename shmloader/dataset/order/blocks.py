"""The order of an epoch's rows: a function of the seed and the master's task order only.

Shuffling is two-level, like most streaming loaders: the master shuffles the *task* order of
each epoch, and the sampler shuffles *rows* across a window of ``shuffle_window`` consecutive
tasks (block shuffle). Blocks are formed from the master's task order, not from the order in
which readers happen to finish, and each block's permutation is seeded from
``(seed, epoch, first task of the block)``; so for a fixed configuration the order is the same
on every run, however the readers race. Each epoch starts with blocks of 1, 2, 4, ... tasks
so that the first batch waits for one task, not a whole window. Neither the blocks nor their
permutations depend on what was consumed before (a resume, a pass continued after ``break``):
the rest of an epoch comes in the uninterrupted order.

Everything here is pure (no waiting, no torch): the walk that waits for the blocks' tasks is
:class:`~shmloader.dataset.order.sampler.TaskSampler`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..core.indices import split_indices
from ..core.record_ranges import row_records
from ..core.tasks import ReadyTask

DEFAULT_SHUFFLE_WINDOW = 8


def block_permutation(seed: int, epoch: int, first_seq: int, n: int) -> np.ndarray:
    """The seeded permutation of a block: a function of its place only, never of timing."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, first_seq])))
    return rng.permutation(n)


def block_grid(first: int, window: int) -> tuple[int, int]:
    """Blocks from the epoch's start are 1, 2, 4, ... tasks up to ``window``: (the tasks from
    position ``first`` to the end of its block, that block's size)."""
    start, size = 0, 1
    while start + size <= first:
        start, size = start + size, min(size * 2, window)
    return start + size - first, size


def by_record(task: ReadyTask, indices: np.ndarray) -> np.ndarray:
    """``indices`` (rows of ``task`` to deliver) laid out one slot per record of the task, -1
    where a record is not delivered (consumed before, or skipped by the source): the layout
    the block's permutation works on, the same whatever was consumed."""
    start, stop = task.records()
    out = np.full(stop - start, -1, dtype=np.int64)
    if len(indices):
        rows = split_indices(indices)[1]
        if task.skipped:
            rows = row_records(start, stop, task.skipped, task.num_rows)[rows] - start
        out[rows] = indices
    return out


def block_order(
    tasks: Sequence[ReadyTask],
    rows: Sequence[np.ndarray],
    *,
    epoch: int,
    seed: int,
    shuffle: bool,
) -> np.ndarray:
    """The rows of a block's ``tasks`` to hand out (``rows[i]``: those of ``tasks[i]`` still
    to deliver), in the block's order.

    The permutation is over every record of the block's tasks, delivered or not; the rows
    consumed before a resume (or by a trainer that left), and records the source skipped,
    are then left out of it. So a resumed block delivers its rest in the order the
    uninterrupted run had: what was consumed is a prefix of that order."""
    if not tasks:
        return np.empty(0, dtype=np.int64)
    indices = np.concatenate([by_record(t, r) for t, r in zip(tasks, rows, strict=True)])
    if shuffle and len(indices) > 1:
        indices = indices[block_permutation(seed, epoch, tasks[0].seq, len(indices))]
    return indices[indices >= 0]
