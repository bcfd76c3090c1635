"""One reporter: every way the trainer hears of rows gathered or consumed, as book updates.

Rows are reported three ways, and each becomes one :class:`~.updates.Reported` here (the book
decides what it means):

- the gather ledger of a plain DataLoader's workers (``gather/ledger.py``): an entry is a row
  gathered and consumed, or, written negated, a row gathered only, whose batch counts once
  torch's requests say the loop received it (:func:`ledger_reports`);
- the training process's own gathers (``num_workers=0``; :meth:`Reporter.gathered`), by the
  batch's :class:`~shmloader.dataset.core.receipts.Receipt`;
- the loop's receipts: ``shmloader.DataLoader`` after its transform returned
  (:meth:`Reporter.delivered`), torch's requests for a plain DataLoader
  (:meth:`Reporter.received`), a batcher's dropped last batch (:meth:`Reporter.dropped`), and
  batches counted before they arrive because the budget cannot hold them
  (:meth:`Reporter.counted_early`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np

from ..core.indices import SegmentRows, group_by_segment
from ..core.receipts import Receipt
from ..gather.ledger import LedgerReader
from .updates import Effect, Reported


def ledger_reports(entries: np.ndarray) -> tuple[list[Reported], int]:
    """The updates of ledger ``entries``, and how many rows of them count as consumed. A
    negated entry (a batch whose receipt is torch's requests) is gathered only."""
    later = entries < 0
    consumed = entries[~later]
    reports = []
    if len(consumed):
        reports.append(Reported(group_by_segment(consumed), gathered=True, consumed=True))
    if later.any():
        reports.append(Reported(group_by_segment(-entries[later]), gathered=True, consumed=False))
    return reports, len(consumed)


def _grouped(indices: np.ndarray) -> list[SegmentRows] | None:
    idx = np.asarray(indices, dtype=np.int64)
    return group_by_segment(idx) if len(idx) else None


class Reporter:
    """Turns reports into updates and hands them to ``apply`` (the data plane's, which applies
    them to the book under its lock). ``all_gathered``: whether the book has every row of these
    groups gathered (asked before reading the ledger for a batch torch's requests report)."""

    def __init__(
        self,
        ledger: LedgerReader,
        apply: Callable[[Reported], list[Effect]],
        all_gathered: Callable[[Sequence[SegmentRows]], bool],
    ) -> None:
        self._ledger = ledger
        self._apply = apply
        self._all_gathered = all_gathered
        # The maintenance thread and the sampler (reclaim) both read the ledger; its reader
        # keeps offsets and deletes finished files, so one at a time. Taken before the plane's
        # lock, never inside it.
        self._ledger_lock = threading.Lock()
        # The batch the trainer gathered last for shmloader.DataLoader's loop, and its groups,
        # until the loop receives it (gathered / delivered).
        self._awaiting_loop: tuple[np.ndarray | None, list[SegmentRows]] = (None, [])
        self.ledger_rows = 0  # rows a plain DataLoader's workers reported consumed, in all

    def read_ledger(self) -> int:
        """Apply the ledger; returns how many rows of it counted as consumed."""
        with self._ledger_lock:
            entries = self._ledger.poll()
            if not len(entries):
                return 0
            reports, consumed = ledger_reports(entries)
            self.ledger_rows += consumed
            for report in reports:
                self._apply(report)
            return consumed

    def gathered(
        self, indices: np.ndarray, groups: list[SegmentRows] | None, *, receipt: Receipt
    ) -> None:
        """The trainer itself gathered these samples (``num_workers=0``: no ledger needed).

        ``groups``: ``indices`` grouped by segment already (by the gather).

        ``receipt``: ``GATHER``, a plain DataLoader's, for which gathered is consumed.
        ``LOOP``, shmloader.DataLoader's: they only await the loop, and :meth:`delivered` reports
        them gathered and consumed once its loop hands the batch over, in one pass over the
        batch's segments; a batch the loop never gets (an exception in between, a transform
        that raised) is then neither, and its rows come again like any unconsumed row.
        ``REQUESTS``: gathered, consumed once :meth:`received` says so.
        """
        if groups is None:
            groups = group_by_segment(indices)
        if receipt is Receipt.LOOP:
            self._awaiting_loop = (indices, groups)
            return
        self._awaiting_loop = (None, [])
        self._apply(Reported(groups, gathered=True, consumed=receipt is Receipt.GATHER))

    def delivered(self, indices: np.ndarray) -> None:
        """The training loop received these samples (``shmloader.DataLoader`` only): gathered
        (in a worker, which writes no ledger for this loader, or here: :meth:`gathered`) and
        consumed."""
        last, groups = self._awaiting_loop
        self._awaiting_loop = (None, [])
        if last is None or not (indices is last or np.array_equal(indices, last)):
            found = _grouped(indices)
            if found is None:
                return
            groups = found
        self._apply(Reported(groups, gathered=True, consumed=True))

    def received(self, indices: np.ndarray) -> None:
        """A plain DataLoader's loop receives this batch now, as its requests report
        (``order/delivery.py``): its rows that workers gathered are consumed. The ledger is
        read first only when the book does not have every row gathered yet (a worker writes
        the ledger before handing the batch over; the loop's thread reads no files for a
        batch gathered long enough ago). A row not gathered (its worker failed) stays
        unconsumed, and comes again."""
        groups = _grouped(indices)
        if groups is None:
            return
        if not self._all_gathered(groups):
            self.read_ledger()
        self._apply(Reported(groups, gathered=False, consumed=True, only_gathered=True))

    def counted_early(self, indices: np.ndarray) -> None:
        """Rows of a plain DataLoader's batches in flight count as consumed before the loop
        receives them: the budget cannot hold them until then (``TaskBatchSampler``). Not
        gathered: their segments stay until the workers have gathered them."""
        groups = _grouped(indices)
        if groups is not None:
            self._apply(Reported(groups, gathered=False, consumed=True))

    def dropped(self, indices: np.ndarray) -> None:
        """A batcher dropped these rows for their epoch (``drop_last``): consumed, as if
        gathered and delivered, so their tasks complete and their segments go."""
        groups = _grouped(indices)
        if groups is not None:
            self._apply(Reported(groups, gathered=True, consumed=True))
