"""What the consumer of a store sends its writers, through small files in the store's folder.

Readers poll these between tasks; a file per hint, replaced or created atomically, so a
reader never sees half of one. Neither needs a lock: a stale answer only delays a reader by
one poll.

- ``wanted``: the keys (``"epoch:seq"``) of the segments the consumer waits for now. Their
  writers may use the room the others leave in the budget (budget.reserve), and a reader
  serves them before other tasks it holds.
- ``largest``: the size of the largest segment the consumer has seen in this store. Writers
  that leave room for one more segment (budget.reserve) leave at least that much, not just
  the largest segment present: when only small ones are present (a next epoch's short tasks,
  read ahead), a large task the consumer waits for would otherwise never fit.
- ``ahead``: present while the consumer holds enough segments it has not taken up yet
  (``Runtime._hold_readers_back``): readers then lease no new task unless one is wanted. A
  reader that leases without end only hoards tasks; with several trainers sharing a master's
  epochs (elastic mode), it would hoard them from the others.

- ``last_epoch``: the last epoch whose tasks readers may read now (a number; no file: any).
  A reader holding a task of a later epoch keeps it, unread, until the number moves on or the
  consumer waits for that task (``Runtime._hold_readers_back``). The consumer sets it to the
  epoch after the last one its sampler began, and to that epoch itself once a window of the
  next epoch's tasks is read: a job that stops after its last pass (``epochs=None``, the
  script counts) then leaves that window decoded for nothing, not the two windows ``ahead``
  allows and those read meanwhile, and nothing of the epoch after.

- ``alive``: when (``time.monotonic()``, one clock for all processes of a Linux host) the
  consumer's maintenance thread last went round (``Runtime._maintain``). A reader whose
  trainer is silent for over half a ``lease_timeout`` (stopped, frozen) leases nothing more
  and stops renewing what it holds: those leases lapse like the trainer's own, so trainers
  sharing the epoch get the tasks, instead of waiting for them as long as the stall lasts.
  No file (a consumer that never said): alive.

- ``left``: present once the consumer left its master (``Runtime._leave_master``: a close, or
  SIGTERM while the readers still run). A reader whose call then finds the consumer unknown
  must not register it again (``MasterClient.speak_for``): that made a ghost of a trainer that
  had left, holding leases that lapsed only after ``lease_timeout``, as failed attempts.

And ones that writers send the consumer:

- ``.peak``: the most bytes of segments the store held at once, written by the writer whose
  reservation reached it, under the store's lock (budget.reserve): ``ds.stats().shm_peak``.

- ``blocked.<pid>-<start>``: present while writer ``pid`` waits for room for a segment the
  consumer waits for (budget.reserve). Then only the consumer can make room, by consuming
  what it holds: the dataset's batcher lets rows go that it keeps for the next batch
  (``TaskBatchSampler``). A file per writer, named as the store names writers' files, so one
  that died (or a pid used again) does not count.
- ``waiting.<pid>-<start>``: present while writer ``pid`` waits for room for any segment.
  The consumer's stall warning (dataset/maintenance.py) tells such a reader, which is not
  stuck, from one that decodes a task's records before it reserves room for them.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence

from .names import is_alive, self_identity

WANTED_NAME = "wanted"
AHEAD_NAME = "ahead"
LAST_EPOCH_NAME = "last_epoch"
LARGEST_NAME = "largest"
BLOCKED_PREFIX = "blocked."
WAITING_PREFIX = "waiting."
ALIVE_NAME = "alive"
LEFT_NAME = "left"
PEAK_NAME = ".peak"  # a dotfile: listings of what holds memory pass over it, as over .lock


def _replace(path: str, text: str) -> None:
    """A hint with content, written whole or not at all."""
    temp = f"{path}.{os.getpid()}"
    with open(temp, "w") as f:
        f.write(text)
    os.replace(temp, path)


def want(folder: str, keys: Sequence[str]) -> None:
    _replace(os.path.join(folder, WANTED_NAME), "\n".join(keys))


def wanted(folder: str) -> set[str]:
    try:
        with open(os.path.join(folder, WANTED_NAME)) as f:
            return set(f.read().split())
    except FileNotFoundError:
        return set()


def _flag(path: str, on: bool) -> None:
    """A hint that is a file's presence."""
    if on:
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def set_ahead(folder: str, ahead: bool) -> None:
    _flag(os.path.join(folder, AHEAD_NAME), ahead)


