"""The trainer-side machinery of a dataset: store, master, client, reader pool, data plane.

Started lazily (on first iteration, or ``SharedTaskDataset.start()``) so that constructing a
dataset is cheap and ``load_state_dict`` can still choose where the master starts. Here: the
start-up (where the master is, where this trainer begins), the readers' messages, and the close
(also at SIGTERM). One maintenance thread (maintenance.py) applies the gather ledger (releasing
segments, completing tasks) and keeps the leases of announced tasks alive; runtimes left open
are closed at the interpreter's exit (at_exit.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import uuid
import weakref
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ...errors import MasterError
from ...master import forked
from ...reader.config import ReaderConfig
from ...reader.death import ReaderDeath
from ...reader.messages import Failed, MasterLost, Message, Ready, Started
from ...reader.pool import STOP_SECONDS, ReaderInfo, ReaderPool, ReaderProcess
from ...reader.unchanged import identities
from ...shm import hints, lifecycle
from ...shm.budget import reap_dead_writers
from ...shm.store import SegmentStore
from ...sources.base import SkippedRecord
from ..accounting.plane import DataPlane
from ..accounting.sampler_feed import SamplerFeed
from ..gather.ledger import LedgerReader, ledger_dir
from ..resume.checkpoint import LoopState, ResumePoint
from . import at_exit
from .cache_use import CacheUse
from .collect import StatsCollector
from .column_forms import FormCheck
from .maintenance import Maintenance, first_unfinished
from .master_ops import MasterOps
from .master_place import MasterPlace, find_master
from .plan_check import check_same_plan
from .rejoin import check_whole_share
from .task_errors import TaskErrors

if TYPE_CHECKING:
    from ...master.client import ConsumerInfo, MasterClient
    from ...master.figures import TrainerFigures
    from .autoscale import Autoscaler
    from .options import DatasetOptions

log = logging.getLogger(__name__)
SKIPPED_KEPT = 10_000  # reports of skipped records kept for a look (Runtime.skipped)
SIGTERM_LEAVE_SECONDS = 3.0  # how long SIGTERM waits for the master to hear we leave
# Of those, how long the whole leave (completions, hand-back) may wait for the plane's locks
# before the consumer just leaves: the interrupted main thread may hold them till it dies.
SIGTERM_LOCKED_SECONDS = 2.0
TORCHRUN_TOKEN_FIX = (
    "Rank 0's embedded master serves no TLS: on a private network leave token= out (it warns), "
    "or run a standalone master with TLS and a token (docs/how-to/security.md) and give every "
    "rank master='host:port', tls_ca=, rank= and world_size="
)
LOST_STOP_SECONDS = 1.0  # readers' time to stop once the master is lost: they hold nothing


def _nothing() -> None:
    """What a SIGTERM hook of a runtime already collected does."""


def next_epoch_tasks(window: int, readers: int) -> int:
    """Tasks of the next epoch that readers read before the sampler begins it: a window (its
    blocks of 1, 2, 4, ... tasks up to the window, order/blocks.py, and the first of the
    next), and at least one for each reader.

    Fewer would not delay the epoch's first batch, but its next blocks: they double in size
    while the readers, which kept about two windows ahead during the epoch, start from what
    they read of it. Measured with readers 1.5 times as fast as the loop (20 tasks an epoch):
    the first two blocks (3 tasks) made each epoch after the first 7% slower than reading
    without this bound; a window, as fast (within 2%)."""
    return max(window, readers)


class Runtime:
    """A started dataset's running parts, built in named steps: the readers launched, then
    :meth:`_connect` (the master found or started, this trainer registered),
    :meth:`_resume_at` (where it begins, as a running master sees the loaded state),
    :meth:`_start_plane` (the data plane, and the readers configured to feed it) and
    :meth:`_start_maintenance`. A failed step closes what the earlier ones started."""

    def __init__(
        self,
        options: DatasetOptions,
        resume: ResumePoint,
        store: SegmentStore,
        launched: Sequence[ReaderProcess] = (),
    ) -> None:
        forked.check("this dataset")  # before any reader starts: gRPC would hang here
        self.options = options
        # Where a loaded state leaves the job (checkpoint.py); FRESH_START: nothing loaded.
        self.resume = resume
        # What readers reported skipping, latest last, for a look at where (Stats counts the
        # skips of consumed tasks: see DataPlane.skipped_records).
        self.skipped: deque[SkippedRecord] = deque(maxlen=SKIPPED_KEPT)
        self.failures: list[Failed] = []
        self.task_errors = TaskErrors()
        self._largest_segment = 0
        self._said_not_cached = False  # cache=True and a decode that draws random numbers
        self.cache_use = CacheUse()  # cache=True: what the cache kept and missed
        self._forms = FormCheck(options.columns, ragged_given=options.ragged_given)
        self._closed = False
        self._left = False  # the consumer's Leave was sent (by close() or the SIGTERM hook)
        self._maintenance: Maintenance | None = None
        # Made now, as the job starts: its CPU figures count from here (probe.py).
        self._stats_collector = StatsCollector(store.handle().path)
        self._ahead = False  # the store's ``ahead`` hint as last set
        self._last_epoch: int | None = None  # the store's ``last_epoch`` hint as last set
        # The epoch the sampler had begun when the first tasks of the one after it were read.
        self._next_epoch_read: int | None = None
        self._ahead_lock = threading.Lock()
        self.store = store  # owned (and closed) by the dataset
        self.handle = store.handle()
        self._pid = os.getpid()
        at_exit.close_at_exit(self)
        self.master_place: MasterPlace | None = None  # where its master runs
        self.client: MasterClient | None = None
        self.pool: ReaderPool | None = None
        try:
            # Readers start first (or were started with the dataset: ``launched``): their
            # imports (a few tenths of a second) overlap the master's start and the
            # registration; they get their configuration once the plane runs.
            self.pool = ReaderPool(
                self._reader_config,
                options.first_readers,
                self._on_message,
                on_reader_death=self._on_reader_death,
                on_error=self._readers_failed,
                launched=launched,
                positions=store.path,
            ).launch()
            info = self._connect()
            ops = MasterOps(self.master_client, self.consumer, info.epochs)  # caches sizes
            start = self._resume_at(info, ops)
            self._start_plane(ops, start)
            self._start_maintenance()
        except BaseException:
            self.close(wait_for_ranks=False)
            raise

    def _connect(self) -> ConsumerInfo:
        """Find or start the master, register this trainer with it and start the heartbeat;
        another process's master is checked to run this job's plan. Returns what the master
        says of the job."""
        from ...master.client import MasterClient

        options = self.options
        self.master_place = place = find_master(options, self.resume.job(options.job))
        self.address = address = place.address
        self.consumer = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        local = place.local  # a master started here: the trainer's calls skip gRPC
        if options.rendezvous is not None and local is None:  # rank 0's, on another machine?
            options.credentials.check_transport(address, fix=TORCHRUN_TOKEN_FIX)
        self.client = MasterClient(
            address,
            token=options.credentials.token,
            root_certificates=options.credentials.tls_ca,
            local=local,
        )
        info = self.client.register(self.consumer, options.rank)
        if place.outlives_trainer:  # another process planned the tasks: the same plan?
            chosen = options.job.records_per_task if options.records_per_task_given else None
            check_same_plan(options.source.plan(), chosen, info, address)
        self.lease_timeout = float(info.lease_timeout)
        self._elastic = info.world_size is None  # trainers share the master's epochs
        if options.cache and options.job.shuffle and (info.world_size or 1) > 1:
            log.warning(
                "cache=True with %d DDP ranks: each epoch shares the tasks out to the "
                "ranks anew (as torch's DistributedSampler does), so a rank finds about "
                "1/%d of its next epoch's tasks in its own cache and reads the rest; "
                "shuffle=False hands every rank the same tasks each epoch "
                "(docs/dataset.md, 'Decoded data kept across epochs')",
                info.world_size,
                info.world_size,
            )
        # Each beat carries this trainer's figures, for the master's /metrics.
        self.client.start_heartbeat(self.consumer, figures=self._figures)
        return info

    def _resume_at(self, info: ConsumerInfo, ops: MasterOps) -> int:
        """Where this trainer begins: the loaded state's point, as a running master that
        another process started sees it (it may have been resumed from that state, be past
        it, or hold the leases a handover names). Returns the epoch to start at. Before the
        readers lease anything."""
        if not self._master_elsewhere:  # started here, from the loaded state: as it is
            return self.resume.epoch
        if self.resume.by_position:
            self.resume = self._unless_resumed(info, ops)
        resume = self.resume
        if resume.handover is not None:
            resume.handover.take_over(self.master_client)
        start = max(resume.epoch, self._first_unfinished_epoch())
        # A DDP rank must come back on a whole share (rejoin.py).
        check_whole_share(
            self.master_client,
            self.consumer,
            info,
            start,
            rank=self.options.rank,
            under_torchrun=self.options.rendezvous is not None,
            loaded=resume.loaded,
        )
        return start

    def _start_plane(self, ops: MasterOps, start: int) -> None:
        """The data plane from ``start``, and the readers configured to feed it."""
        resume, handle = self.resume, self.handle
        taken_over = None
        if resume.handover is not None and self._elastic and self._master_elsewhere:
            taken_over = resume.handover.consumed_of()
        self.plane = DataPlane(
            master=ops,
            segments=handle,
            ledger=LedgerReader(ledger_dir(handle.path)),
            starved=self._starved,
            blocked=lambda: hints.writer_blocked(handle.path),
            start_epoch=start,
            resume=resume,
            taken_over=taken_over,
            consumer=self.consumer,
            lease_timeout=self.lease_timeout if self._elastic else None,
        )
        self.feed = SamplerFeed(self.plane, ops)  # what the sampler asks of the plane
        # The source's own plan, not the master's word: readers open only these files.
        self._allowed = frozenset(shard.path for shard in self.options.source.plan())
        self._files = identities(self._allowed)  # readers refuse a file changed since
        self._hold_readers_back()  # the hints in place before a reader leases
        assert self.pool is not None
        self.pool.configure()

    def _start_maintenance(self) -> None:
        """The maintenance thread; and, with a master that outlives this trainer, the SIGTERM
        hook that tells it this trainer leaves."""
        assert self.pool is not None
        self._maintenance = Maintenance(
            autoscaler=self._autoscaler(),
            plane=self.plane,
            client=self.master_client,
            pool=self.pool,
            store_path=self.store.path,
            lease_timeout=self.lease_timeout,
            hold_readers_back=self._hold_readers_back,
            task_errors=self.task_errors,
            elastic=self._elastic,
        )
        self._maintenance.start()
        if self._master_elsewhere:
            ref = weakref.WeakMethod(self.on_sigterm)
            self._sigterm = lifecycle.on_sigterm(lambda: (ref() or _nothing)())

    def on_sigterm(self) -> None:
        """SIGTERM (a preempted trainer) that will kill the process: leave the master as
        close() would, so that what the loop consumed is not delivered again, from a thread
        joined for at most ``SIGTERM_LEAVE_SECONDS`` (a second SIGTERM ends the wait): the
        interrupted main thread may hold the plane's locks. Then, after
        ``SIGTERM_LOCKED_SECONDS``, the consumer just leaves, without its completions and
        hand-back: its leases go back at once, not after ``consumer_timeout`` (in a tight
        training loop the main thread often holds those locks when SIGTERM comes, and the
        readers would keep leasing meanwhile). What the loop consumed of those tasks may then
        come again, as it would after the timeout. Not called where the application handles
        SIGTERM itself (shm/lifecycle.py): its exit path calls close().

        Also during close() until it leaves: it stops the readers first (up to 5 s), and a
        SIGTERM then (at the end of a run, or torchrun's once another rank ended) would kill
        the process with the consumer and its leases still at the master."""
        # A forked DataLoader worker inherits the hook (torch may SIGTERM its workers): the
        # trainer's plane and client are not its own to use.
        if self._left or self.client is None or os.getpid() != self._pid:
            return
        self.client.stop_retrying()  # the process is going down: one try per call
        leaving = threading.Thread(target=self._leave_master, name="shmloader-sigterm")
        leaving.daemon = True
        leaving.start()
        leaving.join(SIGTERM_LOCKED_SECONDS)
        if leaving.is_alive() and self._master_elsewhere:  # stuck on a lock the main thread holds
            just = threading.Thread(target=self._just_leave, name="shmloader-sigterm-leave")
            just.daemon = True
            just.start()
            just.join(SIGTERM_LEAVE_SECONDS - SIGTERM_LOCKED_SECONDS)

    def _just_leave(self, handed: dict[int, list[tuple[int, int]]] | None = None) -> None:
        """Leave (handing back ``handed``); first tell the readers, which may still run (they
        die with us), not to register this consumer again (shm/hints.py "left")."""
        self._left = True
        with contextlib.suppress(FileNotFoundError):  # the store is gone: so are they
            hints.set_left(self.handle.path)
        with contextlib.suppress(MasterError):
            self.master_client.leave(self.consumer, handed)

    def _leave_master(self) -> None:
        """Complete what the loop consumed since the last tick, then (standalone master)
        leave: elastic mode hands back the records consumed of partly consumed tasks, which
        the next trainer to lease them skips (master/handback.py)."""
        plane = getattr(self, "plane", None)
        if plane is not None:
            try:
                plane.read_ledger_and_send()
            except MasterError:
                self.master_client.stop_retrying()  # gone: leave and the rest get one try each
        if self._master_elsewhere:  # a master started here stops next: nobody to tell
            elastic = getattr(self, "_elastic", False)
            self._just_leave(plane.hand_back() if plane is not None and elastic else None)

    def _unless_resumed(self, info: ConsumerInfo, ops: MasterOps) -> ResumePoint:
        """A loaded state's positions, unless the standalone master was started from that
        state (``--resume``): its schedule then already leaves the consumed records out, and
        the positions, in the old schedule, would name other tasks (their rows were lost).
        Told by the epoch's size; under DDP a rank's share is its own, and is left as is."""
        if info.world_size is not None:
            return self.resume
        whole = sum(shard.num_records for shard in self.options.source.plan())
        if ops.epoch_records(self.resume.epoch) >= whole:
            return self.resume
        return self.resume.without_positions()

    @property
    def master_client(self) -> MasterClient:
        """The client of the job's master (set once the runtime started)."""
        if self.client is None:
            raise MasterError("this dataset's runtime has no master client (it did not start)")
        return self.client

    def _autoscaler(self) -> Autoscaler | None:
        """What adds and retires readers under ``num_readers="auto"`` (None otherwise)."""
        bounds = self.options.reader_bounds
        if bounds is None or self.pool is None:
            return None
        from .autoscale import Autoscaler
        from .reader_scaling import ReaderScaling

        return Autoscaler(self.pool, self.plane, ReaderScaling(*bounds))

    def _figures(self) -> TrainerFigures | None:
        """What the heartbeat carries: ``stats()``'s figures (None until the data plane runs)."""
        if self._maintenance is None or self._closed:
            return None
        return self.stats_collector().collect(self, for_heartbeat=True).figures()

    def stats_collector(self) -> StatsCollector:
        """What makes this dataset's ``stats()``: it keeps the last figures of each process,
        so a call every step measures each at most once a second."""
        return self._stats_collector

    def loop_state(self, also: np.ndarray | None = None, *, closing: bool = False) -> LoopState:
        """Where the loop stands (``DataPlane.loop_state``), with the leases an elastic
        trainer's checkpoint hands over to the trainer resumed from it (handover.py); none
        when ``closing`` (the leases then go back to the master with what was consumed of
        them), and none unless it shares a standalone master's epochs.

        Such a trainer's position is always the master's: its journal knows which tasks
        completed, whoever delivered them. A trainer learns that others share its epoch only
        at the pass's end (the master names the tasks that went elsewhere), so a position of
        its own, saved before then, misses what the others delivered: a restart from it
        ended its passes with those tasks never delivered."""
        shares_master = self._master_elsewhere and self._elastic
        hands_over = shares_master and not closing
        return self.plane.loop_state(
            also,
            master_holds_position=shares_master,
            handing_over_as=self.consumer if hands_over else None,
        )

    def saved_state_of(self, loop: LoopState) -> None:
        """A state is being saved from ``loop``: tell the master what its handover counts of
        each lease (``MasterClient.checkpoint``), so that if this trainer dies, its leases
        lapse and nobody resumes from the state in time, the tasks go back less those rows.
        A master that cannot be told (unreachable) is warned of, once a state: the save goes
        on, only a late restart may then see rows of it come again elsewhere."""
        if loop.handover is None or not loop.handover.leases:
            return
        try:
            self.master_client.checkpoint(loop.handover.consumer, loop.handover.by_lease())
        except MasterError as exc:
            log.warning(
                "the master could not be sent what this saved state counts (%s): should this "
                "trainer die and be resumed from the state after consumer_timeout, rows of "
                "its %d partly consumed tasks may come again from another trainer",
                exc,
                len(loop.handover.leases),
            )

    def live_ranks(self) -> set[int]:
        """The ranks the master counts among its consumers (DDP mode: a rank's trainer and
        readers register with its rank); one that stopped drops out after
        ``consumer_timeout``."""
        return {c.rank for c in self.master_client.progress().consumers if c.rank is not None}

    def _first_unfinished_epoch(self) -> int:
        """The oldest epoch the master has not finished (the next to start if none is open):
        a trainer that joins or restarts later begins there, not with passes over epochs
        every task of which is done."""
        return first_unfinished(self.master_client.progress())

    def _reader_config(self, index: int) -> ReaderConfig:
        """What reader ``index`` needs (asked for once the master is up, and at restarts)."""
        options = self.options
        return ReaderConfig(
            index=index,
            master_address=self.master_place.readers_address if self.master_place else self.address,
            consumer=self.consumer,
            source=options.source,
            store=self.handle,
            allowed_paths=self._allowed,
            lease_timeout=self.lease_timeout,
            credentials=options.credentials,
            rank=options.rank,
            skip_tasks=self.resume.skip_tasks(),
            seed=options.job.seed,
            files=self._files,
            cache=options.cache,
        )

    def _readers_failed(self, exc: BaseException) -> None:
        self.plane.ready.fail(exc)

    @property
    def _master_elsewhere(self) -> bool:
        """Whether the job's master is another process's (or not found yet): it outlives this
        trainer, which must tell it when it leaves."""
        return self.master_place is None or self.master_place.outlives_trainer

    @property
    def metrics_url(self) -> str | None:
        """Where a master started here serves the job's metrics (None: not served here)."""
        return None if self.master_place is None else self.master_place.metrics_url

    # -- reader messages (pool thread) ---------------------------------------------------
    def _on_message(self, info: ReaderInfo, message: Message) -> None:
        if isinstance(message, Ready):
            mismatch = self._forms.check(message)
            if mismatch is not None:  # raised in the loop; none of the task's rows goes out
                self.plane.ready.fail(mismatch)
                return
            if message.nbytes > self._largest_segment:
                self._largest_segment = message.nbytes
                with contextlib.suppress(FileNotFoundError):  # the store is closing
                    hints.set_largest(self.store.path, message.nbytes)
            self.skipped.extend(message.skipped)
            self.plane.announce(
                epoch=message.epoch,
                seq=message.seq,
                task_id=message.task_id,
                lease_id=message.lease_id,
                segment=message.segment,
                num_rows=message.num_rows,
                start=message.start,
                stop=message.stop,
                skipped=tuple(s.index for s in message.skipped),
                consumed=message.consumed,
                path=message.path,
                confirmed=message.confirmed,
                nbytes=message.nbytes,
                cache_key=message.cache_key,
            )
            self.cache_use.announced(message.cache_key, message.nbytes, message.from_cache)
            if message.not_cached and not self._said_not_cached:
                self._said_not_cached = True
                log.warning(
                    "cache=True keeps no decoded task of %s: %s, so its records differ each "
                    "epoch and are decoded again; random augmentation belongs in the "
                    "trainer's transform= with cache=True (docs/how-to/augmentation.md)",
                    message.path,
                    message.not_cached,
                )
            self._hold_readers_back()
        elif isinstance(message, Failed):
            self.failures.append(message)
            self.task_errors.reader_failed(message, info.index, self.plane.ready)
            if not message.retry:
                return  # raised in the loop now; a warning would only say it twice
            log.warning(
                "reader %d failed task %d (epoch %d, %s): %s; the master tries it again, up "
                "to max_retries times in an epoch (then the loop raises)",
                info.index,
                message.task_id,
                message.epoch,
                message.path,
                message.error,
            )
            self._raise_if_quarantined()
        elif isinstance(message, MasterLost):
            self.plane.ready.fail(MasterError(f"reader {info.index}: {message.error}"))
        elif isinstance(message, Started) and message.epoch > self.plane.ready.latest_epoch:
            self._hold_readers_back()  # a task of the next epoch counts from its start

    def _raise_if_quarantined(self) -> None:
        """After a retried failure, which may have been the task's last try: the loop raises
        now if the master quarantined the task, not at the maintenance thread's next look."""
        if self._maintenance is not None:
            self._maintenance.poll_master_now()
        self.task_errors.fail_if_quarantined(self.master_client.progress(), self.plane.ready)

    def _on_reader_death(self, info: ReaderInfo, death: ReaderDeath) -> None:
        # A reader killed mid-write leaves its reservation (tmp-<pid>-...): remove it now, or
        # it would hold budget until some writer happened to wait long enough to reap it.
        reap_dead_writers(self.store.path)
        # Killed after sealing but before announcing: nobody will ever read that segment (its
        # task is read again), so release it.
        if info.sealing is not None:
            self.handle.release(info.sealing, missing_ok=True)
            info.sealing = None
        if info.unusable:  # it said why (messages.Unusable); the pool starts another
            return
        task = death.task
        if task is None:
            log.warning("%s; a new reader is started. Fix: %s", death, death.fix)
            return
        log.warning(
            "%s; the master tries the task again, up to max_retries times in an epoch (then "
            "the loop raises), and a new reader is started. Fix: %s",
            death,
            death.fix,
        )
        self.task_errors.reader_died(death)
        # The lease's failure, told now rather than left to lapse: the master hands the task
        # out again at once, not after lease_timeout, and a quarantine's last error is the
        # death, not "lease N expired".
        try:
            self.master_client.fail(task.lease_id, str(death))
        except MasterError:  # lapsed meanwhile (LeaseError), or no master: it expires as before
            return
        self._raise_if_quarantined()

    def _hold_readers_back(self) -> bool:
        """Raise or lower the store's ``ahead`` hint and set its ``last_epoch`` (shm/hints.py).

        ``ahead``: readers lease no new task while ``ready_ahead`` tasks are ready and not
        taken, or once the next epoch's first window is read. ``last_epoch``: readers read
        no task of an epoch after the one the sampler began last, but for the first
        :func:`next_epoch_tasks` of the next one (which then starts at full speed).
        Without that bound, ``ready_ahead`` alone lets readers decode whole epochs the loop
        may never ask for (a script that counts its epochs over ``epochs=None`` stops
        after its last pass), and with few tasks an epoch, the epoch after that too. Once
        the sampler begins an epoch, its tasks are read as far as ``ready_ahead``.

        Raised as soon as a reader's announcement (or its start on a task of the next epoch)
        fills a count, not at the next tick: a reader of small tasks would lease more within
        one tick. Returns whether readers are held back."""
        with self._ahead_lock:
            begun = self.plane.ready.latest_epoch
            # Once reached, the count holds until the sampler begins the next epoch: a task
            # between its reader's Ready and the board (or a failed one) must not let one
            # more be read.
            enough = self._next_epoch_read == begun
            if not enough:
                later = self.plane.ready.count_after(begun) + self._reading_after(begun)
                readers = len(self.pool.running()) if self.pool is not None else 1
                enough = later >= next_epoch_tasks(self.options.shuffle_window, readers)
                if enough:
                    self._next_epoch_read = begun
            ahead = len(self.plane.ready) >= self.options.ready_ahead or enough
            if ahead != self._ahead:
                self._ahead = ahead
                self.handle.set_ahead(ahead)
            last = begun if enough else begun + 1
            if last != self._last_epoch:
                self._last_epoch = last
                self.handle.set_last_epoch(last)
            return ahead

    def _reading_after(self, epoch: int) -> int:
        """Tasks of epochs after ``epoch`` that readers are reading now."""
        if self.pool is None:
            return 0
        return sum(1 for r in list(self.pool.readers) if (t := r.task) and t.epoch > epoch)

    def _starved(self) -> bool:
        if self._largest_segment == 0:
            return False
        # Readers of tasks the sampler is not waiting for leave room for one more segment
        # (shm budget.reserve), so they are stuck once less than two segments' room is left.
        return self.handle.in_use() + 2 * self._largest_segment > self.handle.budget

    # -- shutdown ------------------------------------------------------------------------
    def _wait_for_other_ranks(self) -> None:
        """Rank 0 under torchrun: the other ranks use this master until their datasets close
        (their last completions, then ``leave``), also those that have not started yet, and
        stopping it first would fail their steps. Waits until each marked its close."""
        rendezvous = self.options.rendezvous
        if rendezvous is None:
            return
        try:
            waiting = rendezvous.wait_for_ranks()
        except MasterError as exc:  # the launcher's store is gone, and with it the job
            log.warning("stopping the master without waiting for the other ranks: %s", exc)
            return
        if waiting:
            log.warning("stopping the master while ranks %s have not closed", waiting)

    def _master_lost(self) -> bool:
        """Whether a call to the master already gave up on it, here or in a reader."""
        if self.client is None:
            return False
        readers = self.pool.readers if self.pool is not None else []
        return self.client.gave_up_at is not None or any(r.master_lost for r in readers)

    def close(self, *, wait_for_ranks: bool = True, hurry: bool = False) -> None:
        """Stop everything; ``wait_for_ranks``: rank 0 under torchrun first lets the other
        ranks finish with its master (not when closing because the loop failed: the job is
        going down, and they would only wait for rank 0 at their next collective).

        With ``hurry`` (Ctrl-C: the user wants out), and once the master is lost, each call
        to it is tried once: ``retry_for`` per call only delayed the exit (a minute with the
        master gone). Not on any error: a master restarting meanwhile must still hear what
        the loop consumed, or other trainers deliver it again."""
        if self._closed or os.getpid() != self._pid:  # a forked child owns none of this
            return
        self._closed = True
        at_exit.forget(self)
        maintenance = self._maintenance
        if maintenance is not None:
            maintenance.stop()
        lost = self._master_lost()
        if (lost or hurry) and self.client is not None:
            self.client.stop_retrying()
        plane = getattr(self, "plane", None)
        if plane is not None:
            plane.ready.close()
        if maintenance is not None:
            maintenance.join(5.0)
        if self.pool is not None:
            # Readers retrying a lost master hear "stop" only after their call gives up.
            self.pool.stop(LOST_STOP_SECONDS if lost else STOP_SECONDS)
        lifecycle.forget_sigterm(getattr(self, "_sigterm", -1))
        if self.client is not None:
            # What the loop consumed since the last tick must reach the master before we
            # leave: a standalone master would hand those tasks out again (duplicates).
            self._leave_master()
            if self._master_elsewhere and self.options.rendezvous is not None:
                try:
                    self.options.rendezvous.mark_closed()
                except MasterError as exc:  # rank 0 then waits for us until its timeout
                    log.warning("could not tell rank 0 this dataset closed: %s", exc)
            self.client.close()
        if self.master_place is not None and not self.master_place.outlives_trainer:
            if wait_for_ranks:
                self._wait_for_other_ranks()
            self.master_place.stop()
