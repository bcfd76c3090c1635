"""Reader processes forked from one warm process, not each a fresh interpreter.

A fresh interpreter imports numpy, pyarrow and grpc before its first task: about 0.2 s of CPU
and 50 MiB of its own per reader, all of it while the first batch waits (two readers and the
trainer importing at once on two cores). The fork server is one such interpreter, started
with the dataset: it imports the reader's modules once, then forks each reader on request, and
the readers share its pages of those libraries (copy on write) instead of holding their own.
A reader started later (a restart, ``num_readers="auto"`` adding one) is ready at once.

The server forks safely because it does nothing else: one thread (OpenBLAS runs one thread
in readers, ``pool.reader_environment``; pyarrow's allocator's background thread is made
fork-safe by jemalloc itself), and no gRPC channel ever opened (a channel's threads and locks
do not survive a fork: a child forked from a process that used gRPC hangs, see
``master/forked.py``). A reader opens its own channel after the fork.

Who waits for whom: the server is the readers' parent, so it reaps them and reports to the trainer
each exit code (``exited``); a reader asks Linux to kill it when the server dies, and the
server when the trainer's launching thread dies (the parent-death signal), so a trainer's
SIGKILL still leaves no reader behind. The trainer signals a reader through the server, which
knows whether that pid is still its child (a pid the server reaped may belong to another
process by then).

The channel to the server carries small pickled tuples each way: the trainer's ``("fork",)``
followed by the reader's end of its pipe (a file descriptor, ``SCM_RIGHTS``), and ``("kill",
pid)`` and ``("exit",)``; the server's ``("forked", pid)``, in the order of the requests,
and ``("exited", pid, code)``, with ``code`` as :attr:`subprocess.Popen.returncode` has it
(negative: the signal that killed it).
"""

from __future__ import annotations

import contextlib
import gc
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Mapping
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle, send_handle
from typing import NoReturn

from .interpreter import handed_pipe, start_interpreter

KILLED = -signal.SIGKILL  # the exit code of a reader whose server died (the death signal)
_POLL = 0.05  # seconds a waiter holds the channel before another may look
# How long a fork request may go unanswered before the server counts as hung. Its imports
# come first (under a second; many on a loaded machine), then each fork takes milliseconds.
ANSWER_SECONDS = 60.0


class ForkedReader:
    """A reader process the server forked: what the pool asks of a process (``pid``,
    ``poll``, ``wait``, ``kill``), answered by the server, whose child it is."""

    def __init__(self, server: ForkServer) -> None:
        self._server = server
        self._pid: int | None = None  # known once the server answered the request
        self._asked_at = time.monotonic()  # the server's answer is awaited from here
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        """Its pid (waits for the server's answer to the fork request, if not there yet): -1
        if the server died first, or did not answer for ``answer_seconds`` (alive but stopped
        or stuck), when it is killed: its readers go with it, and the pool starts another."""
        deadline = self._asked_at + self._server.answer_seconds
        while self._pid is None:
            if time.monotonic() >= deadline:
                self._server.abandon()
            self._server.look(_POLL)
        return self._pid

    def forked(self, pid: int) -> None:
        self._pid = pid

    def poll(self) -> int | None:
        """Its exit code, or None while it runs."""
        if self.returncode is None:
            self._server.look(0.0)
            self.returncode = self._server.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code, once it exited; :class:`subprocess.TimeoutExpired` after
        ``timeout`` seconds of waiting."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = _POLL if deadline is None else min(_POLL, deadline - time.monotonic())
            if left <= 0:
                raise subprocess.TimeoutExpired(f"reader {self.pid}", timeout or 0.0)
            self._server.look(left)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        """SIGKILL it (through the server: it knows whether the pid is still its child)."""
        if self.poll() is None:
            self._server.kill(self.pid)


