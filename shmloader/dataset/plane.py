"""The trainer's side of the data plane: slots, consumption, release and completion.

Readers announce finished tasks; the plane numbers each one with a *slot* (the segment is
renamed after it, so a DataLoader worker can open it from the sample index alone), hands it
to the sampler, learns from the gather ledger which rows have been copied out, releases a
segment once all its rows are, and completes the task at the master when its rows are
consumed: when gathered, or, under ``shmloader.DataLoader``, when the loop received them.

What it tells the master goes through its outbox (outbox.py), sent outside the plane's lock;
what the sampler waits for that is not here, through ``awaited`` (awaited.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

import numpy as np

from ..errors import ShmloaderError
from ..master.tasks import merge_ranges
from . import plane_state as known
from .awaited import Awaited, StrayCount
from .consumed import Ranges, rows_in
from .gather import SegmentRows, encode_indices, group_by_segment
from .handover import HeldLease, RecordRanges
from .lease_check import LeaseCheck
from .ledger import LedgerReader
from .outbox import Outbox
from .plane_state import EpochState, LeaseOps, SegmentOps, SlotState, slot_name
from .ready import ReadyTask, ReadyTasks

log = logging.getLogger(__name__)


class DataPlane:
    """Implements the sampler's ``Feed``; all methods are thread-safe."""

    def __init__(
        self,
        *,
        master: LeaseOps,
        segments: SegmentOps,
        ledger: LedgerReader,
        complete_on_delivery: bool = False,
        starved: Callable[[], bool] | None = None,
        blocked: Callable[[], bool] | None = None,  # a wanted task's reader has no room
        exclude: Callable[[int, int], np.ndarray | None] | None = None,
        start_epoch: int = 0,
        prior: Ranges | None = None,
        done_before: frozenset[tuple[int, int]] = frozenset(),
        partial_before: Mapping[int, np.ndarray] | None = None,  # seq -> rows, start_epoch's
        # Records a crashed trainer's loop consumed of tasks (epoch, task id), whose leases this
        # one took over from its checkpoint (handover.py): left out of any copy that comes here.
        taken_over: Mapping[tuple[int, int], RecordRanges] | None = None,
        consumer: str | None = None,  # this trainer's consumer id at the master
        lease_timeout: float | None = None,  # the master's: check ready tasks' leases
    ) -> None:
        self.ready = ReadyTasks()
        self._master = master
        self._segments = segments
        self._ledger = ledger
        self._complete_on_delivery = complete_on_delivery
        self._starved = starved or (lambda: False)
        self._blocked = blocked or (lambda: False)
        self._exclude = exclude or (lambda epoch, task_id: None)
        self._taken_over = dict(taken_over or {})
        self._lock = threading.RLock()
        self._poll_lock = threading.Lock()  # taken before _lock, never inside it
        # True while shmloader.DataLoader's loop waits for its next batch: rows the trainer
        # gathers then are consumed once the loop receives them (``delivered``). Rows gathered
        # otherwise are a plain DataLoader's, consumed as gathered (see ``gathered``).
        self.loop_receives = False
        # The batch the trainer gathered last for the loop, and its groups, until the loop
        # receives it (see gathered / delivered).
        self._grouped: tuple[np.ndarray | None, list[SegmentRows]] = (None, [])
        # Slot 0 is never used: every index a sampler hands out (slot << 32 | row) is then at
        # least 2**32, never a record number (SharedTaskDataset.__getitem__).
        self._next_slot = 1
        self._ledger_rows = 0  # rows a plain DataLoader's workers reported gathered, in all
        self._handed_out = 0  # rows the sampler handed out so far (their ranks, see reclaim)
        self._slots: dict[int, SlotState] = {}
        self._epochs: dict[int, EpochState] = {}
        self._iter_epoch = start_epoch
        self._start_epoch = start_epoch
        # Records of ``start_epoch`` consumed before a resume (not scheduled again here).
        self._prior: Ranges = dict(prior or {})
        # Tasks a loaded state consumed whole: done at a standalone master, not elsewhere.
        self._done_before = done_before
        for epoch, seq in done_before:
            self._epoch(epoch).completed.add(seq)
        # Rows it consumed of tasks it consumed part of: in checkpoints until admitted.
        self._partial_before = dict(partial_before or {})
        # Records a loaded state consumed, by epoch, of tasks not admitted yet (pass_rows).
        self._before: dict[int, int] = {}
        self._announced: set[tuple[int, int]] = set()
        self._forgotten = 0  # epochs before this are finished and forgotten (forget_finished)
        self.awaited = Awaited(master, segments, self.ready)
        # Whether some task of an epoch went to another consumer, or was done before this
        # trainer started: then what this trainer consumed is not the epoch's position.
        self.shares_epochs = False
        self.consumed_records = 0
        self.skipped_records = 0  # what sources left out of the tasks consumed (on_error)
        self.duplicates = 0
        self.outbox = Outbox(
            master,
            consumer,
            slot_states=self._slot_states,
            ready=self.ready.pending,
            on_delivery=lambda: self._complete_on_delivery,
        )
        self.regranted = self.outbox.regranted  # leases lapsed and handed to another trainer
        self.lease_check = LeaseCheck(master, lease_timeout, consumer)
        self.wait_seconds = 0.0  # how long the training loop waited for batches
        self.batches_delivered = 0

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
    ) -> None:
        """A reader sealed ``segment`` for a task: make it ready for the sampler.
        ``consumed``: records of it that earlier holders consumed (not issued again).

        A task announced twice (its lease lapsed while we held it and another reader read it
        again) is delivered once: the second copy is dropped and its lease completed; so is
        any copy of a task of a forgotten epoch (``forget_finished``: the master finished it).
        """
        with self._lock:
            if (epoch, seq) in self._announced or epoch < self._forgotten:
                self.duplicates += 1
                self._segments.release(segment, missing_ok=True)
                self.outbox.complete(lease_id)
                return
            self._announced.add((epoch, seq))
        before = self._taken_over.get((epoch, task_id))
        if before:
            consumed = tuple(merge_ranges([*consumed, *before]))
        task = ReadyTask(
            epoch, seq, task_id, segment, num_rows, lease_id, start, stop, skipped, consumed, path
        )
        self.lease_check.announced(task, confirmed)
        self.ready.put(task)

    def flush_completions(self) -> None:
        """Tell the master about taken and consumed tasks (outside the lock: outbox.py)."""
        self.outbox.flush()

    def lapsed(self, problems: dict[int, str], what: str = "renewing lease %d: %s") -> None:
        """The master says these leases are not active (the renew cycle's answer): outbox.py."""
        self.outbox.lapsed(problems, what)

    def _slot_states(self) -> list[SlotState]:
        with self._lock:
            return list(self._slots.values())

    # -- sampler's side (Feed) -----------------------------------------------------------
    def _epoch(self, epoch: int) -> EpochState:
        return self._epochs.setdefault(epoch, EpochState())

    def forget_finished(self, before: int) -> None:
        """Drop what is kept of epochs before ``before``, which the master finished (every
        task completed) and the sampler is past: no lease of them can come any more, and a
        long run's memory stays flat (kept, it would grow with every task of every epoch)."""
        with self._lock:
            limit = self._forgotten = max(self._forgotten, min(before, self._iter_epoch))
            self.outbox.forget_before(limit, [s.task.lease_id for s in self._slots.values()])
            for e in [e for e in self._epochs if e < limit]:
                if not any(slot in self._slots for slot in self._epochs[e].slots):
                    del self._epochs[e]
            if any(e < limit for e, _ in self._announced):
                self._announced = {
                    (e, s) for e, s in self._announced if e >= limit or e in self._epochs
                }

    def epoch_to_iterate(self) -> int:
        with self._lock:
            return self._iter_epoch

    def epochs_over(self, epoch: int) -> int | None:
        return self._master.epochs_over(epoch)

    def ledger_rows(self) -> int:
        """Rows a plain DataLoader's workers reported gathered so far (the ledger, as last
        polled): they count as delivered, whether or not the loop received them."""
        return self._ledger_rows

    def epoch_rows(self, epoch: int) -> int:
        return self._master.epoch_records(epoch)

    def resumed_before(self, epoch: int, records: int) -> None:
        """A loaded state consumed ``records`` of ``epoch``, left out as admitted (pass_rows)."""
        with self._lock:
            self._before[epoch] = records

    def pass_rows(self, epoch: int) -> int:
        """Rows a pass over ``epoch`` delivers here: those admitted and not consumed (as
        ``reclaim`` gives them back), and the records of its tasks not admitted yet, less those
        a loaded state consumed. An upper bound where records the source skips, or tasks other
        trainers take (shared epochs), are not known yet (docs/dataset.md, "Length")."""
        self.poll()  # what workers gathered for an abandoned pass is consumed
        total, on_delivery = self._master.epoch_records(epoch), self._complete_on_delivery
        with self._lock:
            st = self._epochs.get(epoch)
            left = total - (0 if st is None else st.records) - self._before.get(epoch, 0)
            held = known.unconsumed_rows(self._epochs, self._slots, epoch, on_delivery)
        return max(0, left) + held

    def remaining_seqs(self, epoch: int) -> list[int]:
        total = self._master.epoch_tasks(epoch)
        with self._lock:
            admitted = self._epoch(epoch).admitted
            return [s for s in range(total) if s not in admitted]

    def elsewhere(self, epoch: int, seqs: list[int]) -> set[int]:
        """Those of ``seqs`` (tasks the sampler waits for) that the master says will not come
        here (awaited.py): then this trainer shares epochs."""
        gone = self.awaited.elsewhere(epoch, seqs)
        if any((epoch, s) not in self._done_before for s in gone):
            with self._lock:
                self.shares_epochs = True
        return gone

    def look_at_strays(self) -> StrayCount:
        return self.awaited.look()

    def want_strays(self) -> None:
        self.awaited.want_strays()

    def completes_on_delivery(self) -> bool:
        return self._complete_on_delivery

    def take_strays(self) -> list[ReadyTask]:
        return self.awaited.take_strays()

    def admit(self, task: ReadyTask) -> np.ndarray:
        """Number the task's segment with the next slot and start tracking its rows.

        Slots are given here, in the sampler's (seeded, timing-free) order, not on arrival:
        a batch lists its rows grouped by slot, so batches are the same from run to run.
        """
        if not self.lease_check.still_ours(task):  # lapsed while ready: not delivered here
            with self._lock:
                self._announced.discard((task.epoch, task.seq))  # a new copy is welcome
                self.awaited.dropped(task)
                self.outbox.dropped(task.lease_id)
            self._segments.release(task.segment, missing_ok=True)
            return np.empty(0, dtype=np.int64)
        rows = np.arange(task.num_rows, dtype=np.int64)
        done = self._exclude(task.epoch, task.seq)
        if done is not None and len(done):
            rows = np.setdiff1d(rows, done)
        first, stop = task.records()
        # What a loaded state consumed of it (pass_rows): all of a task not read again ("").
        before = stop - first if not task.segment else 0 if done is None else len(done)
        if task.consumed and task.num_rows:  # handed back by a trainer that left
            rows = np.setdiff1d(rows, rows_in(task.consumed, task))
        with self._lock:
            slot = self._next_slot
            self._next_slot += 1
            if task.segment:  # "": a task consumed before a resume, not read again
                self._segments.rename(task.segment, slot_name(slot))
            state = SlotState(task, slot, has_segment=bool(task.segment))
            self._slots[slot] = state
            state.emit = rows
            state.gathered = np.zeros(task.num_rows, dtype=bool)
            state.delivered = np.zeros(task.num_rows, dtype=bool)
            self.awaited.admitted(task)
            ep = self._epoch(task.epoch)
            ep.admitted.add(task.seq)
            ep.slots.append(slot)
            ep.records += stop - first
            if task.epoch in self._before:
                self._before[task.epoch] = max(0, self._before[task.epoch] - before)
            self.outbox.taken(state)
            if len(rows) == 0:
                self._settle(state)
        return encode_indices(slot, rows)

    def handed_out(self, indices: np.ndarray) -> None:
        """The sampler hands ``indices`` (admitted rows) out in this order: rank them, so that
        ``reclaim`` gives back those left unconsumed in the same order (a pass continued after
        a ``break`` goes on as the uninterrupted one would have)."""
        with self._lock:
            self._handed_out = known.rank_rows(self._slots, indices, self._handed_out)

    def reclaim(self, epoch: int, *, poll: bool = True) -> np.ndarray:
        """Rows of admitted tasks that were never consumed (an earlier pass was abandoned), in
        the order the sampler handed them out.

        Consumed means gathered, or under ``complete_on_delivery`` delivered: rows that workers
        gathered for an abandoned iterator but the loop never received are issued again (their
        segment is kept until then, see ``_settle``). ``poll``: apply the ledger first.
        """
        if poll:
            self.poll()
        with self._lock:
            # Older epochs too: a stray task of one (see ``take_strays``) is delivered in a
            # later pass, and may be left unconsumed by it.
            on_delivery = self._complete_on_delivery
            rows, older = known.unconsumed_in_order(self._epochs, self._slots, epoch, on_delivery)
            shared = self.shares_epochs
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
        They are the rest of that epoch, a pass of their own, so the next pass is a whole
        epoch again. Empty when trainers share epochs: there, rows of older epochs (strays)
        come first in the current pass (``reclaim``)."""
        if epoch == 0 or self.shares_epochs:
            return np.empty(0, dtype=np.int64)
        return self.reclaim(epoch - 1, poll=poll)

    def starved(self) -> bool:
        return self._starved()

    def want(self, epoch: int, seqs: list[int]) -> None:
        self.awaited.want(epoch, seqs)

    def finish_epoch(self, epoch: int) -> None:
        with self._lock:
            self._epoch(epoch).iterated = True
            self._iter_epoch = max(self._iter_epoch, epoch + 1)

    # -- consumption ---------------------------------------------------------------------
    def poll(self) -> int:
        """Apply what the ledger says was gathered; release and complete what is finished.
        Returns how many rows the ledger had (none unless a plain DataLoader's workers
        gather)."""
        # The maintenance thread and the sampler (reclaim) both poll; the ledger reader keeps
        # offsets and deletes finished files, so one at a time.
        with self._poll_lock:
            gathered = self._ledger.poll()
            self._ledger_rows += len(gathered)
            if len(gathered):
                # Only a plain DataLoader's workers write the ledger (shmloader.DataLoader's
                # write none), and for it a gathered row is consumed: delivered as well, so
                # that under ``complete_on_delivery`` too its tasks complete.
                self._mark_groups(group_by_segment(gathered), gathered=True, delivered=True)
        self.flush_completions()
        return len(gathered)

    def gathered(self, indices: np.ndarray, groups: list[SegmentRows] | None = None) -> None:
        """The trainer itself gathered these samples (``num_workers=0``: no ledger needed).

        ``groups``: ``indices`` grouped by segment already (by the gather).

        While ``loop_receives`` (shmloader.DataLoader's loop receives this batch next), they
        are only kept: :meth:`delivered` marks them gathered and delivered in one pass over
        the batch's segments. A batch the loop never receives (an exception in between) is
        then neither, and its rows come again like any unconsumed row (gathered but not
        delivered, they would too: ``complete_on_delivery``).

        Otherwise a plain DataLoader gathered them, and for it gathered is consumed: they are
        marked delivered too. Else a plain loader used after a shmloader.DataLoader over the
        same dataset (which turns ``complete_on_delivery`` on) never completed a task, and the
        next pass delivered its rows again.
        """
        if groups is None:
            groups = group_by_segment(indices)
        if self.loop_receives:
            self._grouped = (indices, groups)
            return
        self._grouped = (None, [])
        self._mark_groups(groups, gathered=True, delivered=True)

    def record_wait(self, seconds: float) -> None:
        """The loop waited ``seconds`` for its next batch (``shmloader.DataLoader`` only)."""
        with self._lock:
            self.wait_seconds += seconds
            self.batches_delivered += 1

    def delivered(self, indices: np.ndarray, *, gathered: bool = False) -> None:
        """The training loop received these samples (``shmloader.DataLoader`` only).

        ``gathered``: also mark them gathered, for batches of DataLoader workers that write no
        ledger (``shmloader.DataLoader``'s: every row the loop receives was gathered, so the
        ledger would only say it again, later). The batch the trainer gathered last
        (:meth:`gathered`) is marked gathered here in any case.
        """
        last, groups = self._grouped
        self._grouped = (None, [])
        if last is not None and (indices is last or np.array_equal(indices, last)):
            gathered = True
        else:
            idx = np.asarray(indices, dtype=np.int64)
            if not len(idx):
                return
            groups = group_by_segment(idx)
        self._mark_groups(groups, gathered=gathered, delivered=True)

    def blocked(self) -> bool:
        """Whether a reader of a task the sampler waits for has no room (shm/hints.py)."""
        return self._blocked()

    def pinned(self, held: int) -> bool:
        """Blocked, and the ``held`` rows a batcher holds are all that is not consumed: only
        letting those go can make room (TaskBatchSampler)."""
        return self._blocked() and self.unconsumed_rows() == held

    def dead_end(self) -> bool:
        """Blocked, and no row handed out is left to consume that could make room."""
        return self.pinned(0)

    def unconsumed_rows(self) -> int:
        """Rows the sampler handed out (admitted) and not consumed yet: in flight to the loop,
        or held by a batcher. Their segments cannot go until they are."""
        with self._lock:
            n = 0
            for state in self._slots.values():
                if state.emit is not None and not state.completed:
                    done = state.n_delivered if self._complete_on_delivery else state.n_gathered
                    n += len(state.emit) - done
            return n

    def dropped(self, indices: np.ndarray) -> None:
        """A batcher dropped these rows for their epoch (``drop_last``): consumed, as if
        gathered and delivered, so their tasks complete and their segments go."""
        idx = np.asarray(indices, dtype=np.int64)
        if len(idx):
            self._mark_groups(group_by_segment(idx), gathered=True, delivered=True)

    def _mark_groups(
        self, groups: list[SegmentRows], *, gathered: bool, delivered: bool = False
    ) -> None:
        """Flag the rows gathered and/or delivered; settle each slot."""
        with self._lock:
            for group in groups:
                state = self._slots.get(group.slot)
                if state is None and group.slot < self._next_slot:
                    continue  # settled already (a row gathered twice after an abandoned pass)
                if state is None or state.gathered is None or state.delivered is None:
                    raise ShmloaderError(
                        f"sample index names slot {group.slot}, which is not admitted"
                    )
                # A recount, not a count of fresh rows: exact if a row repeats, and a vectorised
                # count over one segment's flags costs less than deduplicating the rows.
                if delivered:
                    state.delivered[group.rows] = True
                    state.n_delivered = int(np.count_nonzero(state.delivered))
                if gathered:
                    state.gathered[group.rows] = True
                    state.n_gathered = int(np.count_nonzero(state.gathered))
                self._settle(state)

    def _settle(self, state: SlotState) -> None:
        assert state.emit is not None and state.gathered is not None
        assert state.delivered is not None
        # Under complete_on_delivery the segment stays until the loop has every row: rows
        # gathered for an abandoned iterator are gathered again by the next pass.
        need = len(state.emit)
        unused = state.n_gathered >= need and (
            not self._complete_on_delivery or state.n_delivered >= need
        )
        if not state.released and unused:
            if state.has_segment:
                self._segments.release(slot_name(state.slot), missing_ok=True)
            state.released = True
        consumed = state.n_delivered if self._complete_on_delivery else state.n_gathered
        if not state.completed and consumed >= need:
            self.outbox.complete(state.task.lease_id, state)
            state.completed = True
            self.consumed_records += len(state.emit)
            self.skipped_records += len(state.task.skipped)
            ep = self._epoch(state.task.epoch)
            ep.completed.add(state.task.seq)
            ep.consumed.append((state.task.task_id, *state.task.records()))
        if state.released and state.completed:
            del self._slots[state.slot]

    def set_complete_on_delivery(self, value: bool) -> None:
        with self._lock:
            self._complete_on_delivery = value

    def position(self) -> tuple[int, list[int], dict[int, list[int]]]:
        """(epoch, consumed task positions, consumed rows of partly consumed tasks)."""
        return self.checkpoint()[:3]

    def checkpoint(self) -> tuple[int, list[int], dict[int, list[int]], Ranges]:
        """What checkpoints store, for the first epoch not wholly consumed: (epoch, consumed
        task positions, consumed rows of partly consumed tasks by position, consumed record
        ranges by task id). Rows excluded on a resume count as consumed."""
        with self._lock:
            epoch = min(
                (e for e, st in self._epochs.items() if len(st.completed) < self._tasks(e)),
                default=self._iter_epoch,
            )
            resumed = epoch == self._start_epoch
            prior = self._prior if resumed else {}
            st, on_delivery = self._epoch(epoch), self._complete_on_delivery
            pending = self._partial_before if resumed else {}
            return epoch, *known.epoch_consumed(st, self._slots, prior, on_delivery, pending)

    def hand_back(self) -> dict[int, list[tuple[int, int]]]:
        """Lease id -> records consumed, of tasks the sampler took and the loop consumed part
        of (rows excluded at admit count as consumed): what a trainer leaving an elastic job
        hands back with its leases (master/handback.py), so that nobody delivers them again."""
        with self._lock:
            parts = known.partly_consumed(self._slots.values(), self._complete_on_delivery)
            return {state.task.lease_id: state.records_of(rows) for state, rows in parts}

    def held_for_handover(self) -> tuple[HeldLease, ...]:
        """The leases this trainer holds whose tasks the loop consumed part of, or all of while
        the master may not know it yet (the completion is queued), with the records consumed:
        what an elastic trainer's checkpoint names, for the trainer resumed from it to hand
        back (handover.py)."""
        with self._lock:  # both under it: a slot completing meanwhile is in one list or the other
            parts = known.partly_consumed(self._slots.values(), self._complete_on_delivery)
            held = [(s.task, s.records_of(rows)) for s, rows in parts]
            held += [(s.task, [s.task.records()]) for s in self.outbox.unconfirmed()]
        return tuple(HeldLease(t.lease_id, t.epoch, t.task_id, tuple(r)) for t, r in held if r)

    def _tasks(self, epoch: int) -> int:
        return self._master.epoch_tasks(epoch)

    def held_leases(self) -> list[int]:
        """Leases of announced tasks not yet completed: the trainer keeps renewing them."""
        with self._lock:
            held = [s.task.lease_id for s in self._slots.values() if not s.completed]
        return held + [t.lease_id for t in self.ready.pending()]

    def live_segments(self) -> list[str]:
        with self._lock:
            return [slot_name(s) for s, st in self._slots.items() if not st.released]
