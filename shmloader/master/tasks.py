"""From a plan to tasks, and from tasks to one epoch's schedule of work units.

Everything here is a pure function of (plan, ``records_per_task``, seed, epoch, world size,
policy), so the dispatcher never has to store a schedule: it rebuilds it after a restart and
only remembers how far each queue got. Tasks live in numpy arrays, one row per task, because a
plan of a million tasks must not become a million Python objects.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Literal, get_args

import numpy as np

from ..errors import ConfigError
from ..sources.base import Shard

# How DDP evens out the ranks' shares: repeat records ("pad") or leave the remainder out.
DdpPolicy = Literal["pad", "drop"]
DDP_POLICIES: tuple[str, ...] = get_args(DdpPolicy)


@dataclass(frozen=True)
class Task:
    """Records ``[start, stop)`` of shard number ``shard`` (``path``); ``task_id`` is its row.

    In DDP mode a lease may carry only a sub-range of a task (the schedule cuts tasks at rank
    boundaries); ``task_id`` then still names the whole task and ``start``/``stop`` the part.
    """

    task_id: int
    shard: int
    path: str
    start: int
    stop: int

    @property
    def num_records(self) -> int:
        return self.stop - self.start


def _refuse_repeated_paths(paths: list[str]) -> None:
    """ConfigError if a path is planned twice: a task names a path and a record range of it,
    so two shards of one path read the same records, and each would reach the loop twice per
    epoch. The built-in sources list each file once; a plan of the user's own might not."""
    first: dict[str, int] = {}
    for i, path in enumerate(paths):
        j = first.setdefault(path, i)
        if j != i:
            raise ConfigError(
                f"plan shards {j} and {i} are both {path}: its records would be delivered "
                "twice in every epoch; a plan must list each path once (a task reads records "
                "[start, stop) of its shard's path)"
            )


class TaskTable:
    """All tasks of a plan: task ``i`` is row ``i`` of ``shard``/``start``/``stop``.

    Task ids depend only on the plan and ``records_per_task`` (shards in plan order, tasks in
    record order inside a shard), so they are stable across processes and restarts.
    """

    def __init__(self, plan: Sequence[Shard], records_per_task: int) -> None:
        if isinstance(records_per_task, bool) or not isinstance(records_per_task, int):
            raise ConfigError(f"records_per_task must be an int, got {records_per_task!r}")
        if records_per_task < 1:
            raise ConfigError(f"records_per_task must be >= 1, got {records_per_task}")
        self.records_per_task = records_per_task
        self.paths: list[str] = [s.path for s in plan]
        counts = np.fromiter((s.num_records for s in plan), dtype=np.int64, count=len(plan))
        if counts.size and int(counts.min()) < 0:
            bad = int(np.argmin(counts))
            raise ConfigError(
                f"plan shard {bad} ({self.paths[bad]}) has a negative record count "
                f"{int(counts[bad])}"
            )
        _refuse_repeated_paths(self.paths)
        self.shard_records = counts
        per_shard = -(-counts // records_per_task)  # ceil; 0 for empty shards
        total = int(per_shard.sum())
        self.shard = np.repeat(np.arange(len(plan), dtype=np.int64), per_shard)
        first = np.cumsum(per_shard) - per_shard
        within = np.arange(total, dtype=np.int64) - np.repeat(first, per_shard)
        self.start = within * records_per_task
        self.stop = np.minimum(self.start + records_per_task, counts[self.shard])

    def __len__(self) -> int:
        return int(self.shard.size)

    @property
    def total_records(self) -> int:
        return int(self.shard_records.sum())

    def task(self, task_id: int, start: int | None = None, stop: int | None = None) -> Task:
        """Task ``task_id`` as a value; ``start``/``stop`` narrow it to a sub-range."""
        shard = int(self.shard[task_id])
        return Task(
            task_id=int(task_id),
            shard=shard,
            path=self.paths[shard],
            start=int(self.start[task_id]) if start is None else int(start),
            stop=int(self.stop[task_id]) if stop is None else int(stop),
        )

    @cached_property
    def plan_digest(self) -> str:
        """SHA-256 of the plan (paths and record counts): what a journal must agree with."""
        h = hashlib.sha256()
        h.update(f"shards={len(self.paths)};".encode())
        h.update("\0".join(self.paths).encode("utf-8", "surrogatepass"))
        h.update(self.shard_records.astype("<i8").tobytes())
        return h.hexdigest()


def task_order(num_tasks: int, *, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """Task ids in the order epoch ``epoch`` hands them out.

    PCG64 seeded from ``SeedSequence([seed, epoch])`` is specified bit for bit by numpy, so
    every process and platform computes the same order without talking to the master.
    """
    if not shuffle:
        return np.arange(num_tasks, dtype=np.int64)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch])))
    return rng.permutation(num_tasks).astype(np.int64, copy=False)


