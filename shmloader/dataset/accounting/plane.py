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
elsewhere (strays.py), where room in the budget stands (room.py) and the loop's waits
(loop_clock.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ..core.indices import SegmentRows, group_by_segment, slot_name
from ..core.ports import LeaseOps, SegmentOps
from ..core.tasks import ReadyTask
from ..gather.ledger import LedgerReader
from ..resume.checkpoint import FRESH_START, LoopState, Position, ResumePoint
from ..resume.handover import Handover, HeldLease, RecordRanges
from ..waiting.lease_check import LeaseCheck
from ..waiting.loop_clock import LoopClock
from ..waiting.ready import ReadyTasks
from ..waiting.room import Room
from ..waiting.strays import Strays
from .book import BookFigures, ConsumptionBook, Kept
from .outbox import Outbox
from .reports import Reporter
from .updates import (
    Admitted,
    Announced,
    Complete,
    ConsumedAgain,
    Effect,
    Elsewhere,
    EpochIterated,
    Finished,
    Forgotten,
    HandedOut,
    HeldTask,
    Issue,
    MakeReady,
    MarkTaken,
    NotDelivered,
    Release,
    Rename,
    Update,
)

__all__ = ["DataPlane", "SegmentOps", "slot_name"]

log = logging.getLogger(__name__)


class DataPlane:
    """Implements the sampler's ``Feed``; all methods are thread-safe."""

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
        self.ready = ReadyTasks()
        self._master = master
        self._segments = segments
        self._book = ConsumptionBook(start_epoch=start_epoch, resume=resume, taken_over=taken_over)
        self._lock = threading.RLock()
        # Every report of rows gathered or consumed (ledger, gathers, the loop's receipts).
        self.reports = Reporter(ledger, self._update, self._all_gathered)
        self.strays = Strays(master, segments, self.ready)
        self.outbox = Outbox(master, consumer, held=self._held_tasks, ready=self.ready.pending)
        self.lapsed_leases = self.outbox.lapsed_leases  # lapsed, handed to another trainer
        self.lease_check = LeaseCheck(master, lease_timeout, consumer)
        # Where room in the budget stands, for the sampler's waits (room.py).
        self.room = Room(starved=starved, blocked=blocked, unconsumed_rows=self.unconsumed_rows)
        # How long the loop waited for its batches (shmloader.DataLoader times them).
        self.loop_clock = LoopClock(self.ready)
        # Rows reported consumed after their slot settled (ConsumedAgain): zero unless a row
        # was delivered twice; the tests of exactly-once read it.
        self.consumed_again = 0

    def _update(self, update: Update) -> list[Effect]:
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
                self._segments.release(effect.segment, missing_ok=True)
            elif isinstance(effect, Rename):
                self._segments.rename(effect.segment, effect.to)
            elif isinstance(effect, MarkTaken):
                self.outbox.taken(effect.held)
            elif isinstance(effect, Complete):
                self.outbox.complete(effect.lease_id, effect.held)
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
            # MakeReady: after the lock (_update); Issue: the indices go back to admit's caller.

    # -- what the book counts -------------------------------------------------------------
    def figures(self) -> BookFigures:
        """What the book counts, as one value read under the lock."""
        with self._lock:
            return self._book.figures()

    def kept(self) -> Kept:
        """What the book still keeps (epochs, tasks announced, live segments), read at once."""
        with self._lock:
            return self._book.kept()

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
        )
        self._update(Announced(task, confirmed))

    def _held_tasks(self) -> list[HeldTask]:
        with self._lock:
            return self._book.held_tasks()

    # -- sampler's side (Feed) -----------------------------------------------------------
    def forget_finished(self, before: int) -> None:
        """Drop what is kept of epochs before ``before``, which the master finished (every
        task completed) and the sampler is past (``ConsumptionBook.forget_finished``)."""
        self._update(Finished(before))

    def epoch_to_iterate(self) -> int:
        with self._lock:
            return self._book.epoch_to_iterate()

    def epochs_over(self, epoch: int) -> int | None:
        return self._master.epochs_over(epoch)

    def ledger_rows(self) -> int:
        """Rows a plain DataLoader's workers reported consumed so far (the ledger, as last
        read): they count as delivered, whether or not the loop received them."""
        return self.reports.ledger_rows

    def epoch_rows(self, epoch: int) -> int:
        """Rows ``epoch`` schedules for this consumer (its rank's queue; elastic: all of it)."""
        return self._master.epoch_records(epoch)

    def pass_rows(self, epoch: int) -> int:
        """Rows a pass over ``epoch`` delivers here: those admitted and not consumed (as
        ``reclaim`` gives them back), and the records of its tasks not admitted yet, less those
        a loaded state consumed. An upper bound where records the source skips, or tasks other
        trainers take (shared epochs), are not known yet (docs/dataset.md, "Length")."""
        self.poll()  # what workers gathered for an abandoned pass is consumed
        total = self._master.epoch_records(epoch)
        with self._lock:
            return self._book.rows_left(epoch, total)

    def remaining_seqs(self, epoch: int) -> list[int]:
        total = self._master.epoch_tasks(epoch)
        with self._lock:
            return self._book.not_admitted(epoch, total)

    def elsewhere(self, epoch: int, seqs: list[int]) -> set[int]:
        """Those of ``seqs`` (tasks the sampler waits for) that the master says will not come
        here (strays.py): then this trainer shares epochs."""
        gone = self.strays.elsewhere(epoch, seqs)
        self._update(Elsewhere(epoch, tuple(sorted(gone))))
        return gone

    def admit(self, task: ReadyTask) -> np.ndarray:
        """Number the task's segment with the next slot and start tracking its rows.

        Slots are given here, in the sampler's (seeded, timing-free) order, not on arrival:
        a batch lists its rows grouped by slot, so batches are the same from run to run.
        """
        if not self.lease_check.still_ours(task):  # lapsed while ready: not delivered here
            with self._lock:
                self._update(NotDelivered(task))
                self.strays.dropped(task)
                self.outbox.dropped(task.lease_id)
            return np.empty(0, dtype=np.int64)
        with self._lock:
            effects = self._update(Admitted(task))
            self.strays.admitted(task)
        return next(e.indices for e in effects if isinstance(e, Issue))

    def handed_out(self, indices: np.ndarray) -> None:
        """The sampler hands ``indices`` (admitted rows) out in this order (their ranks: a pass
        continued after a ``break`` goes on as the uninterrupted one would have)."""
        self._update(HandedOut(indices))

    def reclaim(self, epoch: int, *, poll: bool = True) -> np.ndarray:
        """Rows of admitted tasks that were never consumed (an earlier pass was abandoned), in
        the order the sampler handed them out.

        Rows that workers gathered for an abandoned iterator of ``shmloader.DataLoader`` but
        the loop never received are issued again (their segment is kept until then).
        ``poll``: apply the ledger first.
        """
        if poll:
            self.poll()
        with self._lock:
            rows, older = self._book.unconsumed_in_order(epoch)
            shared = self._book.shares_epochs
        if older and not shared:
            # One trainer has no strays: its last pass ran to the end without these rows.
            log.warning(
                "%d rows of an earlier epoch, whose pass ran to its end, never reached the "
                "loop; they come first in this pass. Either the loop stopped in that pass's "
                "last batches (fine), or a plain DataLoader with drop_last=True dropped them: "
                "to drop them for their epoch, pass "
                "batch_sampler=ds.batch_sampler(batch_size, drop_last=True) instead, or use "
                "shmloader.DataLoader",
                older,
            )
        return rows

    def rest_of_last_pass(self, epoch: int, *, poll: bool = True) -> np.ndarray:
        """Rows of the epoch before ``epoch`` that its pass handed out but the loop never
        consumed: it stopped in the pass's last batches, which workers had already gathered.
        They are the rest of that epoch, a pass of their own (``ConsumptionBook.last_pass``
        says which epoch, if any)."""
        with self._lock:
            last = self._book.last_pass(epoch)
        return np.empty(0, dtype=np.int64) if last is None else self.reclaim(last, poll=poll)

    def finish_epoch(self, epoch: int) -> None:
        self._update(EpochIterated(epoch))

    # -- consumption ---------------------------------------------------------------------
    def poll(self) -> int:
        """Apply what the ledger says was gathered; release and complete what is finished.
        Returns how many rows the ledger had (none unless a plain DataLoader's workers
        gather)."""
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
        with self._lock:
            return self._book.position(self._master.epoch_tasks, _grouped(also))

    def loop_state(
        self, also: np.ndarray | None = None, *, handing_over_as: str | None = None
    ) -> LoopState:
        """Where the loop stands, in one step under the lock (``saved_state`` is made of it):
        the epoch it iterates, its position (None when it shares its epochs, and the master
        holds the position) and, given this trainer's consumer id (elastic mode), the leases
        it hands over (:meth:`_held_for_handover`). ``also``: as for :meth:`position`."""
        groups = _grouped(also)
        with self._lock:
            shared = self._book.shares_epochs
            epoch = self._book.epoch_to_iterate()
            at = None if shared else self._book.position(self._master.epoch_tasks, groups)
            held = () if handing_over_as is None else self._held_for_handover()
        handover = None if handing_over_as is None else Handover(handing_over_as, held)
        return LoopState(epoch=epoch, position=at, handover=handover)

    def hand_back(self) -> dict[int, list[tuple[int, int]]]:
        """Lease id -> records consumed, of tasks the sampler took and the loop consumed part
        of (rows excluded at admit count as consumed): what a trainer leaving an elastic job
        hands back with its leases (master/handback.py), so that nobody delivers them again."""
        with self._lock:
            return {task.lease_id: records for task, records in self._book.consumed_of_held()}

    def _held_for_handover(self) -> tuple[HeldLease, ...]:
        """The leases this trainer holds whose tasks the loop consumed part of, or all of while
        the master may not know it yet (the completion is queued), with the records consumed:
        what an elastic trainer's checkpoint names, for the trainer resumed from it to hand
        back (handover.py). Under the lock, both lists at once: a slot completing meanwhile is
        in one or the other."""
        held = self._book.consumed_of_held()
        held += [(s.task, [s.task.records()]) for s in self.outbox.unconfirmed()]
        return tuple(HeldLease(t.lease_id, t.epoch, t.task_id, tuple(r)) for t, r in held if r)

    def held_leases(self) -> list[int]:
        """Leases of announced tasks not yet completed: the trainer keeps renewing them."""
        with self._lock:
            held = self._book.held_leases()
        return held + [t.lease_id for t in self.ready.pending()]


def _grouped(also: np.ndarray | None) -> list[SegmentRows]:
    """Sample indices to count as consumed in a position (``also``), grouped by segment."""
    return group_by_segment(also) if also is not None and len(also) else []
