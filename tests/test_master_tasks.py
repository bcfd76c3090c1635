"""Plan -> tasks, and tasks -> one epoch's schedule (shuffle, DDP split, pad/drop)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from shmloader.errors import ConfigError
from shmloader.master.tasks import Task, TaskTable, build_schedule, task_order
from shmloader.sources.base import Shard

PLAN = [Shard("a", 10), Shard("empty", 0), Shard("b", 3), Shard("c", 8)]


def _rows(table: TaskTable) -> list[tuple[int, int, int]]:
    return [
        (int(s), int(a), int(b))
        for s, a, b in zip(table.shard, table.start, table.stop, strict=True)
    ]


def test_tasks_split_shards_never_span_two_and_skip_empty_shards() -> None:
    table = TaskTable(PLAN, 4)
    assert _rows(table) == [
        (0, 0, 4),
        (0, 4, 8),
        (0, 8, 10),  # last task of a shard may be short
        (2, 0, 3),  # the empty shard 1 makes no task
        (3, 0, 4),
        (3, 4, 8),
    ]
    assert len(table) == 6
    assert table.total_records == 21
    assert table.task(3) == Task(task_id=3, shard=2, path="b", start=0, stop=3)
    assert table.task(0, 1, 2).num_records == 1


def test_task_ids_are_stable_and_the_digest_tracks_the_plan() -> None:
    a, b = TaskTable(PLAN, 4), TaskTable(list(PLAN), 4)
    assert _rows(a) == _rows(b)
    assert a.plan_digest == b.plan_digest
    assert TaskTable(PLAN, 5).plan_digest == a.plan_digest  # the digest is of the plan only
    assert TaskTable([*PLAN[:-1], Shard("c", 9)], 4).plan_digest != a.plan_digest
    assert TaskTable([Shard("x", 10)], 4).plan_digest != TaskTable([Shard("y", 10)], 4).plan_digest


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_records_per_task_must_be_a_positive_int(bad: object) -> None:
    with pytest.raises(ConfigError, match="records_per_task must be"):
        TaskTable(PLAN, bad)  # type: ignore[arg-type]


def test_negative_record_count_names_the_shard() -> None:
    with pytest.raises(ConfigError, match=r"shard 1 \(bad\) has a negative record count -2"):
        TaskTable([Shard("ok", 1), Shard("bad", -2)], 4)


def test_a_path_planned_twice_is_refused() -> None:
    """A plan of the user's own listing one file twice delivered its records twice an epoch
    (each shard's tasks read the same path); it is refused, naming both shards."""
    with pytest.raises(ConfigError, match="plan shards 0 and 2 are both a: its records"):
        TaskTable([Shard("a", 30), Shard("b", 5), Shard("a", 30)], 10)


def test_task_order_is_pinned_per_seed_and_epoch() -> None:
    # PCG64 + SeedSequence([seed, epoch]) is specified by numpy: these values hold everywhere.
    assert task_order(8, seed=7, epoch=1, shuffle=True).tolist() == [6, 3, 1, 0, 2, 4, 7, 5]
    assert task_order(8, seed=7, epoch=2, shuffle=True).tolist() == [6, 0, 2, 3, 7, 5, 1, 4]
    assert task_order(5, seed=7, epoch=1, shuffle=False).tolist() == [0, 1, 2, 3, 4]


def test_elastic_schedule_is_the_task_order_in_one_queue() -> None:
    table = TaskTable(PLAN, 4)
    s = build_schedule(table, 3, seed=1, shuffle=True, world_size=None)
    order = task_order(len(table), seed=1, epoch=3, shuffle=True)
    assert s.task.tolist() == order.tolist()
    assert s.start.tolist() == table.start[order].tolist()
    assert s.stop.tolist() == table.stop[order].tolist()
    assert s.bounds.tolist() == [0, len(table)]
    assert s.dropped == ()


def _records(table: TaskTable, task: np.ndarray, start: np.ndarray, stop: np.ndarray) -> list:
    return [
        (int(table.shard[t]), r)
        for t, a, b in zip(task, start, stop, strict=True)
        for r in range(a, b)
    ]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7, 21, 50])
def test_ddp_pad_gives_equal_ranks_covering_every_record(world_size: int) -> None:
    table = TaskTable(PLAN, 4)
    s = build_schedule(table, 0, seed=5, shuffle=True, world_size=world_size, policy="pad")
    per = -(-table.total_records // world_size)
    lengths = s.lengths()
    assert [int(lengths[s.bounds[q] : s.bounds[q + 1]].sum()) for q in range(world_size)] == [
        per
    ] * world_size
    seen = Counter(_records(table, s.task, s.start, s.stop))
    every = {(int(table.shard[t]), r) for t in range(len(table)) for r in range(*_span(table, t))}
    assert set(seen) == every
    assert sum(seen.values()) == per * world_size
    assert s.dropped == ()
    # units are inside their task
    assert np.all(s.start >= table.start[s.task]) and np.all(s.stop <= table.stop[s.task])
    assert np.all(s.stop > s.start)


def _span(table: TaskTable, t: int) -> tuple[int, int]:
    return int(table.start[t]), int(table.stop[t])


@pytest.mark.parametrize("world_size", [2, 4, 5, 21])
def test_ddp_drop_gives_equal_ranks_and_lists_the_dropped_tail(world_size: int) -> None:
    table = TaskTable(PLAN, 4)
    s = build_schedule(table, 2, seed=5, shuffle=True, world_size=world_size, policy="drop")
    per = table.total_records // world_size
    lengths = s.lengths()
    for q in range(world_size):
        assert int(lengths[s.bounds[q] : s.bounds[q + 1]].sum()) == per
    kept = _records(table, s.task, s.start, s.stop)
    dropped = [(int(table.shard[t]), r) for t, a, b in s.dropped for r in range(a, b)]
    assert len(kept) == len(set(kept)) == per * world_size
    assert s.dropped_records() == len(dropped) == table.total_records - per * world_size
    every = {(int(table.shard[t]), r) for t in range(len(table)) for r in range(*_span(table, t))}
    assert set(kept) | set(dropped) == every and not set(kept) & set(dropped)


def test_ddp_rank_queues_follow_the_epoch_order() -> None:
    # The stream is the epoch's task order; rank 0 reads its first records.
    # and the padding continues from the stream's start (6 records, 4 ranks of 2).
    table = TaskTable([Shard("a", 6)], 3)  # tasks [0,3) [3,6)
    s = build_schedule(table, 0, seed=0, shuffle=False, world_size=4, policy="pad")
    units = list(zip(s.task.tolist(), s.start.tolist(), s.stop.tolist(), strict=True))
    assert units == [(0, 0, 2), (0, 2, 3), (1, 3, 4), (1, 4, 6), (0, 0, 2)]
    assert s.bounds.tolist() == [0, 1, 3, 4, 5]
    assert [s.queue_of(u) for u in range(5)] == [0, 1, 1, 2, 3]


def test_a_million_tasks_plan_and_schedule() -> None:
    table = TaskTable([Shard(f"s{i}", 1000) for i in range(10_000)], 10)
    assert len(table) == 1_000_000
    s = build_schedule(table, 0, seed=1, shuffle=True, world_size=8, policy="drop")
    assert len(s) <= 1_000_000 + 8
    assert int(s.lengths().sum()) == table.total_records
