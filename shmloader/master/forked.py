"""Refusing gRPC in a process forked after this one used gRPC, instead of hanging.

gRPC's core keeps threads and locks that ``fork()`` does not copy: in a child forked while the
parent had a server or a channel open, the child's first server (``add_insecure_port``) or
call (``Register``) waits for ever. Reproduced with grpcio 1.85: a trainer with a started
dataset, then ``os.fork()`` (or a ``fork`` DataLoader worker, or a ``multiprocessing`` fork
pool) whose code starts a dataset of its own: the child hung silently, and a DataLoader
waiting on such a worker hung with it. Closing them first does not make it safe: gRPC's
threads outlive its servers and channels, and a child forked after the parent's master and
client had stopped hung too, less often (in 2 of 20 and 1 of 30 tries of
``tests/test_master_forked.py`` beside a CPU hog). gRPC supports a forked child only with
``GRPC_ENABLE_FORK_SUPPORT=1`` in the environment when Python starts (it then resets its state
in the child; shmloader sets it to false otherwise, ``_grpc_env.py``, since the DataLoader
workers it forks never use gRPC).

So a :class:`Master` that starts serving and a :class:`MasterClient` that opens its channel
mark the process (:func:`used`); a child forked after that (and without gRPC's fork
support) raises :class:`MasterError` saying why, when it makes a master or a client. A child
forked before the parent's first master or client works.

Such a child also never finalizes what it copied. The parent's unreachable gRPC objects
(a closed client's channel in a reference cycle, a finished call) would be collected by the
child's garbage collector, in a DataLoader worker in the middle of a batch; their
destructors take gRPC's locks as ``fork()`` copied them, held or waited on by a thread the
child does not have, and the worker hangs or aborts ("Mutex::Fer while waiting on
Condition"). So the child freezes every object it inherited (:func:`gc.freeze`): the
collector leaves them alone, and what the child makes itself is collected as usual. The
frozen objects cost no memory of their own: their pages are the parent's until written.
"""

from __future__ import annotations

import gc
import os

from ..errors import MasterError

FORK_SUPPORT_ENV = "GRPC_ENABLE_FORK_SUPPORT"
_TRUE = ("yes", "true", "1")  # what gRPC accepts, compared case-insensitively

_used = False  # a master or client of this process (or of an ancestor before it forked) existed
_forked_from: int | None = None  # the pid whose used gRPC this process (or an ancestor) copied
_forked_as: int | None = None  # the pid of the child forked from it: this one, or an ancestor


def used() -> None:
    """A master started serving or a client opened its channel: gRPC's threads now exist."""
    global _used
    _used = True


def check(what: str) -> None:
    """:class:`MasterError` if this process cannot use gRPC (see the module docstring)."""
    if _forked_from is None:
        return
    # A grandchild (a fork pool of a DataLoader worker, say) names the child it came through.
    through = "" if _forked_as == os.getpid() else f", through process {_forked_as},"
    raise MasterError(
        f"cannot start {what}: this process (pid {os.getpid()}) was forked{through} from "
        f"process {_forked_from} after that one had run a shmloader master or master client, "
        "and gRPC hangs in such a child (its threads outlive them, so also once they closed). "
        "Start it in a process made by 'spawn' or 'forkserver' (multiprocessing.get_context("
        "'spawn'), DataLoader(multiprocessing_context='spawn')), fork before the parent's first "
        f"dataset starts, or run Python with {FORK_SUPPORT_ENV}=1 in the environment"
    )


def _after_fork_in_child() -> None:
    global _forked_from, _forked_as
    if _used and not _FORK_SUPPORT:
        gc.freeze()  # the parent's objects are not this process's to finalize
        if _forked_from is None:
            _forked_from, _forked_as = os.getppid(), os.getpid()


# gRPC reads the variable once, when it is imported (with grpc, here; _grpc_env.py sets
# "false" unless the user set it before importing shmloader).
_FORK_SUPPORT = os.environ.get(FORK_SUPPORT_ENV, "").strip().lower() in _TRUE


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
