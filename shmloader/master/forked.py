"""Refusing gRPC in a process forked while this one's gRPC was live, instead of hanging.

gRPC's core keeps threads and locks that ``fork()`` does not copy: in a child forked while the
parent had a server or a channel open, the child's first server (``add_insecure_port``) or
call (``Register``) waits for ever. Reproduced with grpcio 1.85: a trainer with a started
dataset, then ``os.fork()`` (or a ``fork`` DataLoader worker, or a ``multiprocessing`` fork
pool) whose code starts a dataset of its own: the child hung silently, and a DataLoader
waiting on such a worker hung with it. A child forked after the parent's datasets closed
works, and so does every child with ``GRPC_ENABLE_FORK_SUPPORT=1`` in the environment when
Python starts (gRPC then resets its state in the child; shmloader sets it to false otherwise,
``_grpc_env.py``).

So every :class:`Master` that serves and every open :class:`MasterClient` is tracked here;
a child forked while one of them was live (and without gRPC's fork support) raises
:class:`MasterError` saying why, when it makes a master or a client.
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol

from ..errors import MasterError

FORK_SUPPORT_ENV = "GRPC_ENABLE_FORK_SUPPORT"
_TRUE = ("yes", "true", "1")  # what gRPC accepts, compared case-insensitively


class _GrpcUser(Protocol):
    def uses_grpc(self) -> bool: ...


_users: weakref.WeakSet[_GrpcUser] = weakref.WeakSet()
_forked_from: int | None = None  # the pid whose live gRPC this process (or an ancestor) copied


def track(user: _GrpcUser) -> None:
    """Count ``user`` (a master or a client) while its ``uses_grpc()`` says so."""
    _users.add(user)


def check(what: str) -> None:
    """:class:`MasterError` if this process cannot use gRPC (see the module docstring)."""
    if _forked_from is None:
        return
    raise MasterError(
        f"cannot start {what}: this process (pid {os.getpid()}) was forked from process "
        f"{_forked_from} while that one's shmloader master or master client was open, and "
        "gRPC hangs in such a child. Start it in a process made by 'spawn' or 'forkserver' "
        "(multiprocessing.get_context('spawn'), DataLoader(multiprocessing_context='spawn')), "
        "fork before the parent's dataset starts or after it closes, or run Python with "
        f"{FORK_SUPPORT_ENV}=1 in the environment"
    )


def _after_fork_in_child() -> None:
    global _forked_from
    parent = os.getppid()
    live = any(user.uses_grpc() for user in list(_users))
    _users.clear()  # the parent's, not ours: they refuse to work here anyway
    if _forked_from is None and live and not _FORK_SUPPORT:
        _forked_from = parent


# gRPC reads the variable once, when it is imported (with grpc, here; _grpc_env.py sets
# "false" unless the user set it before importing shmloader).
_FORK_SUPPORT = os.environ.get(FORK_SUPPORT_ENV, "").strip().lower() in _TRUE


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
