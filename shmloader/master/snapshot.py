"""Read-outs of the dispatcher's state: ``progress()`` and ``state_dict`` / ``load_state_dict``.

States are plain JSON values, never pickle. Schedules are not stored: they are a pure function
of the plan and the schedule settings, so a state holds the *schedule key* (those settings and
a digest of the plan) and is refused by a dispatcher whose key differs, naming the settings
that disagree."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ..errors import ConfigError, MasterError
from .closed import GONE_MEMORY, ClosedLeases
from .config import SCHEDULE_FIELDS, JobConfig, resume_key
from .epochs import DONE, LEASED, QUARANTINED, TODO, OpenEpoch, schedule_of
from .progress import (
    ConsumerProgress,
    EpochProgress,
    Lease,
    Progress,
)
from .tasks import TaskTable

STATE_FORMAT = 1
# What :meth:`Dispatcher.whereabouts` says of a unit. "mine": leased by the asking consumer;
# "other": leased by another one, whose trainer has not taken it yet; "taken": it has.
WHEREABOUTS = ("todo", "mine", "other", "done", "quarantined", "taken")
_STATUS_NAMES = {TODO: "todo", DONE: "done", QUARANTINED: "quarantined"}


# Lease request ids remembered per consumer. A trainer's readers all lease under its consumer
# id, so the memo must outlast the calls of its other readers made while one retries.
REQUEST_MEMORY = 64
# Leases returned unread (their consumer left or was declared dead): the counter keeps the key
# "released" on the wire, in journals and in /metrics (shmloader_leases_released_total).
RETURNED = "released"
COUNTERS = ("granted", "completed", "late_completed", "failed", "expired", RETURNED)


@dataclass
class ConsumerState:
    """What the dispatcher knows of a registered consumer.

    ``requests``: the ids of its latest Lease calls (at most ``REQUEST_MEMORY``, oldest
    first) and the leases granted for each: a retried call whose answer was lost gets those
    again rather than new ones, which would lapse unread (orphans) and count as failed
    attempts of their tasks."""

    rank: int | None
    last_seen: float
    leases: set[int] = field(default_factory=set)
    requests: dict[int, list[int]] = field(default_factory=dict)

    def granted_for(self, request: int, lease_id: int) -> None:
        """Remember ``lease_id`` as granted for Lease call ``request``."""
        ids = self.requests.get(request)
        if ids is None:
            ids = self.requests[request] = []
            while len(self.requests) > REQUEST_MEMORY:
                del self.requests[next(iter(self.requests))]
        ids.append(lease_id)

    def granted_before(self, request: int) -> list[int] | None:
        """The leases granted for ``request`` that are still this consumer's (None: unknown
        request, grant anew)."""
        ids = self.requests.get(request)
        return None if ids is None else [i for i in ids if i in self.leases]


@dataclass
class DispatcherState:
    """What a dispatcher holds besides its plan and config: everything its updates change, and
    what a snapshot (``state_dict``) stores. Only the dispatcher's update handlers change it;
    the read-outs below take it as it is."""

    epochs_started: int
    incarnation: int = 0
    next_lease_id: int = 1
    open: dict[int, OpenEpoch] = field(default_factory=dict)
    closed: list[EpochProgress] = field(default_factory=list)
    consumers: dict[str, ConsumerState] = field(default_factory=dict)
    leases: dict[int, Lease] = field(default_factory=dict)
    # Leases no longer active: why, who got their task, which may be completed late.
    ended: ClosedLeases = field(default_factory=lambda: ClosedLeases(GONE_MEMORY))
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))


class Dispatched(Protocol):
    """What the read-outs below read of a dispatcher: its task table, its settings, the state
    its updates made, and whether its epochs are all done. A dispatcher is one; the read-outs
    never change it, and know nothing else of it."""

    @property
    def table(self) -> TaskTable: ...

    @property
    def config(self) -> JobConfig: ...

    @property
    def state(self) -> DispatcherState: ...

    @property
    def finished(self) -> bool: ...


def schedule_key(table: TaskTable, config: JobConfig) -> dict[str, Any]:
    key: dict[str, Any] = {name: getattr(config, name) for name in SCHEDULE_FIELDS}
    key["resume"] = resume_key(config.resume)
    if config.resume is not None:  # the consumed records belong to this epoch
        key["resume_epoch"] = config.first_epoch
    key["plan"] = table.plan_digest
    return key


def check_schedule_key(expected: dict[str, Any], found: dict[str, Any], where: str) -> None:
    """ConfigError naming every setting in which ``found`` (from ``where``) differs."""

    def show(name: str, value: Any) -> str:
        return f"{value[:12]}..." if name == "plan" and isinstance(value, str) else repr(value)

    diffs = [
        f"{name}: {show(name, found.get(name))} there, {show(name, expected[name])} here"
        for name in expected
        if found.get(name) != expected[name]
    ]
    if diffs:
        plan_differs = found.get("plan") != expected.get("plan")
        hint = " (the plan differs: other files or record counts)" if plan_differs else ""
        raise ConfigError(
            f"{where} was made for another task schedule{hint}; differing: {'; '.join(diffs)}"
        )


def _lease_state(lease: Lease) -> dict[str, Any]:
    return {
        "lease_id": lease.lease_id,
        "consumer": lease.consumer,
        "epoch": lease.epoch,
        "unit": lease.unit,
        "attempt": lease.attempt,
        "deadline": lease.deadline,
        "taken": lease.taken,
        **({"checkpointed": [list(r) for r in lease.checkpointed]} if lease.checkpointed else {}),
    }


def _consumer_state(name: str, c: ConsumerState) -> dict[str, Any]:
    out: dict[str, Any] = {"consumer": name, "rank": c.rank, "last_seen": c.last_seen}
    if c.requests:  # as [id, lease ids] pairs, oldest first; absent, states dump as before
        out["requests"] = [[r, list(ids)] for r, ids in c.requests.items()]
    return out


def dump_state(d: Dispatched) -> dict[str, Any]:
    return {
        "format": STATE_FORMAT,
        "schedule": schedule_key(d.table, d.config),
        "incarnation": d.state.incarnation,
        "next_lease_id": d.state.next_lease_id,
        "epochs_started": d.state.epochs_started,
        "open_epochs": [ep.to_state() for ep in d.state.open.values()],
        "closed_epochs": [p.to_dict() for p in d.state.closed],
        "consumers": [_consumer_state(name, c) for name, c in sorted(d.state.consumers.items())],
        "leases": [_lease_state(x) for _, x in sorted(d.state.leases.items())],
        **d.state.ended.to_state(_lease_state),  # "lapsed", "gone", "handed"
        "counters": dict(d.state.counters),
    }


def load_state(table: TaskTable, config: JobConfig, state: dict[str, Any]) -> DispatcherState:
    """The dispatcher state ``state`` (a ``state_dict``) holds, checked against the plan's
    table and the config: ConfigError if it was saved for another schedule or is damaged."""
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise ConfigError(f"not a dispatcher state_dict of format {STATE_FORMAT} (got {found!r})")
    key = state.get("schedule") or {}
    check_schedule_key(schedule_key(table, config), key, "the state_dict")
    try:
        return _load(table, config, state)
    except (KeyError, TypeError, ValueError, IndexError, MasterError) as exc:
        raise ConfigError(f"the state_dict is damaged or incomplete: {exc!r}") from exc


def _load(table: TaskTable, config: JobConfig, state: dict[str, Any]) -> DispatcherState:
    s = DispatcherState(
        epochs_started=int(state["epochs_started"]),
        incarnation=int(state["incarnation"]),
        next_lease_id=int(state["next_lease_id"]),
        closed=[EpochProgress.from_dict(p) for p in state["closed_epochs"]],
    )
    for c in state["consumers"]:
        # States saved before Lease calls had ids have no "requests".
        requests = {int(r): [int(i) for i in ids] for r, ids in c.get("requests", [])}
        consumer = ConsumerState(c["rank"], float(c["last_seen"]), requests=requests)
        s.consumers[str(c["consumer"])] = consumer
    leased: dict[int, list[int]] = {}
    for x in state["leases"]:
        leased.setdefault(int(x["epoch"]), []).append(int(x["unit"]))
    for data in state["open_epochs"]:
        epoch = int(data["epoch"])
        s.open[epoch] = OpenEpoch.from_state(table, config, data, leased.get(epoch, []))
    for x in state["leases"]:
        lease = _lease(table, config, s, x)
        s.leases[lease.lease_id] = lease
        s.consumers[lease.consumer].leases.add(lease.lease_id)
    s.ended.load_state(state, lambda x: _lease(table, config, s, x))
    s.counters.update({k: int(v) for k, v in state["counters"].items()})
    return s


def _lease(table: TaskTable, config: JobConfig, s: DispatcherState, x: dict[str, Any]) -> Lease:
    ep = s.open[int(x["epoch"])]
    lease = ep.make_lease(
        table,
        config,
        int(x["lease_id"]),
        str(x["consumer"]),
        int(x["unit"]),
        int(x["attempt"]),
        float(x["deadline"]),
    )
    # States saved before leases could be taken (or checkpointed) have none: none was.
    checkpointed = tuple((int(a), int(b)) for a, b in x.get("checkpointed", []))
    return replace(lease, taken=bool(x.get("taken", False)), checkpointed=checkpointed)


def progress(d: Dispatched, since_epoch: int = 0) -> Progress:
    closed = (
        d.state.closed
        if since_epoch <= 0
        else [p for p in d.state.closed if p.epoch >= since_epoch]
    )
    epochs = [*closed, *(ep.progress(d.table) for ep in d.state.open.values())]
    consumers = tuple(
        ConsumerProgress(
            consumer=name,
            rank=c.rank,
            last_seen=c.last_seen,
            leases=tuple(sorted(c.leases)),
            leased_records=sum(d.state.leases[i].task.num_records for i in c.leases),
        )
        for name, c in sorted(d.state.consumers.items())
    )
    return Progress(
        epochs_planned=d.config.epochs,
        epochs_started=d.state.epochs_started,
        epochs_finished=len(d.state.closed),
        finished=d.finished,
        num_tasks=len(d.table),
        total_records=d.table.total_records,
        epochs=tuple(epochs),
        consumers=consumers,
        counters=dict(d.state.counters),
    )


def whereabouts(
    d: Dispatched, consumer: str, epoch: int, units: Sequence[int], now: float | None = None
) -> list[str]:
    """See :meth:`Dispatcher.whereabouts`."""
    ep = d.state.open.get(epoch)
    if ep is None and epoch >= d.state.epochs_started:
        return ["todo"] * len(units)
    size = len(ep.status) if ep is not None else _closed_size(d, epoch)
    bad = [u for u in units if not 0 <= u < size]
    if bad:
        raise ConfigError(f"epoch {epoch} has units 0..{size - 1}, not {bad[0]}")
    if ep is None:
        lost = {q.unit for p in d.state.closed if p.epoch == epoch for q in p.quarantined}
        return ["quarantined" if u in lost else "done" for u in units]
    holders = {lease.unit: lease for lease in d.state.leases.values() if lease.epoch == epoch}
    out = []
    for unit in units:
        status = int(ep.status[unit])
        if status != LEASED:
            out.append(_STATUS_NAMES[status])
        elif holders[unit].consumer == consumer:
            out.append("mine")
        else:
            out.append("taken" if _in_hand(d, holders[unit], now) else "other")
    return out


def left_records(d: Dispatched, epoch: int) -> list[int] | None:
    """Records of each queue of ``epoch`` not done yet (to do or leased); None before the
    epoch starts (all of each queue's records), zeros once it finished."""
    ep = d.state.open.get(epoch)
    if ep is not None:
        return ep.left_by_queue()
    if epoch >= d.state.epochs_started:
        return None
    return [0] * (d.config.world_size or 1)


def _in_hand(d: Dispatched, lease: Lease, now: float | None) -> bool:
    """Taken, and renewed within ``lease_timeout``. A taken lease not renewed for longer may
    be its trainer's (stalled or dead) to the end of its hold, up to ``consumer_timeout``
    (``JobConfig.hold``): "other", which trainers wait for at the end of a pass, as for a
    task not taken, else the others could end their last pass before it comes back and its
    rows would be lost. Its deadline is its last renewal plus its hold, so no clock is kept."""
    if not lease.taken or now is None:
        return lease.taken
    renewed_at = lease.deadline - d.config.hold(lease)
    return now - renewed_at <= d.config.lease_timeout


def _closed_size(d: Dispatched, epoch: int) -> int:
    for done in d.state.closed:
        if done.epoch == epoch:
            return done.total_units
    # Before first_epoch (a resumed job): consumed before the master started.
    return len(schedule_of(d.table, d.config, epoch))