@dataclass(frozen=True)
class EpochSchedule:
    """One epoch's work units in queues: queue ``q`` owns units ``bounds[q]:bounds[q+1]``.

    A unit is records ``[start[u], stop[u])`` of task ``task[u]``. Elastic mode has one queue
    holding the epoch's tasks in order; DDP mode has one queue per rank with equal record totals.
    ``dropped`` lists the ``(task_id, start, stop)`` ranges the "drop" policy leaves out.
    """

    epoch: int
    task: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    bounds: np.ndarray
    dropped: tuple[tuple[int, int, int], ...]

    def __len__(self) -> int:
        return int(self.task.size)

    @property
    def num_queues(self) -> int:
        return int(self.bounds.size) - 1

    def lengths(self) -> np.ndarray:
        return self.stop - self.start

    def queue_records(self, queue: int) -> int:
        """The records of queue ``queue``'s units (a rank's share; elastic mode: queue 0)."""
        return int(self.lengths()[self.bounds[queue] : self.bounds[queue + 1]].sum())

    @cached_property
    def _bounds(self) -> list[int]:
        return [int(b) for b in self.bounds]

    def queue_of(self, unit: int) -> int:
        # bisect on a list: numpy's per-call overhead dominates for one scalar
        return bisect_right(self._bounds, unit) - 1

    def dropped_records(self) -> int:
        return sum(stop - start for _, start, stop in self.dropped)


