"""Consumption accounting: which rows of which task this trainer has consumed, and what follows.

This is where the trainer decides exactly-once (docs/architecture.md). :class:`ConsumptionBook`
is a pure state machine, as the master's dispatcher is: each change (a task announced, a task
admitted into the sampler, rows gathered or consumed, a finished epoch forgotten) is an update
value given to :meth:`ConsumptionBook.apply`, which returns the *effects* it calls for, as values
(updates.py: make a task ready, issue its rows, release or rename a segment, mark a lease taken
or complete it). It holds no lock, starts no thread, does no I/O and imports no torch; the data
plane (plane.py) is the shell that holds the lock, applies updates and carries the effects out
against the store, the ready board and the master.

Per row of an admitted task it keeps two flags:

- *gathered*: a process copied the row out of the segment. The segment can go once every row
  to deliver is gathered and consumed (no batch reads it any more).
- *consumed*: the row counts as delivered for its epoch. The task is completed at the master once
  every row to deliver is consumed, checkpoints store the consumed rows, and a pass left early
  gives back the rest (``unconsumed_in_order``).

Who reports what differs by loader, not by a mode of the book: each batch carries its
``Receipt`` (order/delivery.py), and the one ``Reporter`` (reports.py) turns every report into a
``Reported`` update.

NOTE [exactly once on the trainer side]
---------------------------------------
Each invariant below is kept in one place; the other places that touch it point here.

1. *A row goes out once.* A task announced twice (its lease lapsed, another reader read it
   again) is made ready once and the second copy dropped (``_announce``); an admitted task's
   rows are issued once, under one new slot (``_admit``); a row reported consumed after its
   task completed was delivered twice, and the book says so (``ConsumedAgain``) instead of
   ignoring it.
2. *A row counts once the loop has it, not before.* What "has it" means is the batch's
   ``Receipt``, chosen as each pass begins (order/delivery.py): ``shmloader.DataLoader``
   reports after its transform returned (loader.py), torch's requests report for a plain
   DataLoader with workers, a gather in the loop's own thread reports itself. The one early
   count, rows a batch sampler must count before they arrive because the budget cannot hold
   the batches in flight, is a report like the others (``Reporter.counted_early``), warned once
   (order/batch_sampler.py). The book alone turns reports into consumption (``_report``).
3. *A task completes once, when every row to deliver is consumed; its segment goes when no
   batch reads it any more* (``_release_and_complete``: gathered and consumed). Completions
   leave through the outbox, outside the plane's lock (outbox.py); the master completes a late
   one without counting it twice (``Dispatcher``).
4. *What others consumed is left out.* A loaded state's rows (``ResumePoint``, at ``_admit``),
   rows a leaving trainer handed back (``task.consumed``, at ``_admit``), and the records a
   crashed trainer's loop consumed of a task this one took over (``taken_over``, at
   ``_announce``).
5. *A ready copy whose lease lapsed is not delivered here* (another trainer may deliver it):
   the lease check asks the master (waiting/lease_check.py), the book applies ``NotDelivered``
   under the plane's lock.
6. *A pass left early gives its rest back, in order*: ``unconsumed_in_order``; which epoch's rest
   makes a pass of its own is ``last_pass``.
7. *A checkpoint is one snapshot*: the position and the leases handed over are read in one hold
   of the plane's lock (``DataPlane.loop_state``), with the rows counted as the book has them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ...errors import ShmloaderError
from ...master.tasks import merge_ranges
from ..core.indices import SegmentRows, encode_indices, slot_name, split_indices
from ..core.record_ranges import Ranges, row_records, rows_in, to_ranges, union
from ..core.tasks import ReadyTask
from ..resume.checkpoint import FRESH_START, Position, ResumePoint
from ..resume.handover import RecordRanges
from .updates import (
    Admitted,
    AdmittedTask,
    Announced,
    Complete,
    ConsumedAgain,
    Effect,
    Elsewhere,
    EpochIterated,
    Finished,
    Forgotten,
    HandedOut,
    Issue,
    MakeReady,
    MarkTaken,
    NotDelivered,
    Release,
    Rename,
    Reported,
    Undelivered,
    Update,
)

UNRANKED = np.iinfo(np.int64).max  # the rank of a row never handed out (SlotState.ranks_of)


# -- what the book keeps ---------------------------------------------------------------------
@dataclass(eq=False)
class SlotState:
    """One admitted task: its segment's slot, and where each of its rows stands."""

    task: ReadyTask
    slot: int
    # Rows to deliver (all but those consumed before a resume or by an earlier holder).
    to_deliver: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    gathered: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=bool))  # per row
    consumed: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=bool))  # per row
    # How many rows are flagged: release and completion compare counts, not masks.
    n_gathered: int = 0
    n_consumed: int = 0
    # Where each row stands in the order the sampler handed rows out (-1: not handed out): a
    # pass left early resumes the rest in that order.
    rank: np.ndarray | None = None
    released: bool = False
    completed: bool = False
    has_segment: bool = True

    def admitted(self) -> AdmittedTask:
        """This slot's task and counts, as a value (see :class:`AdmittedTask`)."""
        return AdmittedTask(
            self.task, len(self.to_deliver), min(len(self.to_deliver), self.n_consumed)
        )

    def consumed_rows(self, also: np.ndarray | None = None) -> np.ndarray:
        """Rows consumed, or left out when admitted (consumed before a resume, or by an earlier
        holder), and ``also`` (rows to count as consumed too): sorted."""
        done = self.consumed.copy()
        if also is not None:
            done[also] = True
        excluded = np.ones(len(done), dtype=bool)
        excluded[self.to_deliver] = False
        return np.flatnonzero(done | excluded)

    def unconsumed(self) -> np.ndarray:
        """Rows to deliver not consumed yet (none once released): what a pass left early gives
        back, and what the next pass delivers of this task."""
        if self.released:
            return np.empty(0, dtype=np.int64)
        return self.to_deliver[~self.consumed[self.to_deliver]]

    def ranks_of(self, rows: np.ndarray) -> np.ndarray:
        """Where ``rows`` stand in the sampler's order (rows never handed out: last)."""
        if self.rank is None:
            return np.full(len(rows), UNRANKED, dtype=np.int64)
        ranks = self.rank[rows]
        return np.where(ranks < 0, UNRANKED, ranks)

    def records_of(self, rows: np.ndarray) -> list[tuple[int, int]]:
        """The record ranges of sorted ``rows`` of the task's segment."""
        task = self.task
        return to_ranges(row_records(*task.records(), task.skipped, task.num_rows)[rows])


