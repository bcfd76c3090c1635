"""The dispatcher's update records: every change of its state is one of these.

The dispatcher's public methods decide *what* happens and express it as updates; its ``apply``
is the only code that changes state. An update therefore carries every decision that depends
on settings that may change between restarts (deadlines, whether a failure quarantines), so
replaying a journal never re-decides anything. Records are JSON (never pickle): the journal is
read back by a process that must not execute anything it finds there.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import CorruptRecordError


@dataclass(frozen=True)
class Update:
    """Base of every update; ``now`` is the wall-clock time the decision was made at."""

    now: float


class UpdateSink(Protocol):
    """Where applied updates go (the journal): ``record`` before each change, ``commit`` at the
    end of every public call, so the sink can fsync once per request rather than per update."""

    def record(self, update: Update) -> None: ...

    def commit(self, now: float) -> None: ...


@dataclass(frozen=True)
class MasterStarted(Update):
    """A master (re)started on this state. Nobody could reach it while it was down, so
    consumers get a fresh grace period and active leases a fresh deadline: each is extended to
    at least ``lease_deadline`` (``now + JobConfig.restart_grace``; None in records written
    before this field existed, which extended no lease). Lease ids move to a new range so
    that ids handed out before a crash but lost from an unsynced journal tail can never name
    a new lease."""

    incarnation: int
    lease_deadline: float | None = None


@dataclass(frozen=True)
class MasterResumed(Update):
    """The master's expiry timer found it had not run for ``stopped_for`` seconds (the process
    was stopped, or starved of the GIL by the trainer it is embedded in): nobody could reach
    it either, so consumers and active leases get fresh deadlines as at a restart
    (:class:`MasterStarted`), but the incarnation and lease ids stay."""

    lease_deadline: float
    stopped_for: float


@dataclass(frozen=True)
class EpochStarted(Update):
    epoch: int


@dataclass(frozen=True)
class ConsumerRegistered(Update):
    consumer: str
    rank: int | None


@dataclass(frozen=True)
class ConsumerHeartbeat(Update):
    consumer: str


@dataclass(frozen=True)
class ConsumerLeft(Update):
    """The consumer left (``reason="left"``) or went silent (``"timeout"``); its leases go back
    to the front of their queues without counting as failed attempts."""

    consumer: str
    reason: str


@dataclass(frozen=True)
class _LeaseRecords(Update):
    """Records ``consumed`` (``[start, stop)`` ranges, merged) of lease ``lease_id``'s unit."""

    lease_id: int
    consumed: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:  # JSON gives lists back: compare equal to the original
        ranges = tuple((int(a), int(b)) for a, b in self.consumed)
        object.__setattr__(self, "consumed", ranges)


@dataclass(frozen=True)
class LeaseHandedBack(_LeaseRecords):
    """Its holder, leaving (elastic mode), had consumed records ``consumed`` of the lease's
    unit: they join the unit's consumed ranges, which whoever leases the unit next in this
    epoch skips. Recorded just before :class:`ConsumerLeft`."""


@dataclass(frozen=True)
class LeaseCheckpointed(_LeaseRecords):
    """Its holder's trainer saved its state (elastic mode), which counts records ``consumed``
    (merged ranges) of the lease's unit as delivered. Should the lease lapse (expired, or its
    consumer declared dead), they join the unit's consumed ranges as a hand-back would: rows
    of a checkpoint never come again from another trainer. Replaces an earlier checkpoint of
    the lease; a Leave (a clean close, or a trainer resumed from a state handing back for the
    saving one) supersedes it with what it hands back."""


@dataclass(frozen=True)
class LeaseGranted(Update):
    """``request``: the id of the Lease call it was granted for (None: the caller sent none,
    or the record predates the field). Replaying these records rebuilds each consumer's memo of
    recent request ids, so a retried call is answered alike after a restart."""

    lease_id: int
    consumer: str
    epoch: int
    unit: int
    attempt: int
    deadline: float
    request: int | None = None


@dataclass(frozen=True)
class LeaseRenewed(Update):
    lease_id: int
    deadline: float


@dataclass(frozen=True)
class LeaseTaken(Update):
    """The holder's trainer took the task into its sampler: other trainers sharing the epoch
    (elastic mode) no longer wait to see where it goes."""

    lease_id: int


@dataclass(frozen=True)
class LeaseCompleted(Update):
    """Also used for a lease that lapsed but whose unit nobody took since (a late completion)."""

    lease_id: int


@dataclass(frozen=True)
class LeaseFailed(Update):
    """The holder reported ``error``; ``quarantine`` says the retry cap is reached."""

    lease_id: int
    error: str
    quarantine: bool


@dataclass(frozen=True)
class LeaseExpired(Update):
    """The deadline passed; counts as a failed attempt, like :class:`LeaseFailed`."""

    lease_id: int
    error: str
    quarantine: bool


_TYPES: dict[str, type[Update]] = {
    cls.__name__: cls
    for cls in (
        MasterStarted,
        MasterResumed,
        EpochStarted,
        ConsumerRegistered,
        ConsumerHeartbeat,
        ConsumerLeft,
        LeaseHandedBack,
        LeaseCheckpointed,
        LeaseGranted,
        LeaseRenewed,
        LeaseTaken,
        LeaseCompleted,
        LeaseFailed,
        LeaseExpired,
    )
}


def update_to_dict(update: Update) -> dict[str, Any]:
    """A JSON-ready dict: the class name under ``"type"`` plus the fields."""
    out: dict[str, Any] = {"type": type(update).__name__}
    out.update(dataclasses.asdict(update))
    return out


def update_from_dict(data: dict[str, Any]) -> Update:
    """Inverse of :func:`update_to_dict`; names the offending type or field when it cannot."""
    if not isinstance(data, dict):
        raise CorruptRecordError(f"update record is a {type(data).__name__}, not an object")
    name = data.get("type")
    cls = _TYPES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise CorruptRecordError(f"unknown update type {name!r}; known: {sorted(_TYPES)}")
    fields = {f.name for f in dataclasses.fields(cls)}
    # A field with a default was added later: records written before it may lack it.
    optional = {f.name for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    given = set(data) - {"type"}
    if not fields - optional <= given <= fields:
        raise CorruptRecordError(
            f"{name} record has fields {sorted(given)}, expected {sorted(fields)}"
        )
    return cls(**{k: data[k] for k in given})


def encode_update(update: Update) -> bytes:
    return json.dumps(update_to_dict(update), separators=(",", ":"), sort_keys=True).encode()


def decode_update(payload: bytes) -> Update:
    try:
        data = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptRecordError(f"update record is not valid JSON: {exc}") from exc
    return update_from_dict(data)