def records_per_rank(total: int, world_size: int, policy: DdpPolicy) -> int:
    """Records each rank reads per epoch: ``ceil`` (pad) or ``floor`` (drop) of total / N."""
    return -(-total // world_size) if policy == "pad" else total // world_size


def build_schedule(
    table: TaskTable,
    epoch: int,
    *,
    seed: int,
    shuffle: bool,
    world_size: int | None,
    policy: DdpPolicy = "pad",
    consumed: Mapping[int, Sequence[tuple[int, int]]] | None = None,
) -> EpochSchedule:
    """The units of ``epoch``: the task order cut into per-rank queues of equal record totals.

    DDP works like torch's DistributedSampler but on records: the epoch's tasks, in order, form
    one stream of records; rank ``r`` gets stream positions ``[r*k, (r+1)*k)``, a task being cut
    where a rank boundary falls inside it. "pad" makes ``k = ceil(total/N)`` and continues the
    stream from its beginning (the short rank re-reads the epoch's first records); "drop" makes
    ``k = floor(total/N)`` and leaves the tail out.

    ``consumed`` (task id -> record ranges, a checkpoint's) takes those records out of the
    stream first, so a job resumed with another world size splits only what is left; a task
    with a hole becomes several pieces.
    """
    order = task_order(len(table), seed=seed, epoch=epoch, shuffle=shuffle)
    if consumed:
        order, starts, lengths = _remaining(table, order, consumed)
    else:
        starts, lengths = table.start[order], table.stop[order] - table.start[order]
    total = int(lengths.sum())
    ranks = 1 if world_size is None else world_size
    per = total if world_size is None else records_per_rank(total, ranks, policy)
    if total == 0:  # a checkpoint consumed everything: an empty epoch
        empty = np.empty(0, dtype=np.int64)
        return EpochSchedule(epoch, empty, empty, empty, np.zeros(ranks + 1, np.int64), ())
    scheduled = per * ranks
    if scheduled > total:  # pad: repeat the order as often as needed (more than once if N > total)
        reps = -(-scheduled // total)
        order, starts, lengths = (np.tile(a, reps) for a in (order, starts, lengths))
    cum = np.concatenate(([0], np.cumsum(lengths)))
    cuts = np.arange(ranks + 1, dtype=np.int64) * per
    task, start, stop, lo = _cut(order, starts, cum, cuts, 0, scheduled)
    bounds = np.searchsorted(lo, cuts, side="left").astype(np.int64)
    bounds[-1] = task.size
    dropped: tuple[tuple[int, int, int], ...] = ()
    if scheduled < total:
        d_task, d_start, d_stop, _ = _cut(order, starts, cum, cuts[-1:], scheduled, total)
        dropped = tuple(
            (int(t), int(a), int(b)) for t, a, b in zip(d_task, d_start, d_stop, strict=True)
        )
    return EpochSchedule(epoch, task, start, stop, bounds, dropped)


def merge_ranges(ranges: Iterable[Sequence[int]]) -> list[tuple[int, int]]:
    """``[start, stop)`` ranges sorted, empty ones dropped, overlapping or touching ones joined."""
    merged: list[tuple[int, int]] = []
    for a, b in sorted((int(r[0]), int(r[1])) for r in ranges):
        if b <= a:
            continue
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _remaining(
    table: TaskTable, order: np.ndarray, consumed: Mapping[int, Sequence[tuple[int, int]]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The stream ``order`` without the ``consumed`` records: (task, start, length) per piece."""
    pieces: dict[int, list[tuple[int, int]]] = {}
    for task_id, ranges in consumed.items():
        if not 0 <= task_id < len(table):
            raise ConfigError(f"consumed ranges name task {task_id}; the plan has {len(table)}")
        lo, hi = int(table.start[task_id]), int(table.stop[task_id])
        left, at = [], lo
        for a, b in merge_ranges(ranges):
            if a < lo or b > hi:
                raise ConfigError(
                    f"consumed range [{a}, {b}) is outside task {task_id} (records {lo}..{hi})"
                )
            if a > at:
                left.append((at, a))
            at = max(at, b)
        if at < hi:
            left.append((at, hi))
        pieces[task_id] = left
    counts = np.ones(order.size, dtype=np.int64)
    hit = np.flatnonzero(np.isin(order, np.fromiter(pieces, dtype=np.int64, count=len(pieces))))
    for pos in hit:
        counts[pos] = len(pieces[int(order[pos])])
    task = np.repeat(order, counts)
    start = np.repeat(table.start[order], counts)
    stop = np.repeat(table.stop[order], counts)
    first = np.cumsum(counts) - counts
    for pos in hit:
        for i, (a, b) in enumerate(pieces[int(order[pos])]):
            start[first[pos] + i], stop[first[pos] + i] = a, b
    return task, start, stop - start


def _cut(
    order: np.ndarray, starts: np.ndarray, cum: np.ndarray, cuts: np.ndarray, lo: int, hi: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Stream positions ``[lo, hi)`` as units, split at piece boundaries and at ``cuts``.

    Piece ``i`` of the stream is records ``starts[i]...`` of task ``order[i]``."""
    inner = cum[np.searchsorted(cum, lo, side="left") : np.searchsorted(cum, hi, side="right")]
    # ``cum`` is strictly increasing; only the few cut points it lacks need inserting.
    extra = np.unique(np.concatenate((cuts, [lo, hi])))
    extra = extra[(extra >= lo) & (extra <= hi)]
    pos = np.searchsorted(inner, extra)
    missing = (pos >= inner.size) | (inner[np.minimum(pos, inner.size - 1)] != extra)
    points = np.insert(inner, pos[missing], extra[missing])
    seg_lo, seg_hi = points[:-1], points[1:]
    idx = np.searchsorted(cum, seg_lo, side="right") - 1
    task = order[idx]
    start = starts[idx] + (seg_lo - cum[idx])
    return task, start, start + (seg_hi - seg_lo), seg_lo
