"""The reader process loop: lease, read, decode, write a segment, announce; renew; report.

A reader is a fresh interpreter running :func:`main` (pool.py), rather than one started through
``multiprocessing``'s spawn, which would re-import the training script (and torch) in every
reader: here a reader imports only pyarrow, grpc and the source, and starts in a fraction of a
second. Functions the training script defines reach it by value (by_value.py): the script
never runs in a reader.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

from .. import augment
from ..errors import ConfigError, DataError, LeaseError, MasterError, StoreClosedError

# At the top, not where the client is made: a reader imports it (grpc, slow to import) while
# it waits for its configuration, which the trainer sends only once its master is up.
from ..master.client import MasterClient
from ..shm import hints
from ..shm.names import new_segment_name
from ..shm.store import SegmentInfo
from ..sources._tensor_types import schema_forms
from ..sources.base import ReadResult, Shard
from ..sources.skipped import SkippedRecord
from .by_value import PickledConfig, unpickle_config
from .cache_key import cache_key
from .config import ReaderConfig
from .failure import as_ours, describe_error, pack_exception, retry_may_help
from .heap import keep_freed_memory
from .messages import (
    RETIRE,
    Failed,
    Finished,
    MasterLost,
    Message,
    Ready,
    Sealing,
    Started,
    Unusable,
    lease_clock,
    task_key,
)
from .position import RecordPosition
from .unchanged import check_unchanged

PR_SET_PDEATHSIG = 1
AHEAD_POLL = 0.005  # seconds between looks while the trainer holds enough ready tasks
SWEEP_EVERY = 100  # of those looks


def die_with_parent(parent: int) -> None:
    """Ask Linux to SIGKILL us when our parent dies (the trainer, or the readers' fork server,
    forkserver.py); a fallback check covers other systems."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(0)


class _Renewer:
    """Keeps the leases this reader holds alive, from one thread for the reader's lifetime.

    A read can take longer than a lease (slow storage, a slow decode); the trainer renews a
    task's lease only once the reader has announced it. Not while the trainer is ``silent``
    (stopped, frozen: shm/hints.py): the leases then lapse like those of the trainer's ready
    tasks, so that trainers sharing the epoch get the tasks and do not wait for them as long
    as the stall lasts (a reader blocked on the budget of a stopped trainer would hold and
    renew its leases for ever). A copy written after its lease lapsed is dropped by the
    trainer's sampler (dataset/lease_check.py).
    """

    def __init__(self, client: Any, interval: float, silent: Callable[[], bool]) -> None:
        self._client = client
        self._interval = interval
        self._silent = silent
        self._held: set[int] = set()
        self._confirmed: dict[int, float] = {}  # lease id -> when last known active
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-renewer", daemon=True)
        self._thread.start()

    def hold(self, lease_ids: list[int], asked_at: float) -> None:
        """Renew these leases from now on; the master granted them after ``asked_at``."""
        with self._lock:
            self._held.update(lease_ids)
            self._confirmed.update(dict.fromkeys(lease_ids, asked_at))

    def drop(self, lease_id: int) -> None:
        with self._lock:
            self._held.discard(lease_id)
            self._confirmed.pop(lease_id, None)

    def confirmed(self, lease_id: int) -> float | None:
        """When the lease was last asked for or renewed with success (``lease_clock``)."""
        with self._lock:
            return self._confirmed.get(lease_id)

    def _run(self) -> None:
        said = False
        while not self._stop.wait(self._interval):
            with self._lock:
                held = list(self._held)
            if held and self._silent():
                if not said:  # once per silence
                    print(
                        f"shmloader reader: not renewing leases {sorted(held)}: the trainer "
                        "is silent (stopped?); they lapse unless it goes on",
                        file=sys.stderr,
                    )
                said = True
                continue
            said = False
            for lease_id in held:
                try:
                    asked_at = lease_clock()
                    self._client.renew([lease_id])
                    with self._lock:
                        if lease_id in self._held:
                            self._confirmed[lease_id] = asked_at
                except Exception as exc:  # best effort: an expired lease is simply re-queued
                    print(
                        f"shmloader reader: renewing lease {lease_id} failed: {exc}",
                        file=sys.stderr,
                    )

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