@dataclass
class EpochState:
    admitted: set[int] = field(default_factory=set)  # seqs
    slots: list[int] = field(default_factory=list)
    records: int = 0  # records of the tasks admitted (their units' spans, skipped ones too)
    iterated: bool = False  # the sampler yielded everything
    completed: set[int] = field(default_factory=set)  # seqs consumed
    consumed: list[tuple[int, int, int]] = field(default_factory=list)  # (task, start, stop)


class ConsumptionBook:
    """The trainer's consumption accounting (see the module docstring). Not thread-safe: the
    data plane calls it under its lock.

    ``start_epoch``: the first epoch this trainer iterates. ``resume``: where a loaded state
    left the job; what it consumed counts as consumed here (left out when its tasks are
    admitted, and kept in checkpoints) if this trainer starts in its epoch (a standalone
    master may be past it).
    """

    def __init__(
        self,
        *,
        start_epoch: int = 0,
        resume: ResumePoint = FRESH_START,
        taken_over: Mapping[tuple[int, int], RecordRanges] | None = None,
    ) -> None:
        here = start_epoch == resume.epoch
        # Records a crashed trainer's loop consumed of tasks (epoch, task id), whose leases
        # this one took over from its checkpoint (handover.py): left out of any copy here.
        self._taken_over = dict(taken_over or {})
        self._slots: dict[int, SlotState] = {}
        self._epochs: dict[int, EpochState] = {}
        self._announced: set[tuple[int, int]] = set()
        # Slot 0 is never used: every index a sampler hands out (slot << 32 | row) is then at
        # least 2**32, never a record number (SharedTaskDataset.__getitem__).
        self._next_slot = 1
        self._handed_out = 0  # rows the sampler handed out so far (their ranks)
        self._iter_epoch = start_epoch
        self._start_epoch = start_epoch
        self._resume = resume
        # Records of the start epoch consumed before the resume (kept in checkpoints).
        self._prior: Ranges = dict(resume.consumed or {}) if here else {}
        # Tasks a loaded state consumed whole: done at a standalone master, not elsewhere.
        self._done_before = resume.skip_tasks() if here else frozenset()
        for epoch, seq in self._done_before:
            self._epoch(epoch).completed.add(seq)
        # Rows it consumed of tasks it consumed part of: in checkpoints until admitted.
        self._partial_before = dict(resume.partial) if here else {}
        # Records a loaded state consumed, by epoch, of tasks not admitted yet (rows_left).
        self._before: dict[int, int] = {}
        if resume.finished:  # saved after the last epoch: the sampler is past it
            self._iterated(resume.epoch)
        elif resume.by_position:
            self._before[resume.epoch] = resume.consumed_records
        self._forgotten = 0  # epochs before this are finished and forgotten
        # Whether some task of an epoch went to another consumer, or was done before this
        # trainer started: then what this trainer consumed is not the epoch's position.
        self.shares_epochs = False
        self.consumed_rows = 0  # rows consumed since the start, counted as they are consumed
        self.consumed_bytes = 0.0  # what they weigh: each row its segment's share of its size
        self.consumed_records = 0  # rows of the tasks completed (all their rows consumed)
        self.skipped_records = 0  # what sources left out of the tasks consumed (on_error)
        self.duplicates = 0

    def _epoch(self, epoch: int) -> EpochState:
        return self._epochs.setdefault(epoch, EpochState())

    def apply(self, update: Update) -> list[Effect]:
        """The only way the book changes: apply ``update`` (updates.py) and return what it
        calls for. Everything else the book offers is a question that changes nothing."""
        match update:
            case Announced(task, confirmed):
                return self._announce(task, confirmed)
            case NotDelivered(task):
                return self._not_delivered(task)
            case Admitted(task):
                return self._admit(task)
            case HandedOut(indices):
                self._handed_out = rank_rows(self._slots, indices, self._handed_out)
                return []
            case Reported(groups, gathered, consumed, only_gathered):
                return self._report(groups, gathered, consumed, only_gathered)
            case EpochIterated(epoch):
                self._iterated(epoch)
                return []
            case Elsewhere(epoch, seqs):
                self._elsewhere(epoch, seqs)
                return []
            case Finished(before):
                return [Forgotten(self._forget_finished(before), tuple(self.admitted_leases()))]
        raise TypeError(f"not an update of the consumption book: {update!r}")

    # -- readers' side -------------------------------------------------------------------
    def _announce(self, task: ReadyTask, confirmed: float | None) -> list[Effect]:
        """A reader sealed ``task``'s segment: make it ready (with the records a crashed
        trainer whose leases this one took over consumed of it left out). Else the copy is
        dropped (its segment released, its lease completed): a task announced twice (its lease
        lapsed while held here and another reader read it again) is delivered once, and a task
        of a forgotten epoch (the master finished it) not at all."""
        key = (task.epoch, task.seq)
        if key in self._announced or task.epoch < self._forgotten:
            self.duplicates += 1
            return [Release(task.segment, task.cache_key), Complete(task.lease_id)]
        self._announced.add(key)
        before = self._taken_over.get((task.epoch, task.task_id))
        if before:
            task = replace(task, consumed=tuple(merge_ranges([*task.consumed, *before])))
        return [MakeReady(task, confirmed)]

    def _not_delivered(self, task: ReadyTask) -> list[Effect]:
        """A ready copy is not delivered here (its lease lapsed before the sampler took it): a
        new copy of the task is welcome."""
        self._announced.discard((task.epoch, task.seq))
        released = [Release(task.segment, task.cache_key)] if task.segment else []
        return [Undelivered(task), *released]

    # -- the sampler's side --------------------------------------------------------------
    def _admit(self, task: ReadyTask) -> list[Effect]:
        """Number ``task`` with the next slot and start keeping its rows; the effects begin
        with the :class:`Issue` of the sample indices of the rows to deliver.

        Rows a loaded state consumed are left out (not delivered again), and so are those that
        earlier holders handed back (``task.consumed``). A task with nothing left to deliver
        is completed at once.
        """
        excluded = self._resume.excluded(task.epoch, task.seq)
        rows = np.arange(task.num_rows, dtype=np.int64)
        if excluded is not None and len(excluded):
            rows = np.setdiff1d(rows, excluded)
        first, stop = task.records()
        # What a loaded state consumed of it (rows_left): all of a task not read again ("").
        before = stop - first if not task.segment else 0 if excluded is None else len(excluded)
        if task.consumed and task.num_rows:  # handed back by a trainer that left
            rows = np.setdiff1d(rows, rows_in(task.consumed, task))
        slot = self._next_slot
        self._next_slot += 1
        effects: list[Effect] = [Issue(encode_indices(slot, rows))]
        if task.segment:  # "": a task consumed before a resume, not read again
            effects.append(Rename(task.segment, slot_name(slot)))
        state = SlotState(
            task,
            slot,
            to_deliver=rows,
            gathered=np.zeros(task.num_rows, dtype=bool),
            consumed=np.zeros(task.num_rows, dtype=bool),
            has_segment=bool(task.segment),
        )
        self._slots[slot] = state
        ep = self._epoch(task.epoch)
        ep.admitted.add(task.seq)
        ep.slots.append(slot)
        ep.records += stop - first
        if task.epoch in self._before:
            self._before[task.epoch] = max(0, self._before[task.epoch] - before)
        effects.append(MarkTaken(state.admitted()))
        if len(rows) == 0:
            effects += self._release_and_complete(state)
        return effects

    def _iterated(self, epoch: int) -> None:
        """The sampler yielded every row of ``epoch``: the next pass is over the next one."""
        self._epoch(epoch).iterated = True
        self._iter_epoch = max(self._iter_epoch, epoch + 1)

    def epoch_to_iterate(self) -> int:
        return self._iter_epoch

    def _elsewhere(self, epoch: int, seqs: Iterable[int]) -> None:
        """The master says tasks ``seqs`` of ``epoch`` will not come here: unless a loaded
        state consumed them, this trainer shares epochs with others."""
        if any((epoch, s) not in self._done_before for s in seqs):
            self.shares_epochs = True

    # -- consumption ---------------------------------------------------------------------
    def _report(
        self,
        groups: Sequence[SegmentRows],
        gathered: bool,
        consumed: bool,
        only_gathered: bool,
    ) -> list[Effect]:
        """Rows were gathered and/or consumed (see the module docstring); for each slot,
        release a segment nothing reads any more, complete a task wholly consumed.
        ``only_gathered``: of the rows, consume those gathered already (a plain DataLoader's
        loop received their batch, delivery.py; a row a worker failed to gather is not)."""
        effects: list[Effect] = []
        for group in groups:
            state = self._slots.get(group.slot)
            if state is None and group.slot < self._next_slot:
                # Released and completed already. Gathered again is fine (a batch of a pass left
                # early, read from a view before the release); consumed again is a row delivered
                # twice.
                if consumed:
                    effects.append(ConsumedAgain(group.slot, len(group.rows)))
                continue
            if state is None:
                raise ShmloaderError(f"sample index names slot {group.slot}, which is not admitted")
            # A recount, not a count of fresh rows: exact if a row repeats, and a vectorised
            # count over one segment's flags costs less than deduplicating the rows.
            if consumed:
                rows = group.rows[state.gathered[group.rows]] if only_gathered else group.rows
                state.consumed[rows] = True
                before, state.n_consumed = state.n_consumed, int(np.count_nonzero(state.consumed))
                self.consumed_rows += state.n_consumed - before
                if state.task.num_rows:
                    share = state.task.nbytes / state.task.num_rows
                    self.consumed_bytes += (state.n_consumed - before) * share
            if gathered:
                state.gathered[group.rows] = True
                state.n_gathered = int(np.count_nonzero(state.gathered))
            effects += self._release_and_complete(state)
        return effects

    def all_gathered(self, groups: Sequence[SegmentRows]) -> bool:
        """Whether every row of ``groups`` was reported gathered (or its slot is released and
        completed)."""
        for group in groups:
            state = self._slots.get(group.slot)
            if state is not None and not state.gathered[group.rows].all():
                return False
        return True

    def _release_and_complete(self, state: SlotState) -> list[Effect]:
        effects: list[Effect] = []
        need = len(state.to_deliver)
        # The segment stays until every row is consumed as well as gathered: rows gathered for
        # a pass that was left early are gathered again by the next one.
        if not state.released and state.n_gathered >= need and state.n_consumed >= need:
            if state.has_segment:
                effects.append(Release(slot_name(state.slot), state.task.cache_key))
            state.released = True
        if not state.completed and state.n_consumed >= need:
            effects.append(Complete(state.task.lease_id, state.admitted()))
            state.completed = True
            self.consumed_records += need
            self.skipped_records += len(state.task.skipped)
            ep = self._epoch(state.task.epoch)
            ep.completed.add(state.task.seq)
            ep.consumed.append((state.task.task_id, *state.task.records()))
        if state.released and state.completed:
            del self._slots[state.slot]
        return effects

    def _forget_finished(self, before: int) -> int:
        """Drop what is kept of epochs before ``before``, which the master finished and the
        sampler is past: no lease of them can come any more, and a long run's memory stays
        flat. Returns the first epoch still kept."""
        limit = self._forgotten = max(self._forgotten, min(before, self._iter_epoch))
        for e in [e for e in self._epochs if e < limit]:
            if not any(slot in self._slots for slot in self._epochs[e].slots):
                del self._epochs[e]
        if any(e < limit for e, _ in self._announced):
            self._announced = {
                (e, s) for e, s in self._announced if e >= limit or e in self._epochs
            }
        return limit

    # -- questions -----------------------------------------------------------------------
    def unconsumed_in_order(self, last: int) -> tuple[np.ndarray, int]:
        """Rows of admitted tasks of epochs up to ``last`` not consumed yet, as sample indices
        in the order the sampler handed them out, and how many of them are of epochs before
        ``last`` (older epochs count: a task of one that came late is delivered in a later
        pass, and may be left unconsumed by it)."""
        parts, ranks, older = [], [], 0
        for e, slot in [(e, s) for e, st in self._epochs.items() if e <= last for s in st.slots]:
            state = self._slots.get(slot)
            if state is None:
                continue
            rows = state.unconsumed()
            if len(rows):
                parts.append(encode_indices(slot, rows))
                ranks.append(state.ranks_of(rows))
                older += len(rows) if e < last else 0
        if not parts:
            return np.empty(0, dtype=np.int64), older
        order = np.argsort(np.concatenate(ranks), kind="stable")
        return np.concatenate(parts)[order], older

    def unconsumed_rows(self) -> int:
        """Rows the sampler handed out (admitted) and not consumed yet: in flight to the loop,
        or held by a batcher. Their segments cannot go until they are."""
        return sum(
            len(s.to_deliver) - s.n_consumed for s in self._slots.values() if not s.completed
        )

    def rows_left(self, epoch: int, total: int) -> int:
        """Rows a pass over ``epoch`` (of ``total`` records here) delivers: those admitted and
        not consumed, and the records of its tasks not admitted yet, less those a loaded state
        consumed."""
        st = self._epochs.get(epoch)
        left = total - (0 if st is None else st.records) - self._before.get(epoch, 0)
        held = (
            self._slots.get(s) for e, st in self._epochs.items() if e <= epoch for s in st.slots
        )
        return max(0, left) + sum(len(s.unconsumed()) for s in held if s is not None)

    def not_admitted(self, epoch: int, tasks: int) -> list[int]:
        """Positions of ``epoch``'s ``tasks`` not admitted yet."""
        admitted = self._epoch(epoch).admitted
        return [s for s in range(tasks) if s not in admitted]

    def position(
        self, tasks_of: Callable[[int], int], also: Sequence[SegmentRows] = ()
    ) -> Position:
        """What checkpoints store, for the first epoch not wholly consumed (``tasks_of``: the
        master's count of an epoch's tasks here). Rows excluded on a resume count as
        consumed. ``also``: rows to count as consumed though they are not yet (a batch
        sampler's state counts the batches it handed out: ``TaskBatchSampler.state_dict``);
        the book itself is left as it is."""
        extra = {g.slot: g.rows for g in also if g.slot in self._slots}
        completed = {e: set(st.completed) for e, st in self._epochs.items()}
        ranges_done = {e: list(st.consumed) for e, st in self._epochs.items()}
        for slot, rows in extra.items():
            held = self._slots[slot]
            if held.completed:
                continue
            if len(held.consumed_rows(rows)) == held.task.num_rows:  # all of it, with these
                e = held.task.epoch
                completed.setdefault(e, set()).add(held.task.seq)
                ranges_done.setdefault(e, []).append((held.task.task_id, *held.task.records()))
        epoch = min(
            (e for e, done in completed.items() if len(done) < tasks_of(e)),
            default=self._iter_epoch,
        )
        resumed = epoch == self._start_epoch
        st = self._epoch(epoch)
        done_here = completed.get(epoch, set())
        prior = self._prior if resumed else {}
        # Rows a loaded state consumed of tasks not admitted yet: a state saved before they
        # are must still leave them out (they came again, whole, after a second resume).
        partial: dict[int, list[int]] = {
            seq: sorted(int(r) for r in rows)
            for seq, rows in (self._partial_before if resumed else {}).items()
            if seq not in st.admitted and len(rows)
        }
        ranges: list[Ranges] = [prior]
        ranges.extend({t: [(a, b)]} for t, a, b in ranges_done.get(epoch, []))
        for slot in st.slots:
            state = self._slots.get(slot)
            if state is None or state.completed or state.task.seq in done_here:
                continue
            rows = state.consumed_rows(extra.get(slot))
            if len(rows):
                partial[state.task.seq] = rows.tolist()
                ranges.append({state.task.task_id: state.records_of(rows)})
        return Position(epoch, sorted(done_here), partial, union(ranges))

    def partly_consumed(self) -> list[tuple[SlotState, np.ndarray]]:
        """Tasks taken and not completed that the loop consumed part of, with the rows."""
        return list(partly_consumed(self._slots.values()))

    def consumed_of_admitted(self) -> list[tuple[ReadyTask, list[tuple[int, int]]]]:
        """Tasks taken and not completed that the loop consumed part of, with the records
        consumed (rows excluded at admit count as consumed): values, read now, for what a
        trainer hands over or back with its leases."""
        return [(s.task, s.records_of(rows)) for s, rows in self.partly_consumed()]

    def admitted_tasks(self) -> list[AdmittedTask]:
        """What the outbox needs of every admitted task: ids and flags, as they are now."""
        return [state.admitted() for state in self._slots.values()]

    def last_pass(self, epoch: int) -> int | None:
        """The epoch whose pass's unconsumed rest makes a pass of its own before a pass over
        ``epoch`` starts (the loop stopped in that pass's last batches, which workers had
        gathered): the one before, so that the next pass is a whole epoch again. None at the
        first epoch, and where trainers share epochs: there rows of older epochs (elsewhere)
        come first in the current pass instead (``unconsumed_in_order``)."""
        return None if epoch == 0 or self.shares_epochs else epoch - 1

    def figures(self) -> BookFigures:
        """What the book counts, as one value (``ds.stats()`` reads it)."""
        return BookFigures(
            consumed_rows=self.consumed_rows,
            consumed_bytes=int(self.consumed_bytes),
            consumed_records=self.consumed_records,
            skipped_records=self.skipped_records,
            duplicates=self.duplicates,
            shares_epochs=self.shares_epochs,
        )

    def contents(self) -> BookContents:
        """What the book still holds: epochs, tasks announced, segments not released."""
        return BookContents(
            epochs=tuple(sorted(self._epochs)),
            announced=frozenset(self._announced),
            segments=tuple(slot_name(s) for s, st in self._slots.items() if not st.released),
        )

    def admitted_leases(self) -> list[int]:
        """Leases of admitted tasks not completed yet."""
        return [s.task.lease_id for s in self._slots.values() if not s.completed]


