"""Messages from a reader process to its pool: small values only, never sample data."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..sources.skipped import SkippedRecord
from .failure import Link


def lease_clock() -> float:
    """Seconds on a clock every process of the machine shares that also runs while the
    machine sleeps (Linux CLOCK_BOOTTIME; elsewhere the monotonic clock): when a lease was
    last known active, compared across the reader and the trainer (dataset/lease_check.py)."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(boottime) if boottime is not None else time.monotonic()


def task_key(epoch: int, seq: int) -> str:
    """How the sampler names a task it waits for to the readers (``StoreHandle.want``)."""
    return f"{epoch}:{seq}"


# What the pool sends a reader: stop now, or retire (serve the tasks held, lease no more, exit).
STOP = "stop"
RETIRE = "retire"


@dataclass(frozen=True)
class Started:
    """The reader holds ``lease_id`` and is reading it (its segment is not sealed yet): records
    ``[start, stop)`` of ``path``, what the pool names should the reader die on the task."""

    lease_id: int
    epoch: int
    task_id: int
    path: str
    start: int
    stop: int


@dataclass(frozen=True)
class Sealing:
    """The reader is about to write the lease's rows into a segment named ``segment``.

    Sent first so that, if the reader dies after sealing but before its Ready, the trainer
    knows which sealed segment nobody will announce, and removes it.
    """

    lease_id: int
    segment: str


@dataclass(frozen=True)
class Ready:
    """Task rows sealed in ``segment``; the lease is now the trainer's to renew and complete."""

    lease_id: int
    epoch: int
    seq: int
    task_id: int
    path: str
    start: int
    stop: int
    segment: str
    num_rows: int
    nbytes: int
    read_seconds: float  # from the lease to the announcement, budget_wait_seconds included
    skipped: tuple[SkippedRecord, ...]
    # Records of the task that earlier holders consumed (LeaseInfo.consumed): not delivered.
    consumed: tuple[tuple[int, int], ...] = ()
    # When (lease_clock) the reader last asked for or renewed the lease with success: the
    # master kept it until at least then + lease_timeout. None: not known.
    confirmed: float | None = None
    # What each column becomes in a batch (``(name, *gather_form)``): the trainer checks that
    # every task's columns gather alike (dataset/column_forms.py). Empty: not known.
    forms: tuple[tuple[str, bool, str], ...] = ()
    # Of read_seconds, how long the reader waited for room in the shm budget.
    budget_wait_seconds: float = 0.0
    # cache=True: the key to keep the segment under once released (reader/cache_key.py);
    # "" when it is not to be kept (records skipped, or a decode that draws random numbers).
    cache_key: str = ""
    # The segment was the one cached for the task: nothing was read or decoded.
    from_cache: bool = False
    # cache=True, and the task is not kept: why, when the user should hear of it.
    not_cached: str = ""


@dataclass(frozen=True)
class Failed:
    """Reading the task raised; the lease is reported failed to the master right after.

    ``error`` is the text the master keeps; ``raised`` the exception and its causes, which
    the trainer raises in the loop as they were (failure.py). ``retry``: the master tries the
    task again (up to ``max_retries``); if False the failure is the task's own, the master
    quarantines it at once, and the trainer raises ``raised`` without waiting."""

    lease_id: int
    epoch: int
    task_id: int
    path: str
    error: str
    raised: tuple[Link, ...] = ()
    retry: bool = True


@dataclass(frozen=True)
class Finished:
    """The master has no more work ever (all epochs done); the reader exits."""


@dataclass(frozen=True)
class MasterLost:
    """A call to the master failed for good (unreachable for ``retry_for``, or refused): the
    reader exits rather than print a traceback and be restarted into the same wall. The
    trainer raises ``error`` from the sampler, and does not restart the reader."""

    error: str


@dataclass(frozen=True)
class Unusable:
    """The reader could not unpickle its configuration (a source or decode function it cannot
    import by name): it exits, and the trainer raises ``error`` at once as a ``ConfigError``
    rather than restart readers into the same failure until the pool gives up."""

    error: str


Message = Started | Sealing | Ready | Failed | Finished | MasterLost | Unusable
