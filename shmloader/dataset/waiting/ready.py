"""Where tasks that readers finished meet the sampler: a thread-safe board of ready tasks.

The reader pool's receiver thread pins tasks up as readers announce them; the sampler takes them
off in the master's order. Errors that must stop training (a reader pool that cannot recover, a
quarantined task) are pinned up too, and re-raised in the training loop rather than lost in a
background thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from ...errors import ShmloaderError, ShmSpaceError
from ..core.tasks import Pressure, ReadyTask, no_pressure

log = logging.getLogger(__name__)

STUCK_WARN = 10.0  # seconds starved with nothing ready before the warning below
BLOCKED_GRACE = 0.1  # seconds to let releases land before rows held are let go (see take)
DEAD_END_MESSAGE = (
    "shm_budget is full with segments the sampler cannot take yet (readers read ahead into a "
    "later epoch), and the task of epoch {epoch} it waits for (of {seqs}) has no room beside "
    "them, while nothing handed out is left to consume: raise shm_budget to hold two shuffle "
    "windows of tasks, or make tasks more even in size (records_per_task)"
)
STUCK_MESSAGE = (
    "the sampler has waited %.0f s for tasks of epoch %d (%s): readers wait for room in "
    "shm_budget, which rows already handed out hold. A slow training loop gives that room "
    "back as it goes; if it is not slow, a batcher holds rows for its next batch that pin it. "
    "torch's BatchSampler (a DataLoader given sampler=ds.sampler()) cannot let them go: use "
    "shmloader.DataLoader or batch_sampler=ds.batch_sampler(...), or raise shm_budget to two "
    "shuffle windows of tasks"
)


class ReadyTasks:
    def __init__(self, first_epoch: int = 0) -> None:
        self._cond = threading.Condition()
        self._ready: dict[tuple[int, int], ReadyTask] = {}
        self._error: BaseException | None = None
        self._closed = False
        # The latest epoch the sampler asked for tasks of (``first_epoch`` until it asks): the
        # epoch the trainer has begun. Readers read one window of the epoch after it, no more
        # (Runtime._hold_readers_back): a script that stops after this epoch wastes little.
        self.latest_epoch = first_epoch
        # How long take() waited for tasks that were not ready: the sampler, and so the loop,
        # waiting on the readers (Stats.reader_wait_seconds).
        self.waited_seconds = 0.0

    def put(self, task: ReadyTask) -> None:
        with self._cond:
            self._ready[(task.epoch, task.seq)] = task
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        """Make every waiting and future ``take`` raise ``error``."""
        with self._cond:
            if self._error is None:
                self._error = error
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._ready)

    def pending(self) -> list[ReadyTask]:
        with self._cond:
            return list(self._ready.values())

    def count_after(self, epoch: int) -> int:
        """Ready tasks of epochs after ``epoch``."""
        with self._cond:
            return sum(1 for e, _ in self._ready if e > epoch)

    def missing(self, epoch: int, seqs: Iterable[int]) -> list[int]:
        """Those of ``seqs`` not ready (yet) in ``epoch``."""
        with self._cond:
            return [s for s in seqs if (epoch, s) not in self._ready]

    def take(
        self,
        epoch: int,
        seqs: Iterable[int],
        *,
        pressure: Callable[[], Pressure] = no_pressure,
        later: Sequence[int] = (),
        gone: Callable[[list[int]], set[int]] | None = None,
        poll: float = 0.05,
        patience: float = 1.0,
        recheck: float = 0.1,
    ) -> list[ReadyTask] | None:
        """Wait for the tasks ``seqs`` of ``epoch`` and return them in ``seqs`` order.

        ``pressure()``, asked every ``poll`` seconds, says where room in the budget stands
        (:class:`Pressure`). If it stays STARVED or worse for ``patience`` seconds (readers
        wait for room, so the missing tasks cannot arrive until some are consumed), the ready
        subset is returned instead of deadlocking; if none of ``seqs`` is ready, ready tasks
        among ``later`` (the epoch's following tasks) instead, as many as ``seqs`` has:
        consuming them frees room. BLOCKED or worse returns them at once. ``gone(missing)``,
        asked every ``recheck`` seconds while some are missing (outside the lock: it may ask
        the master), names those that will not come here (another trainer took them): they
        are waited for no more. The result is empty only when every one of ``seqs`` is gone.

        Starved with *nothing* ready, only rows already handed out can free room: PINNED
        (after ``patience``, or ``BLOCKED_GRACE`` once a reader said it has no room, for
        segments consumed but not yet released) returns None, for the caller's batcher to let
        its rows go; DEAD_END (after ``patience``) raises ``ShmSpaceError``, since no wait can
        end. Otherwise a warning says what is waited for after ``STUCK_WARN`` seconds.
        """
        began = time.monotonic()
        self._asked(epoch)
        try:
            return self._take(epoch, list(seqs), pressure, later, gone, poll, patience, recheck)
        finally:
            self.waited_seconds += time.monotonic() - began

    def _take(
        self,
        epoch: int,
        wanted: list[int],
        pressure: Callable[[], Pressure],
        later: Sequence[int],
        gone: Callable[[list[int]], set[int]] | None,
        poll: float,
        patience: float,
        recheck: float,
    ) -> list[ReadyTask] | None:
        clock = _WaitClock(patience)
        next_check = time.monotonic() + recheck
        while True:
            with self._cond:
                while True:
                    self._raise_if_stopped()
                    have = [s for s in wanted if (epoch, s) in self._ready]
                    if len(have) == len(wanted):
                        return [self._ready.pop((epoch, s)) for s in wanted]
                    if not have:
                        have = [s for s in later if (epoch, s) in self._ready][: len(wanted)]
                    now = time.monotonic()
                    # A reader of a task waited for that has no room says so itself (one look
                    # at the store per poll): room estimated from the segments seen so far can
                    # look ample while it is not.
                    room = pressure()
                    if clock.take_what_is_ready(bool(have), room, now):
                        return [self._ready.pop((epoch, s)) for s in have]
                    if clock.let_rows_go(not have, room, now, epoch, wanted):
                        return None
                    if gone is not None and now >= next_check:
                        missing = [s for s in wanted if (epoch, s) not in self._ready]
                        break
                    self._cond.wait(poll)
            elsewhere = gone(missing)
            wanted = [s for s in wanted if s not in elsewhere]
            next_check = time.monotonic() + recheck

    def wait(self, timeout: float) -> None:
        """Until a task is put or ``timeout`` passes (raising if stopped)."""
        with self._cond:
            self._raise_if_stopped()
            self._cond.wait(timeout)
            self._raise_if_stopped()

    def take_ready(self, keys: Iterable[tuple[int, int]]) -> list[ReadyTask]:
        """Those tasks of ``keys`` (epoch, seq) that are ready now, without waiting."""
        keys = list(keys)
        with self._cond:
            self._raise_if_stopped()
            for epoch, _ in keys:
                self._asked(epoch)
            return [self._ready.pop(k) for k in keys if k in self._ready]

    def _asked(self, epoch: int) -> None:
        # One int replaced (atomic under the GIL), read without the lock.
        if epoch > self.latest_epoch:
            self.latest_epoch = epoch

    def _raise_if_stopped(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise ShmloaderError("the dataset was closed while the sampler waited for data")


class _WaitClock:
    """How long a wait for a block has been starved (some tasks ready, room short) or empty
    (none ready, room short), and what that calls for (``ReadyTasks.take``)."""

    def __init__(self, patience: float) -> None:
        self.patience = patience
        self.starved_since: float | None = None
        self.empty_since: float | None = None
        self.warned = False

    def take_what_is_ready(self, some_ready: bool, room: Pressure, now: float) -> bool:
        """Whether to return the tasks that are ready in place of the block: room has been
        short for ``patience``, or a reader of one of them says it has none (no need to wait
        and see)."""
        if not some_ready or room is Pressure.NONE:
            self.starved_since = None
            return False
        self.starved_since = self.starved_since or now
        no_room = room.value >= Pressure.BLOCKED.value
        return now - self.starved_since >= self.patience or no_room

    def let_rows_go(
        self, none_ready: bool, room: Pressure, now: float, epoch: int, wanted: list[int]
    ) -> bool:
        """Nothing ready and room short: whether the batcher must let its rows go (PINNED),
        after ``patience`` (or ``BLOCKED_GRACE`` once a reader of a task waited for said it
        has no room, for segments consumed but not yet released); ShmSpaceError at a dead
        end; a warning (once) after ``STUCK_WARN`` seconds."""
        if not none_ready or room is Pressure.NONE:
            self.empty_since = None
            return False
        self.empty_since = since = self.empty_since or now
        grace = BLOCKED_GRACE if room.value >= Pressure.BLOCKED.value else self.patience
        if now - since >= grace and room is Pressure.PINNED:
            return True
        if now - since >= self.patience and room is Pressure.DEAD_END:
            raise ShmSpaceError(DEAD_END_MESSAGE.format(epoch=epoch, seqs=wanted))
        if now - since >= STUCK_WARN and not self.warned:
            self.warned = True
            log.warning(STUCK_MESSAGE, now - since, epoch, wanted)
        return False