@dataclass(frozen=True)
class BookFigures:
    """What the book counts since the trainer started."""

    consumed_rows: int  # rows consumed, counted as they are consumed
    consumed_bytes: int  # shared memory the consumed rows took (each row its segment's share)
    consumed_records: int  # rows of the tasks completed (a task counts once all are consumed)
    skipped_records: int  # what sources left out of the tasks consumed (on_error="skip")
    duplicates: int  # copies of tasks announced twice, dropped
    # Some task of an epoch went to another consumer, or was done before this trainer started:
    # then what this trainer consumed is not the epoch's position.
    shares_epochs: bool


@dataclass(frozen=True)
class BookContents:
    """What the book holds at one moment (forgotten once the master finished the epoch)."""

    epochs: tuple[int, ...]
    announced: frozenset[tuple[int, int]]  # (epoch, task id) of tasks announced
    segments: tuple[str, ...]  # segments of admitted tasks not released yet


def partly_consumed(states: Iterable[SlotState | None]) -> Iterator[tuple[SlotState, np.ndarray]]:
    """Of ``states``, tasks not completed that the loop consumed part of, with the rows consumed
    (``SlotState.consumed_rows``): what checkpoints and a leaving trainer's hand-back hold."""
    for state in states:
        if state is None or state.completed:
            continue
        rows = state.consumed_rows()
        if len(rows):
            yield state, rows


