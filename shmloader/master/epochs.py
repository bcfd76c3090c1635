"""Book-keeping of one open epoch: which of its units are todo, leased, done or quarantined.

Each queue (one per DDP rank, one in elastic mode) hands out its units in schedule order
through a cursor; units that come back (failed, expired, holder gone) wait in a per-queue
retry deque in front of the cursor. Everything before a cursor that is neither leased, retried
nor quarantined is done, which is why a snapshot stores cursors and small lists instead of a
status per unit, and why memory per open epoch is a few numpy arrays, not Python objects.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from itertools import pairwise
from typing import Any

import numpy as np

from ..errors import MasterError
from .config import JobConfig
from .progress import EpochProgress, Lease, QuarantinedTask
from .tasks import EpochSchedule, Task, TaskTable, build_schedule, merge_ranges

TODO, LEASED, DONE, QUARANTINED = 0, 1, 2, 3


def schedule_of(table: TaskTable, config: JobConfig, epoch: int) -> EpochSchedule:
    """Epoch ``epoch``'s schedule under ``config``; only ``first_epoch`` leaves out ``resume``."""
    return build_schedule(
        table,
        epoch,
        seed=config.seed,
        shuffle=config.shuffle,
        world_size=config.world_size,
        policy=config.ddp_policy,
        consumed=config.resume if epoch == config.first_epoch else None,
    )


def find_work(open_epochs: Iterable[OpenEpoch], queue: int) -> tuple[OpenEpoch, int] | None:
    """The oldest open epoch with a unit for ``queue`` to hand out, and that unit."""
    for ep in open_epochs:
        unit = ep.next_unit(queue)
        if unit is not None:
            return ep, unit
    return None