GIVE_WAY_EVERY = 0.5  # seconds between looks at what the sampler waits for, while blocked
# A reader blocked on the budget holds at most this many times lease_ahead leases.
MAX_LEASED_AHEAD = 4


def _key(lease: Any) -> str:
    return task_key(lease.epoch, lease.seq)


class TrainerGone(Exception):
    """The trainer's end of the reader's pipe is closed: the trainer died (a SIGKILL, a crash)
    or let go of it. An expected end, not an error: the reader exits quietly, with code 0. Its
    fork server kills it a moment later anyway; a traceback of each reader's ``EOFError`` or
    ``ConnectionResetError`` in the trainer's terminal would only bury what killed the trainer.
    """


class TrainerPipe:
    """The reader's end of its pipe to the trainer: messages out, the pool's words in (its
    configuration, then "stop" or "retire"). A closed far end raises :class:`TrainerGone`,
    whichever way the pipe met it."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def send(self, message: Message) -> None:
        try:
            self._conn.send(message)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise TrainerGone from exc

    def poll(self) -> bool:
        """Whether the pool said something (or closed its end: :meth:`receive` then raises)."""
        try:
            return self._conn.poll()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise TrainerGone from exc

    def receive(self) -> PickledConfig | str:
        """What the pool says next, waiting for it."""
        try:
            said: PickledConfig | str = self._conn.recv()
        except (EOFError, ConnectionResetError) as exc:
            raise TrainerGone from exc
        return said


class Reader:
    """One reader's loop; ``run`` returns when the master is finished or the pool says stop."""

    def __init__(self, config: ReaderConfig, conn: TrainerPipe, parent: int) -> None:
        self.config = config
        self.conn = conn
        self.parent = parent
        # The record being decoded, on a task that failed before, for the pool to name should
        # this reader die on it (position.py).
        self._position = RecordPosition(config.store.path, config.index)
        self.client = MasterClient(
            config.master_address,
            token=config.credentials.token,
            root_certificates=config.credentials.tls_ca,
        )
        # Not once the trainer has left (closing, SIGTERM): see hints.joined.
        store_path = config.store.path
        self.client.speak_for(
            config.consumer, config.rank, may_register=lambda: hints.joined(store_path)
        )
        self._renewer = _Renewer(self.client, config.lease_timeout / 3, self._trainer_silent)
        self._stop = False
        # The pool retires this reader (num_readers="auto" has too many): it leases nothing
        # more, serves what it holds, and exits as if the master were finished.
        self._retiring = False
        self._queue: list[Any] = []  # leases held and not served yet
        self._next_look = 0.0

    def should_stop(self) -> bool:
        if self._stop:
            return True
        if os.getppid() != self.parent:
            self._stop = True
        elif self.conn.poll():
            said = self.conn.receive()  # a pool sends "stop" or "retire"
            if said == RETIRE:
                self._retiring = True
            else:
                self._stop = True
        return self._stop

    def _trainer_silent(self) -> bool:
        """The trainer said nothing for over half a lease_timeout (shm/hints.py "alive")."""
        return hints.silent_for(self.config.store.path) > self.config.lease_timeout / 2

    def run(self) -> None:
        delay = self.config.idle_poll
        paused = 0  # polls spent waiting while the trainer holds enough ready tasks
        try:
            while not self.should_stop():
                if not self._queue and self._retiring:
                    self.conn.send(Finished())
                    return
                if not self._queue:
                    store = self.config.store
                    # Enough ready (no hoarding), or the trainer is silent (see _Renewer).
                    if (store.is_ahead() and not store.wanted()) or self._trainer_silent():
                        if paused % SWEEP_EVERY == 0:  # as when idle, see below
                            store.sweep_written()
                        paused += 1
                        time.sleep(AHEAD_POLL)
                        continue
                    paused = 0
                    # A few at a time: fewer round trips, and the next task is at hand.
                    asked_at = lease_clock()
                    reply = self.client.lease(self.config.consumer, self.config.lease_ahead)
                    if not reply.leases:
                        if reply.finished:
                            self.conn.send(Finished())
                            return
                        # Idle: let go of mappings of files gone from the store meanwhile.
                        self.config.store.sweep_written()
                        time.sleep(delay)
                        delay = min(delay * 2, 0.5)
                        continue
                    delay = self.config.idle_poll
                    self._take(reply.leases, asked_at)
                # In the order the sampler consumes tasks: the task it waits for is never
                # stuck behind one it does not need yet.
                self._queue.sort(key=lambda lease: (lease.epoch, lease.seq))
                at = self._first_to_serve()
                if at is None:  # every task held is of an epoch the trainer has not begun
                    self._look_for_wanted()
                    if paused % SWEEP_EVERY == 0:
                        self.config.store.sweep_written()
                    paused += 1
                    time.sleep(AHEAD_POLL)
                    continue
                paused = 0
                lease = self._queue.pop(at)
                done = False
                try:
                    with self._watching(lease):
                        done = self._serve(lease)
                finally:
                    if done or self.should_stop():
                        self._renewer.drop(lease.lease_id)
                    else:  # gave way to a task the sampler waits for: serve it again later
                        self._queue.append(lease)
        except StoreClosedError:
            return  # the trainer is closing the dataset
        except LeaseError:
            raise
        except MasterError as exc:  # the trainer says so once; a traceback per reader would not
            self.conn.send(MasterLost(str(exc)))
        finally:
            self._renewer.close()
            self.client.close()

    def _take(self, leases: Any, asked_at: float) -> None:
        self._renewer.hold([lease.lease_id for lease in leases], asked_at)
        self._queue.extend(leases)

    def _first_to_serve(self) -> int | None:
        """Where in the (sorted) queue the next task to serve is: the first of an epoch no
        later than the store's ``last_epoch`` hint, or one the sampler waits for; None while
        there is none. The trainer moves the hint on as its sampler begins an epoch
        (``Runtime._hold_readers_back``); until then the tasks of later epochs stay leased,
        renewed and unread: a job that stops after this epoch decodes none of them. A
        retiring reader serves what it holds and exits."""
        store = self.config.store
        last = None if self._retiring else store.last_epoch()
        if last is None or self._queue[0].epoch <= last:
            return 0
        wanted = store.wanted()
        return next((i for i, lease in enumerate(self._queue) if _key(lease) in wanted), None)

    def _look_for_wanted(self) -> None:
        """While every task held waits for the trainer's next epoch: if the sampler waits for
        a task nobody holds (e.g. one whose reader died, leased again), lease one more to find
        it, as :meth:`_give_way` does; twice a second at most."""
        now = time.monotonic()
        if now < self._next_look or self._trainer_silent():
            return
        self._next_look = now + GIVE_WAY_EVERY
        if (
            self.config.store.wanted()
            and len(self._queue) < MAX_LEASED_AHEAD * self.config.lease_ahead
        ):
            asked_at = lease_clock()
            self._take(self.client.lease(self.config.consumer, 1).leases, asked_at)

    def _give_way(self, lease: Any) -> bool:
        """While waiting for budget for ``lease``: should it step aside for a task the sampler
        waits for? Such a task (e.g. one whose reader died, leased again) would otherwise wait
        behind this one, whose segment cannot fit while the sampler waits: neither would move.
        Looks twice a second; may lease one more task to find it.
        """
        now = time.monotonic()
        if now < self._next_look:
            return False
        self._next_look = now + GIVE_WAY_EVERY
        wanted = self.config.store.wanted()
        if not wanted or _key(lease) in wanted or self._trainer_silent():
            return False
        if any(_key(other) in wanted for other in self._queue):
            return True
        if len(self._queue) >= MAX_LEASED_AHEAD * self.config.lease_ahead:
            return False
        # Leases are handed out retries first: a task whose reader died comes to us now.
        asked_at = lease_clock()
        reply = self.client.lease(self.config.consumer, 1)
        self._take(reply.leases, asked_at)
        return any(_key(other) in wanted for other in reply.leases)

    def _watching(self, lease: Any) -> contextlib.AbstractContextManager[None]:
        """A task that failed before (it may have killed its reader) is served noting each
        record it decodes (position.py): from reading to writing, since a source may decode
        as the store writes (sources/streamed.py)."""
        if lease.attempt > 1:
            return self._position.watching(lease.lease_id)
        return contextlib.nullcontext()

    def _serve(self, lease: Any) -> bool:
        """Read, write and announce ``lease``'s task; False if it gave way (see _give_way)."""
        self.conn.send(
            Started(lease.lease_id, lease.epoch, lease.task_id, lease.path, lease.start, lease.stop)
        )
        began = time.monotonic()
        gave_way = False

        def stop_waiting() -> bool:
            nonlocal gave_way
            gave_way = gave_way or self._give_way(lease)
            return gave_way or self.should_stop()

        try:
            if lease.path not in self.config.allowed_paths:
                raise ConfigError(f"{lease.path}: not a file of the planned dataset; not opened")
            check_unchanged(lease.path, self.config.files.get(lease.path))
            if (lease.epoch, lease.seq) in self.config.skip_tasks:
                self._announce(lease, began, SegmentInfo("", 0, 0), ())
                return True
            key = self._cache_key(lease)
            if key and self._serve_cached(lease, key, began):
                return True
            shard = Shard(lease.path, lease.stop)
            augment.begin_task(self.config.seed, lease.epoch, lease.task_id)
            result = self.config.source.read_result(shard, lease.start, lease.stop)
            if not isinstance(result, ReadResult):  # else an AttributeError about "content"
                raise ConfigError(
                    f"{type(self.config.source).__name__}.read_result returned "
                    f"{type(result).__name__}, not a shmloader.sources.ReadResult: return "
                    "ReadResult(batch, skipped)"
                )
            name = new_segment_name()
            self.conn.send(Sealing(lease.lease_id, name))
            store = self.config.store
            info = store.write(
                result.content,  # fixed-width columns are written without building the batch
                name=name,
                should_stop=stop_waiting,
                # The sampler may be waiting for this very task: then it may use the room
                # other tasks' segments leave free (shm budget.reserve).
                urgent=lambda: _key(lease) in store.wanted(),
            )
            if info is not None:
                _check_count(lease, info.num_rows, result.skipped, lambda: store.release(info.name))
        except (StoreClosedError, TrainerGone):
            raise
        except Exception as raised_here:
            exc = as_ours(raised_here, lease.path, lease.start, lease.stop)
            error, retry = describe_error(exc), retry_may_help(exc)
            raised = pack_exception(exc)
            failed = Failed(
                lease.lease_id, lease.epoch, lease.task_id, lease.path, error, raised, retry
            )
            if retry:
                # The master first: sent the failure, the trainer asks it at once whether
                # that was the last try (the task is quarantined: the loop raises).
                self.client.fail(lease.lease_id, error, permanent=False)
                self.conn.send(failed)
            else:
                # The trainer first: it raises the exception itself, not the quarantine it
                # would otherwise learn of from the master.
                self.conn.send(failed)
                self.client.fail(lease.lease_id, error, permanent=True)
            return True
        if info is None:  # stopped, or gave way, while waiting for budget; nothing written
            return not gave_way
        forms = schema_forms(result.content.schema)
        # Kept for the next epoch (cache=True) only if the segment is all the task will ever
        # be: every record (a skip is reported again each epoch), no random numbers drawn.
        not_cached = ""
        if key and augment.drew():
            key, not_cached = "", "its decode draws from shmloader.task_rng()"
        elif result.skipped:
            key = ""
        if key:
            self.config.store.cache(info.name, key)
        self._announce(lease, began, info, result.skipped, forms, key, not_cached=not_cached)
        return True

    def _cache_key(self, lease: Any) -> str:
        """The key the task's segment is cached under (cache_key.py); "" without cache=."""
        if not self.config.cache:
            return ""
        return cache_key(lease.path, lease.start, lease.stop, self.config.files.get(lease.path))

    def _serve_cached(self, lease: Any, key: str, began: float) -> bool:
        """Announce the segment cached for ``lease``'s task, read and decoded in an earlier
        epoch, without reading anything; False if the cache does not hold it."""
        name = new_segment_name()
        # As for a write: should this reader die before its Ready, the trainer removes it.
        self.conn.send(Sealing(lease.lease_id, name))
        store = self.config.store
        found = store.take_cached(key, name, urgent=lambda: _key(lease) in store.wanted())
        if found is None:
            return False
        info, schema = found
        self._announce(lease, began, info, (), schema_forms(schema), key, from_cache=True)
        return True

    def _announce(
        self,
        lease: Any,
        began: float,
        segment: SegmentInfo,
        skipped: tuple[SkippedRecord, ...],
        forms: tuple[tuple[str, bool, str], ...] = (),
        key: str = "",
        *,
        from_cache: bool = False,
        not_cached: str = "",
    ) -> None:
        self.conn.send(
            Ready(
                lease_id=lease.lease_id,
                epoch=lease.epoch,
                seq=lease.seq,
                task_id=lease.task_id,
                path=lease.path,
                start=lease.start,
                stop=lease.stop,
                segment=segment.name,
                num_rows=segment.num_rows,
                nbytes=segment.nbytes,
                read_seconds=time.monotonic() - began,
                budget_wait_seconds=segment.budget_wait_seconds,
                skipped=skipped,
                consumed=tuple(lease.consumed),
                confirmed=self._renewer.confirmed(lease.lease_id),
                forms=forms,
                cache_key=key,
                from_cache=from_cache,
                not_cached=not_cached,
            )
        )