def rank_rows(slots: Mapping[int, SlotState], indices: np.ndarray, first: int) -> int:
    """Rank the admitted rows ``indices`` ``first``, ``first + 1``, ... in their slots' states
    (``SlotState.rank``); returns the next rank.

    A block's rows (a window of tasks) lie in a few slots numbered close together, so the ranks
    are scattered once into a flat ``(slot, row)`` table and each slot takes its part: one pass
    over the block, not one mask of the whole block per slot.
    """
    n = len(indices)
    if not n:
        return first
    slot_of, rows = split_indices(indices)
    lo, hi = int(slot_of.min()), int(slot_of.max())
    width = int(rows.max()) + 1
    if not _table_fits(lo, hi, width, n):
        _rank_by_slot(slots, slot_of, rows, first)
        return first + n
    table = np.full((hi - lo + 1, width), -1, dtype=np.int64)
    table[slot_of - lo, rows] = np.arange(first, first + n, dtype=np.int64)
    for slot in range(lo, hi + 1):
        state = slots.get(slot)
        if state is None:  # released and completed already, or not in this block
            continue
        part = table[slot - lo, : state.task.num_rows]
        ranked = part >= 0
        if not ranked.any():
            continue
        if state.rank is None:
            state.rank = np.full(state.task.num_rows, -1, dtype=np.int64)
        state.rank[: len(part)][ranked] = part[ranked]
    return first + n


