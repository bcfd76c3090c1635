"""Whether a ready task's lease is still this trainer's, asked before the sampler takes it.

In elastic mode the master keeps a lease once the trainer took its task into its sampler
(``Dispatcher.mark_taken``): a stalled trainer's taken tasks stay its own for
``consumer_timeout`` after their last renewal. A task that is only *ready* (its reader sealed
it, the sampler has not taken it) has no such protection: the master cannot tell a stalled
trainer from a stuck reader, so the lease lapses after ``lease_timeout`` and the task may go to
another trainer. If this trainer then took its copy, both would deliver the rows. So the sampler
takes a ready task only while its lease is surely active: confirmed (granted or renewed, by the
reader or the maintenance thread) less than half a ``lease_timeout`` ago, which leaves the other
half for the ``Taken`` call to reach the master. Otherwise it asks the master (``mark_taken``,
which confirms and marks at once) and drops its copy when the lease lapsed; the task then comes
back like a task another trainer's readers hold (one elsewhere): delivered here if this trainer's
readers lease it again, else by the trainer that got it. Only after a stall (or a master
unreachable for that long) is the answer not at hand already. (NOTE [exactly once on the trainer
side], 5, in accounting/book.py.)
"""

from __future__ import annotations

import logging
import threading

from ...reader.messages import lease_clock
from ..core.ports import LeaseOps
from ..core.tasks import ReadyTask

log = logging.getLogger(__name__)


class LeaseCheck:
    """When each ready task's lease was last known active; whether it still is (thread-safe)."""

    def __init__(self, master: LeaseOps, lease_timeout: float | None, consumer: str | None):
        self._master = master
        # None: no check (a plane driven without a clock, as in tests of the plane alone).
        self._fresh_for = None if lease_timeout is None else lease_timeout / 2
        self._consumer = consumer
        self._lock = threading.Lock()
        self._confirmed: dict[int, float] = {}
        self.dropped = 0  # ready copies dropped because their lease had lapsed

    def announced(self, task: ReadyTask, confirmed: float | None) -> None:
        if confirmed is not None:
            with self._lock:
                self._confirmed[task.lease_id] = confirmed

    def confirmed(self, lease_ids: list[int], at: float, pending: list[ReadyTask]) -> None:
        """The master renewed ``lease_ids`` after ``at``; only ready tasks' leases are kept."""
        keep = {t.lease_id for t in pending}
        with self._lock:
            for lease_id in lease_ids:
                if lease_id in keep:
                    self._confirmed[lease_id] = max(at, self._confirmed.get(lease_id, at))
            for lease_id in [x for x in self._confirmed if x not in keep]:
                del self._confirmed[lease_id]

    def still_ours(self, task: ReadyTask) -> bool:
        """False if the task's lease lapsed: its copy must not be delivered (see above)."""
        with self._lock:
            at = self._confirmed.pop(task.lease_id, None)
        if self._fresh_for is None or not task.segment:
            return True
        if at is not None and lease_clock() - at < self._fresh_for:
            return True
        why = self._master.mark_taken([task.lease_id]).get(task.lease_id)
        if why is None:
            return True
        to = getattr(why, "handed_to", None)
        if to is not None and to == self._consumer:
            # This trainer's own readers got it again: one copy is dropped as a duplicate
            # (announce), and the lease that stays is completed once this copy is consumed.
            return True
        self.dropped += 1
        log.info(
            "epoch %d, task %d: not delivering its ready copy (lease %d): %s; the task comes "
            "back to whichever trainer holds it now",
            task.epoch,
            task.task_id,
            task.lease_id,
            why,
        )
        return False
