"""Removing an owner's dataset directory on close, normal exit, garbage collection and SIGTERM.

Each owner registers a ``weakref.finalize`` (runs once: on ``close()``, when the owner is
garbage collected, or at interpreter exit — which includes exit after an uncaught
KeyboardInterrupt or a ``SystemExit``).

SIGTERM is ours to handle only where its disposition is the default, i.e. where it would kill
the process without any cleanup. One handler then serves all owners of the process: it runs
the hooks (:func:`on_sigterm`: a dataset leaves its master as a clean close would, so that a
preempted trainer hands back what it consumed), then every pending finalizer, then
re-delivers the signal with the default action so the process still dies *by* SIGTERM. A
second SIGTERM while that runs skips what is left of the hooks: the user wants out now. It is
installed with the first owner (main thread only: Python allows no other) and put back when
the last owner closes, if nobody replaced it meanwhile.

Where the application has a SIGTERM handler of its own when the first owner opens (typically
a preemption handler that sets a flag, so that the loop finishes its step, saves a checkpoint
and exits), nothing is installed: that handler decides what SIGTERM means, and the stores
stay usable until the application's own exit path (``close()``, ``with``, ``finally``,
atexit) removes them. If it ends the process without such a path (``os._exit``), what it
leaves is reaped like a SIGKILL's. Ignored SIGTERM: nothing is installed either (the process
will not die of it). A handler installed *after* the first owner replaces ours likewise, also
when it calls ours (as returned by ``signal.signal``), as handlers that chain to the previous
one do (Lightning's, for one): called while it is not the installed handler, ours does
nothing, since a chaining handler calls what it found to notify it, not to be killed by it
(the default action it would have found is no callable). SIGKILL cannot be caught: the
next store creation or ``shmloader clean`` reaps what it leaves.

Removal is tied to the owner's pid: a forked child (a DataLoader worker, which torch may
SIGTERM) inherits the finalizers, the hooks and the handler, but neither runs a hook nor
deletes its parent's directory: its SIGTERM only takes the default action.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import signal
import threading
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any

_log = logging.getLogger(__name__)

_pending: dict[int, weakref.finalize[Any, Any]] = {}
_first: dict[int, Callable[[], None]] = {}  # run before the finalizers (on_sigterm)
_previous: Any = None
_installed = False
_installer_pid = -1  # the process whose hooks and stores the handler serves
_stage = ""  # where our handler is: "" (not running), "hooks", "removing"
_guard = threading.RLock()  # re-entrant: GC or the signal handler may run while it is held
_keys = itertools.count()


def remove_dataset_dir(path: str, owner_pid: int) -> None:
    """Delete ``path`` if this process is its owner. Retries while writers race to add files."""
    if os.getpid() != owner_pid:
        return
    for attempt in range(5):
        try:
            shutil.rmtree(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            # A writer in another process created a reservation after rmtree listed the
            # directory (ENOTEMPTY); it fails on its next step, so another pass succeeds.
            if attempt == 4:
                raise


def register(owner: object, path: str) -> weakref.finalize[Any, Any]:
    """Arrange removal of ``path``; calling the returned finalizer removes it now."""
    key = next(_keys)
    fin = weakref.finalize(owner, _finalize, path, os.getpid(), key)
    with _guard:
        _pending[key] = fin
        _install()
    return fin


def on_sigterm(hook: Callable[[], None]) -> int:
    """Run ``hook`` on SIGTERM before segments are removed, where the signal's disposition
    was the default (the process is about to die): a dataset reports to its master what it
    consumed, as a clean close would. Where the application handles SIGTERM itself, hooks do
    not run: its exit path calls ``close()``. A hook runs in the signal handler, so it must
    not block on locks the interrupted code may hold. Returns a key for
    :func:`forget_sigterm`."""
    key = next(_keys)
    with _guard:
        _first[key] = hook
    return key


def forget_sigterm(key: int) -> None:
    with _guard:
        _first.pop(key, None)


def _finalize(path: str, owner_pid: int, key: int) -> None:
    try:
        remove_dataset_dir(path, owner_pid)
    finally:
        with _guard:
            _pending.pop(key, None)
            if not _pending:
                _uninstall()


def _install() -> None:
    global _installed, _previous, _installer_pid
    if _installed and _installer_pid == os.getpid():
        return
    if threading.current_thread() is not threading.main_thread():
        _log.debug("not in the main thread: SIGTERM will not remove shared-memory segments")
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is _on_sigterm:  # a forked child opening a store of its own
        previous = _previous
    if previous is signal.SIG_IGN:
        return  # the process ignores SIGTERM, so it will not die of it: nothing to clean
    if callable(previous):
        # The application handles SIGTERM (a preemption handler, say): tearing down here
        # would take the store and the master from under the step it means to finish.
        _log.debug("SIGTERM has the application's handler: its exit path removes the stores")
        return
    _previous = previous
    signal.signal(signal.SIGTERM, _on_sigterm)
    _installed = True
    _installer_pid = os.getpid()


def _uninstall() -> None:
    global _installed, _previous
    if not _installed or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not _on_sigterm:
        # Someone installed a handler on top of ours: leave theirs. If it calls ours, that
        # takes the default action (and removes whatever store is open by then).
        return
    signal.signal(signal.SIGTERM, _previous if _previous is not None else signal.SIG_DFL)
    _installed = False
    _previous = None


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """The default action of SIGTERM, with the hooks and the removal of this process's stores
    first. A second SIGTERM (Python runs it inside the first) during the hooks skips the rest
    of them, and during the removal lets the first finish it. In a forked child, only the
    default action: none of this is the child's."""
    global _stage
    if os.getpid() == _installer_pid and signal.getsignal(signal.SIGTERM) is not _on_sigterm:
        # Called by a handler installed on top of ours that chains to the one it replaced: it
        # owns SIGTERM now (module doc); the stores go when the application exits.
        return
    if os.getpid() == _installer_pid:
        if _stage == "removing":
            return  # the first handler removes the stores, then dies
        first = _stage == ""
        _stage = "hooks"
        for hook in list(_first.values()) if first else []:
            try:
                hook()
            except Exception:  # the process is going down: removing segments matters more
                _log.exception("a SIGTERM hook failed")
        _stage = "removing"
        for fin in list(_pending.values()):
            try:
                fin()
            except Exception:  # raised here, it left the other stores and kept the process
                # alive, raising into whatever the main thread ran; a later SIGTERM found
                # "removing" and returned: the process no longer died of SIGTERM at all.
                _log.exception("removing a store on SIGTERM failed")
    # Die by the signal, as if we had never been installed.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
