"""A reader that died, reported as the user needs it: which reader, how, on which record, and what
to do.

A reader that dies sends nothing: the pool knows how from its exit code, which task from its
last ``Started`` message, and, on a retry, which record from what it noted (position.py). The
same text goes to the log as the death happens, to the master as the lease's failure (its
"last error"), and into the loop's error once the task is quarantined.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from .messages import Started

# Signals a process sends itself when its code crashes (a bad pointer, abort()).
CRASHES = frozenset(
    {signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL, signal.SIGFPE, signal.SIGSYS}
)
RAISE_INSTEAD = (
    "make decode raise an exception on a record it cannot handle: an exception names the "
    "record, and on_error='skip' skips such records"
)


@dataclass(frozen=True)
class ReaderDeath:
    """Reader ``index`` (``pid``) exited with ``code`` (``subprocess.Popen.returncode``:
    negative, the signal that killed it) while reading ``task`` (None: between tasks), at
    ``record`` (None: not known)."""

    index: int
    pid: int
    code: int
    task: Started | None = None
    record: int | None = None

    @property
    def how(self) -> str:
        """``"was killed by SIGSEGV (Segmentation fault)"`` or ``"exited with code 7"``."""
        if self.code >= 0:
            return f"exited with code {self.code}"
        try:
            killer = signal.Signals(-self.code)
        except ValueError:  # a real-time signal: no name
            return f"was killed by signal {-self.code}"
        words = signal.strsignal(killer)
        return f"was killed by {killer.name}" + (f" ({words})" if words else "")

    @property
    def where(self) -> str:
        """What it was doing: the record, else the task's records, else "between tasks"."""
        task = self.task
        if task is None:
            return "between tasks"
        which = f"task {task.task_id} of epoch {task.epoch}"
        if self.record is not None:
            return (
                f"while decoding record {self.record} of {task.path} ({which}, records "
                f"{task.start}..{task.stop})"
            )
        return f"while reading records {task.start}..{task.stop} of {task.path} ({which})"

    @property
    def fix(self) -> str:
        """What to do about it, by how it died."""
        if self.code >= 0:
            return (
                f"decode (or code it calls) ended the reader's process: os._exit({self.code}), "
                f"sys.exit({self.code}) or a C library's exit(); {RAISE_INSTEAD}"
            )
        if -self.code == signal.SIGKILL:
            return (
                "SIGKILL comes from outside the reader, most often the kernel's out-of-memory "
                "killer (`dmesg` names it): give the job more memory, or lower num_readers or "
                "what a task's decode holds"
            )
        if -self.code in CRASHES:
            return (
                "native code crashed the reader (decode, or a library it calls): run with "
                "PYTHONFAULTHANDLER=1 in the environment (readers inherit it) and the reader "
                f"prints its Python stack as it crashes; then {RAISE_INSTEAD}"
            )
        return "another process sent the reader that signal (kill, a job scheduler)"

    def __str__(self) -> str:
        return f"reader {self.index} (pid {self.pid}) {self.how} {self.where}"