def ranked_by_table(indices: np.ndarray) -> bool:
    """Whether :func:`rank_rows` ranks the block ``indices`` through one flat ``(slot, row)``
    table (slots numbered close together) rather than one slot at a time (slots far apart).
    Both give the same ranks; this says which of the two costs a block pays."""
    if not len(indices):
        return False
    slot_of, rows = split_indices(indices)
    lo, hi = int(slot_of.min()), int(slot_of.max())
    return _table_fits(lo, hi, int(rows.max()) + 1, len(indices))


def _table_fits(lo: int, hi: int, width: int, n: int) -> bool:
    """A table of slots ``lo..hi`` by ``width`` rows is worth it for ``n`` rows: it is not mostly
    empty (slots far apart)."""
    return (hi - lo + 1) * width <= 4 * n


def _rank_by_slot(
    slots: Mapping[int, SlotState], slot_of: np.ndarray, rows: np.ndarray, first: int
) -> None:
    """:func:`rank_rows` one slot at a time (for slots numbered far apart)."""
    ranks = np.arange(first, first + len(rows), dtype=np.int64)
    for slot in np.unique(slot_of).tolist():
        state = slots.get(slot)
        if state is None:  # released and completed already: nothing to deliver
            continue
        if state.rank is None:
            state.rank = np.full(state.task.num_rows, -1, dtype=np.int64)
        mine = slot_of == slot
        state.rank[rows[mine]] = ranks[mine]
