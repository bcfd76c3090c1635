"""The walk over an epoch: the blocks of its order (blocks.py), each waited for and handed out.

:class:`TaskSampler` yields the indices of rows that are ready in shared memory, a block at a
time, in the order blocks.py gives: it waits for each block's tasks on the ready board,
admits them (the data plane numbers their segments and starts tracking their rows), and ends
the pass once the epoch's tasks are here, elsewhere, or (at the master's last epoch) done.
A block's segments are all released once it has been consumed, which bounds shared memory to
about two windows (one being consumed, one filling). The batches of it for a DataLoader's
``batch_sampler=`` are batch_sampler.py's.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

import numpy as np
import torch.utils.data

from ...errors import ConfigError, ShmSpaceError
from ..core.receipts import ConsumedWhen
from ..core.tasks import ReadyTask
from ..waiting.budget_pressure import BudgetPressure
from .blocks import DEFAULT_SHUFFLE_WINDOW, block_grid, block_order
from .delivery import depth_of, loader_of
from .feed import Feed, FirstPass

__all__ = [
    "DEFAULT_SHUFFLE_WINDOW",
    "FLUSH",
    "SHORT_BATCH",
    "Chunk",
    "FirstPass",
    "PassWalk",
    "Signal",
    "TaskSampler",
]

log = logging.getLogger(__name__)


class Signal(enum.Enum):
    """What ``TaskSampler.chunks`` yields to a batcher between blocks of indices."""

    # The batcher must hand out the rows it holds as a short batch: they pin the budget, and
    # the task waited for has no room until they are consumed.
    SHORT_BATCH = "short batch"
    # The end of the master's last epoch, before the pass waits for tasks other trainers hold:
    # the batcher hands out (or with drop_last drops) the rows it keeps, as at a pass's end.
    FLUSH = "flush"


SHORT_BATCH = Signal.SHORT_BATCH
FLUSH = Signal.FLUSH
Chunk = np.ndarray | Signal  # what chunks() yields: a block's indices, or a signal


@dataclass(frozen=True)
class PassWalk:
    """How a batcher walks a pass (``TaskSampler.chunks``).

    ``stuck()``: whether the batcher holds every row handed out and not yet consumed, while
    it waits for more (see ``ReadyTasks.take``); then :data:`SHORT_BATCH` comes.
    ``rest_alone``: rows the last epoch's pass handed out and the loop never received (it
    stopped in that pass's last batches) make up this pass alone, as the rest of their
    epoch; the next pass starts the next epoch. For batchers that never drop rows unsaid
    (ours): torch's BatchSampler with ``drop_last`` would drop such a short pass every time,
    so for it they come first in the next epoch's pass instead.
    ``flush``: the batcher takes :data:`FLUSH` (see ``Signal``).
    ``consumed_when``: when the batcher's loader consumes rows; the end of the master's last
    epoch allows a plain DataLoader's workers time to gather theirs.
    ``passes_again``: the loader makes one more pass itself when this one leaves the master's
    last epoch open (``shmloader.DataLoader``); else a warning says it is needed."""

    stuck: Callable[[], bool] | None = None
    rest_alone: bool = False
    flush: bool = False
    consumed_when: ConsumedWhen = ConsumedWhen.GATHERED
    passes_again: bool = False


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
ELSEWHERE_POLL = 0.1  # seconds between asking the master where tasks given up as elsewhere are
# After this long waiting at the end of the last epoch for tasks other trainers hold, say so.
LAST_EPOCH_WARN = 10.0
# How long a plain DataLoader's workers are given to gather the batches handed to them.
GATHER_GRACE = 2.0


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
        # trainers' hands it could not wait for (_wait_for_elsewhere): the next pass finishes it.
        self.left_open: int | None = None

    @property
    def feed(self) -> Feed:
        """What the sampler draws from: the dataset's data plane, started on first use."""
        return self._get_feed()

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
        for chunk in self.chunks(PassWalk(stuck=_NoProgress(self._get_feed().pressure))):
            if isinstance(chunk, Signal):  # SHORT_BATCH: torch cannot hand its rows out
                raise ShmSpaceError(PINNED_BY_TORCH)
            for index in chunk.tolist():
                drawn.pulled += 1
                yield index

    def chunks(self, walk: PassWalk = PassWalk()) -> Iterator[Chunk]:
        """The epoch's indices in order, a block at a time (for batchers that slice arrays),
        with the signals ``walk`` asks for between them (``PassWalk``, ``Signal``)."""
        feed = self._get_feed()
        epoch = self._pass_epoch(feed)
        if epoch != feed.epoch_to_iterate():
            feed.finish_epoch(epoch - 1)  # delivered whole by the pass before (see _pass_epoch)
        self._passes += 1
        # The rest of a last epoch left open (_wait_for_elsewhere): every task not taken here
        # was found elsewhere, and comes here only as such; no need to ask about them again.
        reopened, self.left_open = self.left_open == epoch, None
        if walk.rest_alone:
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
        yield from self._blocks(feed, epoch, pending, walk.stuck)
        over = yield from self._wait_for_elsewhere(feed, epoch, walk)
        self._open_pass = None
        if over:
            feed.finish_epoch(epoch)
        else:
            self.left_open = epoch

    def _blocks(
        self, feed: Feed, epoch: int, pending: list[int], stuck: Callable[[], bool] | None
    ) -> Iterator[Chunk]:
        """The ``pending`` tasks of ``epoch`` in blocks of 1, 2, 4, ... tasks up to the window
        from the epoch's first task: the first batch needs one task read, not a whole window.
        A pass that continues an epoch (after a ``break``) goes on with the blocks the whole
        pass would have had. Each block is waited for on the ready board and admitted; tasks
        found elsewhere meanwhile are given up (waited for at the pass's end)."""
        dropped: set[int] = set()

        def gone(missing: list[int]) -> set[int]:
            elsewhere = feed.find_elsewhere(epoch, missing)
            dropped.update(elsewhere)
            return elsewhere

        size, full = block_grid(pending[0], self.window) if pending else (1, 1)
        while pending:
            block, pending = _next_block(feed, epoch, pending, size, gone)
            this = size, full
            size = full = min(full * 2, self.window)
            tasks: list[ReadyTask] | None = []
            if block:
                feed.elsewhere.want(epoch, block)
                tasks = feed.ready.take(
                    epoch,
                    block,
                    pressure=lambda: feed.pressure.now(stuck),
                    later=pending,
                    gone=gone,
                )
                feed.elsewhere.want(epoch, [])
            if tasks is None:  # nothing can come until the batcher lets its rows go
                pending, (size, full) = block + pending, this  # the same block, once room is back
                yield SHORT_BATCH
                continue
            got = {t.seq for t in tasks}
            # Starved: part of the block, or later tasks in its place. Tasks found elsewhere
            # while waiting are not put back.
            left = [s for s in block if s not in got and s not in dropped]
            if left or not got <= set(block):
                pending = left + [s for s in pending if s not in got]
                self._warn_out_of_order(epoch, left, sorted(got))
            indices = self._block_indices(feed, epoch, tasks + feed.elsewhere.take_ready())
            if len(indices):
                yield indices

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
            "next pass (logged once)",
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
            "master) with more epochs, or epochs=None for no end (logged once)",
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
            "on timing, not only on the seed (each row still comes once; logged once, however "
            "often it happens again). For a reproducible order raise shm_budget (several "
            "shuffle windows of tasks: docs/dataset.md, 'Order and shuffling')",
            epoch,
            missing,
            got,
        )

    def _wait_for_elsewhere(
        self, feed: Feed, epoch: int, walk: PassWalk
    ) -> Generator[Chunk, None, bool]:
        """The end of a pass that gave tasks up as elsewhere (elastic mode: other trainers took
        them): wait until each is done or in some trainer's hands, delivering those that come
        here after all (their holder died and this trainer's readers leased them again).
        Returns whether the epoch is over for this trainer.

        Tasks other trainers took in hand are not waited for while rows this trainer handed
        out are not consumed yet: those trainers may wait for ours just so, and rows this pass
        yielded last may sit in a batch that the loop gets only once the pass ends (a
        DataLoader's last, short batch, or one torch prefetched). Should such a trainer die,
        its tasks come here, found elsewhere no more, in the next pass.

        The master's last epoch has no next pass, and a trainer that died with tasks of it in
        hand would have them lost, silently. So there, once every row handed out here is
        consumed (``flush``: the batcher first hands out the rows it keeps), the pass waits
        for those tasks too: nothing of this trainer's is in flight, so nobody waits on it and
        the waits cannot close a cycle; a dead trainer's tasks come here once its leases lapse.
        While rows of its own are in flight, the pass ends with the epoch left open
        (``left_open``): the next pass waits for them, with nothing in flight
        (shmloader.DataLoader makes that pass itself; a plain DataLoader is told).
        """
        flush = walk.flush
        last = feed.epochs_over(epoch + 1) is not None
        waited_since: float | None = None
        kept = flush  # the batcher may keep rows of the pass: FLUSH before waiting
        try:
            while True:
                indices = self._block_indices(feed, epoch, feed.elsewhere.take_ready())
                if len(indices):
                    yield indices
                    kept = flush
                elsewhere = feed.elsewhere.look()
                if not elsewhere.may_come:
                    held = elsewhere.taken_elsewhere
                    if not last or not held:
                        return True
                    if kept:
                        kept = False
                        yield FLUSH
                    by_the_loop = walk.consumed_when is ConsumedWhen.DELIVERED
                    if not _all_consumed(feed.pressure, 0.0 if by_the_loop else GATHER_GRACE):
                        if not walk.passes_again:
                            self._warn_left_open(epoch, held)
                        return False
                    waited_since = self._note_waiting(epoch, held, waited_since)
                feed.elsewhere.want_all()
                feed.ready.wait(ELSEWHERE_POLL)
        finally:
            feed.elsewhere.want(epoch, [])

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
                "passed since it was last heard from (logged once)",
                epoch,
                now - since,
                held,
            )
        return since

    def _warn_left_open(self, epoch: int, held: int) -> None:
        """The pass over the master's last epoch ends with tasks of it in other trainers'
        hands, and rows of this trainer's not consumed yet, so it cannot wait for them (see
        ``_wait_for_elsewhere``). shmloader.DataLoader then makes another pass, which waits; a plain
        DataLoader is told (once) that one is needed."""
        if self._warned_open:
            return
        self._warned_open = True
        log.warning(
            "epoch %d, the master's last, is not over: other trainers hold %d task(s) of it. "
            "Should one of them have died, its tasks come to this trainer once its leases "
            "lapse, but only in one more pass over the loader (it waits for them, delivers "
            "what comes, and ends): iterate it once more after the last epoch, or use "
            "shmloader.DataLoader, which does so itself (logged once)",
            epoch,
            held,
        )

    def _block_indices(self, feed: Feed, epoch: int, tasks: list[ReadyTask]) -> np.ndarray:
        """The rows of a block's tasks, admitted, in the block's order (blocks.py), told to
        the feed as handed out."""
        if not tasks:
            return np.empty(0, dtype=np.int64)
        rows = [feed.admit(t) for t in tasks]
        indices = block_order(tasks, rows, epoch=epoch, seed=self.seed, shuffle=self.shuffle)
        feed.handed_out(indices)
        return indices


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
    starting). The wait acts on it while starved with nothing ready (``BudgetPressure.now``)."""

    def __init__(self, pressure: BudgetPressure, stall: float = STALL_SECONDS) -> None:
        self._pressure = pressure
        self._stall = stall
        self._rows: int | None = None
        self._since = 0.0

    def __call__(self) -> bool:
        rows, now = self._pressure.unconsumed_rows(), time.monotonic()
        if rows != self._rows:
            self._rows, self._since = rows, now
            return False
        return rows > 0 and self._pressure.blocked() and now - self._since >= self._stall


def _all_consumed(pressure: BudgetPressure, grace: float) -> bool:
    """Whether every row handed out is consumed, allowing ``grace`` seconds (a plain
    DataLoader's workers gather the batches they were given without the loop)."""
    deadline = time.monotonic() + grace
    while pressure.unconsumed_rows():
        if time.monotonic() >= deadline:
            return False
        time.sleep(ELSEWHERE_POLL / 4)
    return True


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
