"""``flock()`` locks that a ``fork()`` cannot leave held.

A flock belongs to an open file description, and ``fork()`` gives the child a copy of every
descriptor. If one thread holds the lock while another forks (a DataLoader starting its
workers), the child holds it too: the parent's ``close()`` no longer releases it, and the next
taker waits for as long as the child lives. In a trainer whose workers wait for the trainer,
that is forever. So:

- :func:`exclusive` (short critical sections) holds a process-wide guard that ``fork()`` takes
  first: no fork happens while this process opens, holds or closes such a lock.
- :func:`hold` (a lock held for a process's lifetime, e.g. a master's journal) points the
  child's copy of the descriptor at ``/dev/null`` right after ``fork()``: the number stays
  valid in the child (a later ``close`` there closes nothing of ours), the lock stays the
  parent's alone.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_guard = threading.Lock()
_held: set[int] = set()


def _before_fork() -> None:
    _guard.acquire()


def _after_fork_in_parent() -> None:
    _guard.release()


def _after_fork_in_child() -> None:
    if _held:
        null = os.open(os.devnull, os.O_RDWR)
        try:
            for fd in _held:
                os.dup2(null, fd, inheritable=False)
        finally:
            os.close(null)
        _held.clear()
    _guard.release()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )


@contextmanager
def exclusive(path: str) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (which must exist), waiting for it.

    A fresh descriptor each time, so threads of one process exclude each other too (a flock
    taken again through the same description would not wait). Raises FileNotFoundError.
    """
    with _guard:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # the only descriptor of this description: the lock goes with it


def hold(path: str) -> int | None:
    """Take an exclusive flock on ``path`` (created if missing) without waiting, to keep until
    :func:`release`: its descriptor, or None if someone else holds the lock. A file it
    creates is the owner's alone (0600), like the journal beside it: nobody else can take the
    lock and hold a master off its directory."""
    with _guard:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        _held.add(fd)
        return fd


def release(fd: int) -> None:
    """Give up a lock taken with :func:`hold`."""
    with _guard:
        _held.discard(fd)
        os.close(fd)