class ForkServer:
    """The trainer's end of a fork server it started (from the calling thread: the server
    dies with it, and the readers with the server)."""

    def __init__(self, environ: Mapping[str, str], answer_seconds: float = ANSWER_SECONDS) -> None:
        self.answer_seconds = answer_seconds
        self.popen, self._conn = start_interpreter(
            "shmloader.reader.forkserver",
            "serve",
            "sys.exit(serve(int(sys.argv[1]), int(sys.argv[2])))",
            environ,
        )
        self._lock = threading.Lock()  # one reader of the channel at a time (and one writer)
        self._waiting: deque[ForkedReader] = deque()  # asked for, pid not known yet
        self._exits: dict[int, int] = {}
        self._gone = False  # the server exited (or closed the channel)

    @property
    def alive(self) -> bool:
        return not self._gone and self.popen.poll() is None

    def fork(self) -> tuple[ForkedReader, Connection]:
        """Ask for a reader; returns at once with its process (whose pid comes with the
        server's answer) and the trainer's end of its pipe. ``OSError`` if the server is
        gone."""

        def ask(fd: int) -> ForkedReader:
            reader = ForkedReader(self)
            with self._lock:
                self._conn.send(("fork",))
                send_handle(self._conn, fd, self.popen.pid)
                self._waiting.append(reader)
            return reader

        return handed_pipe(ask)

    def kill(self, pid: int) -> None:
        with self._lock, contextlib.suppress(OSError):
            self._conn.send(("kill", pid))

    def exit_code(self, pid: int) -> int | None:
        """How reader ``pid`` exited, as far as the server said; None while it runs."""
        code = self._exits.get(pid)
        if code is None and self._gone:
            return KILLED  # the death signal took it with the server
        return code

    def look(self, timeout: float) -> None:
        """Read what the server said, waiting up to ``timeout`` seconds for a first word."""
        if not self._lock.acquire(timeout=max(timeout, 0.0) + _POLL):
            return  # another thread is reading it
        try:
            while not self._gone and self._conn.poll(timeout):
                timeout = 0.0
                try:
                    said = self._conn.recv()
                except (EOFError, OSError):
                    self._gone_now()
                    return
                if said[0] == "forked":
                    self._waiting.popleft().forked(said[1])
                elif said[0] == "exited":
                    self._exits[said[1]] = said[2]
        except OSError:  # the channel was closed here (close)
            self._gone_now()
        finally:
            self._lock.release()

    def abandon(self) -> None:
        """Kill a server that stopped answering: what was asked of it and not answered is as
        good as killed (its readers die with it: the parent-death signal)."""
        self.popen.kill()
        self.popen.wait()
        with self._lock:
            self._gone_now()

    def _gone_now(self) -> None:
        self._gone = True
        while self._waiting:  # asked for and never forked: as good as killed
            self._waiting.popleft().forked(-1)

    def close(self, timeout: float) -> int:
        """Tell the server to exit (it kills what readers are left), wait, and return its exit
        code (killed after ``timeout``: negative). Said, not left to the channel's end: a
        DataLoader worker forked from the trainer holds a copy of it."""
        with self._lock:
            with contextlib.suppress(OSError):
                self._conn.send(("exit",))
            self._conn.close()
            self._gone_now()
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait()


# -- the server process --------------------------------------------------------------------


def serve(fd: int, parent: int) -> int:
    """The server's loop: fork a reader per request, reap them, report to the trainer; returns
    when the trainer closes the channel (or dies)."""
    # Here, not at the top: the trainer imports this module too, and must not load what a
    # reader needs (grpc, pyarrow) before its own start-up needs it.
    import pyarrow.ipc  # noqa: F401 - what every reader uses, loaded once for all of them

    from .process import die_with_parent

    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer stops us itself

    gc.freeze()  # the modules live as long as the server, and in every reader after a fork
    conn = Connection(fd)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes select via the pipe
    children: set[int] = set()
    try:
        while True:
            ready, _, _ = select.select([conn.fileno(), wake_read], [], [])
            if wake_read in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_read, 4096)
                _reap(children, conn)
            if conn.fileno() not in ready:
                continue
            try:
                said = conn.recv()
            except (EOFError, OSError):
                return 0  # the trainer closed the channel, or died
            if said[0] == "fork":
                reader_fd = recv_handle(conn)
                pid = os.fork()
                if pid == 0:
                    _run_reader(reader_fd, conn, (wake_read, wake_write))
                os.close(reader_fd)
                children.add(pid)
                conn.send(("forked", pid))
            elif said[0] == "exit":
                return 0
            elif said[0] == "kill" and said[1] in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(said[1], signal.SIGKILL)
    except (BrokenPipeError, ConnectionResetError, EOFError):
        return 0  # the trainer is gone (EOFError: from recv_handle, as it died mid-request)
    finally:
        for pid in children:  # readers left when the trainer let go of us: they hold nothing
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _reap(children: set[int], conn: Connection) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        conn.send(("exited", pid, os.waitstatus_to_exitcode(status)))


def _run_reader(fd: int, conn: Connection, wake: tuple[int, int]) -> NoReturn:
    """In the forked child: become a reader on pipe ``fd``, whose parent is the server; never
    returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for own in wake:
            os.close(own)
        conn.close()  # the server's channel is not the reader's
        from .process import main

        code = main([str(fd), str(os.getppid())])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
