"""The trainer's consumption accounting alone (``ConsumptionBook.apply``): no store, no
master, no threads. Each test drives the book through one of the cases where exactly-once is
at stake and checks the effects it returns and what it says is consumed."""

from __future__ import annotations

import numpy as np
import pytest

from shmloader.dataset.accounting.book import ConsumptionBook
from shmloader.dataset.accounting.updates import (
    Admitted,
    Announced,
    Complete,
    ConsumedAgain,
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
)
from shmloader.dataset.core.indices import group_by_segment, slot_name, split_indices
from shmloader.dataset.core.tasks import ReadyTask
from shmloader.dataset.resume.checkpoint import ResumePoint
from shmloader.errors import ShmloaderError

ROWS = 8  # rows per task


def task(seq: int, *, epoch: int = 0, lease: int | None = None, **kw: object) -> ReadyTask:
    """Task ``seq`` of ``epoch``: records ``seq * ROWS`` on, in segment ``r<epoch>-<seq>``."""
    return ReadyTask(
        epoch,
        seq,
        seq,  # task id
        kw.pop("segment", f"r{epoch}-{seq}"),  # type: ignore[arg-type]
        ROWS,
        100 * epoch + seq if lease is None else lease,
        seq * ROWS,
        **kw,  # type: ignore[arg-type]
    )


def admitted(book: ConsumptionBook, t: ReadyTask):
    """Announce and admit ``t``: the indices the book issues, and its other effects."""
    assert book.apply(Announced(t)) == [MakeReady(t)]
    return admitted_ready(book, t)


def consume(book: ConsumptionBook, indices: np.ndarray, *, gathered: bool = True):
    return book.apply(Reported(group_by_segment(indices), gathered=gathered, consumed=True))


def rows_of(indices: np.ndarray) -> list[int]:
    return split_indices(indices)[1].tolist()


def test_a_task_is_released_and_completed_once_every_row_is_consumed() -> None:
    book = ConsumptionBook()
    t = task(0)
    indices, effects = admitted(book, t)
    slot = int(split_indices(indices)[0][0])
    assert effects[0] == Rename("r0-0", slot_name(slot))
    assert isinstance(effects[1], MarkTaken) and effects[1].admitted.task == t
    assert rows_of(indices) == list(range(ROWS))
    assert consume(book, indices[:5]) == []
    assert book.unconsumed_rows() == 3
    effects = consume(book, indices[5:])
    assert [type(e) for e in effects] == [Release, Complete]
    assert effects[0] == Release(slot_name(slot))
    assert effects[1].lease_id == t.lease_id
    assert book.consumed_records == ROWS and book.contents().segments == ()
    # A row gathered again after its slot was released and completed (an abandoned pass's
    # worker) changes nothing.
    assert book.apply(Reported(group_by_segment(indices[:1]), gathered=True, consumed=False)) == []
    assert book.position(lambda e: 1).completed == [0]
    # Consumed again is a row delivered twice: said, not ignored, and nothing else changes.
    assert consume(book, indices[:3]) == [ConsumedAgain(slot, 3)]
    assert book.consumed_rows == ROWS and book.position(lambda e: 1).completed == [0]


def test_rows_gathered_for_a_pass_left_early_come_back_in_the_order_handed_out() -> None:
    """``break`` under shmloader.DataLoader: workers gathered rows the loop never received.
    They are not consumed: the task is not completed, its segment is kept (the next pass
    gathers them again), and the next pass gets them first, in the order they were handed out;
    the checkpoint names exactly the rows received."""
    book = ConsumptionBook()
    first, _ = admitted(book, task(0))
    second, _ = admitted(book, task(1))
    order = np.concatenate([second[::-1], first])  # the sampler's shuffled order
    book.apply(HandedOut(order))
    received = order[:6]
    assert consume(book, received) == []  # the loop got these
    # Workers gathered the next four for batches the loop never received.
    assert book.apply(Reported(group_by_segment(order[6:10]), gathered=True, consumed=False)) == []
    again, older = book.unconsumed_in_order(0)
    assert older == 0
    assert again.tolist() == order[6:].tolist()
    at = book.position(lambda e: 2)
    assert at.completed == [] and at.partial == {1: sorted(rows_of(received))}
    assert at.ranges == {1: [(ROWS + 2, 2 * ROWS)]}
    # The next pass consumes the rest: both tasks complete, each once.
    effects = consume(book, again)
    assert sorted(e.lease_id for e in effects if isinstance(e, Complete)) == [0, 1]
    assert len([e for e in effects if isinstance(e, Release)]) == 2
    assert book.unconsumed_in_order(0)[0].tolist() == []
    assert book.consumed_records == 2 * ROWS


