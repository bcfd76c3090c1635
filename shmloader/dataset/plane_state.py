"""What the data plane keeps per slot and per epoch, and what it asks of the master and the
store (protocols, so tests can give it a dispatcher behind a lock and a plain store)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .consumed import Ranges, row_records, to_ranges, union
from .gather import encode_indices, split_indices
from .ready import ReadyTask

# Whereabouts (Dispatcher.whereabouts) of a task the sampler waits for that may still come. A
# quarantined one never does, but is waited for all the same: the runtime raises its loss in
# the loop (TaskQuarantinedError), as it does for one trainer, rather than the pass ending
# without it.
MAY_COME = frozenset({"todo", "mine", "quarantined"})
# Of a task given up as elsewhere: it cannot come here any more ("done"), or may ("todo",
# "mine", or "other": another trainer's readers hold it and that trainer may die before it
# takes it in hand). One another trainer took in hand ("taken") comes back only if that trainer
# dies: kept as a stray (see take_strays), but not waited for.
DONE_ELSEWHERE = frozenset({"done"})
TAKEN_ELSEWHERE = "taken"
MAY_BE_WAITED_FOR = frozenset({"todo", "mine", "other", "quarantined"})
UNRANKED = np.iinfo(np.int64).max  # the rank of a row never handed out (SlotState.ranks_of)


def slot_name(slot: int) -> str:
    """The segment name of a slot: a valid store segment name derived from the number alone."""
    return f"seg-{slot:032x}"


class LeaseOps(Protocol):
    """The master calls the plane makes (a client, or the dispatcher behind a lock in tests)."""

    def complete(self, lease_ids: list[int]) -> dict[int, str]:
        """Complete the leases; returns those that could not be completed, with why."""
        ...

    def epoch_tasks(self, epoch: int) -> int:
        """How many tasks this consumer gets in ``epoch``."""
        ...

    def epoch_records(self, epoch: int) -> int: ...

    def epochs_over(self, epoch: int) -> int | None:
        """The number of epochs planned, if ``epoch`` is past the last; else None."""
        ...

    def whereabouts(self, epoch: int, seqs: list[int]) -> list[str]:
        """Where tasks ``seqs`` are (``Dispatcher.whereabouts``), as this consumer sees it."""
        ...

    def mark_taken(self, lease_ids: list[int]) -> dict[int, str]:
        """This trainer took the leases' tasks into its sampler (others stop waiting)."""
        ...


class SegmentOps(Protocol):
    def rename(self, name: str, new_name: str) -> None: ...

    def release(self, name: str, *, missing_ok: bool = False) -> None: ...

    def want(self, keys: Sequence[str]) -> None: ...


@dataclass
class SlotState:
    task: ReadyTask
    slot: int
    emit: np.ndarray | None = None  # rows to deliver (set when admitted)
    gathered: np.ndarray | None = None  # bool per row
    delivered: np.ndarray | None = None  # bool per row
    # How many rows of ``emit`` are gathered / delivered: settling compares counts, not
    # whole masks, on every batch.
    n_gathered: int = 0
    n_delivered: int = 0
    # Where each row stands in the order the sampler handed rows out (``DataPlane.handed_out``;
    # -1: not handed out): a pass left early resumes the rest in that order.
    rank: np.ndarray | None = None
    released: bool = False
    completed: bool = False
    has_segment: bool = True

    def consumed_rows(self, on_delivery: bool) -> np.ndarray:
        """Rows consumed (delivered under ``complete_on_delivery``, else gathered), or left out
        when admitted (consumed before a resume, or by an earlier holder): sorted."""
        consumed = self.delivered if on_delivery else self.gathered
        assert consumed is not None and self.emit is not None
        done = consumed.copy()
        excluded = np.ones(len(done), dtype=bool)
        excluded[self.emit] = False
        return np.flatnonzero(done | excluded)

    def unconsumed(self, on_delivery: bool) -> np.ndarray:
        """Rows admitted to deliver and not consumed yet (none once released): what a pass
        left early gives back (``DataPlane.reclaim``), and what the next pass delivers of
        this task (``DataPlane.pass_rows``)."""
        if self.released or self.emit is None:
            return np.empty(0, dtype=np.int64)
        consumed = self.delivered if on_delivery else self.gathered
        assert consumed is not None
        return self.emit[~consumed[self.emit]]

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


