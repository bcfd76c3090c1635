"""What the trainer reports to the master about its leases, sent outside the data plane's lock.

The plane decides under its lock that the sampler took a task (``SamplerFeed.admit``: its lease
is marked taken, so other trainers stop waiting for it and the master keeps it), that a task was
consumed (its lease is completed), or that a copy came twice (its lease is completed too). A
round trip to the master must not hold the lock the sampler and the training loop need, so the
plane queues the lease here and ``flush`` sends the queues, one call each, from the maintenance
thread or a poll (NOTE [exactly once on the trainer side], 3, in book.py).

The master may answer that some leases are not active any more: they lapsed (this trainer was
too slow) and may have gone to another trainer. The renew cycle gets the same answers. ``lapsed``
routes them to ``LapsedLeases`` (lapsed_leases.py), which warns about tasks the sampler took that
another trainer delivers too, and logs each lease's reason once, outside every lock.

Locks, always taken in this order: the flush lock (one flush at a time, so a lease's answer is
routed before the lease is forgotten), the plane's lock, this outbox's own lock (it guards the
queues, the slots being completed and ``lapsed_leases``). The plane calls in while it holds its
lock; the outbox asks for the plane's slots (``admitted``, which takes the plane's lock)
never while it holds its own, or the two threads would deadlock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping

from ..core.ports import LeaseOps
from ..core.tasks import ReadyTask
from .book import AdmittedTask
from .lapsed_leases import LapsedLeases

log = logging.getLogger(__name__)


class Outbox:
    """Leases to mark taken and to complete at the master, and the master's "not active"
    answers (thread-safe; see the lock order above)."""

    def __init__(
        self,
        master: LeaseOps,
        consumer: str | None,
        *,
        # The tasks the sampler took, listed under its lock.
        admitted: Callable[[], list[AdmittedTask]],
        ready: Callable[[], list[ReadyTask]],  # tasks ready and not taken by the sampler
    ) -> None:
        self._master = master
        self._admitted = admitted
        self._ready = ready
        self._flush_lock = threading.Lock()
        self._lock = threading.Lock()
        self._to_complete: list[int] = []
        self._to_mark_taken: list[int] = []
        # Slots whose completion is being sent: warned about if the master answers that their
        # lease went to another trainer.
        self._completing: dict[int, AdmittedTask] = {}
        self.lapsed_leases = LapsedLeases(consumer)  # leases lapsed and handed to another trainer

    def complete(self, lease_id: int, admitted: AdmittedTask | None = None) -> None:
        """Queue completing the lease: its task was consumed (``admitted``), or its copy was
        dropped as a duplicate."""
        with self._lock:
            self._to_complete.append(lease_id)
            if admitted is not None:
                self._completing[lease_id] = admitted

    def unconfirmed(self) -> list[AdmittedTask]:
        """Tasks whose completion is queued or being sent: the master may not have it yet."""
        with self._lock:
            return list(self._completing.values())

    def taken(self, admitted: AdmittedTask) -> None:
        """The sampler took the task: queue marking its lease taken, and warn now if its
        lease already went to another trainer."""
        with self._lock:
            self._to_mark_taken.append(admitted.task.lease_id)
            self.lapsed_leases.warn(admitted)

    def dropped(self, lease_id: int) -> None:
        """The lease's ready copy was not delivered (it lapsed): nothing more to say of it."""
        with self._lock:
            self.lapsed_leases.done([lease_id])

    def forget_before(self, epoch: int, live: Iterable[int]) -> None:
        """The plane forgot epochs before ``epoch``: so does ``lapsed_leases``, but for ``live``
        leases (LapsedLeases.forget_before)."""
        with self._lock:
            self.lapsed_leases.forget_before(epoch, live)

    def flush(self) -> None:
        """Tell the master about taken and consumed tasks (one call each)."""
        with self._flush_lock:
            with self._lock:
                taken, self._to_mark_taken = self._to_mark_taken, []
                pending, self._to_complete = self._to_complete, []
            if taken:  # lapsed meanwhile (this trainer was too slow): it still delivers them
                self.lapsed(self._master.mark_taken(taken), "marking lease %d taken: %s")
            if not pending:
                return
            # Completed late after it lapsed: counted once, unless it was handed out again.
            self.lapsed(self._master.complete(pending), "completing lease %d: %s")
            with self._lock:
                for lease_id in pending:
                    self._completing.pop(lease_id, None)
                self.lapsed_leases.done(pending)

    def lapsed(self, problems: Mapping[int, str], what: str = "renewing lease %d: %s") -> None:
        """The master says these leases are not active (a renew, complete or taken call):
        warn about tasks whose lease went to another trainer that the sampler took, now or
        when it takes them (``taken``). Each lease's reason is logged once, after the locks
        are let go (a lapsed lease still held fails every renew cycle)."""
        if not problems:
            return
        with self._lock:
            unlogged = self.lapsed_leases.lapsed(problems)
        # Listed after the leases are noted: a task the sampler takes from now on is warned
        # about by ``taken``, one it took before is in the list.
        epochs = {t.lease_id: t.epoch for t in self._ready()}
        states = self._admitted()  # takes the plane's lock: never while holding ours
        with self._lock:
            self.lapsed_leases.admitted(
                problems,
                [*self._completing.values(), *states],
                epochs=epochs,
            )
        for lease_id, why in unlogged:
            log.info(what, lease_id, why)