class OpenEpoch:
    """An epoch that has started and not finished; the dispatcher keeps at most two."""

    def __init__(self, schedule: EpochSchedule) -> None:
        self.schedule = schedule
        self.epoch = schedule.epoch
        self.lengths = schedule.lengths()
        self.status = np.zeros(len(schedule), dtype=np.int8)
        self.cursor: list[int] = [int(b) for b in schedule.bounds[:-1]]
        self.retry: list[deque[int]] = [deque() for _ in range(schedule.num_queues)]
        self.failures: dict[int, int] = {}
        self.quarantined: dict[int, str] = {}
        # Records of a unit consumed by holders that left (LeaseHandedBack), merged: the next
        # holder skips them. Forgotten once the unit is done.
        self.consumed: dict[int, tuple[tuple[int, int], ...]] = {}
        self.units = [len(schedule), 0, 0, 0]
        self.records = [int(self.lengths.sum()), 0, 0, 0]

    @classmethod
    def create(cls, table: TaskTable, config: JobConfig, epoch: int) -> OpenEpoch:
        return cls(schedule_of(table, config, epoch))

    # A unit's records, as ints for the values handed out.
    def start(self, unit: int) -> int:
        return int(self.schedule.start[unit])

    def stop(self, unit: int) -> int:
        return int(self.schedule.stop[unit])

    def next_unit(self, queue: int) -> int | None:
        """The unit ``queue`` would hand out next: a retry first, else the cursor's."""
        if self.retry[queue]:
            return self.retry[queue][0]
        cursor = self.cursor[queue]
        return cursor if cursor < self.schedule.bounds[queue + 1] else None

    def can_take(self, unit: int) -> bool:
        if not 0 <= unit < len(self.status) or self.status[unit] != TODO:
            return False
        q = self.schedule.queue_of(unit)
        return unit == self.cursor[q] or unit in self.retry[q]

    def take(self, unit: int) -> None:
        q = self.schedule.queue_of(unit)
        if self.retry[q] and self.retry[q][0] == unit:
            self.retry[q].popleft()
        elif unit == self.cursor[q]:
            self.cursor[q] += 1
        else:
            self.retry[q].remove(unit)
        self.move(unit, LEASED)

    def put_back(self, unit: int) -> None:
        """Back to the front of its queue, so that it is retried soon."""
        self.move(unit, TODO)
        self.retry[self.schedule.queue_of(unit)].appendleft(unit)

    def quarantine(self, unit: int, error: str) -> None:
        self.move(unit, QUARANTINED)
        self.quarantined[unit] = error

    def complete_late(self, unit: int) -> None:
        """A lapsed lease was completed late: take its unit out of the retry queue (or out of
        quarantine) and count it done."""
        status = int(self.status[unit])
        if status == TODO:
            self.retry[self.schedule.queue_of(unit)].remove(unit)
        elif status == QUARANTINED:
            del self.quarantined[unit]
        else:
            raise MasterError(
                f"epoch {self.epoch} unit {unit}: cannot complete late, status {status}"
            )
        self.move(unit, DONE)

    def outside(self, unit: int, ranges: tuple[tuple[int, int], ...]) -> tuple[int, int] | None:
        """The first of ``ranges`` that is empty or not within the unit's records, if any."""
        lo, hi = self.start(unit), self.stop(unit)
        return next(((a, b) for a, b in ranges if not lo <= a < b <= hi), None)

    def hand_back(self, unit: int, ranges: tuple[tuple[int, int], ...]) -> None:
        """Add ``ranges`` (checked with :meth:`outside`) to the unit's consumed records."""
        merged = merge_ranges([*self.consumed.get(unit, ()), *ranges])
        self.consumed[unit] = tuple(merged)

    def move(self, unit: int, new: int) -> None:
        old = int(self.status[unit])
        n = int(self.lengths[unit])
        self.units[old] -= 1
        self.units[new] += 1
        self.records[old] -= n
        self.records[new] += n
        self.status[unit] = new
        if new == DONE:
            self.consumed.pop(unit, None)

    def left_by_queue(self) -> list[int]:
        """Records of each queue not done yet (to do or leased), in queue order."""
        left = np.where(self.status <= LEASED, self.lengths, 0)
        cum = np.concatenate(([0], np.cumsum(left)))
        return [int(cum[hi] - cum[lo]) for lo, hi in pairwise(self.schedule.bounds.tolist())]

    @property
    def finished(self) -> bool:
        return not (self.units[TODO] or self.units[LEASED])

    def make_lease(
        self,
        table: TaskTable,
        config: JobConfig,
        lease_id: int,
        consumer: str,
        unit: int,
        attempt: int,
        deadline: float,
    ) -> Lease:
        """A lease of ``unit`` (with the records handed back of it so far)."""
        rank = None if config.world_size is None else self.schedule.queue_of(unit)
        task = self.unit_task(table, unit)
        consumed = self.consumed.get(unit, ())
        return Lease(
            lease_id, task, self.epoch, consumer, deadline, attempt, unit, rank, False, consumed
        )

    def unit_task(self, table: TaskTable, unit: int) -> Task:
        return table.task(int(self.schedule.task[unit]), self.start(unit), self.stop(unit))

    def progress(self, table: TaskTable) -> EpochProgress:
        dropped = self.schedule.dropped
        return EpochProgress(
            epoch=self.epoch,
            total_records=sum(self.records),
            todo_records=self.records[TODO],
            leased_records=self.records[LEASED],
            done_records=self.records[DONE],
            quarantined_records=self.records[QUARANTINED],
            dropped_records=self.schedule.dropped_records(),
            total_units=len(self.status),
            todo_units=self.units[TODO],
            leased_units=self.units[LEASED],
            done_units=self.units[DONE],
            quarantined_units=self.units[QUARANTINED],
            finished=self.finished,
            quarantined=tuple(
                QuarantinedTask(self.epoch, u, self.unit_task(table, u), err)
                for u, err in sorted(self.quarantined.items())
            ),
            dropped=tuple(table.task(t, a, b) for t, a, b in dropped),
        )

    # -------------------------------------------------------------- snapshots

    def to_state(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "cursor": list(self.cursor),
            "retry": [list(r) for r in self.retry],
            "failures": sorted([u, n] for u, n in self.failures.items()),
            "quarantined": sorted([u, e] for u, e in self.quarantined.items()),
            "consumed": sorted([u, [list(r) for r in rs]] for u, rs in self.consumed.items()),
        }

    @classmethod
    def from_state(
        cls, table: TaskTable, config: JobConfig, data: dict[str, Any], leased: list[int]
    ) -> OpenEpoch:
        """Rebuild from :meth:`to_state` plus the units of the epoch's active leases."""
        ep = cls.create(table, config, int(data["epoch"]))
        bounds = ep.schedule.bounds
        if len(data["cursor"]) != ep.schedule.num_queues:
            raise MasterError(
                f"epoch {ep.epoch}: state has {len(data['cursor'])} queues, schedule has "
                f"{ep.schedule.num_queues}"
            )
        for q, cursor in enumerate(data["cursor"]):
            if not bounds[q] <= cursor <= bounds[q + 1]:
                raise MasterError(f"epoch {ep.epoch}: cursor {cursor} outside queue {q}")
            ep.cursor[q] = int(cursor)
            ep.status[bounds[q] : cursor] = DONE
        ep.retry = [deque(int(u) for u in r) for r in data["retry"]]
        for r in ep.retry:
            ep.status[list(r)] = TODO
        ep.failures = {int(u): int(n) for u, n in data["failures"]}
        ep.quarantined = {int(u): str(e) for u, e in data["quarantined"]}
        ep.status[list(ep.quarantined)] = QUARANTINED
        # States saved before units could be handed back have no "consumed": none was.
        for u, rs in data.get("consumed", []):
            ep.consumed[int(u)] = tuple((int(a), int(b)) for a, b in rs)
        ep.status[leased] = LEASED
        ep.units = [int(n) for n in np.bincount(ep.status, minlength=4)]
        weights = np.bincount(ep.status, weights=ep.lengths, minlength=4)
        ep.records = [int(n) for n in weights]
        return ep
