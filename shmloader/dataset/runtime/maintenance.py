"""The trainer's maintenance thread: what keeps a started dataset's tasks moving between batches.

Every ``POLL_SECONDS`` it applies the gather ledger (``DataPlane.poll``: releasing segments,
completing tasks), lowers the store's ``ahead`` hint once the sampler took tasks, and warns of a
reader stuck on one task; every third of the lease timeout it renews the leases of announced
tasks and reads the master's progress (quarantined tasks, epochs the master finished).

The short tick is for the ledger, which only a plain DataLoader's workers write, and for readers
held back by the ``ahead`` hint. With neither (``num_workers=0``, or ``shmloader.DataLoader``,
whose loop marks what it consumed itself), the thread ticks every ``IDLE_POLL_SECONDS``: each
wake-up takes the GIL from the training loop, so fewer of them leave it more of the trainer's
CPU. Completions then reach the master up to that much later.

Apart from the runtime (runtime.py), which starts and wires the parts and later closes them,
because this is one job with its own thread, clock and state (when to renew, which readers were
warned of), reached only through :meth:`Maintenance.start`, :meth:`~Maintenance.stop` and
:meth:`~Maintenance.join`. An error it meets fails the plane's ready queue, so the training loop
raises it, unless it was told to stop (the close then under way causes such errors).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...errors import LeaseError, MasterError
from ...reader.messages import lease_clock
from ...reader.pool import ReaderPool
from ...shm import hints
from ..accounting.plane import DataPlane
from .task_errors import TaskErrors

if TYPE_CHECKING:
    from ...master.client import MasterClient
    from ...master.progress import Progress
    from .autoscale import Autoscaler

# The runtime's logger, as before this thread had a module of its own: filters keep working.
log = logging.getLogger(__name__)
POLL_SECONDS = 0.005
IDLE_POLL_SECONDS = 0.02  # the tick with no ledger rows and no readers held back
STALL_SECONDS = 300.0  # on one task this long, not waiting for room: warned of
STALL_CHECK_SECONDS = 1.0  # how often readers are looked at for that (a listdir at most)
ALIVE_EVERY = 0.25  # seconds between the trainer's signs of life to its readers (hints.py)


def first_unfinished(progress: Progress) -> int:
    """The oldest epoch the master has not finished, or the next to start if none is open."""
    open_epochs = [e.epoch for e in progress.epochs if not e.finished]
    return min(open_epochs, default=progress.epochs_started)


@dataclass(eq=False, kw_only=True)
class Maintenance:
    """The maintenance thread of one runtime; ``hold_readers_back`` raises or lowers the
    store's ``ahead`` hint (the runtime's, shared with the readers' announcements)."""

    plane: DataPlane
    client: MasterClient
    pool: ReaderPool
    store_path: str
    lease_timeout: float
    hold_readers_back: Callable[[], bool]  # returns whether readers are held back
    task_errors: TaskErrors  # what the loop raises for a quarantined task
    # Elastic mode: readers renew their leases only while the trainer says it is alive.
    elastic: bool = False
    autoscaler: Autoscaler | None = None  # num_readers="auto"
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)
    _next_stall_check: float = field(default=0.0, init=False)
    _next_alive: float = field(default=0.0, init=False)
    _since_epoch: int = field(default=0, init=False)  # the oldest open at the last look
    _look_now: threading.Event = field(default_factory=threading.Event, init=False)
    # reader index -> when last warned of
    _stall_warned: dict[int, float] = field(default_factory=dict, init=False)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="shmloader-maintenance", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Tell the thread to end (at its next tick); errors from then on are not reported."""
        self._stop.set()

    def poll_master_now(self) -> None:
        """Read the master's progress at the next tick, not at the next renewal: a reader's
        retried failure may have been the task's last try (then the loop raises at once)."""
        self._look_now.set()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        plane = self.plane
        renew_every = self.lease_timeout / 3
        next_renew = 0.0
        tick = POLL_SECONDS
        try:
            while not self._stop.wait(tick):
                busy = plane.read_ledger_and_send() > 0
                busy = self.hold_readers_back() or busy  # lowered here once the sampler took tasks
                tick = POLL_SECONDS if busy else IDLE_POLL_SECONDS
                now = time.monotonic()
                self._say_alive(now)
                self._warn_of_stalls(now)
                if self.autoscaler is not None:
                    self.autoscaler.tick(now)
                if now >= next_renew:
                    asked_at, renewed = lease_clock(), []
                    for lease_id in plane.held_leases():
                        # One at a time: a lease completed meanwhile must not stop the rest.
                        self._say_alive(time.monotonic())  # many leases, a slow master
                        try:
                            self.client.renew([lease_id])
                            renewed.append(lease_id)
                        except LeaseError as exc:  # RenewError: maybe handed to another trainer
                            plane.outbox.lapsed(getattr(exc, "not_active", {}))
                    plane.lease_check.confirmed(renewed, asked_at, plane.ready.pending())
                    self._look_now.clear()
                    self._check_master()
                    next_renew = now + renew_every
                elif self._look_now.is_set():
                    self._look_now.clear()
                    self._check_master()
        except BaseException as exc:
            if not self._stop.is_set():
                plane.ready.fail(exc if isinstance(exc, Exception) else MasterError(str(exc)))

    def _say_alive(self, now: float) -> None:
        """Readers renew their leases only while the trainer says it is alive (hints.py): a
        trainer whose process alone stopped must not have its readers hold tasks the other
        trainers wait for. Elastic mode only: a DDP rank's tasks go to no other trainer, and a
        lapse would only count as a failed attempt of each."""
        if self.elastic and now >= self._next_alive:
            with contextlib.suppress(FileNotFoundError):  # the store is closing
                hints.set_alive(self.store_path)
            self._next_alive = now + min(ALIVE_EVERY, self.lease_timeout / 8)

    def _check_master(self) -> None:
        """What the master's progress says, asked every renewal interval: a task quarantined
        by lease expiry (its reader died every time, so no Failed message came) would leave
        the sampler waiting for ever; epochs the master finished need nothing kept here.

        Asked for the epochs from the oldest one open at the last look: an epoch that
        finished since (with a task quarantined, say) is among them, and a long job's
        thousands of finished epochs are not read again every few seconds."""
        progress = self.client.progress(since_epoch=self._since_epoch)
        self.task_errors.fail_if_quarantined(progress, self.plane.ready)
        self._since_epoch = first_unfinished(progress)
        self.plane.forget_finished(self._since_epoch)

    def _warn_of_stalls(self, now: float) -> None:
        """A reader on one task for ``STALL_SECONDS`` that has not come to write it is likely
        stuck in the source or the decode function: its lease is renewed all the while (a slow
        read is allowed), so nothing else would ever say so."""
        if now < self._next_stall_check:
            return
        self._next_stall_check = now + STALL_CHECK_SECONDS
        waiting: set[int] | None = None  # pids of readers waiting for room
        for info in self.pool.readers:
            began = info.started_at
            if began is None or now - began < STALL_SECONDS:
                continue
            if info.sealing is not None:  # waiting for room is no stall; decoding the task is
                if waiting is None:
                    waiting = hints.waiting_writers(self.store_path)
                if info.pid in waiting:
                    continue
            last = self._stall_warned.get(info.index, 0.0)
            if now - last >= STALL_SECONDS:
                self._stall_warned[info.index] = now
                log.warning(
                    "reader %d (pid %d) has been on one task (lease %s) for %.0f s, not "
                    "waiting for room: does the source or the decode function hang? "
                    "`py-spy dump --pid %d` shows where it is",
                    info.index,
                    info.pid,
                    info.current_lease,
                    now - began,
                    info.pid,
                )
