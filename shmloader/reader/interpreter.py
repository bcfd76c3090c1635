"""A fresh Python interpreter running one function of shmloader, on a pipe to the trainer.

Both ways readers start use it: a reader of its own (``pool.launch_reader``, where there is no
``fork``) and the readers' fork server (``forkserver.py``). The interpreter imports the
shmloader the trainer imported, from the same folder: ``python -m`` would put the working
folder first on its ``sys.path``, and a ``shmloader/`` there (a checkout, another version)
would be the readers' while the trainer runs the installed one.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from typing import TypeVar

T = TypeVar("T")

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Run as ``python -c BOOT PACKAGE_ROOT FD PARENT_PID``: the called function gets ``FD`` (its
# end of the pipe) and ``PARENT_PID`` (the trainer) as ``sys.argv[1:]``.
_BOOT = "import sys; sys.path.insert(0, sys.argv.pop(1)); from {module} import {function}; {call}"


def start_interpreter(
    module: str, function: str, call: str, environ: Mapping[str, str]
) -> tuple[subprocess.Popen[bytes], Connection]:
    """Start ``python -c`` running ``call`` (e.g. ``"sys.exit(main())"``) after importing
    ``function`` from ``module``; returns the process and the trainer's end of its pipe."""
    boot = _BOOT.format(module=module, function=function, call=call)
    return handed_pipe(
        lambda fd: subprocess.Popen(
            [sys.executable, "-c", boot, PACKAGE_ROOT, str(fd), str(os.getpid())],
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL,
            env=dict(environ),
        )
    )


def handed_pipe(hand_over: Callable[[int], T]) -> tuple[T, Connection]:
    """A pipe to another process: ``hand_over(fd)`` gives it one end (by ``fd``, which is
    closed here afterwards); returns what that returned, and the trainer's end. On a failure
    both ends are closed."""
    ours, theirs = socket.socketpair()
    try:
        handed = hand_over(theirs.fileno())
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return handed, Connection(ours.detach())
