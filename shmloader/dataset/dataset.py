"""``SharedTaskDataset``: a map-style torch Dataset over rows that readers put in shared memory.

The dataset object lives in the trainer; DataLoader workers get only its :class:`Gatherer`
(a store handle and column names). ``__getitems__`` turns a list of sample indices from
:meth:`sampler` into a batch with one copy per byte; the sampler decides which rows exist.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

# numpy 2 loads numpy.random on its first use. Loaded here, by the thread that imports the
# dataset, before any thread of ours starts: torch's DataLoader workers seed numpy.random as
# they start, and a worker forked while another thread of the trainer was importing it (the
# embedded master building an epoch's order as readers lease, say) waited for ever on the
# module's import lock it inherited, and outlived the trainer.
import numpy.random
import torch.utils.data

from .._keywords import suggest_keywords
from ..errors import ConfigError, DataError, ShmloaderError
from ..master.config import JobConfig
from ..reader.pool import ReaderProcess, launch_readers, stop_readers
from ..shm.space import AUTO_BUDGET
from ..shm.store import SegmentStore
from ..sources.base import Source
from ..sources.hf import HFDataset
from .core.indices import ROW_BITS, encode_indices
from .core.ragged_form import Ragged
from .core.receipts import IndexBatch, Receipt, issued_batch
from .gather import ring
from .gather.gather import gather, segment_views
from .gather.gatherer import Gatherer
from .gather.ring import RingBatch
from .order.batch_sampler import TaskBatchSampler
from .order.blocks import DEFAULT_SHUFFLE_WINDOW
from .order.feed import FirstPass
from .order.natural import SHUFFLED, Refused, RowStream, are_positions, in_sequence
from .order.sampler import TaskSampler
from .resume.checkpoint import (
    FRESH_START,
    DatasetFacts,
    identity,
    merge_states,
    resume_point,
    saved_state,
)
from .runtime.options import DatasetOptions

if TYPE_CHECKING:
    from ..master.tasks import DdpPolicy
    from ..stats.stats import Stats
    from .resume.checkpoint import ResumePoint
    from .runtime.runtime import Runtime


# Readers never configured hold nothing (no lease, no segment): they are asked to stop but
# not waited for, since one still importing would read the request only after its imports.
_UNCONFIGURED_STOP = 0.0


def collate(batch: Any) -> Any:
    """The collate function to give a DataLoader: ``__getitems__`` has already built the batch."""
    return batch


def _one_row(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: (v[0] if isinstance(v, (list, torch.Tensor)) else v) for k, v in batch.items()}


def read_record(source: Source, index: int, columns: Sequence[str] | None) -> dict[str, Any]:
    """Record ``index`` of ``source`` (negative: from the end), in plan order, as a batch of
    one row; IndexError past the end (so ``for record in ds`` ends), DataError if the source
    skipped it (``on_error="skip"``)."""
    shards = source.plan()
    total = sum(shard.num_records for shard in shards)
    at = index + total if index < 0 else index
    if not 0 <= at < total:
        raise IndexError(f"record {index} of a dataset of {total} records")
    for shard in shards:
        if at < shard.num_records:
            break
        at -= shard.num_records
    result = source.read_result(shard, at, at + 1)
    if result.batch.num_rows == 0:
        why = result.skipped[0].error if result.skipped else "the source gave no row"
        raise DataError(f"record {at} was skipped: {why}", path=shard.path, index=at)
    views = segment_views(result.batch)
    names = list(columns) if columns else result.batch.schema.names
    return gather(lambda slot: views, encode_indices(0, np.zeros(1, np.int64)), names)


class _DatasetReports:
    """A batch sampler's reports (``BatchReports``, core/ports.py), to the data plane of the
    dataset's runtime, which the first report starts; its states, from the dataset."""

    def __init__(
        self,
        runtime: Callable[[], Runtime],
        state: Callable[[np.ndarray | None], dict[str, Any]],
        load_state: Callable[[dict[str, Any]], None],
    ) -> None:
        self._runtime = runtime
        self.state = state
        self.load_state = load_state

    def dropped(self, rows: np.ndarray) -> None:
        self._runtime().plane.reports.dropped(rows)

    def received(self, rows: np.ndarray) -> None:
        self._runtime().plane.reports.received(rows)

    def counted_early(self, rows: np.ndarray) -> None:
        self._runtime().plane.reports.counted_early(rows)

    def pinned(self, held: int) -> bool:
        return self._runtime().plane.pressure.pinned(held)


