"""Tasks the sampler waits for that are not ready here: which readers should make room for,
and which are elsewhere.

The sampler takes an epoch's tasks in its fixed order and waits for the next one missing.
Readers are sent the tasks it awaits (``want``): those may use the room the others leave in
the shared-memory budget (shm budget.reserve), so they can always be written. In elastic mode
trainers share one queue, so another trainer's readers may have taken a task it waits for, and
a trainer restarted against a running master finds tasks done: the master's whereabouts say so
(``find``), and the sampler stops waiting. Such a task is kept as one *elsewhere*: if it comes
here after all (its holder died and the master handed it out again, or its ready copy here was
dropped because its lease lapsed, lease_check.py), the sampler takes it as it can.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, NamedTuple

from ...reader.messages import task_key
from ..core.ports import LeaseOps
from ..core.tasks import ReadyTask
from .ready import ReadyTasks

if TYPE_CHECKING:
    from ..core.ports import SegmentOps

# Whereabouts (Dispatcher.whereabouts) of a task the sampler waits for that may still come. A
# quarantined one never does, but is waited for all the same: the runtime raises its loss in
# the loop (TaskQuarantinedError), as it does for one trainer, rather than the pass ending
# without it.
MAY_COME = frozenset({"todo", "mine", "quarantined"})
# Of a task given up as elsewhere: it cannot come here any more ("done"), or may ("todo",
# "mine", or "other": another trainer's readers hold it and that trainer may die before it
# takes it in hand). One another trainer took in hand ("taken") comes back only if that trainer
# dies: kept as one elsewhere (see take_ready), but not waited for.
DONE_ELSEWHERE = frozenset({"done"})
TAKEN_ELSEWHERE = "taken"
MAY_BE_WAITED_FOR = frozenset({"todo", "mine", "other", "quarantined"})


class ElsewhereCount(NamedTuple):
    """Tasks given up as elsewhere: how many may still come here, how many another trainer
    took in hand."""

    may_come: int
    taken_elsewhere: int


class ElsewhereTasks:
    """The tasks elsewhere, and what readers were sent (thread-safe; its lock is taken inside the
    plane's, and no other lock inside its own)."""

    def __init__(self, master: LeaseOps, segments: SegmentOps, ready: ReadyTasks) -> None:
        self._master = master
        self._segments = segments
        self._ready = ready
        self._lock = threading.Lock()
        self.tasks: set[tuple[int, int]] = set()  # (epoch, seq); read under the lock
        self._wanting = False  # whether readers were last sent tasks the sampler awaits

    def want(self, epoch: int, seqs: list[int]) -> None:
        """Send readers those of ``seqs`` the sampler waits for (empty: none)."""
        self._set_wanted([task_key(epoch, s) for s in self._ready.missing(epoch, seqs)])

    def want_all(self) -> None:
        """Readers of tasks elsewhere may use the budget's reserve (see want): the sampler waits
        for them, and other tasks' segments may fill the budget."""
        with self._lock:
            tasks = sorted(self.tasks)
        self._set_wanted([task_key(e, s) for e, s in tasks if self._ready.missing(e, [s])])

    def _set_wanted(self, keys: list[str]) -> None:
        if keys or self._wanting:
            self._segments.want(keys)
            self._wanting = bool(keys)

    def find(self, epoch: int, seqs: list[int]) -> set[int]:
        """Those of ``seqs`` that the master says will not come here: kept as elsewhere."""
        if not seqs:
            return set()
        where = self._master.whereabouts(epoch, seqs)
        gone = {s for s, w in zip(seqs, where, strict=True) if w not in MAY_COME}
        with self._lock:
            self.tasks.update((epoch, s) for s in gone)
        return gone

    def look(self) -> ElsewhereCount:
        """Where the tasks elsewhere are, asking the master once per epoch with some: how many may
        still come here (waiting in the queue, held by this trainer's readers, or by another
        trainer's readers before that trainer took it: it may die first), and how many another
        trainer took in hand (not waited for but at the end of the master's last epoch:
        TaskSampler._wait_for_elsewhere). Those found done are forgotten."""
        with self._lock:
            by_epoch: dict[int, list[int]] = {}
            for epoch, seq in sorted(self.tasks):
                by_epoch.setdefault(epoch, []).append(seq)
        may_come = taken = 0
        for epoch, seqs in by_epoch.items():
            where = self._master.whereabouts(epoch, seqs)
            may_come += sum(w in MAY_BE_WAITED_FOR for w in where)
            taken += sum(w == TAKEN_ELSEWHERE for w in where)
            finished = {(epoch, s) for s, w in zip(seqs, where, strict=True) if w in DONE_ELSEWHERE}
            with self._lock:
                self.tasks -= finished
        return ElsewhereCount(may_come, taken)

    def take_ready(self) -> list[ReadyTask]:
        """Tasks elsewhere that came to this trainer, ready now (not waited for)."""
        with self._lock:
            keys = sorted(self.tasks)
        return self._ready.take_ready(keys) if keys else []

    def admitted(self, task: ReadyTask) -> None:
        """The sampler admitted ``task``: not elsewhere any more."""
        with self._lock:
            self.tasks.discard((task.epoch, task.seq))

    def dropped(self, task: ReadyTask) -> None:
        """The sampler dropped ``task``'s ready copy (its lease lapsed): elsewhere."""
        with self._lock:
            self.tasks.add((task.epoch, task.seq))