def is_ahead(folder: str) -> bool:
    return os.path.exists(os.path.join(folder, AHEAD_NAME))


def set_last_epoch(folder: str, epoch: int | None) -> None:
    """``None`` takes the limit away."""
    path = os.path.join(folder, LAST_EPOCH_NAME)
    if epoch is None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    else:
        _replace(path, str(epoch))


def last_epoch(folder: str) -> int | None:
    """The last epoch readers may read now, or ``None`` when the consumer set no limit."""
    try:
        with open(os.path.join(folder, LAST_EPOCH_NAME)) as f:
            return int(f.read())
    except (FileNotFoundError, ValueError):
        return None


def _set_writer_flag(folder: str, prefix: str, on: bool) -> None:
    pid, token = self_identity()
    _flag(os.path.join(folder, f"{prefix}{pid}-{token}"), on)


def _live_writers(folder: str, prefix: str) -> set[int]:
    """Pids of the live writers with a ``<prefix><pid>-<start>`` file (a file of one that
    died names a process that is gone: its pid and start time, as the store's own names do,
    so a reused pid does not count)."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return set()
    pids = set()
    for name in names:
        if name.startswith(prefix):
            pid, _, token = name[len(prefix) :].partition("-")
            if pid.isdigit() and token.isdigit() and is_alive(int(pid), int(token)):
                pids.add(int(pid))
    return pids


def set_blocked(folder: str, blocked: bool) -> None:
    _set_writer_flag(folder, BLOCKED_PREFIX, blocked)


def writer_blocked(folder: str) -> bool:
    """Whether a live writer waits for room for a segment the consumer waits for."""
    return bool(_live_writers(folder, BLOCKED_PREFIX))


def set_waiting(folder: str, waiting: bool) -> None:
    _set_writer_flag(folder, WAITING_PREFIX, waiting)


def waiting_writers(folder: str) -> set[int]:
    """Pids of the live writers waiting for room for a segment."""
    return _live_writers(folder, WAITING_PREFIX)


def set_largest(folder: str, nbytes: int) -> None:
    _replace(os.path.join(folder, LARGEST_NAME), str(nbytes))


def largest(folder: str) -> int:
    return _number(folder, LARGEST_NAME)


def set_peak(folder: str, nbytes: int) -> None:
    """Under the store's lock, by the writer whose reservation reaches ``nbytes`` in use."""
    _replace(os.path.join(folder, PEAK_NAME), str(nbytes))


def peak(folder: str) -> int:
    return _number(folder, PEAK_NAME)


def _number(folder: str, name: str) -> int:
    """A hint that is a number (0 when absent)."""
    try:
        with open(os.path.join(folder, name)) as f:
            return int(f.read() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def set_alive(folder: str) -> None:
    _replace(os.path.join(folder, ALIVE_NAME), repr(time.monotonic()))


def silent_for(folder: str) -> float:
    """Seconds since the consumer last said it was alive; 0 if it never did (or the store is
    gone: then the reader stops anyway, on StoreClosedError)."""
    try:
        with open(os.path.join(folder, ALIVE_NAME)) as f:
            said = float(f.read())
    except (FileNotFoundError, ValueError):
        return 0.0
    return max(0.0, time.monotonic() - said)


def set_left(folder: str) -> None:
    """Before the consumer's ``leave``: see :func:`joined`."""
    _flag(os.path.join(folder, LEFT_NAME), True)


def joined(folder: str) -> bool:
    """Whether the consumer may still be registered again on its behalf: it has not left its
    master, and its store is still there. ``left`` is looked at first: it goes only with the
    store's folder, so one found missing either was not set yet (the consumer had not left
    when the master answered) or the folder is gone (it was closing)."""
    return not os.path.exists(os.path.join(folder, LEFT_NAME)) and os.path.isdir(folder)
