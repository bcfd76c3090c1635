"""The master's dispatcher: a pure state machine over journaled update records.

Public methods check a request, decide its outcome as :mod:`~shmloader.master.updates` records
and pass each to :meth:`Dispatcher.apply`, the only code that changes state. Nothing here does
I/O, starts threads or reads a clock (``now`` is passed in), so a journal replayed onto a fresh
dispatcher with the same plan and schedule settings rebuilds the same state. See docs/master.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ..errors import ConfigError, MasterError, NotActive
from ..sources.base import Shard
from . import snapshot
from .config import JobConfig
from .epochs import DONE, OpenEpoch, find_work
from .handback import HandBack, handed_back
from .progress import Lease, Progress
from .snapshot import ConsumerState, DispatcherState
from .tasks import TaskTable, records_per_rank
from .updates import (
    ConsumerHeartbeat,
    ConsumerLeft,
    ConsumerRegistered,
    EpochStarted,
    LeaseCheckpointed,
    LeaseCompleted,
    LeaseExpired,
    LeaseFailed,
    LeaseGranted,
    LeaseHandedBack,
    LeaseRenewed,
    LeaseTaken,
    MasterResumed,
    MasterStarted,
    Update,
    UpdateSink,
)


class Dispatcher:
    """Tasks, epochs, leases and progress of one job; see the module docstring."""

    def __init__(
        self, plan: Sequence[Shard], config: JobConfig, *, sink: UpdateSink | None = None
    ) -> None:
        self.config = config
        self.table = TaskTable(plan, config.records_per_task)
        if self.table.total_records == 0:
            raise ConfigError("the plan has no records: there is nothing to hand out")
        if config.world_size is not None and not records_per_rank(
            self.table.total_records, config.world_size, config.ddp_policy
        ):
            raise ConfigError(
                f'ddp_policy="drop" with world_size={config.world_size} gives every rank 0 of '
                f'the plan\'s {self.table.total_records} records; use "pad" or more data'
            )
        self.sink = sink
        self._handlers: dict[type[Update], Callable[[Any], None]] = {
            MasterStarted: self._on_master_started,
            MasterResumed: self._on_master_resumed,
            EpochStarted: self._on_epoch_started,
            ConsumerRegistered: self._on_registered,
            ConsumerHeartbeat: self._on_heartbeat,
            ConsumerLeft: self._on_left,
            LeaseHandedBack: self._on_handed_back,
            LeaseCheckpointed: self._on_checkpointed,
            LeaseGranted: self._on_granted,
            LeaseRenewed: self._on_renewed,
            LeaseTaken: self._on_taken,
            LeaseCompleted: self._on_completed,
            LeaseFailed: self._on_failed,
            LeaseExpired: self._on_failed,
        }
        self._reset()

    def _reset(self) -> None:
        # Everything the updates change, and a snapshot holds (snapshot.py).
        self.state = DispatcherState(epochs_started=self.config.first_epoch)

    # ----------------------------------------------------------------- queries

    @property
    def finished(self) -> bool:
        """All planned epochs closed (never, with ``epochs=None``): readers may stop asking."""
        planned = self.config.epochs
        return planned is not None and len(self.state.closed) >= planned - self.config.first_epoch

    def get_lease(self, lease_id: int) -> Lease:
        """The active lease ``lease_id``; LeaseError saying why when it is not active."""
        lease = self.state.leases.get(lease_id)
        if lease is None:
            raise self.state.ended.not_active(lease_id)
        return lease

    def rank_of(self, consumer: str) -> int | None:
        """Whose queue ``consumer`` draws from (None: elastic); MasterError if unregistered."""
        return self.consumer_state(consumer).rank

    def leases_of(self, consumer: str) -> list[Lease]:
        """Its active leases by id; MasterError if unregistered, so it doubles as a check."""
        return [self.state.leases[i] for i in sorted(self.consumer_state(consumer).leases)]

    def whereabouts(
        self, consumer: str, epoch: int, units: Sequence[int], now: float | None = None
    ) -> list[str]:
        """Where each of ``units`` of ``epoch`` is, as seen by ``consumer``: one of
        ``snapshot.WHEREABOUTS``. A trainer asks this about tasks it waits for, to learn which of
        them another trainer's readers took (elastic mode: all share one queue), which that
        trainer took in hand (:meth:`mark_taken`), and which are finished already.

        Epochs not started yet are all "todo"; finished ones "done" or "quarantined". With
        ``now``, a taken task whose lease was not renewed for over ``lease_timeout`` is "other"."""
        self.consumer_state(consumer)
        return snapshot.whereabouts(self, consumer, epoch, units, now)

    def progress(self, since_epoch: int = 0) -> Progress:
        """Per-epoch counts, quarantined and dropped work, consumers and their leases; finished
        epochs before ``since_epoch`` are left out of ``epochs`` (not of the counts)."""
        return snapshot.progress(self, since_epoch)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue after a restart, as JSON-ready dicts and lists."""
        return snapshot.dump_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace all state by ``state``; ConfigError if it was made for another schedule, or
        is damaged (the state is then as it was)."""
        self.state = snapshot.load_state(self.table, self.config, state)

    # ---------------------------------------------------------- public requests

    def restart(self, now: float) -> None:
        """Mark a (re)start on recovered state: see :class:`~.updates.MasterStarted`. Active
        leases last at least ``JobConfig.restart_grace`` from now; taken elastic leases are
        renewed for their full hold (``JobConfig.hold``) from now,
        as journaled ``LeaseRenewed`` records: nobody could renew them while the master was
        down."""
        self._fresh(MasterStarted(now, self.state.incarnation + 1, now + self.config.restart_grace))

    def resume(self, now: float, stopped_for: float) -> None:
        """The master could not run for ``stopped_for`` seconds up to ``now`` (its timer saw
        the gap): fresh deadlines as at :meth:`restart`, before ``expire`` judges a silence
        that nobody could have broken. See :class:`~.updates.MasterResumed`."""
        self._fresh(MasterResumed(now, now + self.config.restart_grace, stopped_for))

    def _fresh(self, update: MasterStarted | MasterResumed) -> None:
        now = update.now
        self.apply(update)
        for lease_id, lease in sorted(self.state.leases.items()):
            if lease.long_hold:
                self.apply(LeaseRenewed(now, lease_id, now + self.config.hold(lease)))
        self._commit(now)

    def register(self, consumer: str, now: float, rank: int | None = None) -> None:
        """Join (or re-join with the same rank); in DDP mode ``rank`` says whose queue it reads."""
        self.config.check_rank(consumer, rank)
        known = self.state.consumers.get(consumer)
        if known is not None and known.rank != rank:
            raise MasterError(
                f"consumer {consumer!r} is registered with rank {known.rank}; leave before "
                f"registering with rank {rank}"
            )
        self._run(now, ConsumerRegistered(now, consumer, rank))

    def heartbeat(self, consumer: str, now: float) -> None:
        """Keep ``consumer`` alive; leases are extended separately with :meth:`renew`."""
        self.consumer_state(consumer)
        self._run(now, ConsumerHeartbeat(now, consumer))

    def leave(self, consumer: str, now: float, consumed: HandBack | None = None) -> None:
        """Unregister; the consumer's leases go back to the front of their queues at once,
        with the records ``consumed`` of them (elastic mode; lease id -> ranges): handback.py."""
        leaving = self.consumer_state(consumer)
        for update in handed_back(self.state, leaving, consumed, now):  # all checked first
            self.apply(update)
        self._run(now, ConsumerLeft(now, consumer, "left"))

    def checkpoint(self, consumer: str, consumed: HandBack, now: float) -> None:
        """``consumer``'s trainer saved a state that counts records ``consumed`` (lease id ->
        ranges) of its leases as delivered (elastic mode): should a lease lapse, its unit goes
        back less them (handback.py). Leases it does not hold (any more) are left out."""
        holder = self.consumer_state(consumer)
        updates = handed_back(self.state, holder, consumed, now, LeaseCheckpointed)
        for update in updates:  # all checked first
            self.apply(update)
        self._run(now, ConsumerHeartbeat(now, consumer))

    def lease(
        self, consumer: str, max_tasks: int, now: float, request: int | None = None
    ) -> list[Lease]:
        """Up to ``max_tasks`` new leases for ``consumer``; empty when nothing is left for it now.

        Work of the oldest open epoch comes first, retries before fresh units. Epoch e+1 starts
        when a consumer finds nothing left for it in epoch e and no epoch older than e is open.
        ``request`` names the call: a repeat of a recent one that was granted leases (a retry
        whose first answer was lost) gets those still active again, and no new ones.
        """
        state = self.consumer_state(consumer)
        if isinstance(max_tasks, bool) or not isinstance(max_tasks, int) or max_tasks < 0:
            raise MasterError(f"max_tasks must be an int >= 0, got {max_tasks!r}")
        before = None if request is None else state.granted_before(request)
        if before is not None:
            self._run(now, ConsumerHeartbeat(now, consumer))
            return [self.state.leases[i] for i in before]
        queue = state.rank or 0
        granted: list[Lease] = []
        while len(granted) < max_tasks:
            found = find_work(self.state.open.values(), queue)
            if found is None:
                planned = self.config.epochs
                if len(self.state.open) > 1 or (
                    planned is not None and self.state.epochs_started >= planned
                ):
                    break
                self.apply(EpochStarted(now, self.state.epochs_started))
                continue
            ep, unit = found
            lease_id = self.state.next_lease_id
            self.apply(
                LeaseGranted(
                    now,
                    lease_id=lease_id,
                    consumer=consumer,
                    epoch=ep.epoch,
                    unit=unit,
                    attempt=ep.failures.get(unit, 0) + 1,
                    deadline=now + self.config.lease_timeout,
                    request=request,
                )
            )
            granted.append(self.state.leases[lease_id])
        if not granted:
            self.apply(ConsumerHeartbeat(now, consumer))
        self._commit(now)
        return granted

    def renew(self, lease_id: int, now: float) -> Lease:
        """Extend an active lease to ``now + lease_timeout`` (a taken elastic lease: ``now +
        max(lease_timeout, consumer_timeout)``, see ``JobConfig.hold``); returns the
        renewed lease."""
        lease = self.get_lease(lease_id)
        self._run(now, LeaseRenewed(now, lease_id, now + self.config.hold(lease)))
        return self.state.leases[lease_id]

    def mark_taken(self, lease_ids: Sequence[int], now: float) -> dict[int, str]:
        """The holders' trainers took these leases' tasks into their samplers: a trainer
        sharing the epoch stops waiting for them (see :meth:`whereabouts`). Leases no longer
        active are returned with why; the others are marked and, in elastic mode, renewed for
        the longer hold of a taken lease (``JobConfig.hold``)."""
        problems: dict[int, str] = {}
        for lease_id in lease_ids:
            lease = self.state.leases.get(lease_id)
            if lease is None:
                problems[lease_id] = NotActive.of_error(self.state.ended.not_active(lease_id))
            elif not lease.taken:
                self.apply(LeaseTaken(now, lease_id))
                taken = self.state.leases[lease_id]
                if taken.long_hold:
                    self.apply(LeaseRenewed(now, lease_id, now + self.config.hold(taken)))
        self._commit(now)
        return problems

    def complete(self, lease_id: int, now: float) -> None:
        """Count the lease's records as delivered, once.

        A lease that lapsed (expired, or its holder was dropped) is still accepted while nobody
        has taken its unit since; otherwise LeaseError says what became of it.
        """
        if lease_id not in self.state.leases and self.state.ended.lapsed(lease_id) is None:
            raise self.state.ended.not_active(lease_id)
        self._run(now, LeaseCompleted(now, lease_id))

    def fail(self, lease_id: int, error: str, now: float, *, permanent: bool = False) -> None:
        """The holder could not read the task: retry it soon, or quarantine it at the cap, or
        at once if the failure is ``permanent`` (the task's own: a retry fails the same way)."""
        lease = self.get_lease(lease_id)
        quarantine = permanent or self._exhausted(lease)
        self._run(now, LeaseFailed(now, lease_id, str(error), quarantine))

    def expire(self, now: float) -> list[Update]:
        """Take back leases past their deadline and leases of consumers silent for longer than
        ``consumer_timeout``; both count as failed attempts (a task that kills its reader must
        end up quarantined, not loop forever). Call it periodically. A taken elastic lease's
        deadline is later (``JobConfig.hold``); replays apply the journaled records,
        never decide."""
        applied: list[Update] = []
        for name, c in sorted(self.state.consumers.items()):
            if now - c.last_seen > self.config.consumer_timeout:
                for lease_id in sorted(c.leases):
                    self._take_back(
                        applied,
                        lease_id,
                        f"consumer {name!r} silent since "
                        f"t={c.last_seen} (holding lease {lease_id})",
                        now,
                    )
                applied.append(ConsumerLeft(now, name, "timeout"))
                self.apply(applied[-1])
        for lease_id, lease in sorted(self.state.leases.items()):
            if now > lease.deadline:
                self._take_back(
                    applied,
                    lease_id,
                    f"lease {lease_id} held by {lease.consumer!r} expired at t={lease.deadline}",
                    now,
                )
        self._commit(now)
        return applied

    def _take_back(self, applied: list[Update], lease_id: int, why: str, now: float) -> None:
        exhausted = self._exhausted(self.state.leases[lease_id])
        applied.append(LeaseExpired(now, lease_id, why, exhausted))
        self.apply(applied[-1])

    # ------------------------------------------------------------------- apply

    def apply(self, update: Update) -> None:
        """Apply one update: the only way state changes (also how a journal is replayed).

        An update that does not fit the state (a corrupt or foreign journal) raises MasterError
        before anything changes; the sink sees the update only once it is known to apply.
        """
        handler = self._handlers.get(type(update))
        if handler is None:
            raise MasterError(f"not a dispatcher update: {update!r}")
        handler(update)

    def _emit(self, update: Update) -> None:
        if self.sink is not None:
            self.sink.record(update)

    def _on_master_started(self, u: MasterStarted) -> None:
        if u.incarnation <= self.state.incarnation:
            raise MasterError(f"{u}: incarnation must exceed the current {self.state.incarnation}")
        self._emit(u)
        self.state.incarnation = u.incarnation
        self.state.next_lease_id = (u.incarnation << 32) + 1
        self._grace(u.now, u.lease_deadline)

    def _on_master_resumed(self, u: MasterResumed) -> None:
        self._emit(u)
        self._grace(u.now, u.lease_deadline)

    def _grace(self, now: float, lease_deadline: float | None) -> None:
        """Nobody could reach the master until ``now``: consumers count as seen then, and
        active leases last at least to ``lease_deadline`` (None: old record, none extended)."""
        for c in self.state.consumers.values():
            c.last_seen = max(c.last_seen, now)
        if lease_deadline is not None:
            for lease_id, lease in self.state.leases.items():
                if lease.deadline < lease_deadline:
                    self.state.leases[lease_id] = replace(lease, deadline=lease_deadline)

    def _on_epoch_started(self, u: EpochStarted) -> None:
        if u.epoch != self.state.epochs_started:
            raise MasterError(f"{u}: the next epoch to start is {self.state.epochs_started}")
        self._emit(u)
        self.state.open[u.epoch] = OpenEpoch.create(self.table, self.config, u.epoch)
        self.state.epochs_started += 1

    def _on_registered(self, u: ConsumerRegistered) -> None:
        known = self.state.consumers.get(u.consumer)
        if known is not None and known.rank != u.rank:
            raise MasterError(f"{u}: consumer is registered with rank {known.rank}")
        self._emit(u)
        if known is None:
            self.state.consumers[u.consumer] = ConsumerState(u.rank, u.now)
        else:
            known.last_seen = u.now

    def _on_heartbeat(self, u: ConsumerHeartbeat) -> None:
        c = self.consumer_state(u.consumer)
        self._emit(u)
        c.last_seen = u.now

    def _on_left(self, u: ConsumerLeft) -> None:
        c = self.consumer_state(u.consumer)
        self._emit(u)
        # Highest id first onto the front, so the oldest lease's unit is retried first.
        for lease_id in sorted(c.leases, reverse=True):
            lease = self.state.leases.pop(lease_id)
            # Declared dead: what its last saved state counted. A Leave hands back what it
            # says instead (LeaseHandedBack, just before), superseding the checkpoint.
            if u.reason != "left":
                self._hand_back_checkpoint(lease)
            self.state.open[lease.epoch].put_back(lease.unit)
            self.state.ended.lapse(lease, f"consumer {u.consumer!r} left ({u.reason}) at t={u.now}")
            self.state.counters[snapshot.RETURNED] += 1
        del self.state.consumers[u.consumer]

    def _on_handed_back(self, u: LeaseHandedBack) -> None:
        lease = self._active(u.lease_id, u)
        ep = self.state.open[lease.epoch]
        if lease.rank is not None or ep.outside(lease.unit, u.consumed) is not None:
            raise MasterError(f"{u}: not elastic mode, or records outside the lease's task")
        self._emit(u)
        ep.hand_back(lease.unit, u.consumed)

    def _on_checkpointed(self, u: LeaseCheckpointed) -> None:
        lease = self._active(u.lease_id, u)
        ep = self.state.open[lease.epoch]
        if lease.rank is not None or ep.outside(lease.unit, u.consumed) is not None:
            raise MasterError(f"{u}: not elastic mode, or records outside the lease's task")
        self._emit(u)
        self.state.leases[u.lease_id] = replace(lease, checkpointed=u.consumed)
        self._touch(lease.consumer, u.now)

    def _hand_back_checkpoint(self, lease: Lease) -> None:
        """A lease lapsing without a Leave: its unit keeps what the holder's last saved state
        counted (LeaseCheckpointed), skipped by whoever leases it next."""
        if lease.checkpointed:
            self.state.open[lease.epoch].hand_back(lease.unit, lease.checkpointed)

    def _on_granted(self, u: LeaseGranted) -> None:
        c = self.consumer_state(u.consumer)
        ep = self.state.open.get(u.epoch)
        if ep is None or not ep.can_take(u.unit) or u.lease_id < self.state.next_lease_id:
            raise MasterError(f"{u}: the unit is not available or the lease id is reused")
        self._emit(u)
        ep.take(u.unit)
        self.state.ended.regranted(u.epoch, u.unit, u.lease_id, u.consumer)
        self.state.leases[u.lease_id] = ep.make_lease(
            self.table, self.config, u.lease_id, u.consumer, u.unit, u.attempt, u.deadline
        )
        self.state.next_lease_id = u.lease_id + 1
        c.leases.add(u.lease_id)
        if u.request is not None:
            c.granted_for(u.request, u.lease_id)
        c.last_seen = u.now
        self.state.counters["granted"] += 1

    def _on_renewed(self, u: LeaseRenewed) -> None:
        lease = self._active(u.lease_id, u)
        self._emit(u)
        self.state.leases[u.lease_id] = replace(lease, deadline=u.deadline)
        self._touch(lease.consumer, u.now)

    def _on_taken(self, u: LeaseTaken) -> None:
        lease = self._active(u.lease_id, u)
        self._emit(u)
        self.state.leases[u.lease_id] = replace(lease, taken=True)
        self._touch(lease.consumer, u.now)

    def _on_completed(self, u: LeaseCompleted) -> None:
        lease = self.state.leases.get(u.lease_id)
        late = lease is None
        if lease is None:
            lease = self.state.ended.lapsed(u.lease_id)
            if lease is None:
                raise MasterError(f"{u}: {self.state.ended.not_active(u.lease_id)}")
        self._emit(u)
        ep = self.state.open[lease.epoch]
        if late:
            self.state.ended.complete_late(u.lease_id)
            ep.complete_late(lease.unit)
            self.state.counters["late_completed"] += 1
        else:
            self._drop_lease(lease)
            ep.move(lease.unit, DONE)
        self.state.counters["completed"] += 1
        self._touch(lease.consumer, u.now)
        self.state.ended.forget(
            u.lease_id,
            f"it was completed at t={u.now}; task {lease.task.task_id} of epoch {lease.epoch} "
            "is counted once",
        )
        self._maybe_close(ep)

    def _on_failed(self, u: LeaseFailed | LeaseExpired) -> None:
        lease = self._active(u.lease_id, u)
        self._emit(u)
        self._drop_lease(lease)
        ep = self.state.open[lease.epoch]
        ep.failures[lease.unit] = ep.failures.get(lease.unit, 0) + 1
        if u.quarantine:
            ep.quarantine(lease.unit, u.error)
        else:
            self._hand_back_checkpoint(lease)  # rows a saved state counted never come again
            ep.put_back(lease.unit)
        if isinstance(u, LeaseExpired):
            self.state.counters["expired"] += 1
            self.state.ended.lapse(lease, f"it was taken back at t={u.now}: {u.error}")
        else:
            self.state.counters["failed"] += 1
            self.state.ended.forget(u.lease_id, f"it was reported failed at t={u.now}: {u.error}")
            self._touch(lease.consumer, u.now)
        self._maybe_close(ep)

    # ----------------------------------------------------------------- helpers

    def _run(self, now: float, update: Update) -> None:
        self.apply(update)
        self._commit(now)

    def _commit(self, now: float) -> None:
        if self.sink is not None:
            self.sink.commit(now)

    def consumer_state(self, consumer: str) -> ConsumerState:
        """What is known of ``consumer``; MasterError unless it is registered."""
        c = self.state.consumers.get(consumer)
        if c is None:
            raise MasterError(
                f"consumer {consumer!r} is not registered (never was, left, or was declared "
                f"dead after {self.config.consumer_timeout}s of silence); register again"
            )
        return c

    def _touch(self, consumer: str, now: float) -> None:
        c = self.state.consumers.get(consumer)
        if c is not None:
            c.last_seen = max(c.last_seen, now)

    def _active(self, lease_id: int, update: Update) -> Lease:
        lease = self.state.leases.get(lease_id)
        if lease is None:
            raise MasterError(f"{update}: {self.state.ended.not_active(lease_id)}")
        return lease

    def _exhausted(self, lease: Lease) -> bool:
        failures = self.state.open[lease.epoch].failures.get(lease.unit, 0) + 1
        return failures > self.config.max_retries

    def _drop_lease(self, lease: Lease) -> None:
        del self.state.leases[lease.lease_id]
        c = self.state.consumers.get(lease.consumer)
        if c is not None:
            c.leases.discard(lease.lease_id)

    def _maybe_close(self, ep: OpenEpoch) -> None:
        if not ep.finished:
            return
        del self.state.open[ep.epoch]
        self.state.closed.append(ep.progress(self.table))
        self.state.ended.epoch_closed(ep.epoch)
