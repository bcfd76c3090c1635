"""The data plane: the shell around the trainer's consumption accounting.

Readers announce finished tasks; the sampler admits them in its order; gathers and the loop
report rows gathered and consumed (reports.py turns every report into an update). What each of
those means for exactly-once is decided by the
:class:`~shmloader.dataset.accounting.book.ConsumptionBook`, a pure state machine applying
updates (updates.py); this class holds the lock around it, applies the updates, and carries out
the effects the book returns: tasks put on the ready board, segments renamed and released in the
store, leases marked taken and completed through the outbox (outbox.py, sent outside the lock).
Around the book it keeps the board of ready tasks (ready.py), the check that a ready task's
lease is still this trainer's (lease_check.py), the tasks the sampler waits for that are
elsewhere (elsewhere.py), the budget pressure (budget_pressure.py) and the loop's waits
(loop_clock.py). The sampler's questions and requests go through ``SamplerFeed``
(sampler_feed.py), written against this class's two seams: :meth:`DataPlane.update` and
:meth:`DataPlane.read`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import numpy as np

from ..core.indices import SegmentRows, group_by_segment, slot_name
from ..core.ports import LeaseOps, SegmentOps
from ..core.tasks import ReadyTask
from ..gather.ledger import LedgerReader
from ..resume.checkpoint import FRESH_START, LoopState, Position, ResumePoint
from ..resume.handover import Handover, HandoverLease, RecordRanges
from ..waiting.budget_pressure import BudgetPressure
from ..waiting.elsewhere import ElsewhereTasks
from ..waiting.lease_check import LeaseCheck
from ..waiting.loop_clock import LoopClock
from ..waiting.ready import ReadyTasks
from .book import BookContents, BookFigures, ConsumptionBook
from .outbox import Outbox
from .reports import Reporter
from .updates import (
    AdmittedTask,
    Announced,
    Complete,
    ConsumedAgain,
    Effect,
    Finished,
    Forgotten,
    MakeReady,
    MarkTaken,
    Release,
    Rename,
    Undelivered,
    Update,
)

__all__ = ["DataPlane", "SegmentOps", "slot_name"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class DataPlane:
    """The lock around the consumption book: updates applied, effects carried out. All methods
    are thread-safe."""

    def __init__(
        self,
        *,
        master: LeaseOps,
        segments: SegmentOps,
        ledger: LedgerReader,
        starved: Callable[[], bool] | None = None,
        blocked: Callable[[], bool] | None = None,  # a wanted task's reader has no room
        start_epoch: int = 0,
        resume: ResumePoint = FRESH_START,  # where a loaded state left the job
        # Records a crashed trainer's loop consumed of tasks (epoch, task id), whose leases this
        # one took over from its checkpoint (handover.py): left out of any copy that comes here.
        taken_over: Mapping[tuple[int, int], RecordRanges] | None = None,
        consumer: str | None = None,  # this trainer's consumer id at the master
        lease_timeout: float | None = None,  # the master's: check ready tasks' leases
    ) -> None:
        self.ready = ReadyTasks(start_epoch)
        self._master = master  # the positions of a checkpoint ask for the epochs' task counts
        self._segments = segments
        self._book = ConsumptionBook(start_epoch=start_epoch, resume=resume, taken_over=taken_over)
        self._lock = threading.RLock()
        # Every report of rows gathered or consumed (ledger, gathers, the loop's receipts).
        self.reports = Reporter(ledger, self.update, self._all_gathered)
        self.elsewhere = ElsewhereTasks(master, segments, self.ready)
        self.outbox = Outbox(
            master, consumer, admitted=self._admitted_tasks, ready=self.ready.pending
        )
        self.lapsed_leases = self.outbox.lapsed_leases  # lapsed, handed to another trainer
        self.lease_check = LeaseCheck(master, lease_timeout, consumer)
        # How the budget stands, for the sampler's waits (budget_pressure.py).
        self.pressure = BudgetPressure(
            starved=starved, blocked=blocked, unconsumed_rows=self.unconsumed_rows
        )
        # How long the loop waited for its batches (shmloader.DataLoader times them).
        self.loop_clock = LoopClock(self.ready)
        # Rows reported consumed after their slot was released and completed (ConsumedAgain):
        # zero unless a row was delivered twice; the tests of exactly-once read it.
        self.consumed_again = 0

    def update(self, update: Update) -> list[Effect]:
        """Apply ``update`` to the book and carry out its effects, under the lock; but for
        :class:`MakeReady`, carried out after it: a wait on the ready board asks the plane
        (its pressure probe) while holding the board's condition, so the plane never takes
        that condition inside its own lock. Never called with the lock held for an update
        that makes a task ready (``Announced``)."""
        with self._lock:
            effects = self._book.apply(update)
            self._apply(effects)
        for effect in effects:
            if isinstance(effect, MakeReady):
                # The lease check first: the sampler may take the task as soon as it is put.
                self.lease_check.announced(effect.task, effect.confirmed)
                self.ready.put(effect.task)
        return effects

    def read(self, question: Callable[[ConsumptionBook], T]) -> T:
        """The book's answer to ``question``, asked under the lock (a question changes
        nothing: changes are updates)."""
        with self._lock:
            return question(self._book)

    def _all_gathered(self, groups: Sequence[SegmentRows]) -> bool:
        with self._lock:
            return self._book.all_gathered(groups)

    def _apply(self, effects: list[Effect]) -> None:
        """Carry out the book's effects (under the lock: store calls are quick, and the outbox
        only queues what it sends to the master later, outside it)."""
        for effect in effects:
            if isinstance(effect, Forgotten):
                self.outbox.forget_before(effect.before, effect.live_leases)
            elif isinstance(effect, Release):
                self._segments.release(effect.segment, missing_ok=True, cache_as=effect.cache_as)
            elif isinstance(effect, Rename):
                self._segments.rename(effect.segment, effect.to)
            elif isinstance(effect, MarkTaken):
                self.outbox.taken(effect.admitted)
                self.elsewhere.admitted(effect.admitted.task)
            elif isinstance(effect, Undelivered):
                self.elsewhere.dropped(effect.task)
                self.outbox.dropped(effect.task.lease_id)
            elif isinstance(effect, Complete):
                self.outbox.complete(effect.lease_id, effect.admitted)
            elif isinstance(effect, ConsumedAgain):
                if not self.consumed_again:
                    log.error(
                        "%d rows of segment slot %d were reported consumed after every row of "
                        "it was (rows delivered twice): please report this as a bug, with how "
                        "the loader is iterated; consumed_again counts every such row",
                        effect.rows,
                        effect.slot,
                    )
                self.consumed_again += effect.rows
            # MakeReady: after the lock (update); Issue: the indices go back to admit's caller.

    # -- what the book counts -------------------------------------------------------------
    def figures(self) -> BookFigures:
        """What the book counts, as one value read under the lock."""
        with self._lock:
            return self._book.figures()

    def contents(self) -> BookContents:
        """What the book still holds (epochs, tasks announced, live segments), read at once."""
        with self._lock:
            return self._book.contents()

    # -- readers' side -------------------------------------------------------------------
    def announce(
        self,
        *,
        epoch: int,
        seq: int,
        task_id: int,
        lease_id: int,
        segment: str,
        num_rows: int,
        start: int = 0,
        stop: int | None = None,
        skipped: tuple[int, ...] = (),
        consumed: tuple[tuple[int, int], ...] = (),
        path: str = "",
        confirmed: float | None = None,  # when the lease was last known active (lease_check)
        nbytes: int = 0,  # the segment's size
        cache_key: str = "",  # cache=True: kept under this key once released
    ) -> None:
        """A reader sealed ``segment`` for a task: the book makes it ready for the sampler, or
        drops a second copy (``ConsumptionBook``, ``Announced``). ``consumed``: records of it
        that earlier holders consumed (not issued again)."""
        task = ReadyTask(
            epoch,
            seq,
            task_id,
            segment,
            num_rows,
            lease_id,
            start,
            stop,
            skipped,
            consumed,
            path,
            nbytes,
            cache_key,
        )
        self.update(Announced(task, confirmed))

    def _admitted_tasks(self) -> list[AdmittedTask]:
        with self._lock:
            return self._book.admitted_tasks()

    def forget_finished(self, before: int) -> None:
        """Drop what is kept of epochs before ``before``, which the master finished (every
        task completed) and the sampler is past (``ConsumptionBook.forget_finished``)."""
        self.update(Finished(before))

    # -- consumption ---------------------------------------------------------------------
    def read_ledger_and_send(self) -> int:
        """Apply what the ledger says was gathered (releasing and completing what that
        finishes), then send the master the completions and marks queued (the outbox, outside
        the lock). Returns how many rows the ledger had (none unless a plain DataLoader's
        workers gather)."""
        rows = self.reports.read_ledger()
        self.outbox.flush()  # outside the lock: outbox.py
        return rows

    def unconsumed_rows(self) -> int:
        """Rows the sampler handed out (admitted) and not consumed yet: in flight to the loop,
        or held by a batcher. Their segments cannot go until they are."""
        with self._lock:
            return self._book.unconsumed_rows()

    def position(self, also: np.ndarray | None = None) -> Position:
        """What checkpoints store, for the first epoch not wholly consumed
        (``ConsumptionBook.position``); ``also``: sample indices to count as consumed."""
        groups = _grouped(also)
        return self._with_epoch_sizes(lambda tasks_of: self._book.position(tasks_of, groups))

    def loop_state(
        self,
        also: np.ndarray | None = None,
        *,
        master_holds_position: bool = False,
        handing_over_as: str | None = None,
    ) -> LoopState:
        """Where the loop stands, in one step under the lock (``saved_state`` is made of it):
        the epoch it iterates, its position (None when the master holds the position: told
        so by ``master_holds_position``, or seen to share the epochs with other trainers)
        and, given this trainer's consumer id (elastic mode), the leases it hands over
        (:meth:`_handover_leases`). ``also``: as for :meth:`position`. (NOTE [exactly once
        on the trainer side], 7, in book.py.)"""
        groups = _grouped(also)

        def state(tasks_of: Callable[[int], int]) -> LoopState:
            shared = master_holds_position or self._book.shares_epochs
            epoch = self._book.epoch_to_iterate()
            at = None if shared else self._book.position(tasks_of, groups)
            held = () if handing_over_as is None else self._handover_leases()
            handover = None if handing_over_as is None else Handover(handing_over_as, held)
            return LoopState(epoch=epoch, position=at, handover=handover)

        return self._with_epoch_sizes(state)

    def _with_epoch_sizes(self, answer: Callable[[Callable[[int], int]], T]) -> T:
        """``answer(tasks_of)`` under the lock, where ``tasks_of(epoch)`` is the master's count
        of the epoch's tasks. The counts are asked before, outside the lock (a call to the
        master may take a retry's time, and the readers' announcements and the loop's reports
        would wait on it), for every epoch the book keeps; should an epoch be added meanwhile,
        its count is asked and the answer made again."""
        sizes: dict[int, int] = {}

        def tasks_of(epoch: int) -> int:
            if epoch not in sizes:
                raise _SizeNotAsked(epoch)
            return sizes[epoch]

        while True:
            with self._lock:
                missing = [e for e in self._book.contents().epochs if e not in sizes]
                if not missing:
                    try:
                        return answer(tasks_of)
                    except _SizeNotAsked as unknown:
                        missing = [unknown.epoch]
            sizes.update((epoch, self._master.epoch_tasks(epoch)) for epoch in missing)

    def hand_back(self) -> dict[int, list[tuple[int, int]]]:
        """Lease id -> records consumed, of tasks the sampler took and the loop consumed part
        of (rows excluded at admit count as consumed): what a trainer leaving an elastic job
        hands back with its leases (master/handback.py), so that nobody delivers them again."""
        with self._lock:
            return {task.lease_id: records for task, records in self._book.consumed_of_admitted()}

    def _handover_leases(self) -> tuple[HandoverLease, ...]:
        """The leases this trainer holds whose tasks the loop consumed part of, or all of while
        the master may not know it yet (the completion is queued), with the records consumed:
        what an elastic trainer's checkpoint names, for the trainer resumed from it to hand
        back (handover.py). Under the lock, both lists at once: a slot completing meanwhile is
        in one or the other."""
        held = self._book.consumed_of_admitted()
        held += [(s.task, [s.task.records()]) for s in self.outbox.unconfirmed()]
        return tuple(HandoverLease(t.lease_id, t.epoch, t.task_id, tuple(r)) for t, r in held if r)

    def held_leases(self) -> list[int]:
        """Leases of announced tasks not yet completed: the trainer keeps renewing them."""
        with self._lock:
            held = self._book.admitted_leases()
        return held + [t.lease_id for t in self.ready.pending()]


class _SizeNotAsked(Exception):
    """An answer needed the size of an epoch the book did not keep when the sizes were asked."""

    def __init__(self, epoch: int) -> None:
        super().__init__(epoch)
        self.epoch = epoch


def _grouped(also: np.ndarray | None) -> list[SegmentRows]:
    """Sample indices to count as consumed in a position (``also``), grouped by segment."""
    return group_by_segment(also) if also is not None and len(also) else []