def test_a_segment_stays_until_every_row_is_gathered_as_well_as_consumed() -> None:
    book = ConsumptionBook()
    indices, _ = admitted(book, task(0))
    effects = book.apply(Reported(group_by_segment(indices), gathered=False, consumed=True))
    assert [type(e) for e in effects] == [Complete]  # consumed: the task is done ...
    assert book.contents().segments == (slot_name(1),)
    effects = book.apply(Reported(group_by_segment(indices), gathered=True, consumed=False))
    assert effects == [Release(slot_name(1))]  # ... and once gathered, nothing reads it
    assert book.contents().segments == ()


def test_a_resume_leaves_out_what_the_loaded_state_consumed() -> None:
    """A state saved in epoch 1 with task 0 consumed whole, rows 0..2 of task 1, and records
    of task 3 consumed by another trainer (``prior``): none of it comes again, and a state
    saved before those tasks are admitted still names it."""
    resume = ResumePoint(
        epoch=1,
        done=frozenset({0}),
        partial={1: np.array([0, 1, 2])},
        consumed={3: [(24, 28)]},
        consumed_records=ROWS + 3 + 4,
    )
    book = ConsumptionBook(start_epoch=1, resume=resume)
    at = book.position(lambda e: 4)
    assert (at.epoch, at.completed, at.partial) == (1, [0], {1: [0, 1, 2]})
    assert at.ranges == {3: [(24, 28)]}
    assert book.rows_left(1, 4 * ROWS) == 4 * ROWS - (ROWS + 3 + 4)
    indices, effects = admitted(book, task(1, epoch=1))
    assert rows_of(indices) == list(range(3, ROWS))
    at = book.position(lambda e: 4)
    assert at.partial == {1: [0, 1, 2]}  # now as the admitted task's consumed rows
    assert at.ranges == {1: [(ROWS, ROWS + 3)], 3: [(24, 28)]}
    effects = consume(book, indices)
    assert [e.lease_id for e in effects if isinstance(e, Complete)] == [101]
    assert book.consumed_records == ROWS - 3
    assert book.position(lambda e: 4).completed == [0, 1]


def test_a_task_consumed_before_the_resume_and_not_read_again_completes_at_once() -> None:
    book = ConsumptionBook(resume=ResumePoint(partial={0: np.arange(ROWS)}))
    t = task(0, segment="")  # the resumed master hands it out with no rows left to read
    indices, effects = admitted(book, t)
    assert len(indices) == 0
    assert [type(e) for e in effects] == [MarkTaken, Complete]  # no segment: no Rename/Release


def test_rows_a_leaving_trainer_handed_back_are_not_delivered_again() -> None:
    book = ConsumptionBook()
    t = task(2, consumed=((16, 20),))  # records 16..19 are rows 0..3
    indices, _ = admitted(book, t)
    assert rows_of(indices) == [4, 5, 6, 7]
    assert book.partly_consumed()[0][1].tolist() == [0, 1, 2, 3]
    assert [type(e) for e in consume(book, indices)] == [Release, Complete]


def test_a_task_read_again_after_its_reader_died_is_delivered_once() -> None:
    """Its first reader's lease lapsed and another reader read it again: the second copy is
    dropped (segment released, its lease completed), whenever it comes."""
    book = ConsumptionBook()
    indices, _ = admitted(book, task(0))
    again = task(0, segment="r0-0-again", lease=7)
    assert book.apply(Announced(again)) == [Release("r0-0-again"), Complete(7)]
    assert book.duplicates == 1
    consume(book, indices)
    late = task(0, segment="r0-0-late", lease=8)
    assert book.apply(Announced(late)) == [Release("r0-0-late"), Complete(8)]
    assert book.duplicates == 2 and book.consumed_records == ROWS


