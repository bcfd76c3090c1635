"""Runtimes a process left open are closed when its interpreter exits, while threads still work.

Left to the dataset's ``__del__`` during finalization, closing hangs: by then the embedded
master's gRPC executor has shut down (concurrent.futures stops its pools in threading's exit
hooks, before ``atexit``), so readers' and our own calls to it never return. So the close runs
in the same phase, registered after (hence run before) those pools' hook.

Apart from the runtime because it is the process's, not one runtime's: one hook for every
runtime of the process. Registering one per runtime added a hook per dataset that was never
removed (a process that made 200 datasets ran 200 at exit).
"""

from __future__ import annotations

import atexit
import threading
import weakref
from typing import Protocol


class Closable(Protocol):
    """What the exit hook needs of a runtime: its close (a ``Runtime``)."""

    def close(self) -> None: ...


_open_runtimes: weakref.WeakSet[Closable] = weakref.WeakSet()
_exit_hook_registered = False


def close_at_exit(runtime: Closable) -> None:
    """Close ``runtime`` when the interpreter exits, unless :func:`forget` came first."""
    global _exit_hook_registered
    _open_runtimes.add(runtime)
    if not _exit_hook_registered:
        _exit_hook_registered = True
        register = getattr(threading, "_register_atexit", atexit.register)
        register(_close_all)


def forget(runtime: Closable) -> None:
    """``runtime`` is closing: nothing is left for the exit hook to do with it."""
    _open_runtimes.discard(runtime)


def _close_all() -> None:
    for runtime in list(_open_runtimes):
        runtime.close()