def _check_count(
    lease: Any, rows: int, skipped: tuple[SkippedRecord, ...], release: Callable[[], None]
) -> None:
    """A DataError (after releasing the segment) unless the source accounted for every record
    of the task: rows written plus records skipped. A source that returns fewer rows without
    a SkippedRecord (a Parquet or Arrow file rewritten shorter after planning, or a source of
    the user's own) would otherwise lose records from the epoch without a word."""
    asked = lease.stop - lease.start
    if rows + len(skipped) == asked:
        return
    release()
    raise DataError(
        f"records [{lease.start}, {lease.stop}): the source gave {rows} rows and skipped "
        f"{len(skipped)}, where the plan has {asked} records; the file changed after the "
        "dataset planned it, or the source's read() does not return the range it was asked",
        path=lease.path,
    )


@contextlib.contextmanager
def _connection(fd: int) -> Iterator[Connection]:
    conn = Connection(fd)
    try:
        yield conn
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point of a reader: ``FD PARENT_PID`` (pool.py starts it; ``python -m
    shmloader.reader FD PARENT_PID`` runs it too)."""
    args = sys.argv[1:] if argv is None else argv
    fd, parent = int(args[0]), int(args[1])
    die_with_parent(parent)
    keep_freed_memory()
    # The trainer's Ctrl-C reaches the whole process group; the trainer stops us itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with _connection(fd) as conn:
        try:
            return _serve_trainer(TrainerPipe(conn), parent)
        except TrainerGone:  # the trainer closed the pipe, or died: nobody to read for
            return 0


def _serve_trainer(pipe: TrainerPipe, parent: int) -> int:
    """Wait for the configuration, then read for the trainer until told to stop."""
    first = pipe.receive()
    # "stop" before it was configured: the dataset was closed before its first use, or the
    # trainer failed to start.
    if not isinstance(first, PickledConfig):
        return 0
    try:
        config = unpickle_config(first)
    except ConfigError as exc:
        pipe.send(Unusable(str(exc)))  # the trainer raises it; a traceback here adds nothing
        return 1
    # Everything imported so far lives as long as the reader: keep the garbage collector's
    # full passes off it. A task makes thousands of short-lived objects (one payload view per
    # record), and each full pass walked every module object too: 4% of a reader's samples in
    # a py-spy profile of the data-plane benchmark's images.
    gc.freeze()
    Reader(config, pipe, parent).run()
    return 0