def test_every_release_of_a_cached_task_keeps_it_under_its_key() -> None:
    """cache=True: a task's segment is released to the cache under its key whichever way it
    goes (consumed, a second copy, a ready copy not delivered); without a key, as a spare."""
    book = ConsumptionBook()
    t = task(0, cache_key="k0")
    indices, _ = admitted(book, t)
    again = task(0, segment="r0-0-again", lease=7, cache_key="k0")
    assert book.apply(Announced(again)) == [Release("r0-0-again", "k0"), Complete(7)]
    slot = int(split_indices(indices)[0][0])
    assert consume(book, indices)[0] == Release(slot_name(slot), "k0")
    lapsed = task(1, cache_key="k1")
    assert book.apply(Announced(lapsed)) == [MakeReady(lapsed)]
    assert book.apply(NotDelivered(lapsed)) == [Undelivered(lapsed), Release("r0-1", "k1")]


def test_a_ready_copy_not_delivered_lets_a_new_copy_in() -> None:
    """A ready copy whose lease lapsed before the sampler took it is dropped; the copy the
    next holder's reader writes is then welcome (it is not a duplicate)."""
    book = ConsumptionBook()
    t = task(0)
    assert book.apply(Announced(t)) == [MakeReady(t)]
    assert book.apply(NotDelivered(t)) == [Undelivered(t), Release(t.segment)]
    again = task(0, segment="r0-0-again", lease=9)
    assert book.apply(Announced(again)) == [MakeReady(again)]
    assert book.duplicates == 0


def test_a_late_task_of_an_older_epoch_is_delivered_in_a_later_pass() -> None:
    """Trainers sharing epochs: a task of epoch 0 that came back after its holder died is
    admitted while the sampler is in epoch 1; left unconsumed, it comes back first, counted
    as an older epoch's rows."""
    book = ConsumptionBook()
    book.apply(EpochIterated(0))
    late, _ = admitted(book, task(5, epoch=0))
    current, _ = admitted(book, task(0, epoch=1))
    book.apply(HandedOut(np.concatenate([late, current])))
    rows, older = book.unconsumed_in_order(1)
    assert rows.tolist() == [*late.tolist(), *current.tolist()] and older == ROWS
    consume(book, rows)
    assert book.consumed_records == 2 * ROWS


def test_a_copy_of_a_finished_epoch_is_dropped_once_the_epoch_is_forgotten() -> None:
    book = ConsumptionBook()
    indices, _ = admitted(book, task(0))
    consume(book, indices)
    book.apply(EpochIterated(0))
    assert book.apply(Finished(1)) == [Forgotten(1, ())]
    assert book.contents().epochs == () and book.contents().announced == set()
    # A reader whose lease lapsed while it read writes its copy after the master finished it.
    assert book.apply(Announced(task(3, segment="late", lease=55))) == [
        Release("late"),
        Complete(55),
    ]


def test_an_index_of_a_slot_never_admitted_is_an_error() -> None:
    book = ConsumptionBook()
    with pytest.raises(ShmloaderError, match="slot 7, which is not admitted"):
        consume(book, np.array([7 << 32], dtype=np.int64))


def test_a_resume_in_an_epoch_this_trainer_does_not_start_in_counts_nothing_consumed() -> None:
    """A standalone master may be past the loaded state's epoch: its positions name tasks of
    an epoch this trainer never iterates, and nothing of the epoch it does start in is
    consumed."""
    resume = ResumePoint(epoch=0, done=frozenset({0}), consumed={0: [(0, ROWS)]})
    book = ConsumptionBook(start_epoch=2, resume=resume)
    at = book.position(lambda e: 3)
    assert (at.epoch, at.completed, at.ranges) == (2, [], {})
    indices, _ = admitted(book, task(0, epoch=2))
    assert rows_of(indices) == list(range(ROWS))


