"""The sampler's feed: what ``TaskSampler`` asks of the trainer's data plane (order/feed.py).

Each request is one update of the consumption book, applied by the plane
(:meth:`DataPlane.update`), and each question one read of it under the plane's lock
(:meth:`DataPlane.read`), or a question for the master (the epochs' sizes, ``LeaseOps``).
Nothing here decides what counts as consumed: the book does (NOTE [exactly once on the trainer
side], in book.py).
"""

from __future__ import annotations

import logging

import numpy as np

from ..core.ports import LeaseOps
from ..core.tasks import ReadyTask
from ..waiting.budget_pressure import BudgetPressure
from ..waiting.elsewhere import ElsewhereTasks
from ..waiting.ready import ReadyTasks
from .book import ConsumptionBook
from .plane import DataPlane
from .updates import Admitted, Elsewhere, EpochIterated, HandedOut, Issue, NotDelivered

log = logging.getLogger(__name__)


class SamplerFeed:
    """Implements the sampler's ``Feed`` over ``plane``; ``master``: the epochs' sizes."""

    def __init__(self, plane: DataPlane, master: LeaseOps) -> None:
        self._plane = plane
        self._master = master
        self.ready: ReadyTasks = plane.ready
        self.pressure: BudgetPressure = plane.pressure

    @property
    def elsewhere(self) -> ElsewhereTasks:
        return self._plane.elsewhere

    def epoch_to_iterate(self) -> int:
        return self._plane.read(ConsumptionBook.epoch_to_iterate)

    def epochs_over(self, epoch: int) -> int | None:
        return self._master.epochs_over(epoch)

    def ledger_rows(self) -> int:
        """Rows a plain DataLoader's workers reported consumed so far (the ledger, as last
        read): they count as delivered, whether or not the loop received them."""
        return self._plane.reports.ledger_rows

    def epoch_rows(self, epoch: int) -> int:
        """Rows ``epoch`` schedules for this consumer (its rank's queue; elastic: all of it)."""
        return self._master.epoch_records(epoch)

    def pass_rows(self, epoch: int) -> int:
        """Rows a pass over ``epoch`` delivers here: those admitted and not consumed (as
        ``reclaim`` gives them back), and the records of its tasks not admitted yet, less those
        a loaded state consumed. An upper bound where records the source skips, or tasks other
        trainers take (shared epochs), are not known yet (docs/dataset.md, "Length")."""
        # What workers gathered for an abandoned pass is consumed.
        self._plane.read_ledger_and_send()
        total = self._master.epoch_records(epoch)
        return self._plane.read(lambda book: book.rows_left(epoch, total))

    def remaining_seqs(self, epoch: int) -> list[int]:
        total = self._master.epoch_tasks(epoch)
        return self._plane.read(lambda book: book.not_admitted(epoch, total))

    def find_elsewhere(self, epoch: int, seqs: list[int]) -> set[int]:
        """Those of ``seqs`` (tasks the sampler waits for) that the master says will not come
        here (elsewhere.py): then this trainer shares epochs."""
        gone = self._plane.elsewhere.find(epoch, seqs)
        self._plane.update(Elsewhere(epoch, tuple(sorted(gone))))
        return gone

    def admit(self, task: ReadyTask) -> np.ndarray:
        """Number the task's segment with the next slot and start tracking its rows; returns
        the sample indices of its rows to deliver.

        Slots are given here, in the sampler's (seeded, timing-free) order, not on arrival:
        a batch lists its rows grouped by slot, so batches are the same from run to run. A
        copy whose lease lapsed while it was ready is not delivered here (NOTE [exactly once
        on the trainer side], 5, in book.py).
        """
        if not self._plane.lease_check.still_ours(task):
            self._plane.update(NotDelivered(task))
            return np.empty(0, dtype=np.int64)
        effects = self._plane.update(Admitted(task))
        return next(e.indices for e in effects if isinstance(e, Issue))

    def handed_out(self, indices: np.ndarray) -> None:
        """The sampler hands ``indices`` (admitted rows) out in this order (their ranks: a pass
        continued after a ``break`` goes on as the uninterrupted one would have)."""
        self._plane.update(HandedOut(indices))

    def reclaim(self, epoch: int, *, poll: bool = True) -> np.ndarray:
        """Rows of admitted tasks that were never consumed (an earlier pass was abandoned), in
        the order the sampler handed them out.

        Rows that workers gathered for an abandoned iterator of ``shmloader.DataLoader`` but
        the loop never received are issued again (their segment is kept until then).
        ``poll``: apply the ledger first.
        """
        if poll:
            self._plane.read_ledger_and_send()
        rows, older, shared = self._plane.read(
            lambda book: (*book.unconsumed_in_order(epoch), book.shares_epochs)
        )
        if older and not shared:
            # One trainer has no tasks elsewhere: its last pass ran to the end without these rows.
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
        last = self._plane.read(lambda book: book.last_pass(epoch))
        return np.empty(0, dtype=np.int64) if last is None else self.reclaim(last, poll=poll)

    def finish_epoch(self, epoch: int) -> None:
        self._plane.update(EpochIterated(epoch))
