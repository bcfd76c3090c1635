"""Removing an owner's dataset directory on close, normal exit, garbage collection and SIGTERM.

On SIGTERM, hooks (:func:`on_sigterm`) run first: a dataset leaves its master as a clean close
would, so a trainer that is preempted hands back what it consumed.

Each owner registers a ``weakref.finalize`` (runs once: on ``close()``, when the owner is
garbage collected, or at interpreter exit — which includes exit after an uncaught
KeyboardInterrupt). One SIGTERM handler serves all owners of the process: it runs every pending
finalizer, then hands the signal to whatever handler was there before (a Python handler is
called; the default action is re-delivered so the process still dies *by* SIGTERM). It is
installed with the first owner (main thread only: Python allows no other) and put back when the
last owner closes, if nobody replaced it meanwhile. SIGKILL cannot be caught: the next store
creation or ``shmloader clean`` reaps what it leaves.

Removal is tied to the owner's pid: a forked child inherits the finalizers and the handler but
never deletes its parent's directory.
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
    """Run ``hook`` on SIGTERM before segments are removed (while a store's handler is
    installed): a dataset tells its master what it consumed, as a clean close would. It runs
    in the signal handler, so it must not block on locks the interrupted code may hold.
    Returns a key for :func:`forget_sigterm`."""
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
    global _installed, _previous
    if _installed or threading.current_thread() is not threading.main_thread():
        if not _installed:
            _log.debug("not in the main thread: SIGTERM will not remove shared-memory segments")
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_IGN:
        return  # the process ignores SIGTERM, so it will not die of it: nothing to clean
    _previous = previous
    signal.signal(signal.SIGTERM, _on_sigterm)
    _installed = True


def _uninstall() -> None:
    global _installed, _previous
    if not _installed or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not _on_sigterm:
        # Someone chained on top of us: stay in their chain (we only forward from now on).
        return
    signal.signal(signal.SIGTERM, _previous if _previous is not None else signal.SIG_DFL)
    _installed = False
    _previous = None


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    previous = _previous  # read first: the last finalizer puts the previous handler back
    for hook in list(_first.values()):
        try:
            hook()
        except Exception:  # the process is going down: removing segments matters more
            _log.exception("a SIGTERM hook failed")
    for fin in list(_pending.values()):
        fin()
    if callable(previous):
        previous(signum, frame)
        return
    if previous is signal.SIG_IGN:
        return
    # Default action: die by the signal, as if we had never been installed.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