def test_a_state_saved_after_the_last_epoch_puts_the_sampler_past_it() -> None:
    book = ConsumptionBook(start_epoch=1, resume=ResumePoint(epoch=1, finished=True))
    assert book.epoch_to_iterate() == 2


def test_a_batch_received_before_its_rows_are_known_gathered_consumes_only_those_gathered() -> None:
    """A plain DataLoader's loop received a batch (reported by its requests): rows the ledger has
    not said gathered yet (or never will: the worker failed) are not consumed."""
    book = ConsumptionBook()
    indices, _ = admitted(book, task(0))
    groups = group_by_segment(indices)
    assert not book.all_gathered(groups)
    book.apply(Reported(group_by_segment(indices[:3]), gathered=True, consumed=False))
    assert book.apply(Reported(groups, gathered=False, consumed=True, only_gathered=True)) == []
    assert book.unconsumed_in_order(0)[0].tolist() == indices[3:].tolist()
    book.apply(Reported(group_by_segment(indices[3:]), gathered=True, consumed=False))
    assert book.all_gathered(groups)
    effects = book.apply(Reported(groups, gathered=False, consumed=True, only_gathered=True))
    assert [type(e) for e in effects] == [Release, Complete]


def test_a_copy_of_a_task_taken_over_leaves_out_what_the_crashed_trainer_consumed() -> None:
    """Elastic mode: a trainer resumed from a crashed one's checkpoint took over its leases
    (handover.py); the records its loop consumed of a task are left out of the copy that comes
    here, merged with what earlier holders handed back."""
    book = ConsumptionBook(taken_over={(0, 2): [(16, 19)]})
    t = task(2, consumed=((22, 24),))
    (ready,) = book.apply(Announced(t))
    assert isinstance(ready, MakeReady) and ready.task.consumed == ((16, 19), (22, 24))
    indices, _ = admitted_ready(book, ready.task)
    assert rows_of(indices) == [3, 4, 5]


def admitted_ready(book: ConsumptionBook, t: ReadyTask):
    effects = book.apply(Admitted(t))
    assert isinstance(effects[0], Issue)
    return effects[0].indices, effects[1:]


def test_only_updates_change_the_book() -> None:
    with pytest.raises(TypeError, match="not an update"):
        ConsumptionBook().apply(task(0))  # type: ignore[arg-type]


def test_the_rest_of_the_last_pass_is_a_pass_of_its_own_unless_trainers_share_epochs() -> None:
    """The last-pass policy is the book's: the rows a finished pass left unconsumed make a
    pass alone before the next epoch's, except at the first epoch and once another trainer
    took a task of an epoch (then they come first in the current pass, as tasks elsewhere)."""
    book = ConsumptionBook()
    assert book.last_pass(0) is None and book.last_pass(3) == 2
    book.apply(Elsewhere(1, (4,)))
    assert book.figures().shares_epochs and book.last_pass(3) is None


def test_the_figures_and_what_is_kept_are_values_of_the_moment() -> None:
    book = ConsumptionBook()
    t = task(0, consumed=((0, 2),), nbytes=800)
    indices, _ = admitted(book, t)
    consume(book, indices[:2])
    held = book.consumed_of_admitted()
    before = book.figures()
    assert [(h.lease_id, records) for h, records in held] == [(t.lease_id, [(0, 4)])]
    assert (before.consumed_rows, before.consumed_records, before.duplicates) == (2, 0, 0)
    assert book.contents().segments == (slot_name(1),)
    consume(book, indices[2:])
    assert held == [(t, [(0, 4)])] and before.consumed_rows == 2  # unchanged: values
    after = book.figures()
    assert (after.consumed_rows, after.consumed_records) == (ROWS - 2, ROWS - 2)  # here
    assert after.consumed_bytes == 600  # the 6 rows consumed here, each 1/8 of 800 bytes
    assert book.consumed_of_admitted() == [] and book.contents().segments == ()
