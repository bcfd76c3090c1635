"""The sampler: yields indices of rows that are ready in shared memory, shuffled per window.

Shuffling is two-level, like most streaming loaders: the master shuffles the *task* order of
each epoch, and the sampler shuffles *rows* across a window of ``shuffle_window`` consecutive
tasks (block shuffle). Blocks are formed from the master's task order, not from the order in
which readers happen to finish, and each block's permutation is seeded from
``(seed, epoch, first task of the block)``; so for a fixed configuration the order is the same
on every run, however the readers race. Each epoch starts with blocks of 1, 2, 4, ... tasks
so that the first batch waits for one task, not a whole window. Neither the blocks nor their
permutations depend on what was consumed before (a resume, a pass continued after ``break``):
the rest of an epoch comes in the uninterrupted order. A block's segments are all released
once it has been consumed, which bounds shared memory to about two windows (one being
consumed, one filling).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch.utils.data

from ...errors import ConfigError, ShmSpaceError
from ..core.indices import split_indices
from ..core.receipts import ConsumedWhen, Receipt, of_the_loop, tracked
from ..core.record_ranges import row_records
from ..core.tasks import Pressure, ReadyTask
from ..waiting.ready import ReadyTasks
from ..waiting.strays import StrayCount
from .delivery import Requests, depth_of, loader_of, prefetch_depth
from .wrappers import Wrapper, wrapper_of

log = logging.getLogger(__name__)

DEFAULT_SHUFFLE_WINDOW = 8
# Yielded by ``TaskSampler.chunks`` when a batcher must hand out the rows it holds (see there).
LET_GO = np.empty(0, dtype=np.int64)
# How long the rows handed out to a batcher the sampler cannot see stay unconsumed, while the
# task waited for has no room, before that is taken for what it is (see _NoProgress).
STALL_SECONDS = 8.0  # under ready.STUCK_WARN: the error comes instead of that warning
PINNED_BY_TORCH = (
    "shm_budget is full with the segments of rows handed out to torch's BatchSampler (a "
    "DataLoader given sampler=ds.sampler()), which keeps them for its next batch and cannot "
    "hand out a short one, and the task the sampler waits for has no room beside them, so "
    "nothing can move: raise shm_budget to hold two shuffle windows of tasks (or lower "
    "records_per_task or shuffle_window), or use shmloader.DataLoader or "
    "batch_sampler=ds.batch_sampler(batch_size), which hand such rows out as a short batch"
)
# Yielded by ``TaskSampler.chunks(flush=True)`` when a batcher must hand out the rows it keeps.
FLUSH = np.empty(0, dtype=np.int64)
STRAY_POLL = 0.1  # seconds between asking the master where tasks given up as elsewhere are
# After this long waiting at the end of the last epoch for tasks other trainers hold, say so.
LAST_EPOCH_WARN = 10.0
# How long a plain DataLoader's workers are given to gather the batches handed to them.
GATHER_GRACE = 2.0


class Feed(Protocol):
    """What the sampler needs from the dataset's data plane (kept narrow for testing)."""

    ready: ReadyTasks

    @property
    def strays(self) -> StrayFeed:
        """The tasks the sampler waits for that are not ready here."""
        ...

    def epoch_to_iterate(self) -> int:
        """The unfinished epoch, or the next one."""
        ...

    def remaining_seqs(self, epoch: int) -> list[int]:
        """Task positions of ``epoch`` not yet admitted, in order."""
        ...

    def epochs_over(self, epoch: int) -> int | None:
        """The master's number of epochs if ``epoch`` is past its last one, else None."""
        ...

    def ledger_rows(self) -> int:
        """Rows a plain DataLoader's workers reported gathered so far (consumed as gathered)."""
        ...

    def reclaim(self, epoch: int) -> np.ndarray:
        """Indices emitted earlier in ``epoch`` but never consumed (an abandoned pass)."""
        ...

    def rest_of_last_pass(self, epoch: int, *, poll: bool = True) -> np.ndarray:
        """Indices the finished pass of the epoch before ``epoch`` left unconsumed."""
        ...

    def admit(self, task: ReadyTask) -> np.ndarray:
        """Start tracking ``task``; returns the indices of its rows still to deliver."""
        ...

    def handed_out(self, indices: np.ndarray) -> None:
        """The sampler hands these admitted rows out, in this order: ``reclaim`` gives back
        those left unconsumed in it."""
        ...

    def starved(self) -> bool:
        """True when readers wait for shared-memory budget (more tasks cannot arrive)."""
        ...

    def blocked(self) -> bool:
        """True when a reader of a task waited for has no room in the budget."""
        ...

    def dead_end(self) -> bool:
        """True when a task waited for has no room and nothing handed out is unconsumed."""
        ...

    def unconsumed_rows(self) -> int:
        """Rows handed out and not consumed yet (in flight to the loop, or held by a batcher)."""
        ...

    def pass_rows(self, epoch: int) -> int:
        """Rows a pass over ``epoch`` delivers: what ``reclaim`` gives back, and the epoch's
        rows not admitted yet, less those consumed before a resume."""
        ...

    def epoch_rows(self, epoch: int) -> int:
        """Rows ``epoch`` schedules for this consumer, consumed or not."""
        ...

    def finish_epoch(self, epoch: int) -> None: ...

    def elsewhere(self, epoch: int, seqs: list[int]) -> set[int]:
        """Those of ``seqs`` that will not come here (another trainer took them, or done)."""
        ...