def rank_rows(slots: Mapping[int, SlotState], indices: np.ndarray, first: int) -> int:
    """Rank the admitted rows ``indices`` ``first``, ``first + 1``, ... in their slots' states
    (``SlotState.rank``); returns the next rank.

    A block's rows (a window of tasks, 32,768 rows for 8 tasks of 4096) lie in a few slots
    numbered close together, so the ranks are scattered once into a flat ``(slot, row)`` table
    and each slot takes its part: one pass over the block, not one per slot (a mask of the
    whole block per slot cost the trainer about 0.07 µs per row, as much as half the gather).
    """
    n = len(indices)
    if not n:
        return first
    slot_of, rows = split_indices(indices)
    lo, hi = int(slot_of.min()), int(slot_of.max())
    width = int(rows.max()) + 1
    if (hi - lo + 1) * width > 4 * n:  # slots far apart: the table would be mostly empty
        _rank_by_slot(slots, slot_of, rows, first)
        return first + n
    table = np.full((hi - lo + 1, width), -1, dtype=np.int64)
    table[slot_of - lo, rows] = np.arange(first, first + n, dtype=np.int64)
    for slot in range(lo, hi + 1):
        state = slots.get(slot)
        if state is None:  # settled already, or not in this block
            continue
        part = table[slot - lo, : state.task.num_rows]
        ranked = part >= 0
        if not ranked.any():
            continue
        if state.rank is None:
            state.rank = np.full(state.task.num_rows, -1, dtype=np.int64)
        state.rank[: len(part)][ranked] = part[ranked]
    return first + n


def _rank_by_slot(
    slots: Mapping[int, SlotState], slot_of: np.ndarray, rows: np.ndarray, first: int
) -> None:
    """:func:`rank_rows` one slot at a time (for slots numbered far apart)."""
    ranks = np.arange(first, first + len(rows), dtype=np.int64)
    for slot in np.unique(slot_of).tolist():
        state = slots.get(slot)
        if state is None:  # settled already: nothing of it to deliver
            continue
        if state.rank is None:
            state.rank = np.full(state.task.num_rows, -1, dtype=np.int64)
        mine = slot_of == slot
        state.rank[rows[mine]] = ranks[mine]


def partly_consumed(
    states: Iterable[SlotState | None], on_delivery: bool
) -> Iterator[tuple[SlotState, np.ndarray]]:
    """Tasks taken and not completed that the loop consumed part of, with the rows consumed
    (``SlotState.consumed_rows``): what checkpoints and a leaving trainer's hand-back hold."""
    for state in states:
        if state is None or state.completed or state.delivered is None:
            continue
        rows = state.consumed_rows(on_delivery)
        if len(rows):
            yield state, rows


@dataclass
class EpochState:
    admitted: set[int] = field(default_factory=set)  # seqs
    slots: list[int] = field(default_factory=list)
    records: int = 0  # records of the tasks admitted (their units' spans, skipped ones too)
    iterated: bool = False  # the sampler yielded everything
    completed: set[int] = field(default_factory=set)  # seqs consumed
    consumed: list[tuple[int, int, int]] = field(default_factory=list)  # (task, start, stop)


def unconsumed_rows(
    epochs: Mapping[int, EpochState], slots: Mapping[int, SlotState], last: int, on_delivery: bool
) -> int:
    """Rows of tasks of epochs up to ``last`` admitted and not consumed yet."""
    held = (slots.get(s) for e, st in epochs.items() if e <= last for s in st.slots)
    return sum(len(state.unconsumed(on_delivery)) for state in held if state is not None)


def unconsumed_in_order(
    epochs: Mapping[int, EpochState], slots: Mapping[int, SlotState], last: int, on_delivery: bool
) -> tuple[np.ndarray, int]:
    """Rows of tasks of epochs up to ``last`` admitted and not consumed yet, as sample indices
    in the order the sampler handed them out (``rank_rows``), and how many of them are of
    epochs before ``last``."""
    parts, ranks, older = [], [], 0
    for e, slot in [(e, s) for e, st in epochs.items() if e <= last for s in st.slots]:
        state = slots.get(slot)
        if state is None:
            continue
        rows = state.unconsumed(on_delivery)
        if len(rows):
            parts.append(encode_indices(slot, rows))
            ranks.append(state.ranks_of(rows))
            older += len(rows) if e < last else 0
    if not parts:
        return np.empty(0, dtype=np.int64), older
    return np.concatenate(parts)[np.argsort(np.concatenate(ranks), kind="stable")], older


def epoch_consumed(
    st: EpochState,
    slots: Mapping[int, SlotState],
    prior: Ranges,
    on_delivery: bool,
    pending: Mapping[int, np.ndarray] | None = None,
) -> tuple[list[int], dict[int, list[int]], Ranges]:
    """What a checkpoint stores of an epoch: its consumed task positions, the consumed rows of
    its partly consumed tasks by position, and all it consumed as record ranges by task id
    (with ``prior``: records consumed before a resume). ``pending``: rows a loaded state
    consumed of tasks (by position) not admitted yet, which a state saved before they are
    must still leave out (they came again, whole, after a second resume)."""
    partial: dict[int, list[int]] = {
        seq: sorted(int(r) for r in rows)
        for seq, rows in (pending or {}).items()
        if seq not in st.admitted and len(rows)
    }
    ranges: list[Ranges] = [prior]
    ranges.extend({t: [(a, b)]} for t, a, b in st.consumed)
    for state, rows in partly_consumed(map(slots.get, st.slots), on_delivery):
        partial[state.task.seq] = rows.tolist()
        ranges.append({state.task.task_id: state.records_of(rows)})
    return sorted(st.completed), partial, union(ranges)
