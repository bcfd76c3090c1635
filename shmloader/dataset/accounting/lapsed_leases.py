"""Tasks this trainer delivers whose lease lapsed and went to another consumer.

A lease lapses when nobody renews it for the master's ``lease_timeout`` (its holder stalled: a
long pause, swapping, SIGSTOP) or its consumer is declared dead. The master then hands the
task to whoever asks next; in elastic mode that may be another trainer, which delivers its
rows too. The old holder keeps delivering the rows its sampler took: the other trainer may
have ended its pass without waiting for the task (this trainer had it in hand), so dropping
them could lose them. What it can do is say so: the master names the new holder in its answer
to this trainer's renew, complete or taken call (``NotActive.handed_to``), and the trainer
logs one warning per task, with the rows that may come twice, and counts them for ``stats()``.

What is kept of a lease goes when its task completes here or is dropped (``done``), or when the
plane forgets the lease's epoch (``forget_before``): a long elastic run stays flat in memory.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from .book import AdmittedTask

log = logging.getLogger(__name__)


class LapsedLeases:
    """Which leases went to another consumer, and what was warned about (the outbox's lock
    guards it: outbox.py)."""

    def __init__(self, consumer: str | None) -> None:
        self._consumer = consumer
        self._to: dict[int, tuple[str, int | None]] = {}  # lease id -> (consumer, its lease)
        self._warned: set[int] = set()
        # Lease id -> why the master last said it is not active, as logged: a lapsed lease that
        # the trainer still holds fails every renew cycle, and is logged once per reason.
        self._logged: dict[int, str] = {}
        self._epoch: dict[int, int] = {}  # lease id -> its task's epoch, where known
        # Leases handed to another consumer that were forgotten here (lease id -> epoch): a
        # later answer about one (a renew sent before its completion, or the completion of a
        # task forgotten by forget_before meanwhile) must not warn and count it again, or its
        # rows would be counted twice. Few; kept an epoch longer.
        self._forgotten: dict[int, int | None] = {}
        self.tasks = 0  # tasks warned about
        self.records = 0  # their rows this trainer delivers: they may come twice

    def lapsed(self, problems: Mapping[int, str]) -> list[tuple[int, str]]:
        """Note the leases of ``problems`` (lease id -> why it is not active, a ``NotActive``)
        handed to another consumer. One handed to this trainer's own consumer is no duplicate:
        its readers read it again, and the plane drops the second copy. Returns the problems
        not logged before, for the caller to log outside its locks; ``admitted`` then warns."""
        unlogged = []
        for lease_id, why in problems.items():
            if self._logged.get(lease_id) != why:
                self._logged[lease_id] = why
                unlogged.append((lease_id, why))
            to = getattr(why, "handed_to", None)
            known_to = lease_id in self._to or lease_id in self._forgotten
            if to and to != self._consumer and not known_to:
                self._to[lease_id] = (to, getattr(why, "handed_as", None))
        return unlogged

    def admitted(
        self,
        problems: Mapping[int, str],
        states: Iterable[AdmittedTask],
        *,
        epochs: Mapping[int, int],
    ) -> None:
        """After ``lapsed``: keep the epochs of ``problems``' leases (for ``forget_before``),
        and warn about those of ``states`` (tasks the sampler took) that went to another
        consumer. ``epochs``: lease id -> epoch of ready tasks. A lease done meanwhile is not
        kept again; a task taken meanwhile was warned about when taken (``warn``)."""
        states = list(states)
        known = dict(epochs)
        known.update((state.task.lease_id, state.task.epoch) for state in states)
        for lease_id in problems:
            if lease_id in known and lease_id in self._logged:
                self._epoch[lease_id] = known[lease_id]
            elif lease_id not in known and lease_id not in self._to:
                # Not held here (a renew sent before the task completed here: "it was
                # completed"), so never asked about again: no reason to keep, and kept, such
                # answers would pile up for the trainer's life.
                self._logged.pop(lease_id, None)
        unwarned = {x for x in problems if x in self._to and x not in self._warned}
        for state in states if unwarned else ():
            if state.task.lease_id in unwarned:
                self.warn(state)

    def done(self, lease_ids: Iterable[int]) -> None:
        """These leases' tasks completed here, or their copy was dropped: nothing more to say."""
        for lease_id in lease_ids:
            if self._to.pop(lease_id, None) is not None:
                self._forgotten[lease_id] = self._epoch.get(lease_id)
            self._warned.discard(lease_id)
            self._logged.pop(lease_id, None)
            self._epoch.pop(lease_id, None)

    def forget_before(self, epoch: int, live: Iterable[int]) -> None:
        """The plane forgot epochs before ``epoch`` (finished at the master): forget their
        leases, but for ``live`` ones (tasks the sampler took and still delivers)."""
        if any(e < epoch for e in self._epoch.values()):
            keep = set(live)
            self.done([x for x, e in self._epoch.items() if e < epoch and x not in keep])
        # An epoch late: a task still completing here is not among ``live`` (the sampler's
        # slots), so it is forgotten above before its completion's answer comes.
        for lease_id in [x for x, e in self._forgotten.items() if e is None or e < epoch - 1]:
            del self._forgotten[lease_id]

    def kept_leases(self) -> dict[int, int | None]:
        """The leases something is kept of (where one went, a warning, the reason last logged,
        its epoch), each with its task's epoch where known: what ``done`` and
        ``forget_before`` let go, so that a long elastic run stays flat in memory (but for the
        few forgotten ones, kept an epoch longer: see ``__init__``)."""
        ids = set(self._to) | self._warned | set(self._logged) | set(self._epoch)
        return {lease_id: self._epoch.get(lease_id) for lease_id in sorted(ids)}

    def warn(self, state: AdmittedTask) -> None:
        """Warn once about a task the sampler took, if its lease went to another consumer."""
        task = state.task
        if task.lease_id not in self._to or task.lease_id in self._warned:
            return
        self._warned.add(task.lease_id)
        to, as_lease = self._to[task.lease_id]
        rows, so_far = state.rows, state.consumed
        self.tasks += 1
        self.records += rows
        start, stop = task.records()
        log.warning(
            "epoch %d, task %d (%s, records %d..%d): this trainer's lease %d lapsed (not renewed "
            "in time: was this process stalled, by a long pause, swapping or SIGSTOP?) and the "
            "master handed the task to consumer %r (lease %s), which delivers it too. The %d "
            "rows of it that this trainer delivers (%d so far) may reach training twice in this "
            "epoch. Set the master's consumer_timeout well above the longest stall "
            "(docs/trainers.md, 'Several trainers without world_size')",
            task.epoch,
            task.task_id,
            task.path or "?",
            start,
            stop,
            task.lease_id,
            to,
            as_lease,
            rows,
            so_far,
        )
