"""The reader pool: starts reader processes, relays their messages, restarts the dead.

One pipe per reader (no shared queue lock that a SIGKILLed reader could leave held), and one
thread in the trainer that waits on all pipes and process sentinels at once. A reader that
dies is replaced, and its death reported (death.py) to ``on_reader_death``: the trainer removes
the segment it was writing and reports the task failed to the master, naming the death, so the
task is tried again at once and a quarantine names its cause. Tasks it held and had not
begun come back from the master when their leases expire; nothing is lost and nothing is
delivered twice.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Protocol

from ..errors import ConfigError, ShmloaderError
from .by_value import pickle_config
from .config import ReaderConfig
from .death import ReaderDeath
from .forkserver import ForkServer
from .interpreter import start_interpreter
from .messages import (
    RETIRE,
    STOP,
    Failed,
    Finished,
    MasterLost,
    Message,
    Ready,
    Sealing,
    Started,
    Unusable,
)
from .position import last_record

STOP_SECONDS = 5.0  # how long readers get to stop on their own before they are killed
BLAS_THREADS = "OPENBLAS_NUM_THREADS"  # numpy's wheels bundle OpenBLAS
# How often readers are looked at for a death their pipe did not report (a child of theirs
# holding its end open). A reader's death closes its pipe, which wakes the pool at once; this
# is the fallback, not done after every message (a waitpid per reader per message).
EXIT_CHECK_SECONDS = 0.1


@dataclass
class ReaderInfo:
    """What the pool knows of one reader slot (stats read this)."""

    index: int
    # 0 until known: a forked reader's pid comes with its server's answer (``pids()`` waits
    # for it). Never signal it unchecked: ``os.kill(0, ...)`` signals the whole process group.
    pid: int = 0
    restarts: int = 0
    # Deaths since the slot last read a task: the pool gives up on a crash loop, not on a long
    # job's occasional deaths (counting all of them, it gave up at the 11th of the run).
    deaths_in_a_row: int = 0
    tasks: int = 0
    cached_tasks: int = 0  # of tasks, those served from the cache (cache=True): not read
    records: int = 0
    bytes: int = 0
    failures: int = 0
    busy_seconds: float = 0.0  # reading and writing tasks, not waiting for room
    budget_wait_seconds: float = 0.0  # waiting for room in the shm budget
    # time.monotonic() when the slot's first reader began its first task (its interpreter's
    # start and first lease are not time spent waiting for tasks), and when its last one
    # exited for good (None: still running): busy_seconds is a share of the time in between.
    since: float | None = None
    ended: float | None = None
    current_lease: int | None = None
    task: Started | None = None  # the task of current_lease: named should the reader die on it
    sealing: str | None = None  # segment being written for current_lease, not announced yet
    started_at: float | None = None  # time.monotonic() when it began current_lease
    finished: bool = False
    retiring: bool = False  # asked to retire (ReaderPool.retire): not restarted once it exits
    master_lost: str | None = None  # why it gave up on the master and exited (not restarted)
    # The last reader of this slot could not load its configuration (messages.Unusable): the
    # next one that cannot either is a ConfigError of the loop, not a restart.
    unusable: bool = False
    exit_codes: list[int] = field(default_factory=list)


class Process(Protocol):
    """What the pool asks of a reader's process: a ``subprocess.Popen`` (a fresh interpreter)
    or a ``ForkedReader`` (forked by the readers' fork server, forkserver.py)."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


class ReaderProcess:
    """A started reader process, the trainer's end of its pipe, and what started it."""

    def __init__(
        self, process: Process, conn: Connection, launcher: ReaderLauncher | None = None
    ) -> None:
        self.process = process
        self.conn = conn
        self.launcher = launcher


class ReaderLauncher:
    """Starts one dataset's readers: forks of its fork server (forkserver.py), started on the
    first launch from the calling thread (the server dies with that thread, and its readers
    with it), and again if it died; fresh interpreters where there is no ``fork``."""

    def __init__(self) -> None:
        self._server: ForkServer | None = None
        self._lock = threading.Lock()

    @property
    def server_pid(self) -> int | None:
        """The fork server's pid while it runs."""
        server = self._server
        return server.popen.pid if server is not None and server.alive else None

    def launch(self) -> ReaderProcess:
        """One reader, started now: it waits for its configuration (or "stop") on its pipe."""
        if not hasattr(os, "fork"):
            return launch_reader()
        with self._lock:
            for tries in range(2):
                if self._server is None or not self._server.alive:
                    self._server = ForkServer(reader_environment(os.environ))
                try:
                    process, conn = self._server.fork()
                    return ReaderProcess(process, conn, self)
                except OSError:  # the server died since it was last asked: start another
                    if tries:
                        raise
                    self._server = None
            raise AssertionError("unreachable")

    def close(self, timeout: float = STOP_SECONDS) -> int | None:
        """Stop the fork server (its readers were stopped first); how it exited (0: on its
        own; None: there was none). Idempotent."""
        with self._lock:
            server, self._server = self._server, None
        return None if server is None else server.close(timeout)


def launch_reader() -> ReaderProcess:
    """Start one reader process (``shmloader.reader.process.main``); it imports what it needs,
    then waits for its configuration (or "stop") on the pipe.

    It asks Linux to kill it when its parent goes (the parent-death signal), and Linux means
    the parent *thread*: launch from a thread that lives as long as the readers should.
    """
    popen, conn = start_interpreter(
        "shmloader.reader.process", "main", "sys.exit(main())", reader_environment(os.environ)
    )
    return ReaderProcess(popen, conn)


def reader_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The trainer's environment, with one BLAS thread unless the user chose a number.

    A reader does no linear algebra, but importing numpy starts OpenBLAS's threads, one per
    core but one, and each spins for a while before it sleeps: 0.08 s of CPU per reader on 2
    cores (``python -c "import numpy"``: 0.18 s of CPU against 0.10 s with one thread), more
    with more cores, all of it while the readers race to the first batch. torch's DataLoader
    workers likewise run with one thread (``torch.set_num_threads(1)``).
    """
    return {**environ, BLAS_THREADS: environ.get(BLAS_THREADS) or "1"}


def launch_readers(count: int) -> list[ReaderProcess]:
    """``count`` readers started now, forked by a fork server of their own (all or none: those
    started are stopped on a failure)."""
    launcher = ReaderLauncher()
    launched: list[ReaderProcess] = []
    try:
        for _ in range(count):
            launched.append(launcher.launch())
    except BaseException:
        stop_readers(launched)
        launcher.close()
        raise
    return launched


def stop_readers(
    procs: list[ReaderProcess], timeout: float = STOP_SECONDS, *, close_pipes: bool = True
) -> None:
    """Ask readers to stop, kill those still running after ``timeout``, close their pipes
    (unless a thread still reads them), then stop their fork servers; idempotent."""
    for proc in procs:
        with contextlib.suppress(OSError):
            proc.conn.send(STOP)
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.process.kill()
            proc.process.wait()
    if close_pipes:
        for proc in procs:
            proc.conn.close()
    for launcher in {id(p.launcher): p.launcher for p in procs if p.launcher}.values():
        launcher.close()


class ReaderPool:
    """Runs ``num_readers`` readers; ``on_message(info, message)`` is called on its thread.

    A reader that dies is started again, after ``on_reader_death(info, death)``; ``max_restarts``
    deaths of one slot in a row, with no task read in between, end the pool with an error (a
    crash loop, not bad luck). ``positions``: the folder where readers note the record they
    decode (their store's, ``ReaderConfig.store.path``), for a death to name it.
    """

    def __init__(
        self,
        make_config: Callable[[int], ReaderConfig],
        num_readers: int,
        on_message: Callable[[ReaderInfo, Message], None],
        *,
        on_reader_death: Callable[[ReaderInfo, ReaderDeath], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
        max_restarts: int = 10,
        launched: Sequence[ReaderProcess] = (),
        positions: str | None = None,
    ) -> None:
        if num_readers < 1:
            raise ShmloaderError(f"num_readers must be at least 1, got {num_readers}")
        self._make_config = make_config
        self._on_message = on_message
        self._on_death = on_reader_death
        self._on_error = on_error
        # Read at each death: a caller may change it while the pool runs.
        self.max_restarts = max_restarts
        # Where readers note the record they decode (position.py): their store's folder.
        self._positions = positions
        self.readers = [ReaderInfo(i) for i in range(num_readers)]
        # Readers to add (ReaderPool.add), started by the relay thread: a reader dies with the
        # thread that started it (the parent-death signal).
        self._to_add = 0
        self._to_add_lock = threading.Lock()
        self._procs: dict[int, ReaderProcess] = {}
        self._next_exit_check = 0.0  # when _step next looks for deaths the pipes missed
        self._launched = list(launched)  # started before the pool, adopted by its thread
        # Restarts (and readers added) come from the launcher of those adopted, or one of the
        # pool's own, whose fork server starts from the pool's thread.
        adopted = [p.launcher for p in self._launched if p.launcher is not None]
        self._launcher = adopted[0] if adopted else ReaderLauncher()
        self._stopping = threading.Event()
        self._started = threading.Event()
        self._configure = threading.Event()  # configure() was called: send the configs
        self._configured = threading.Event()  # ... and they were sent (or failed)
        self._start_error: BaseException | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> ReaderPool:
        """Start the readers and configure them (:meth:`launch`, then :meth:`configure`)."""
        return self.launch().configure()

    def launch(self) -> ReaderPool:
        """Start the reader processes from the pool's own thread; return once they are.

        They import what they need (a few tenths of a second) and then wait for their
        configuration, so a caller can start them before its master and register meanwhile.
        Readers ask Linux to kill them when their parent goes (the parent-death signal), and
        Linux means the parent *thread*: started from the caller's thread, they would die with
        it. The relay thread lives as long as the pool, and restarts come from it anyway.
        Readers given as ``launched`` are adopted instead: whoever started them chose a thread
        that lives long enough (the dataset: the main thread, which lives as long as the process).
        """
        self._thread = threading.Thread(target=self._loop, name="shmloader-readers", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._start_error is not None:
            raise self._start_error
        return self

    def configure(self) -> ReaderPool:
        """Send every launched reader its configuration (``make_config`` is called now);
        return once sent. Raises what making it raised (a source that cannot be pickled)."""
        self._configure.set()
        self._configured.wait()
        if self._start_error is not None:
            raise self._start_error
        return self

    def _spawn(self, info: ReaderInfo) -> None:
        self._launch(info)
        self._send_config(info)

    def _launch(self, info: ReaderInfo) -> None:
        proc = self._launched.pop() if self._launched else self._launcher.launch()
        # Known once the reader is up: a forked one's pid comes with its server's answer, and
        # the start-up need not wait for that (the server may still be importing).
        info.pid = 0
        info.current_lease = info.started_at = info.task = None
        self._procs[info.index] = proc

    def _send_config(self, info: ReaderInfo) -> None:
        pickled = pickle_config(self._make_config(info.index))  # a failure is the caller's
        with contextlib.suppress(OSError):  # it died already: the relay loop restarts it
            self._procs[info.index].conn.send(pickled)

    def stop(self, timeout: float = STOP_SECONDS) -> None:
        """Ask readers to stop, then make sure they have; idempotent."""
        self._stopping.set()
        procs = [*self._procs.values(), *self._launched]  # launched: if the thread never ran
        stop_readers(procs, timeout, close_pipes=False)  # the relay thread may still read them
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        for proc in procs:
            proc.conn.close()
        self._procs.clear()
        self._launched.clear()
        self._launcher.close(timeout)  # restarted readers came after those stopped above

    # -- the relay thread ----------------------------------------------------------------
    def _loop(self) -> None:
        try:
            for info in self.readers:
                self._launch(info)
        except BaseException as exc:
            self._start_error = exc
            self._configured.set()
            return
        finally:
            self._started.set()
        try:
            while not self._configure.wait(0.05):
                if self._stopping.is_set():
                    return  # stopped before configured: stop() told the readers
            for info in self.readers:
                self._send_config(info)
        except BaseException as exc:
            self._start_error = exc
            return
        finally:
            self._configured.set()
        try:
            while not self._stopping.is_set():
                self._step()
        except BaseException as exc:
            if not self._stopping.is_set():
                if self._on_error is None:
                    raise
                self._on_error(exc)
        finally:
            # Our readers die with this thread (parent-death signal): let them finish first.
            for proc in list(self._procs.values()):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.process.wait(STOP_SECONDS)

    def add(self) -> None:
        """Start one more reader (soon, from the relay thread)."""
        with self._to_add_lock:
            self._to_add += 1

    def retire(self) -> ReaderInfo | None:
        """Retire the reader started last of those running: it leases nothing more, serves the
        tasks it holds, and exits (not restarted). None if only one runs."""
        running = self.running()
        if len(running) <= 1:
            return None
        info = running[-1]
        info.retiring = True
        proc = self._procs.get(info.index)
        if proc is not None:
            with contextlib.suppress(OSError):  # it died already: not restarted either
                proc.conn.send(RETIRE)
        return info

    def running(self) -> list[ReaderInfo]:
        """The reader slots that run and are not retiring, oldest first."""
        return [r for r in self.readers if r.ended is None and not r.retiring]

    def _add_readers(self) -> None:
        with self._to_add_lock:
            n, self._to_add = self._to_add, 0
        for _ in range(n):
            info = ReaderInfo(len(self.readers))
            self._spawn(info)
            self.readers.append(info)  # once it runs: stats and scaling read the list

    def _step(self) -> None:
        if self._to_add:
            self._add_readers()
        by_conn = {p.conn: i for i, p in self._procs.items()}
        if not self._procs:
            time.sleep(0.05)
            return
        ready = wait(list(by_conn), timeout=EXIT_CHECK_SECONDS)
        for conn in ready:
            assert isinstance(conn, Connection)
            index = by_conn[conn]
            try:
                message = conn.recv()
            except (EOFError, OSError):
                self._reader_gone(index)
                continue
            self._handle(self.readers[index], message)
        now = time.monotonic()
        if ready and now < self._next_exit_check:
            return
        self._next_exit_check = now + EXIT_CHECK_SECONDS
        for index in list(by_conn.values()):  # a death whose pipe said nothing yet
            proc = self._procs.get(index)
            if proc is not None and proc.process.poll() is not None and proc.conn not in ready:
                self._reader_gone(index)

    def _handle(self, info: ReaderInfo, message: Message) -> None:
        if not info.pid:  # it speaks, so it runs: its pid is known
            proc = self._procs.get(info.index)
            if proc is not None:
                info.pid = proc.process.pid
        if isinstance(message, Started):
            if info.since is None:
                info.since = time.monotonic()
            info.current_lease = message.lease_id
            info.task = message
            info.started_at = time.monotonic()
            info.sealing = None  # a task it gave way from named a segment it never wrote
        elif isinstance(message, Sealing):
            info.sealing = message.segment
        elif isinstance(message, Ready):
            info.current_lease = info.started_at = info.task = None
            info.sealing = None
            info.deaths_in_a_row = 0
            info.unusable = False
            info.tasks += 1
            info.cached_tasks += message.from_cache
            info.records += message.num_rows
            info.bytes += message.nbytes
            info.busy_seconds += message.read_seconds - message.budget_wait_seconds
            info.budget_wait_seconds += message.budget_wait_seconds
        elif isinstance(message, Failed):
            info.current_lease = info.started_at = info.task = None
            info.sealing = None
            info.failures += 1
        elif isinstance(message, Finished):
            info.finished = True
        elif isinstance(message, MasterLost):
            info.master_lost = message.error
        elif isinstance(message, Unusable):
            if not info.unusable:  # once may pass (an import on a busy shared file system)
                info.unusable = True  # it exits; _reader_gone starts another
                return
            info.finished = True  # twice in a row: every new reader would fail the same way
            raise ConfigError(f"reader {info.index} (started twice) {message.error}")
        self._on_message(info, message)

    def _reader_gone(self, index: int) -> None:
        proc = self._procs.pop(index, None)
        if proc is None:
            return
        if not self.readers[index].pid:
            self.readers[index].pid = proc.process.pid
        # Drain what it said before dying (a Ready must not be lost).
        with contextlib.suppress(EOFError, OSError):
            while proc.conn.poll():
                self._handle(self.readers[index], proc.conn.recv())
        code = proc.process.wait()
        proc.conn.close()
        info = self.readers[index]
        info.exit_codes.append(code)
        if (
            self._stopping.is_set()
            or info.finished
            or info.retiring
            or info.master_lost is not None
        ):
            info.ended = time.monotonic()
            return
        death = self._death(info, code)
        if self._on_death is not None:
            self._on_death(info, death)
        if info.deaths_in_a_row >= self.max_restarts:
            raise ShmloaderError(
                f"reader {index} died {info.deaths_in_a_row + 1} times in a row without "
                f"reading a task; giving up. The last one (pid {death.pid}) {death.how} "
                f"{death.where}: {death.fix} (the readers' error output above may say more)"
            )
        info.deaths_in_a_row += 1
        info.restarts += 1
        self._spawn(info)

    def _death(self, info: ReaderInfo, code: int) -> ReaderDeath:
        """How ``info``'s reader died, and on what (its pipe was drained: its last Started
        is known)."""
        task = info.task
        record = None
        if task is not None and self._positions is not None:
            record = last_record(self._positions, info.index, task.lease_id)
        return ReaderDeath(info.index, info.pid, code, task, record)

    def pids(self) -> list[int]:
        """The running readers' pids (waiting for a forked one's, if not known yet), which
        their ``ReaderInfo`` then has too."""
        pids = []
        for index, proc in list(self._procs.items()):
            self.readers[index].pid = pid = proc.process.pid
            pids.append(pid)
        return pids

    @property
    def server_pid(self) -> int | None:
        """The readers' fork server's pid while it runs (forkserver.py)."""
        return self._launcher.server_pid

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called: from then on a reader that exits is not started
        again, and the pool's thread winds down."""
        return self._stopping.is_set()

    def reader_process(self, index: int) -> ReaderProcess | None:
        """What runs in reader slot ``index`` now (None between a death and its restart, or
        once stopped): its process and the trainer's end of its pipe. A pid alone may name
        another process once the reader exits; this is the reader itself, and the pipe says
        whether the pool's thread has read all it sent (``conn.poll()``)."""
        return self._procs.get(index)

    def alive(self) -> int:
        return sum(1 for p in self._procs.values() if p.process.poll() is None)

    def __getstate__(self) -> Any:
        raise TypeError("a ReaderPool belongs to the trainer process and cannot be pickled")
