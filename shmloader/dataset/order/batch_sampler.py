"""Batches of the sampler's walk for a DataLoader's ``batch_sampler=``: how a pass's rows are
cut into batches, how each batch's receipt is told (core/receipts.py, delivery.py), and what is
done when the rows a batcher holds fill the budget."""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch.utils.data

from ...errors import ConfigError, ShmSpaceError
from ..core.ports import BatchReports
from ..core.receipts import ConsumedWhen, IndexBatch, Receipt, SampleIndices
from .delivery import RequestCounts, Requests, depth_of, prefetch_depth
from .sampler import FLUSH, PassWalk, Signal, TaskSampler
from .wrappers import Wrapper, wrapper_of

log = logging.getLogger(__name__)


class TaskBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Batches of a :class:`TaskSampler` for a DataLoader's ``batch_sampler=``.

    Each batch is a list of sample indices, *sorted* (a ``SampleIndices``, which keeps the
    ``IndexBatch`` it was made from: the int64 array and the pass's receipt): the dataset
    gathers the array without converting the list or sorting it by segment, and reads each
    segment's rows in address order (the batch holds the same samples; only their order inside
    it changes).

    ``drop_last`` drops the short last batch of a pass *for its epoch*, as torch means it: its
    rows are reported ``dropped``, which marks them consumed. torch's own ``drop_last`` (a
    plain DataLoader given ``sampler=``) drops them without the dataset knowing, so they are
    still owed to the epoch and come first in the next pass.

    The rows left over from a block wait for the next block to fill a batch, and pin their
    segments meanwhile; so do the batches a DataLoader's workers hold for the training process
    (``_in_flight``), which it cannot receive while this batcher waits for the sampler. Should
    those fill ``shm_budget`` (a budget below about a window of tasks), the task the sampler
    waits for finds no room and the run would wait for ever. ``pinned(n)`` says when that is
    so: a writer of a task the sampler waits for is blocked on room, and the ``n`` rows held
    here are all that is not consumed (both asked of ``reports``, the dataset's: one port,
    core/ports.py). This batcher then hands the rows it keeps out as a short
    batch, with a warning (torch receives the batches in flight meanwhile). Under DDP
    (``short_batches=False``) a short batch would give ranks unequal steps, and with no rows kept
    nothing could be handed out: then it raises ``ShmSpaceError``.
    """

    def __init__(
        self,
        sampler: TaskSampler,
        batch_size: int,
        drop_last: bool,
        reports: BatchReports | None = None,
        *,
        short_batches: bool = True,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive int, got {batch_size!r}")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = bool(drop_last)
        # None: no dataset behind it (rows count as gathered, nothing is reported).
        self.reports = reports
        self.short_batches = short_batches
        # Batches issued and not received by the loop yet, oldest first: shmloader.DataLoader
        # reports each as its loop receives it, and a plain DataLoader's requests tell
        # (delivery.py). Their rows are in flight: consumed only once received.
        self.issued: deque[np.ndarray] = deque()
        # How this pass's deliveries are told (delivery.py), chosen as it starts: by
        # shmloader.DataLoader's loop when it claimed the pass (``claimed``), else by torch's
        # requests where the loader asking can be found, else by the gather.
        self._receipt = Receipt.GATHER
        self._claimed = False
        # A wrapper between torch's DataLoader and the loop that holds batches back
        # (wrappers.py): receipts come that many batches later, the last at its end.
        self._wrapper: Wrapper | None = None
        # What torch asked of a wrapped pass's requests (delivery.py).
        self._counts: RequestCounts | None = None
        self._warned_held_back = False  # see _end_wrapped_pass
        self._warned_early = False  # see _count_in_flight
        self._warned_no_receipt = False  # see _warn_no_receipt
        self._carried = 0  # rows carried to the next batch
        self._warned = False

    @property
    def receipt(self) -> Receipt:
        """How the current (or last) pass's deliveries are told."""
        return self._receipt

    @contextlib.contextmanager
    def claimed(self) -> Iterator[None]:
        """The passes begun inside are ``shmloader.DataLoader``'s own loop, which reports each
        batch as it hands it over (``issued``): it starts torch's iterator inside, which asks
        for this batcher's iterator once or twice (torch makes one, then its first ``_reset``
        another). Any other iteration (a wrapper's DataLoader rebuilt from the loader's parts,
        as accelerate's ``prepare`` does) is a plain DataLoader's."""
        self._claimed = True
        try:
            yield
        finally:
            self._claimed = False

    def stuck(self) -> bool:
        """Whether the rows this batcher holds (kept for the next batch, or in batches in
        flight) are all that keeps the task the sampler waits for from being read."""
        held = self._carried + self._in_flight()
        return held > 0 and self.reports is not None and self.reports.pinned(held)

    def _in_flight(self) -> int:
        """Rows of batches issued that only this thread could receive (none where a plain
        DataLoader's workers report rows consumed as they gather them)."""
        return sum(len(batch) for batch in self.issued)

    def __iter__(self) -> Iterator[list[int]]:
        """The pass's batches. Under a plain DataLoader with workers whose deliveries its
        requests tell (delivery.py), an iterator that reports each batch as the loop receives
        it; so rows its workers prefetched for a pass left early come again."""
        if self._claimed:
            return _listed(self.loop_pass(), Receipt.LOOP)
        self._end_wrapped_pass()
        if self.reports is None:
            return _listed(self._start(Receipt.GATHER), Receipt.GATHER)
        wrapper = wrapper_of(self)  # ConfigError for one that would drop batches
        # A wrapper says which DataLoader it iterates (accelerate's GradientState); a plain
        # DataLoader is found asking on the call stack (delivery.py).
        prefetch = depth_of(wrapper.drawn_by) if wrapper is not None else prefetch_depth(self)
        depth = prefetch.depth
        ahead = 0
        if depth is not None and wrapper is not None:
            ahead = wrapper.ahead
            self._wrapper = wrapper
        if depth is not None and depth + ahead:
            batches = self._start(Receipt.REQUESTS)
            requests = Requests(batches, depth, ahead, self.issued, self.reports.received)
            if self._wrapper is not None:
                # torch's iterator, which holds these requests, goes as the wrapper's pass
                # ends or is left (break), while the wrapper still says whether the loop had
                # its last batch: receive it then, in the loop's thread (not a late collection's).
                self._counts = requests.counts
                here = threading.get_ident()
                weakref.finalize(requests, self._receive_held_back_in, here, requests.counts)
            return requests
        if depth is None:
            self._warn_no_receipt(prefetch.why)
        return _listed(self._start(Receipt.GATHER), Receipt.GATHER)

    def state_dict(self) -> dict[str, Any]:
        """The dataset's state as it will be once the loop has every batch this batcher handed
        out so far, for a loader that saves its batch sampler's state with each batch as it
        hands the batch out (torchdata's ``StatefulDataLoader``, also under accelerate's
        ``use_stateful_dataloader``): it takes the state as it asks for a batch, and gives back
        the one taken with the last batch the loop got. ``ds.state_dict()`` counts only what
        the loop has."""
        if self.reports is None:
            raise ConfigError("this batch sampler has no dataset: take it from ds.batch_sampler()")
        issued = [batch for batch in self.issued if len(batch)]
        return self.reports.state(np.concatenate(issued) if issued else None)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (the dataset's, as :meth:`state_dict` gave it): before the
        first iteration, as ``SharedTaskDataset.load_state_dict``."""
        if self.reports is None:
            raise ConfigError("this batch sampler has no dataset: take it from ds.batch_sampler()")
        self.reports.load_state(state)

    def receive_held_back(self) -> None:
        """Receive what a wrapper that holds batches back has handed to the loop by now
        without torch's requests saying so: its last batch, which it yields once torch's
        iterator has ended. Called as a pass begins, and before a state is taken or the
        dataset closes."""
        wrapper = self._wrapper
        if wrapper is None or not wrapper.loop_has_last_batch() or self.reports is None:
            return
        while self.issued:
            self.reports.received(self.issued.popleft())

    def _receive_held_back_in(self, thread: int, counts: RequestCounts) -> None:
        if threading.get_ident() == thread:
            self.receive_held_back()
            counts.asked_at_end = True

    def _end_wrapped_pass(self) -> None:
        """As a pass begins: receive what the last one's wrapper handed to the loop
        (:meth:`receive_held_back`), say (once) where that cannot be known. The wrapper says whether
        its loop had the last batch only until its next pass begins, which is now; it was
        asked as torch's iterator went, unless something kept that iterator past the pass.
        Then a loop that left the pass (``break``) after torch had returned every batch may or
        may not have had the one the wrapper held back: its rows count as not delivered, and
        come again in this pass."""
        self.receive_held_back()
        counts, self._counts = self._counts, None
        held = sum(len(batch) for batch in self.issued)
        in_doubt = counts is not None and counts.returned_all and not counts.asked_at_end
        if self._wrapper is not None and in_doubt and held and not self._warned_held_back:
            self._warned_held_back = True
            log.warning(
                "a pass over ds.batch_sampler(%d) under a wrapper that holds a batch back "
                "(accelerate's prepare) was left after torch had handed the wrapper its last "
                "batch, and its DataLoader iterator was kept past the pass, so whether the "
                "loop had that batch cannot be told: its %d rows count as not delivered and "
                "come again in this pass. Let the iterator go when you leave a pass, or take "
                "the dataset's state (ds.state_dict(), accelerator.save_state()) before the "
                "next one, and they count exactly (logged once)",
                self.batch_size,
                held,
            )
        self._wrapper = None

    def loop_pass(self) -> Iterator[np.ndarray]:
        """A pass of ``shmloader.DataLoader``'s own loop (``Receipt.LOOP``): the batches as
        arrays, which that loop gathers itself (no workers: ``_in_process``) or torch hands to
        its workers (as lists, ``__iter__`` under ``claimed``); the loop reports each."""
        self._end_wrapped_pass()
        return self._start(Receipt.LOOP)

    def in_process(self) -> Iterator[np.ndarray]:
        """A pass gathered in this process by a loop that gets each batch as it is gathered (a
        plain DataLoader without workers, driven by the dataset: ``SharedTaskDataset``'s
        natural form): counted as gathered."""
        return self._start(Receipt.GATHER)

    def _start(self, receipt: Receipt) -> Iterator[np.ndarray]:
        self.issued.clear()
        self._receipt = receipt
        return self._batches()

    def _warn_no_receipt(self, why: str) -> None:
        """Say (once) that a plain DataLoader's deliveries cannot be told, what that risks and
        the fix: its rows count as gathered, which its workers do ahead of the loop."""
        if self._warned_no_receipt:
            return
        self._warned_no_receipt = True
        log.warning(
            "batches of ds.batch_sampler(%d) are drawn by a DataLoader whose deliveries the "
            "dataset cannot tell (%s), so rows count as consumed when they are gathered: "
            "should it use workers, a break or a state_dict() in the middle of a pass counts "
            "the batches they prefetched (up to num_workers * prefetch_factor) as delivered. "
            "shmloader.DataLoader(ds, batch_size=%d, ...) counts exactly what its loop gets "
            "(logged once)",
            self.batch_size,
            why,
            self.batch_size,
        )

    def _batches(self) -> Iterator[np.ndarray]:
        size = self.batch_size
        carry = np.empty(0, dtype=np.int64)
        self._carried = 0
        # arrays: no work per sample
        delivered = self._receipt is not Receipt.GATHER
        walk = PassWalk(
            stuck=self.stuck,
            rest_alone=True,
            flush=True,
            consumed_when=ConsumedWhen.DELIVERED if delivered else ConsumedWhen.GATHERED,
            passes_again=self._receipt is Receipt.LOOP,
        )
        chunks = self.sampler.chunks(walk)
        for chunk in chunks:
            if chunk is FLUSH:
                if len(carry):
                    yield from self._end_of_pass(carry)
                carry = np.empty(0, dtype=np.int64)
                self._carried = 0
                if self._receipt is Receipt.REQUESTS:
                    # The pass is to wait for tasks other trainers hold, which it may only with
                    # nothing of its own in flight (_wait_for_elsewhere); the loop receives
                    # these batches only once it goes on, so they count now, as gathered.
                    self._count_in_flight(warn=False)
                continue
            if isinstance(chunk, Signal):  # SHORT_BATCH
                tracked = self._receipt is Receipt.REQUESTS
                if not len(carry) and tracked and self._in_flight():
                    self._count_in_flight()  # their rows hold the room: count them now
                    continue
                self._short_batch(len(carry))
                yield self._issue(np.sort(carry))
                carry = np.empty(0, dtype=np.int64)
                self._carried = 0
                continue
            if len(carry):
                chunk = np.concatenate((carry, chunk))
            full = len(chunk) - len(chunk) % size
            carry = chunk[full:]
            self._carried = len(carry)
            for i in range(0, full, size):
                yield self._issue(np.sort(chunk[i : i + size]))
        self._carried = 0
        yield from self._end_of_pass(carry)

    def _end_of_pass(self, carry: np.ndarray) -> Iterator[np.ndarray]:
        """The rows kept for a batch the pass does not fill: a short batch, or dropped.
        Only a pass that ran to its end drops: one left early (``break``) resumes with them."""
        if len(carry) and self.drop_last:
            if self.reports is not None:
                self.reports.dropped(carry)
        elif len(carry):
            yield self._issue(np.sort(carry))

    def _count_in_flight(self, *, warn: bool = True) -> None:
        """A plain DataLoader whose deliveries its requests tell, stuck: the batches it has in
        flight hold the budget, and their rows count as consumed only once the loop receives
        them, which it cannot while this batcher waits. They are counted consumed now (their
        segments go once gathered), with a warning: a ``break`` before the loop receives them
        loses them, as under ``sampler=ds.sampler()``. Also at the end of the master's last
        epoch (FLUSH), without one. (NOTE [exactly once on the trainer side], 2, in
        accounting/book.py.)"""
        rows = self._in_flight()
        for i, batch in enumerate(self.issued):
            if len(batch) and self.reports is not None:
                self.reports.counted_early(batch)
            self.issued[i] = batch[:0]  # its request still comes: nothing left to report
        if warn and not self._warned_early:
            self._warned_early = True
            log.warning(
                "shm_budget is full with the segments of %d rows in batches the DataLoader's "
                "workers prefetched, which count as consumed only once the loop receives them, "
                "so the task the sampler waits for cannot be read: counting them consumed now "
                "(a break before the loop gets them loses them; logged once). To keep a break "
                "exact, raise shm_budget to hold two shuffle windows of tasks (or lower "
                "num_workers or prefetch_factor)",
                rows,
            )

    def _short_batch(self, rows: int) -> None:
        why = (
            f"shm_budget is full with the segments of rows not consumed yet ({rows} kept for "
            f"the next batch of {self.batch_size}, the rest in batches in flight), so the task "
            "the sampler waits for cannot be read"
        )
        fix = (
            "raise shm_budget to hold two shuffle windows of tasks (or lower records_per_task, "
            "shuffle_window, num_workers or prefetch_factor)"
        )
        if not rows:
            raise ShmSpaceError(f"{why}; {fix}")
        if not self.short_batches:
            raise ShmSpaceError(
                f"{why}; under DDP a short batch would give this rank a step more than the "
                f"others: {fix}"
            )
        if not self._warned:  # once: with such a budget it happens at most blocks
            self._warned = True
            log.warning(
                "%s: handing them out as a short batch (and so on, whenever it "
                "happens again); to keep every batch full, %s",
                why,
                fix,
            )

    def _issue(self, batch: np.ndarray) -> np.ndarray:
        if self._receipt is not Receipt.GATHER:  # received later: by the loop or torch's requests
            self.issued.append(batch)
        return batch

    def __len__(self) -> int:
        self.receive_held_back()  # a wrapper's last batch the loop has is not owed to the next pass
        n = self.sampler.pass_rows(rest_alone=True)  # as __iter__ will walk it
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


def _listed(batches: Iterator[np.ndarray], receipt: Receipt) -> Iterator[list[int]]:
    """The batches as torch's batch samplers hand them out (see ``SampleIndices``), with the
    pass's receipt."""
    for batch in batches:
        yield SampleIndices(IndexBatch(batch, receipt))