class SharedTaskDataset(torch.utils.data.Dataset[dict[str, Any]]):
    """A map-style torch ``Dataset`` over the rows of ``source``, which reader processes
    decode into shared memory; iterate it with :class:`~shmloader.DataLoader`.

    A master (embedded, or standalone with ``master=``) splits the source into tasks and
    hands them out each epoch; every record reaches the loop once per epoch. Every argument
    is checked as the dataset is made, before anything starts. Guide: docs/dataset.md.

    Args:
        source: Any source (``RecordFileSource``, ``ParquetSource``, ...), or a Hugging Face
            ``datasets.Dataset``.
        num_readers: Reader processes. ``"auto"``: as many as keep the loop fed, between 1
            and the cores this process may use (docs/how-to/tuning.md).
        records_per_task: Records per task, never spanning two files. ``None``: sized from
            the data (docs/dataset.md, "Task size"), or a standalone master's own.
        shuffle: Shuffle the task order each epoch, and rows within a window of tasks.
        seed: Seed of both shuffles and of ``task_rng()``.
        shm_budget: Most bytes of segments in shared memory at once (``"4GiB"`` or an int).
            ``"auto"``: 1 GiB, or three quarters of the free space, split among the
            machine's ranks, where that is less.
        epochs: Epochs the master hands out (``None``: no last epoch). Give the passes the
            script makes: readers then decode nothing past them.
        shuffle_window: Tasks whose rows are shuffled together.
        master: ``"host:port"`` of a standalone master; ``"torchrun"``: rank 0's embedded
            master serves every rank; ``None``: an embedded master.
        master_host: Interface an embedded master listens on (``None``: loopback).
        metrics_port: Port of an embedded master's Prometheus ``/metrics`` (0: any free
            port; ``None``: not served).
        token: Secret of a master started with ``--token`` (else ``$SHMLOADER_TOKEN``);
            never sent in clear beyond this machine (docs/how-to/security.md).
        tls_ca: CA certificate (PEM file) of a standalone master serving TLS (else
            ``$SHMLOADER_TLS_CA``).
        rank: DDP rank. With ``world_size``, every rank gets the same rows per epoch;
            without both, trainers on one master share its epochs.
        world_size: DDP ranks.
        ddp_policy: ``"pad"`` repeats rows to make the ranks' shares equal; ``"drop"``
            leaves the tail out (reported).
        lease_timeout: Seconds before a dead or stuck reader's task is handed out again.
        max_retries: Retries of a task that failed for a reason a retry may fix, before
            it is quarantined.
        shm_dir: Base folder of the shared memory (``None``: ``$SHMLOADER_SHM_DIR``, else
            ``/dev/shm``).
        columns: Columns to put in batches (``None``: all).
        cache: Keep decoded tasks in shared memory for the next epochs, as far as
            ``shm_budget`` holds them; ``decode`` must give the same records every epoch
            (docs/dataset.md, "Decoded data kept across epochs").
        ragged: What a batch holds for a list column whose length varies: ``"list"`` (of
            1-D tensors; the default), ``"padded"`` (a tensor and ``<name>_lengths``) or
            ``"offsets"`` (the values and ``<name>_offsets``); docs/dataset.md,
            "Variable-length columns".
        pad_value: Value after each row's end under ``ragged="padded"``.

    Attributes:
        options: The arguments as checked, a frozen ``DatasetOptions``:
            ``ds.options.num_readers``, ``ds.options.shm_budget`` (bytes), ...; the job's
            settings are ``ds.options.job`` (``records_per_task``, ``epochs``, ``shuffle``,
            ``seed``, ``lease_timeout``, ``max_retries``, ``world_size``, ``ddp_policy``).
    """

    collate = staticmethod(collate)

    # The trainer side's own, set by _forget_the_job.
    _columns_checked: bool  # columns= against the data, at the first gather
    _resume: ResumePoint  # where a loaded state leaves the job (checkpoint.py)
    _loaded: dict[str, Any]  # the state loaded last, as given
    _rows_known: tuple[ResumePoint, FirstPass] | None  # _rows_before_start's
    _runtime: Runtime | None
    _sampler: TaskSampler | None
    _rows: RowStream | None  # a plain DataLoader's own sampler's (natural.py)
    _batchers: weakref.WeakSet[TaskBatchSampler]
    _lock: threading.Lock
    _closed: bool
    _state_at_close: dict[str, Any] | None
    _launched: list[ReaderProcess]  # readers started with the dataset, not configured yet
    _store: SegmentStore | None  # None in a worker's copy
    _gatherer: Gatherer | None  # None once closed

    @suggest_keywords()
    def __init__(
        self,
        source: Source | HFDataset,
        *,
        num_readers: int | Literal["auto"] = 2,
        records_per_task: int | None = None,
        shuffle: bool = JobConfig.shuffle,
        seed: int = JobConfig.seed,
        shm_budget: int | str = AUTO_BUDGET,
        epochs: int | None = None,
        shuffle_window: int = DEFAULT_SHUFFLE_WINDOW,
        master: str | None = None,
        master_host: str | None = None,
        metrics_port: int | None = None,
        token: str | None = None,
        tls_ca: str | os.PathLike[str] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        ddp_policy: DdpPolicy = JobConfig.ddp_policy,
        lease_timeout: float = JobConfig.lease_timeout,
        max_retries: int = JobConfig.max_retries,
        shm_dir: str | None = None,
        columns: Sequence[str] | None = None,
        cache: bool = False,
        ragged: Ragged | None = None,
        pad_value: int | float = 0,
    ) -> None:
        # Every option checked here, once, before anything starts (runtime/options.py).
        self.options = DatasetOptions.checked(**{k: v for k, v in locals().items() if k != "self"})
        self._job: JobConfig | None = None  # options.job, its task size sized (see job)
        self._state_calls = 0  # whole-job states taken (torchrun): the n-th meets the n-th
        self._owner_pid = os.getpid()
        self._forget_the_job(gatherer=None)
        # The store exists from the start (cheap: a folder in /dev/shm), so DataLoader workers
        # forked before the first batch already know where segments will be; the master starts
        # on first use, and the readers are configured then.
        self._store = SegmentStore.create(self.options.shm_budget, base_dir=shm_dir)
        self._gatherer = Gatherer(
            self._store.handle(), list(self.options.columns or ()), self.options.ragged
        )
        # The reader processes start now and wait for their configuration until first use, so
        # that their imports (a few tenths of a second) overlap whatever the script does before
        # its first batch, as building its model. Only from the main thread: a reader dies with
        # the thread that started it (the parent-death signal), and the main thread lasts as
        # long as the process; from another, they start on first use, from the pool's thread.
        if threading.current_thread() is threading.main_thread():
            try:
                self._launched = launch_readers(self.options.first_readers)
            except BaseException:
                self._close(wait_for_ranks=False)
                raise

    # The options, as checked: ``options``; the job's own parameters, sized: ``job``.
    @property
    def job(self) -> JobConfig:
        """The job's own parameters, as the embedded master runs them (``JobConfig``):
        ``options.job`` with its ``records_per_task``, where not given, sized from the data on
        the first ask (the source's plan is made then: about 32 MiB of the files per task,
        less where ``shm_budget`` is small, and at least 8 tasks an epoch per rank; 4096 where
        the files' sizes are not known: docs/dataset.md, "Task size"). A standalone master
        splits by its own (``shmloader master --records-per-task``), and this says what was
        given here."""
        if self._job is None:
            self._job = self.options.sized_job()
        return self._job

    # -- trainer side --------------------------------------------------------------------
    def start(self) -> SharedTaskDataset:
        """Start the master, readers and store now (else: on first use)."""
        self._ensure_started()
        return self

    def _ensure_started(self) -> Runtime:
        with self._lock:
            if self._closed:
                raise ShmloaderError("this SharedTaskDataset is closed")
            if self._owner_pid != os.getpid():
                raise ShmloaderError(
                    "this is a DataLoader worker's copy of the dataset: only __getitems__ works "
                    "here; sampling, stats and state belong to the training process"
                )
            if self._runtime is None:
                assert self._store is not None
                # Imported here, not at the top: the readers start at construction, and
                # the trainer's imports of its master's side overlap theirs.
                from .runtime.runtime import Runtime

                launched, self._launched = self._launched, []
                try:
                    options = dataclasses.replace(self.options, job=self.job)
                    runtime = Runtime(options, self._resume, self._store, launched)
                except BaseException:
                    stop_readers(launched, _UNCONFIGURED_STOP)  # no-op once a pool stopped them
                    raise
                self._runtime = runtime
                if self._gatherer is not None:
                    self._gatherer.report_to(runtime.plane.reports.gathered)
            return self._runtime

    # -- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where the loop is: the epoch and the rows of it consumed so far (JSON-able); see
        ``shmloader.DataLoader.state_dict``, which returns the same.

        Under torchrun (``master="torchrun"``, two ranks or more) it is the whole job's state:
        every rank calls it at the same step, each gets every rank's :meth:`rank_state_dict`
        merged (:func:`~shmloader.merge_states`), the same on every rank. Save it from one
        rank and load it into every rank of a job with any number of ranks. A call made on
        some ranks only is a ConfigError after ``$SHMLOADER_STATE_SECONDS`` (180 s), naming
        the ranks that did not call.

        It starts the dataset if it has not started: the epoch a state names may be the
        master's (a standalone master's job can be past the state loaded). After
        :meth:`close`, the rank's own state when it closed (a framework
        that checkpoints after its loop ended; rank 0's master may be gone). In a DataLoader
        worker's copy, ``{}``: the training process's dataset holds the state (torchdata's
        ``StatefulDataLoader`` asks every worker for its dataset's)."""
        if self._owner_pid != os.getpid():
            return {}  # a DataLoader worker's copy (torchdata asks each worker): see above
        return self._whole_job(self._state_counting(None))

    def rank_state_dict(self) -> dict[str, Any]:
        """This trainer's own state, whatever the launcher: what its loop consumed. Under
        torchrun, to save each rank's state on its own (no rank waits for the others); load
        ``shmloader.merge_states(every rank's state)`` to resume with another number of ranks,
        or each rank's own into the same rank of a job of the same size."""
        if self._owner_pid != os.getpid():
            return {}
        return self._state_counting(None)

    def _whole_job(self, own: dict[str, Any]) -> dict[str, Any]:
        """``own`` merged with every other rank's of the same call, under torchrun (see
        :meth:`state_dict`); ``own`` otherwise, and once closed."""
        rendezvous = self.options.rendezvous
        if rendezvous is None or rendezvous.world_size < 2 or self._closed:
            return own
        call, self._state_calls = self._state_calls, self._state_calls + 1
        runtime = self._ensure_started()
        shared = rendezvous.share_state(call, json.dumps(own), alive=runtime.live_ranks)
        return merge_states([json.loads(text) for text in shared])

    def _state_counting(self, also: np.ndarray | None) -> dict[str, Any]:
        """The state, counting the sample indices ``also`` as consumed (the batches a batch
        sampler handed out: ``TaskBatchSampler.state_dict``)."""
        if self._closed and self._state_at_close is not None:
            return self._state_at_close  # a checkpoint written after the loop ended
        runtime = self._ensure_started()
        self._receive_held_back()
        loop = runtime.loop_state(also)
        runtime.saved_state_of(loop)  # the master keeps what it counts, should this trainer die
        return saved_state(self._facts(), self._resume, loop, master=runtime.address)

    def _state_before_start(self) -> dict[str, Any] | None:
        """The state while the dataset has not started, without starting it: the one loaded,
        or ``{}`` (nothing consumed, which :meth:`load_state_dict` takes as it is); None once
        started. torchdata's ``StatefulDataLoader`` asks its batch sampler for a state as it
        makes its iterator, before it loads the one it was given."""
        if self._runtime is not None or self._closed:
            return None
        return dict(self._loaded)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; call before the first iteration (the readers start from
        it). The last state loaded counts. A DataLoader worker's copy takes only the ``{}``
        its :meth:`state_dict` gave."""
        if self._owner_pid != os.getpid():
            if state:
                raise ConfigError(
                    "a DataLoader worker's copy of the dataset was given a state; load it "
                    "into the dataset in the training process, before the first iteration"
                )
            return
        if not state and self._runtime is None:
            return  # the state of a batch sampler whose dataset had not started: nothing yet
        if self._runtime is not None:
            why = "the readers start from it"
            if self._runtime.plane.figures().consumed_rows == 0:
                why = (
                    "here the dataset started before its loop got anything: a loader made "
                    "its iterator to take a first state, as accelerate's prepare() does with "
                    "use_stateful_dataloader=True; under accelerate, leave that off and "
                    "register the dataset, accelerator.register_for_checkpointing(ds), which "
                    "saves and loads its state before it starts"
                )
            raise ConfigError(
                f"load_state_dict must come before the first iteration ({why}); make a new "
                "dataset and loader, and load the state into them first"
            )
        self._resume = resume_point(self._facts(), state)
        self._loaded = state

    def _facts(self) -> DatasetFacts:
        return DatasetFacts(
            identity=identity(
                self.options.source,
                records_per_task=self.job.records_per_task,
                seed=self.job.seed,
                shuffle=self.job.shuffle,
                world_size=self.job.world_size,
                rank=self.options.rank,
                ddp_policy=self.job.ddp_policy,
            ),
            source=self.options.source,
            records_per_task=self.job.records_per_task,
            epochs=self.job.epochs,
            master_given=self.options.master is not None,
            standalone_master=self.options.standalone_master is not None,
        )

    def sampler(self) -> TaskSampler:
        """The sampler to give the DataLoader (one per dataset: it owns the epoch's order)."""
        if self._sampler is None:
            self._sampler = TaskSampler(
                lambda: self._ensure_started().feed,
                shuffle=self.job.shuffle,
                seed=self.job.seed,
                window=self.options.shuffle_window,
                rows_before_start=self._rows_before_start,
            )
        return self._sampler

    def batch_sampler(self, batch_size: int, *, drop_last: bool = False) -> TaskBatchSampler:
        """Batches of :meth:`sampler`, for a plain DataLoader's ``batch_sampler=``.

        Use it for ``drop_last=True``: the rows of a pass's short last batch are then dropped
        for that epoch. With ``sampler=ds.sampler()`` and torch's ``drop_last=True`` the dataset
        never learns of the drop, and those rows come first in the next pass.
        """
        batcher = TaskBatchSampler(
            self.sampler(),
            batch_size,
            drop_last,
            _DatasetReports(self._ensure_started, self._batcher_state, self.load_state_dict),
            short_batches=self.job.world_size
            in (None, 1),  # DDP: a short batch would unbalance steps
        )
        self._batchers.add(batcher)  # asked before a state is taken (receive_held_back)
        return batcher

    def _batcher_state(self, also: np.ndarray | None) -> dict[str, Any]:
        """A batch sampler's state (``TaskBatchSampler.state_dict``): nothing it handed out yet
        (``also`` None) and the dataset not started, the state before the start, without
        starting it."""
        before = self._state_before_start() if also is None else None
        return before if before is not None else self._whole_job(self._state_counting(also))

    def _receive_held_back(self) -> None:
        for batcher in list(self._batchers):
            batcher.receive_held_back()

    def __len__(self) -> int:
        """Rows the next pass delivers: what is left of the epoch (``TaskSampler.pass_rows``).
        Before the first iteration, with an embedded master, it is worked out from the plan
        (the schedule is a function of it and the job), without starting anything."""
        return len(self.sampler())

    def _rows_before_start(self) -> FirstPass | None:
        """The first pass's rows while nothing has started, for an embedded master (None: the
        runtime has started, or a standalone master keeps its own epochs: ask it)."""
        if self._runtime is not None or self.options.standalone_master is not None:
            return None
        resume = self._resume
        known = self._rows_known
        if known is not None and known[0] is resume:
            return known[1]
        from ..master.epochs import schedule_of
        from ..master.tasks import TaskTable

        job = resume.job(self.job)
        if resume.finished or (job.epochs is not None and resume.epoch >= job.epochs):
            rows = FirstPass(epoch_rows=0, left=0)
        else:
            table = TaskTable(self.options.source.plan(), job.records_per_task)
            share = schedule_of(table, job, resume.epoch).queue_records(self.options.rank or 0)
            left = max(0, share - (resume.consumed_records if resume.by_position else 0))
            rows = FirstPass(epoch_rows=share, left=left)
        self._rows_known = (resume, rows)
        return rows

    def read_record(self, index: int) -> dict[str, Any]:
        """Record ``index`` of the dataset, counted in plan order (file by file; negative: from
        the end), as a dict of its columns (a batch's, without the batch axis), to look at the
        data. It is read from the source in this process, not through the readers, and
        consumes nothing of any epoch. IndexError past the end."""
        return _one_row(read_record(self.options.source, index, self.options.columns))

    def __getitem__(self, index: int) -> dict[str, Any]:
        """``ds[i]``: :meth:`read_record`, so that ``ds[0]`` shows the data. An index the
        dataset's sampler handed out (all are at least 2**32: torch's unbatched mode,
        ``batch_size=None``) gives that row of shared memory instead."""
        if index < 1 << ROW_BITS:
            return self.read_record(index)
        batch = self._gather([index], ring=False)
        assert isinstance(batch, dict)
        return _one_row(batch)

    def __getitems__(
        self, indices: Sequence[int] | np.ndarray | IndexBatch
    ) -> dict[str, Any] | RingBatch:
        """The batch: a dict of tensors; in a worker of ``shmloader.DataLoader``, a
        :class:`~shmloader.dataset.gather.ring.RingBatch`, which reaches the training process
        as one.
        How its rows count as consumed travels with a batch the batch sampler issued (its
        ``IndexBatch``'s receipt, delivery.py); other indices count once gathered.

        Positions of a torch sampler (``DataLoader(ds, batch_size=64)``, no ``sampler=``) take
        the next rows of the dataset's order, in the training process; a worker refuses them
        (natural.py)."""
        issued = issued_batch(indices)
        if issued is not None:
            return self._gather(issued.indices, ring=True, receipt=issued.receipt)
        assert not isinstance(indices, IndexBatch)  # for mypy: issued_batch took those
        if are_positions(indices):
            return self._natural_batch(indices)
        return self._gather(indices, ring=True, receipt=Receipt.GATHER)

    def _natural_batch(self, positions: Sequence[int] | np.ndarray) -> dict[str, Any]:
        """As many of the next rows of the dataset's order as there are ``positions``, for a
        DataLoader that brings its own sampler (natural.py): gathered here, or refused in a
        worker or for positions out of sequence."""
        size = len(positions)
        if self._owner_pid != os.getpid():
            return Refused(size)
        if not in_sequence(positions):
            raise ConfigError(SHUFFLED)
        with self._lock:
            if self._rows is None:
                self._rows = RowStream(
                    self.batch_sampler(size),
                    consumed=lambda rows: self._ensure_started().plane.reports.counted_early(rows),
                )
            rows = self._rows
        batch = self._gather(rows.take(size), ring=False, receipt=Receipt.GATHER)
        rows.look_ahead()
        assert isinstance(batch, dict)
        return batch

    def gather(
        self, indices: Sequence[int] | np.ndarray, *, consumed: bool = True
    ) -> dict[str, Any]:
        """The batch of sample indices (as the sampler hands them out), gathered in this
        process. ``consumed=False``: the rows count as consumed only once the caller reports
        that its loop received them (``shmloader.DataLoader`` does)."""
        receipt = Receipt.GATHER if consumed else Receipt.LOOP
        issued = issued_batch(indices)
        batch = self._gather(
            indices if issued is None else issued.indices, ring=False, receipt=receipt
        )
        assert isinstance(batch, dict)  # no ring outside a worker
        return batch

    def use_ring(self, ring_slots: int) -> None:
        """In a worker of ``shmloader.DataLoader`` (its ``worker_init_fn``): hand batches over
        through a ring of ``ring_slots`` slots, and leave reporting them to the loader."""
        if self._gatherer is not None:
            self._gatherer.use_ring(ring_slots)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return self._closed

    @property
    def started(self) -> bool:
        """Whether the job has started: its master, the readers' configuration, the data
        plane (on the first batch, ``len(ds)`` with a standalone master, ``stats()`` or
        :meth:`start`). Before, the readers wait, already imported, and nothing is leased."""
        return self._runtime is not None

    @property
    def store_path(self) -> str | None:
        """The folder of this dataset's shared memory (None in a worker's copy)."""
        return None if self._store is None else self._store.path

    def _gather(
        self,
        indices: Sequence[int] | np.ndarray,
        *,
        ring: bool,
        receipt: Receipt = Receipt.GATHER,
    ) -> dict[str, Any] | RingBatch:
        gatherer = self._gatherer
        if gatherer is None:
            raise ShmloaderError("this SharedTaskDataset is closed")
        if not gatherer.columns:
            gatherer.columns = self._columns_of(gatherer, indices)
        elif not self._columns_checked:
            have = self._columns_of(gatherer, indices)
            missing = [c for c in gatherer.columns if c not in have]
            if missing:
                raise ConfigError(
                    f"columns= names {', '.join(map(repr, missing))}, which the data does not "
                    f"have; its columns: {', '.join(have)}"
                )
            self._columns_checked = True
        return gatherer.gather(indices, ring=ring, receipt=receipt)

    @staticmethod
    def _columns_of(gatherer: Gatherer, indices: Sequence[int] | np.ndarray) -> list[str]:
        from .core.indices import split_indices

        slots, _ = split_indices(indices[:1])
        return list(gatherer.views(int(slots[0])))

    @property
    def master_address(self) -> str | None:
        """The master's ``host:port``: ``master=``, or the embedded master's once the dataset
        has started (None before: :meth:`start` starts it; and once it is closed). ``shmloader
        stats`` / ``top`` watch the job through it, and other trainers join it."""
        standalone = self.options.standalone_master
        if standalone is not None:
            return standalone
        runtime = self._runtime
        return None if runtime is None else str(runtime.address)

    @property
    def metrics_url(self) -> str | None:
        """Where the embedded master serves the job's Prometheus metrics once the dataset has
        started (None: not started, ``metrics_port`` not given, the master is standalone, or
        the dataset is closed)."""
        runtime = self._runtime
        return None if runtime is None else runtime.metrics_url

    def stats(self) -> Stats:
        """A snapshot to tell whether readers keep up and what the job's memory costs;
        ``ds.stats().advice()`` says what to change.

        It starts the dataset if it has not started. Counts are exact at the call; memory, CPU
        and the master's progress are measured at most once a second and given from the last
        measurement in between, so a call every step costs little (docs/how-to/tuning.md).
        """
        runtime = self._ensure_started()
        return runtime.stats_collector().collect(runtime)

    def close(self) -> None:
        """Stop readers and the embedded master, remove every shared-memory segment."""
        self._close(wait_for_ranks=True)

    def _close(self, *, wait_for_ranks: bool, hurry: bool = False) -> None:
        live = self._runtime is not None and not self._closed
        if live and not hurry and self._owner_pid == os.getpid():
            self._receive_held_back()  # what the loop got, for the state it closes with
        with self._lock:
            if self._closed:
                return
            self._closed = True
            runtime, self._runtime = self._runtime, None
            launched, self._launched = self._launched, []
        # A forked worker inherits the runtime but owns none of it: only the trainer closes.
        if self._owner_pid != os.getpid():
            return
        if runtime is not None and not hurry:
            self._state_at_close = self._closing_state(runtime)
        try:
            stop_readers(launched, _UNCONFIGURED_STOP)  # closed before its first use
            if runtime is not None:
                runtime.close(wait_for_ranks=wait_for_ranks, hurry=hurry)
        finally:  # a second Ctrl-C during the runtime's close must not leave /dev/shm behind
            if self._gatherer is not None:
                self._gatherer.close()  # the trainer's own mappings (num_workers=0)
            if self._store is not None:
                ring.forget(self._store.path)  # persistent workers' rings, mapped here
                self._store.close()

    def _closing_state(self, runtime: Runtime) -> dict[str, Any] | None:
        """What ``state_dict()`` gives once closed: the state as it closes (None when that
        cannot be told, the runtime having failed: state_dict() then says it is closed)."""
        try:
            loop = runtime.loop_state(closing=True)
            return saved_state(self._facts(), self._resume, loop, master=runtime.address)
        except ShmloaderError:
            return None

    def __enter__(self) -> SharedTaskDataset:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        # An error or Ctrl-C takes the job down: other ranks must not wait for rank 0's close.
        ended = exc is None or (isinstance(exc, SystemExit) and exc.code in (0, None))
        self._close(wait_for_ranks=ended, hurry=isinstance(exc, KeyboardInterrupt))

    def __del__(self) -> None:
        if getattr(self, "_store", None) is not None:
            self.close()

    # -- worker side: only the gatherer travels -------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        # Pickled for a spawned DataLoader worker: only what gathering needs travels.
        return {"_gatherer": self._gatherer}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._owner_pid = -1  # a worker copy: never starts or closes anything
        self._forget_the_job(gatherer=state["_gatherer"])

    def _forget_the_job(self, gatherer: Gatherer | None) -> None:
        """What the trainer side holds, as it is before anything starts: in a new dataset
        (``gatherer`` None: made with its store below), and in a DataLoader worker's copy (only
        ``gatherer`` travels; no store, no readers)."""
        self._columns_checked = False
        self._resume = FRESH_START
        self._loaded = {}
        self._rows_known = None
        self._runtime = None
        self._sampler = None
        self._rows = None
        self._batchers = weakref.WeakSet()
        self._lock = threading.Lock()
        self._closed = False
        self._state_at_close = None
        self._launched = []
        self._store = None
        self._gatherer = gatherer

    @property
    def runtime(self) -> Runtime:
        """The running parts (master link, readers, store, data plane) of a started dataset
        (:attr:`started`); ShmloaderError before: asking starts nothing (:meth:`start` does)."""
        runtime = self._runtime
        if runtime is None:
            why = "is closed" if self._closed else "has not started: ds.start() starts it"
            raise ShmloaderError(f"this SharedTaskDataset {why}")
        return runtime
