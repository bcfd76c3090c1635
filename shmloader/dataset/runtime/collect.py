"""Making a :class:`~shmloader.stats.stats.Stats` from a running dataset.

Counts come from the trainer's data plane and reader pool, exact at the call; memory and CPU
from a :class:`~shmloader.stats.probe.ProcessProbe`, and the master's progress from a call to
it, each refreshed at most once a second, so ``ds.stats()`` is cheap enough for every step.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Protocol

from ...shm.space import space
from ...stats.probe import PROBE_INTERVAL, ProcessProbe, Usage, usable_cores
from ...stats.stats import ProcessStats, ReaderStats, Stats

if TYPE_CHECKING:
    from ...master.client import MasterClient
    from ...master.progress import Progress
    from ...reader.messages import Failed
    from ...reader.pool import ReaderInfo, ReaderPool
    from ...shm.store import SegmentStore
    from ..accounting.plane import DataPlane
    from .cache_use import CacheUse


class Observed(Protocol):
    """What the figures are read from: a started dataset's ``Runtime``."""

    plane: DataPlane
    pool: ReaderPool | None
    store: SegmentStore
    failures: list[Failed]
    cache_use: CacheUse

    @property
    def master_client(self) -> MasterClient: ...


class StatsCollector:
    """One dataset's: the probe of its processes and the master's last progress."""

    def __init__(self, segments_dir: str, *, interval: float = PROBE_INTERVAL) -> None:
        self.probe = ProcessProbe(segments_dir, interval=interval)
        self.interval = interval
        self._progress: tuple[float, Progress | None] = (-float("inf"), None)
        self._cores = usable_cores()
        self._lock = threading.Lock()

    def collect(self, runtime: Observed, *, for_heartbeat: bool = False) -> Stats:
        """The figures now. ``for_heartbeat``: for the heartbeat thread's ``TrainerFigures``,
        without the two steps that act on the job (applying the gather ledger, which
        completes tasks at the master, and asking the master for its progress): that thread
        only reports, and must not race the training loop's own calls to the master."""
        # The loop's thread (ds.stats()) and the heartbeat's (figures for /metrics) both ask.
        with self._lock:
            return self._collect(runtime, for_heartbeat)

    def _collect(self, runtime: Observed, for_heartbeat: bool) -> Stats:
        plane = runtime.plane
        if not for_heartbeat:
            # Count what workers gathered up to now, not up to the last tick.
            plane.read_ledger_and_send()
        epoch = plane.read(lambda book: book.epoch_to_iterate())
        readers, processes = self._processes(runtime.pool, epoch)
        handle = runtime.store.handle()
        in_use, spare, cached = handle.occupancy()
        progress = None if for_heartbeat else self._master_progress(runtime)
        book, clock = plane.figures(), plane.loop_clock
        return Stats(
            readers=readers,
            processes=processes,
            shm_in_use=in_use,
            shm_peak=max(handle.peak(), in_use),
            shm_spare=spare,
            shm_cached=cached,
            tasks_decoded_again=runtime.cache_use.decoded_again,
            cache_wanted=runtime.cache_use.decoded_bytes,
            shm_budget=handle.budget,
            shm_free=space(handle.base_dir).free,
            records_consumed=book.consumed_rows,
            records_completed=book.consumed_records,
            bytes_consumed=book.consumed_bytes,
            records_skipped=book.skipped_records,
            task_failures=len(runtime.failures),
            duplicate_tasks=book.duplicates,
            epochs_started=0 if progress is None else progress.epochs_started,
            epochs_finished=0 if progress is None else progress.epochs_finished,
            quarantined_tasks=0 if progress is None else len(progress.quarantined),
            batches_delivered=clock.batches_delivered,
            loop_wait_seconds=clock.wait_seconds,
            loop_seconds=clock.loop_seconds,
            first_batch_seconds=clock.first_batch_seconds,
            reader_wait_seconds=clock.reader_wait_seconds,
            regranted_tasks=plane.lapsed_leases.tasks,
            regranted_records=plane.lapsed_leases.records,
            cpu_cores=self._cores,
            cpu_busy_share=self.probe.machine_busy_share(),
            cpu_job_cores=self.probe.job_busy_cores(sum(p.cpu_seconds for p in processes)),
        )

    def _processes(
        self, pool: ReaderPool | None, epoch: int
    ) -> tuple[list[ReaderStats], list[ProcessStats]]:
        """Each reader slot's figures, and every process of the job's (the trainer, its
        readers, their fork server, DataLoader workers), measured for ``epoch``."""
        if pool is not None:
            pool.pids()  # every running reader's pid known (a reader just forked may not be)
        reader_infos = pool.readers if pool is not None else []
        reader_pids = {r.pid for r in reader_infos}
        me = os.getpid()
        processes = [_process(me, "trainer", self.probe.usage(me, epoch))]
        children = self.probe.children()
        server = pool.server_pid if pool is not None else None
        for pid in children:
            if pid not in reader_pids:
                # The readers' fork server holds the libraries' pages they share.
                role = "reader server" if pid == server else "worker"
                processes.append(_process(pid, role, self.probe.usage(pid, epoch)))
        now = time.monotonic()
        readers = []
        for info in reader_infos:
            if info.ended is None:
                usage = self.probe.usage(info.pid, epoch)
            else:  # it exited for good: what it last used
                usage = self.probe.exited(info.pid)
            readers.append(_reader(info, usage, now))
            if usage is not None:
                processes.append(_process(info.pid, "reader", usage))
        self.probe.forget({me, *children, *reader_pids})
        return readers, processes

    def _master_progress(self, runtime: Observed) -> Progress:
        """The master's progress, asked for at most once per ``interval``."""
        at, progress = self._progress
        now = time.monotonic()
        if progress is None or now - at >= self.interval:
            progress = runtime.master_client.progress()
            self._progress = (now, progress)
        return progress


def _process(pid: int, role: str, usage: Usage | None) -> ProcessStats:
    if usage is None:
        return ProcessStats(pid, role, None)
    return ProcessStats(
        pid,
        role,
        usage.memory,
        cpu_seconds=usage.cpu_seconds,
        cpu_share=usage.cpu_share,
        alive=usage.alive,
        pss_by_epoch=usage.pss_by_epoch,
        uss_by_epoch=usage.uss_by_epoch,
    )


def _reader(info: ReaderInfo, usage: Usage | None, now: float) -> ReaderStats:
    span = ((info.ended or now) - info.since) if info.since is not None else 0.0
    return ReaderStats(
        index=info.index,
        pid=info.pid,
        restarts=info.restarts,
        tasks=info.tasks,
        records=info.records,
        bytes=info.bytes,
        failures=info.failures,
        busy_seconds=info.busy_seconds,
        budget_wait_seconds=info.budget_wait_seconds,
        busy_share=min(1.0, info.busy_seconds / span) if span > 0 else 0.0,
        budget_wait_share=min(1.0, info.budget_wait_seconds / span) if span > 0 else 0.0,
        memory=None if usage is None else usage.memory,
        alive=info.ended is None and (usage is None or usage.alive),
        cpu_share=0.0 if usage is None else usage.cpu_share,
        cached_tasks=info.cached_tasks,
    )
