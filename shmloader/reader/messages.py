"""Messages from a reader process to its pool: small values only, never sample data."""

from __future__ import annotations

import functools
import os
import sysconfig
import time
import traceback
from dataclasses import dataclass

from ..errors import ShmloaderError
from ..sources.base import SkippedRecord

_SHMLOADER = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "")


@functools.cache
def _not_users() -> tuple[str, ...]:
    """Where code that is not the user's lies: frames there are passed over when saying where
    an error was raised (the standard library, installed packages, shmloader itself). Found on
    the first error, not at import: every reader imports this module as it starts."""
    found = {
        os.path.join(os.path.realpath(p), "")
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if (p := sysconfig.get_paths().get(key))
    }
    return tuple(found | {_SHMLOADER})


def lease_clock() -> float:
    """Seconds on a clock every process of the machine shares that also runs while the
    machine sleeps (Linux CLOCK_BOOTTIME; elsewhere the monotonic clock): when a lease was
    last known active, compared across the reader and the trainer (dataset/lease_check.py)."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(boottime) if boottime is not None else time.monotonic()


def task_key(epoch: int, seq: int) -> str:
    """How the sampler names a task it waits for to the readers (``StoreHandle.want``)."""
    return f"{epoch}:{seq}"


@dataclass(frozen=True)
class Started:
    """The reader holds ``lease_id`` and is reading it (its segment is not sealed yet)."""

    lease_id: int
    epoch: int
    task_id: int


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
    read_seconds: float
    skipped: tuple[SkippedRecord, ...]
    # Records of the task that earlier holders consumed (LeaseInfo.consumed): not delivered.
    consumed: tuple[tuple[int, int], ...] = ()
    # When (lease_clock) the reader last asked for or renewed the lease with success: the
    # master kept it until at least then + lease_timeout. None: not known.
    confirmed: float | None = None
    # What each column becomes in a batch (``(name, *gather_form)``): the trainer checks that
    # every task's columns gather alike (dataset/forms.py). Empty: not known.
    forms: tuple[tuple[str, bool, str], ...] = ()


def describe_error(exc: BaseException) -> str:
    """``Failed.error``: the exception's type and text and, for one that is not shmloader's
    (or one of ours chained to one that is not, as a ``DecodeError`` is to what decode
    raised), where that was raised. It crosses into the trainer as text, without its
    traceback, and a read() or decode of the user's own failing with ``IndexError: list
    index out of range`` said nothing of where. The place is the innermost frame in the
    user's code (not the standard library, an installed package or shmloader); else, for the
    user's code installed as a package, the outermost frame outside shmloader (the function
    shmloader called: the innermost could be a line of ``json/decoder.py`` the user's
    decode called); else the innermost frame."""
    text = f"{type(exc).__name__}: {exc}"
    cause: BaseException | None = exc
    while isinstance(cause, ShmloaderError):  # e.g. a DecodeError chained to decode's error
        cause = cause.__cause__
    frames = traceback.extract_tb(cause.__traceback__) if cause is not None else []
    if not frames:
        return text
    not_users = _not_users()
    users = [f for f in frames if not os.path.realpath(f.filename).startswith(not_users)]
    foreign = [f for f in frames if not os.path.realpath(f.filename).startswith(_SHMLOADER)]
    frame = users[-1] if users else foreign[0] if foreign else frames[-1]
    return f"{text} (raised at {frame.filename}:{frame.lineno}, in {frame.name})"


@dataclass(frozen=True)
class Failed:
    """Reading the task raised; the lease was reported failed to the master."""

    lease_id: int
    epoch: int
    task_id: int
    path: str
    error: str


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