class FirstPass(NamedTuple):
    """The first pass while the dataset has not started (worked out from the plan, so that
    ``len()`` starts nothing): its epoch's rows for this consumer, and those left of them."""

    epoch_rows: int
    left: int


class StrayFeed(Protocol):
    """What the sampler asks of the tasks it waits for that are not ready here (strays.py)."""

    def want(self, epoch: int, seqs: list[int]) -> None:
        """The sampler is about to wait for these tasks (empty: for none)."""
        ...

    def take_strays(self) -> list[ReadyTask]:
        """Tasks given up as elsewhere that came here after all, ready now."""
        ...

    def look(self) -> StrayCount:
        """Of the tasks given up as elsewhere, how many may still come here and how many
        another trainer took in hand."""
        ...

    def want_strays(self) -> None:
        """The sampler is about to wait for the tasks given up as elsewhere."""
        ...


def block_permutation(seed: int, epoch: int, first_seq: int, n: int) -> np.ndarray:
    """The seeded permutation of a block: a function of its place only, never of timing."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, first_seq])))
    return rng.permutation(n)


class TaskSampler(torch.utils.data.Sampler[int]):
    """Indices for ``SharedTaskDataset.__getitems__``; each ``iter()`` is one (rest of an) epoch.

    A pass that is left early (``break``) is continued by the next ``iter()``: rows are
    delivered once per epoch, so the next pass finishes the epoch before a new one starts.
    """

    def __init__(
        self,
        feed: Callable[[], Feed],
        *,
        shuffle: bool,
        seed: int,
        window: int = DEFAULT_SHUFFLE_WINDOW,
        rows_before_start: Callable[[], FirstPass | None] | None = None,
    ) -> None:
        if window < 1:
            raise ConfigError(f"shuffle_window must be >= 1, got {window}")
        self._get_feed = feed  # called late: the dataset starts on first use
        # The rows of the first pass while the dataset has not started (None: ask the feed),
        # so that len() does not start it.
        self._rows_before_start = rows_before_start or (lambda: None)
        self.shuffle = shuffle
        self.seed = seed
        self.window = window
        self._warned_order = False  # see _warn_out_of_order
        self._warned_empty = False  # see _warn_empty
        self._passes = 0  # passes begun: the first one may join a master whose epochs ended
        # The epoch of the pass begun last, the ledger's rows then and what torch's BatchSampler
        # drew in it, until it ends the epoch.
        self._open_pass: tuple[int, int, _Drawn] | None = None
        self._warned_prefetch = False  # see _warn_prefetched
        # What torch's BatchSampler draws in the pass __iter__ begins (chunks takes it).
        self._drawing = _Drawn()
        self._warned_open = False  # see _warn_left_open
        self._warned_wait = False  # see _note_waiting
        # The master's last epoch, when a pass over it ended with tasks of it in other
        # trainers' hands that it could not wait for (see _strays): the next pass finishes it.
        self.left_open: int | None = None

    def __len__(self) -> int:
        return self.pass_rows(rest_alone=False)

    def epoch_rows(self) -> int:
        """Rows of the whole epoch the next pass is in (this consumer's share), whatever part
        of it was consumed: the length a framework that counts a resumed epoch's steps from
        where it stopped expects (``DataLoader(length="epoch")``)."""
        before = self._rows_before_start()
        if before is not None:
            return before.epoch_rows
        feed = self._get_feed()
        epoch = self._pass_epoch(feed)
        return 0 if feed.epochs_over(epoch) is not None else feed.epoch_rows(epoch)

    def pass_rows(self, *, rest_alone: bool) -> int:
        """Rows the next pass delivers: what is left of the epoch (not what it had: after a
        ``break`` or a resume, progress bars and schedules count the steps from ``len``), or
        with ``rest_alone`` (see ``chunks``) the rest of the last epoch when its pass left
        some."""
        before = self._rows_before_start()
        if before is not None:  # nothing delivered yet: no rest of a pass either
            return before.left
        feed = self._get_feed()
        epoch = self._pass_epoch(feed)
        rest = feed.rest_of_last_pass(epoch) if rest_alone else ()
        return len(rest) if len(rest) else feed.pass_rows(epoch)

    def _pass_epoch(self, feed: Feed) -> int:
        """The epoch the next pass is over: the one to iterate, or the one after it when the
        last pass delivered every row of it but was not run to its end (the loop stopped
        after the epoch's last batch: nothing of it is left for a pass of its own)."""
        epoch = feed.epoch_to_iterate()
        if self.left_open == epoch or feed.epochs_over(epoch) is not None:
            return epoch
        if feed.epoch_rows(epoch) > 0 and feed.pass_rows(epoch) == 0:
            return epoch + 1
        return epoch

    def __iter__(self) -> Iterator[int]:
        """One index at a time, for torch's BatchSampler (a DataLoader given this sampler),
        which keeps what it was given until it has a whole batch: when those rows fill the
        budget and the next task has no room, nothing can move, and this raises."""
        # The loader drawing from it, if it can be found, so that a pass it leaves early is
        # told with the rows it lost (_warn_prefetched): batches of batch_size, depth ahead.
        loader = loader_of(self)
        depth = None if loader is None else depth_of(loader).depth
        size = None if loader is None else loader.batch_size
        drawn = self._drawing = _Drawn(batch_size=size, depth=depth)  # taken by chunks()
        for chunk in self.chunks(stuck=_NoProgress(self._get_feed())):
            if chunk is LET_GO:
                raise ShmSpaceError(PINNED_BY_TORCH)
            for index in chunk.tolist():
                drawn.pulled += 1
                yield index

    def chunks(
        self,
        stuck: Callable[[], bool] | None = None,
        *,
        rest_alone: bool = False,
        flush: bool = False,
        consumed_when: ConsumedWhen = ConsumedWhen.GATHERED,
        passes_again: bool = False,
    ) -> Iterator[np.ndarray]:
        """The epoch's indices in order, a block at a time (for batchers that slice arrays).

        ``stuck()``: whether the batcher holds every row handed out and not yet consumed, while
        it waits for more (see ``ReadyTasks.take``). When the budget is full and nothing can
        come until those rows are consumed, :data:`LET_GO` is yielded: the batcher hands them
        out as they are, then asks again.

        ``rest_alone``: rows the last epoch's pass handed out and the loop never received (it
        stopped in that pass's last batches) make up this pass alone, as the rest of their
        epoch; the next pass starts the next epoch. For batchers that never drop rows unsaid
        (ours): torch's BatchSampler with ``drop_last`` would drop such a short pass every
        time, so for it they come first in the next epoch's pass instead.

        ``flush``: the batcher takes :data:`FLUSH`, yielded at the end of the master's last
        epoch before the pass waits for tasks other trainers hold (see ``_strays``): it hands
        out (or with ``drop_last`` drops) the rows it keeps, as at the end of the pass.

        ``consumed_when``: when the batcher's loader consumes rows (``ConsumedWhen``); the end
        of the master's last epoch allows a plain DataLoader's workers time to gather theirs.
        ``passes_again``: the loader makes one more pass itself when this one leaves the
        master's last epoch open (``shmloader.DataLoader``); else a warning says it is needed.
        """
        feed = self._get_feed()
        epoch = self._pass_epoch(feed)
        if epoch != feed.epoch_to_iterate():
            feed.finish_epoch(epoch - 1)  # delivered whole by the pass before (see _pass_epoch)
        self._passes += 1
        # The rest of a last epoch left open (see _strays): every task of it not taken here
        # was found elsewhere, and is a stray; no need to ask about them again.
        reopened, self.left_open = self.left_open == epoch, None
        if rest_alone:
            rest = feed.rest_of_last_pass(epoch)
            if len(rest):
                yield rest
                return
        planned = feed.epochs_over(epoch)
        if planned is not None:
            self._warn_empty(planned)
            return
        leftover = feed.reclaim(epoch)  # polls the ledger: what the last pass's workers did
        self._warn_prefetched(epoch, feed.ledger_rows())
        if len(leftover):
            yield leftover
        pending = [] if reopened else feed.remaining_seqs(epoch)
        dropped: set[int] = set()

        def gone(missing: list[int]) -> set[int]:
            elsewhere = feed.elsewhere(epoch, missing)
            dropped.update(elsewhere)
            return elsewhere

        # Blocks of 1, 2, 4, ... tasks up to the window from the epoch's first task: the first
        # batch needs one task read, not a whole window. A pass that continues an epoch (after
        # a ``break``) goes on with the blocks the whole pass would have had.
        size, full = block_grid(pending[0], self.window) if pending else (1, 1)
        while pending:
            block, pending = _next_block(feed, epoch, pending, size, gone)
            this = size, full
            size = full = min(full * 2, self.window)
            tasks: list[ReadyTask] | None = []
            if block:
                feed.strays.want(epoch, block)
                tasks = feed.ready.take(
                    epoch, block, pressure=lambda: _pressure(feed, stuck), later=pending, gone=gone
                )
                feed.strays.want(epoch, [])
            if tasks is None:  # nothing can come until the batcher lets its rows go
                pending, (size, full) = block + pending, this  # the same block, once room is back
                yield LET_GO
                continue
            got = {t.seq for t in tasks}
            # Starved: part of the block, or later tasks in its place. Tasks found elsewhere
            # while waiting are not put back.
            left = [s for s in block if s not in got and s not in dropped]
            if left or not got <= set(block):
                pending = left + [s for s in pending if s not in got]
                self._warn_out_of_order(epoch, left, sorted(got))
            indices = self._block_indices(feed, epoch, tasks + feed.strays.take_strays())
            if len(indices):
                yield indices
        over = yield from self._strays(feed, epoch, flush, consumed_when, passes_again)
        self._open_pass = None
        if over:
            feed.finish_epoch(epoch)
        else:
            self.left_open = epoch

    def _warn_prefetched(self, epoch: int, ledger_rows: int) -> None:
        """A pass begins; if the last one left ``epoch`` unfinished (a ``break``) while a
        plain DataLoader's workers gathered rows of it, say (once) what that cost: torch had
        prefetched batches the loop never received, and the dataset counted them delivered
        (torch's BatchSampler hides which batches reach the loop; our batchers see it)."""
        drawn, self._drawing = self._drawing, _Drawn()
        last, self._open_pass = self._open_pass, (epoch, ledger_rows, drawn)
        if last is None or last[0] != epoch or self._warned_prefetch:
            return
        gathered = ledger_rows - last[1]
        if gathered <= 0:
            return
        self._warned_prefetch = True
        lost = last[2].lost(gathered)  # of the pass left early
        what = (
            f"{lost} of the {gathered} rows its workers gathered (those of the batches torch "
            "had prefetched and not handed to the loop yet)"
            if lost is not None
            else f"of the {gathered} rows its workers gathered, those of the batches torch "
            "had prefetched and not handed to the loop yet (up to num_workers * "
            "prefetch_factor batches)"
        )
        log.warning(
            "the last pass over epoch %d ended early (a break?) under a plain "
            "torch.utils.data.DataLoader with workers given sampler=ds.sampler(): %s never "
            "reached the loop, and do not come again this epoch. With "
            "batch_sampler=ds.batch_sampler(batch_size) instead (or with shmloader.DataLoader) "
            "the dataset knows which batches reach the loop and delivers the others in the "
            "next pass (said once)",
            epoch,
            what,
        )

    def _warn_empty(self, planned: int) -> None:
        """Say (once) why a pass yields nothing: a loop of ``for epoch in range(5)`` over a
        dataset of ``epochs=1`` trained once and then silently did nothing four times."""
        if self._warned_empty:
            return
        self._warned_empty = True
        joined = (
            " before this trainer's first pass (it joined a master that had finished)"
            if self._passes == 1
            else ""
        )
        log.warning(
            "this pass is empty: the master's %d epoch(s) are over%s. Each full pass of the "
            "loop is one epoch; for more passes make the dataset (or start the standalone "
            "master) with more epochs, or epochs=None for no end (said once)",
            planned,
            joined,
        )

    def _warn_out_of_order(self, epoch: int, missing: list[int], got: list[int]) -> None:
        """Say (once) that the order stopped being a function of the configuration: ``take``
        went on without the whole block because readers had no room in the budget for it.
        Exactly once still holds, so nothing else would tell the user that a rerun with the
        same seed will not see the same batches."""
        if self._warned_order:
            return
        self._warned_order = True
        log.warning(
            "epoch %d: readers had no room in shm_budget for tasks %s of the block the sampler "
            "waited for, so it went on with the tasks ready (%s): from here the order depends "
            "on timing, not only on the seed (each row still comes once; said once, however "
            "often it happens again). For a reproducible order raise shm_budget (several "
            "shuffle windows of tasks: docs/dataset.md, 'Order and shuffling')",
            epoch,
            missing,
            got,
        )

    def _strays(
        self,
        feed: Feed,
        epoch: int,
        flush: bool,
        consumed_when: ConsumedWhen,
        passes_again: bool,
    ) -> Generator[np.ndarray, None, bool]:
        """The end of a pass that gave tasks up as elsewhere (elastic mode: other trainers took
        them): wait until each is done or in some trainer's hands, delivering those that come
        here after all (their holder died and this trainer's readers leased them again).
        Returns whether the epoch is over for this trainer.

        Tasks other trainers took in hand are not waited for while rows this trainer handed
        out are not consumed yet: those trainers may wait for ours just so, and rows this pass
        yielded last may sit in a batch that the loop gets only once the pass ends (a
        DataLoader's last, short batch, or one torch prefetched). Should such a trainer die,
        its tasks come here as strays of the next pass.

        The master's last epoch has no next pass, and a trainer that died with tasks of it in
        hand would have them lost, silently. So there, once every row handed out here is
        consumed (``flush``: the batcher first hands out the rows it keeps), the pass waits
        for those tasks too: nothing of this trainer's is in flight, so nobody waits on it and
        the waits cannot close a cycle; a dead trainer's tasks come here once its leases lapse.
        While rows of its own are in flight, the pass ends with the epoch left open
        (``left_open``): the next pass waits for them, with nothing in flight
        (shmloader.DataLoader makes that pass itself; a plain DataLoader is told).
        """
        last = feed.epochs_over(epoch + 1) is not None
        waited_since: float | None = None
        kept = flush  # the batcher may keep rows of the pass: FLUSH before waiting
        try:
            while True:
                indices = self._block_indices(feed, epoch, feed.strays.take_strays())
                if len(indices):
                    yield indices
                    kept = flush
                strays = feed.strays.look()
                if not strays.may_come:
                    held = strays.taken_elsewhere
                    if not last or not held:
                        return True
                    if kept:
                        kept = False
                        yield FLUSH
                    by_the_loop = consumed_when is ConsumedWhen.DELIVERED
                    if not _all_consumed(feed, 0.0 if by_the_loop else GATHER_GRACE):
                        if not passes_again:
                            self._warn_left_open(epoch, held)
                        return False
                    waited_since = self._note_waiting(epoch, held, waited_since)
                feed.strays.want_strays()
                feed.ready.wait(STRAY_POLL)
        finally:
            feed.strays.want(epoch, [])

    def _note_waiting(self, epoch: int, held: int, since: float | None) -> float:
        """Say that the end of the last epoch waits for tasks other trainers hold: at once in
        the log's info, and as a warning (once) when it has waited ``LAST_EPOCH_WARN`` s."""
        now = time.monotonic()
        if since is None:
            log.info(
                "epoch %d, the master's last: waiting for %d task(s) of it that other trainers "
                "hold (they deliver them, or, should one have died, this trainer does once its "
                "leases lapse)",
                epoch,
                held,
            )
            return now
        if now - since >= LAST_EPOCH_WARN and not self._warned_wait:
            self._warned_wait = True
            log.warning(
                "epoch %d, the master's last: still waiting after %.0f s for %d task(s) of it "
                "that other trainers hold; one that died with them gives them up once the "
                "master's lease_timeout (consumer_timeout, for a task its loop had begun) has "
                "passed since it was last heard from (said once)",
                epoch,
                now - since,
                held,
            )
        return since

    def _warn_left_open(self, epoch: int, held: int) -> None:
        """The pass over the master's last epoch ends with tasks of it in other trainers'
        hands, and rows of this trainer's not consumed yet, so it cannot wait for them (see
        ``_strays``). shmloader.DataLoader then makes another pass, which waits; a plain
        DataLoader is told (once) that one is needed."""
        if self._warned_open:
            return
        self._warned_open = True
        log.warning(
            "epoch %d, the master's last, is not over: other trainers hold %d task(s) of it. "
            "Should one of them have died, its tasks come to this trainer once its leases "
            "lapse, but only in one more pass over the loader (it waits for them, delivers "
            "what comes, and ends): iterate it once more after the last epoch, or use "
            "shmloader.DataLoader, which does so itself (said once)",
            epoch,
            held,
        )

    def _block_indices(self, feed: Feed, epoch: int, tasks: list[ReadyTask]) -> np.ndarray:
        """The rows of a block's tasks, admitted, shuffled with the block's own seed.

        The permutation is over every record of the block's tasks, delivered or not; the rows
        consumed before a resume (or by a trainer that left), and records the source skipped,
        are then left out of it. So a resumed block delivers its rest in the order the
        uninterrupted run had: what was consumed is a prefix of that order."""
        if not tasks:
            return np.empty(0, dtype=np.int64)
        indices = np.concatenate([_by_record(t, feed.admit(t)) for t in tasks])
        if self.shuffle and len(indices) > 1:
            indices = indices[block_permutation(self.seed, epoch, tasks[0].seq, len(indices))]
        indices = indices[indices >= 0]
        feed.handed_out(indices)
        return indices


class TaskBatchSampler(torch.utils.data.Sampler[np.ndarray]):
    """Batches of a :class:`TaskSampler` for a DataLoader's ``batch_sampler=``.

    Each batch is handed over as a *sorted* int64 array, not a list: the dataset gathers it
    without converting a list or sorting it by segment, and reads each segment's rows in
    address order (the batch holds the same samples; only their order inside it changes).

    ``drop_last`` drops the short last batch of a pass *for its epoch*, as torch means it: its
    rows are handed to ``on_drop``, which marks them consumed. torch's own ``drop_last`` (a
    plain DataLoader given ``sampler=``) drops them without the dataset knowing, so they are
    still owed to the epoch and come first in the next pass.

    The rows left over from a block wait for the next block to fill a batch, and pin their
    segments meanwhile; so do the batches a DataLoader's workers hold for the training process
    (``_in_flight``), which it cannot receive while this batcher waits for the sampler. Should
    those fill ``shm_budget`` (a budget below about a window of tasks), the task the sampler
    waits for finds no room and the run would wait for ever. ``pinned(n)`` says when that is
    so: a writer of a task the sampler waits for is blocked on room, and the ``n`` rows held
    here are all that is not consumed. This batcher then hands the rows it keeps out as a short
    batch, with a warning (torch receives the batches in flight meanwhile). Under DDP
    (``let_go=False``) a short batch would give ranks unequal steps, and with no rows kept
    nothing could be handed out: then it raises ``ShmSpaceError``.
    """

    def __init__(
        self,
        sampler: TaskSampler,
        batch_size: int,
        drop_last: bool,
        on_drop: Callable[[np.ndarray], None],
        pinned: Callable[[int], bool] | None = None,
        let_go: bool = True,
        on_received: Callable[[np.ndarray], None] | None = None,
        on_counted_early: Callable[[np.ndarray], None] | None = None,
        state_counting: Callable[[np.ndarray | None], dict[str, Any]] | None = None,
        load_state: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive int, got {batch_size!r}")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = bool(drop_last)
        self.on_drop = on_drop
        self.pinned = pinned
        self.let_go = let_go
        self.on_received = on_received
        self.on_counted_early = on_counted_early
        self._state_counting = state_counting
        self._load_state = load_state
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
        self._warned_early = False  # see _count_in_flight
        self._warned_untold = False  # see _warn_untold
        self._held = 0  # rows kept back for the next batch
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

    def _stuck(self) -> bool:
        held = self._held + self._in_flight()
        return held > 0 and self.pinned is not None and self.pinned(held)

    def _in_flight(self) -> int:
        """Rows of batches issued that only this thread could receive (none where a plain
        DataLoader's workers report rows consumed as they gather them)."""
        return sum(len(batch) for batch in self.issued)

    def __iter__(self) -> Iterator[np.ndarray]:
        """The pass's batches. Under a plain DataLoader with workers whose deliveries its
        requests tell (delivery.py), an iterator that reports each batch as the loop receives
        it; so rows its workers prefetched for a pass left early come again."""
        self.settle()  # the last pass's end, as a wrapper told it
        self._wrapper = None
        if self._claimed:
            return self._start(Receipt.LOOP)
        if self.on_received is None:
            return self._start(Receipt.GATHER)
        wrapper = wrapper_of(self)  # ConfigError for one that would drop batches
        prefetch = prefetch_depth(self)
        depth = prefetch.depth
        if depth is not None and wrapper is not None:
            depth += wrapper.ahead
            self._wrapper = wrapper
        if depth:
            batches = self._start(Receipt.REQUESTS)
            return Requests(batches, depth, self.issued, self.on_received)
        if depth is None:
            self._warn_untold(prefetch.why)
        return self._start(Receipt.GATHER)

    def state_dict(self) -> dict[str, Any]:
        """The dataset's state as it will be once the loop has every batch this batcher handed
        out so far, for a loader that saves its batch sampler's state with each batch as it
        hands the batch out (torchdata's ``StatefulDataLoader``, also under accelerate's
        ``use_stateful_dataloader``): it takes the state as it asks for a batch, and gives back
        the one taken with the last batch the loop got. ``ds.state_dict()`` counts only what
        the loop has."""
        if self._state_counting is None:
            raise ConfigError("this batch sampler has no dataset: take it from ds.batch_sampler()")
        issued = [batch for batch in self.issued if len(batch)]
        return self._state_counting(np.concatenate(issued) if issued else None)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (the dataset's, as :meth:`state_dict` gave it): before the
        first iteration, as ``SharedTaskDataset.load_state_dict``."""
        if self._load_state is None:
            raise ConfigError("this batch sampler has no dataset: take it from ds.batch_sampler()")
        self._load_state(state)

    def settle(self) -> None:
        """Receive what a wrapper that holds batches back has handed to the loop by now
        without torch's requests saying so: its last batch, which it yields once torch's
        iterator has ended. Called as a pass begins, and before a state is taken or the
        dataset closes."""
        wrapper = self._wrapper
        if wrapper is None or not wrapper.ends.end_of_dataloader or self.on_received is None:
            return
        while self.issued:
            self.on_received(self.issued.popleft())

    def in_process(self) -> Iterator[np.ndarray]:
        """A pass gathered in this process by a loop that gets each batch as it is gathered (a
        plain DataLoader without workers, driven by the dataset: ``SharedTaskDataset``'s
        natural form): counted as gathered."""
        return self._start(Receipt.GATHER)

    def _start(self, receipt: Receipt) -> Iterator[np.ndarray]:
        self.issued.clear()
        self._receipt = receipt
        return self._batches()

    def _warn_untold(self, why: str) -> None:
        """Say (once) that a plain DataLoader's deliveries cannot be told, what that risks and
        the fix: its rows count as gathered, which its workers do ahead of the loop."""
        if self._warned_untold:
            return
        self._warned_untold = True
        log.warning(
            "batches of ds.batch_sampler(%d) are drawn by a DataLoader whose deliveries the "
            "dataset cannot tell (%s), so rows count as consumed when they are gathered: "
            "should it use workers, a break or a state_dict() in the middle of a pass counts "
            "the batches they prefetched (up to num_workers * prefetch_factor) as delivered. "
            "shmloader.DataLoader(ds, batch_size=%d, ...) counts exactly what its loop gets "
            "(said once)",
            self.batch_size,
            why,
            self.batch_size,
        )

    def _batches(self) -> Iterator[np.ndarray]:
        size = self.batch_size
        carry = np.empty(0, dtype=np.int64)
        self._held = 0
        # arrays: no work per sample
        delivered = self._receipt is not Receipt.GATHER
        chunks = self.sampler.chunks(
            stuck=self._stuck,
            rest_alone=True,
            flush=True,
            consumed_when=ConsumedWhen.DELIVERED if delivered else ConsumedWhen.GATHERED,
            passes_again=self._receipt is Receipt.LOOP,
        )
        for chunk in chunks:
            if chunk is FLUSH:
                if len(carry):
                    yield from self._end_of_pass(carry)
                carry = np.empty(0, dtype=np.int64)
                self._held = 0
                if self._receipt is Receipt.REQUESTS:
                    # The pass is to wait for tasks other trainers hold, which it may only with
                    # nothing of its own in flight (TaskSampler._strays); the loop receives
                    # these batches only once it goes on, so they count now, as gathered.
                    self._count_in_flight(warn=False)
                continue
            if chunk is LET_GO:
                tracked = self._receipt is Receipt.REQUESTS
                if not len(carry) and tracked and self._in_flight():
                    self._count_in_flight()  # their rows hold the room: count them now
                    continue
                self._let_go(len(carry))
                yield self._issue(np.sort(carry))
                carry = np.empty(0, dtype=np.int64)
                self._held = 0
                continue
            if len(carry):
                chunk = np.concatenate((carry, chunk))
            full = len(chunk) - len(chunk) % size
            carry = chunk[full:]
            self._held = len(carry)
            for i in range(0, full, size):
                yield self._issue(np.sort(chunk[i : i + size]))
        self._held = 0
        yield from self._end_of_pass(carry)

    def _end_of_pass(self, carry: np.ndarray) -> Iterator[np.ndarray]:
        """The rows kept for a batch the pass does not fill: a short batch, or dropped.
        Only a pass that ran to its end drops: one left early (``break``) resumes with them."""
        if len(carry) and self.drop_last:
            self.on_drop(carry)
        elif len(carry):
            yield self._issue(np.sort(carry))

    def _count_in_flight(self, *, warn: bool = True) -> None:
        """A plain DataLoader whose deliveries its requests tell, stuck: the batches it has in
        flight hold the budget, and their rows count as consumed only once the loop receives
        them, which it cannot while this batcher waits. They are counted consumed now (their
        segments go once gathered), with a warning: a ``break`` before the loop receives them
        loses them, as under ``sampler=ds.sampler()``. Also at the end of the master's last
        epoch (FLUSH), without one."""
        rows = self._in_flight()
        for i, batch in enumerate(self.issued):
            if len(batch) and self.on_counted_early is not None:
                self.on_counted_early(batch)
            self.issued[i] = batch[:0]  # its request still comes: nothing left to report
        if warn and not self._warned_early:
            self._warned_early = True
            log.warning(
                "shm_budget is full with the segments of %d rows in batches the DataLoader's "
                "workers prefetched, which count as consumed only once the loop receives them, "
                "so the task the sampler waits for cannot be read: counting them consumed now "
                "(a break before the loop gets them loses them; said once). To keep a break "
                "exact, raise shm_budget to hold two shuffle windows of tasks (or lower "
                "num_workers or prefetch_factor)",
                rows,
            )

    def _let_go(self, rows: int) -> None:
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
        if not self.let_go:
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
        if self._receipt is Receipt.GATHER:
            return batch
        batch = tracked(batch) if self._receipt is Receipt.REQUESTS else of_the_loop(batch)
        self.issued.append(batch)
        return batch

    def __len__(self) -> int:
        n = self.sampler.pass_rows(rest_alone=True)  # as __iter__ will walk it
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


@dataclass
class _Drawn:
    """What torch's BatchSampler drew from a :class:`TaskSampler` in one pass: ``pulled``
    indices, in batches of ``batch_size`` that its DataLoader requests ``depth`` ahead of the
    one its loop receives (None: the loader was not found)."""

    batch_size: int | None = None
    depth: int | None = None
    pulled: int = 0

    def lost(self, gathered: int) -> int | None:
        """Of ``gathered`` rows the workers gathered (and so counted delivered), those the
        loop never received once the pass was left: the loop received every batch but the
        last ``depth`` requested. None when that cannot be told."""
        if not self.batch_size or self.depth is None:
            return None
        requested = -(-self.pulled // self.batch_size)
        received = max(0, requested - self.depth) * self.batch_size
        return max(0, min(gathered, self.pulled) - received)


class _NoProgress:
    """``stuck()`` for a batcher the sampler cannot see (torch's BatchSampler): true once the
    rows handed out and not consumed stayed as many for ``STALL_SECONDS`` while no task the
    sampler waits for is ready and a reader of one has no room. Nothing else could consume
    them: the loop does not run while torch asks the sampler for indices, and workers gather
    the batches they were given in milliseconds (the wait allows for workers that are still
    starting). The wait acts on it only while starved with nothing ready (``_pressure``)."""

    def __init__(self, feed: Feed, stall: float = STALL_SECONDS) -> None:
        self._feed = feed
        self._stall = stall
        self._rows: int | None = None
        self._since = 0.0

    def __call__(self) -> bool:
        rows, now = self._feed.unconsumed_rows(), time.monotonic()
        if rows != self._rows:
            self._rows, self._since = rows, now
            return False
        return rows > 0 and self._feed.blocked() and now - self._since >= self._stall


def _pressure(feed: Feed, stuck: Callable[[], bool] | None) -> Pressure:
    """Where room in the budget stands for the sampler's wait (:class:`Pressure`): from the
    data plane, and ``stuck()`` of the batcher (whether the rows it holds pin the room)."""
    if not feed.blocked():
        return Pressure.STARVED if feed.starved() else Pressure.NONE
    if stuck is not None and stuck():
        return Pressure.PINNED
    return Pressure.DEAD_END if feed.dead_end() else Pressure.BLOCKED


def _all_consumed(feed: Feed, grace: float) -> bool:
    """Whether every row handed out is consumed, allowing ``grace`` seconds (a plain
    DataLoader's workers gather the batches they were given without the loop)."""
    deadline = time.monotonic() + grace
    while feed.unconsumed_rows():
        if time.monotonic() >= deadline:
            return False
        time.sleep(STRAY_POLL / 4)
    return True


def block_grid(first: int, window: int) -> tuple[int, int]:
    """Blocks from the epoch's start are 1, 2, 4, ... tasks up to ``window``: (the tasks from
    position ``first`` to the end of its block, that block's size)."""
    start, size = 0, 1
    while start + size <= first:
        start, size = start + size, min(size * 2, window)
    return start + size - first, size


def _by_record(task: ReadyTask, indices: np.ndarray) -> np.ndarray:
    """``indices`` (rows of ``task`` to deliver) laid out one slot per record of the task, -1
    where a record is not delivered (consumed before, or skipped by the source): the layout
    the block's permutation works on, the same whatever was consumed."""
    start, stop = task.records()
    out = np.full(stop - start, -1, dtype=np.int64)
    if len(indices):
        rows = split_indices(indices)[1]
        if task.skipped:
            rows = row_records(start, stop, task.skipped, task.num_rows)[rows] - start
        out[rows] = indices
    return out


def _next_block(
    feed: Feed,
    epoch: int,
    pending: list[int],
    size: int,
    gone: Callable[[list[int]], set[int]],
) -> tuple[list[int], list[int]]:
    """The next ``size`` pending tasks that may still come here, and the rest.

    Only tasks not ready yet are asked about (one call to the master per refill), so a trainer
    whose readers are ahead asks nothing; tasks another trainer took are skipped and the
    block is filled from the ones after them.
    """
    block: list[int] = []
    while pending and len(block) < size:
        head, pending = pending[: size - len(block)], pending[size - len(block) :]
        missing = feed.ready.missing(epoch, head)
        elsewhere = gone(missing) if missing else set()
        block.extend(s for s in head if s not in elsewhere)
    return block, pending
