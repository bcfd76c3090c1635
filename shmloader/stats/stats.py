"""``Stats``: one snapshot of what a dataset is doing and what it costs.

Memory is measured with psutil per process (RSS, USS, and PSS, which splits shared pages among
the processes mapping them: the honest figure for "how much does this job use", since shared
memory segments are mapped by several processes at once). Segment files are memory whether
or not anyone maps them, gathering processes keep mappings of released segments for reuse
(``shm/kept.py``) and readers keep mappings of the files they wrote (``shm/written.py``),
so :attr:`Stats.total_memory` counts the store's files once, as files, and the processes' PSS
without their mappings of them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import psutil

from ..shm.space import space

if TYPE_CHECKING:
    from ..dataset.dataset import SharedTaskDataset


@dataclass(frozen=True)
class Memory:
    rss: int
    uss: int
    pss: int
    # The part of ``pss`` that maps this dataset's segment files.
    pss_segments: int = 0


@dataclass(frozen=True)
class ProcessStats:
    pid: int
    role: str  # "trainer", "reader", "worker"
    memory: Memory | None


@dataclass(frozen=True)
class ReaderStats:
    index: int
    pid: int
    restarts: int
    tasks: int
    records: int
    bytes: int
    failures: int
    busy_seconds: float
    memory: Memory | None


@dataclass(frozen=True)
class Stats:
    """What ``SharedTaskDataset.stats()`` saw at one moment; ``print()`` it for a summary.

    Counts marked "master" are the whole job's (every trainer of a shared master); the others
    are this trainer's, since it started.

    - ``readers``: one ``ReaderStats`` per reader slot (pid, restarts, tasks, records, bytes,
      failures, busy seconds, memory); ``processes``: the trainer, its DataLoader workers and
      readers with their ``Memory`` (None when it could not be measured: it exited, or
      access was denied).
    - ``shm_in_use``: bytes of segments in the store now, written or being written;
      ``shm_budget``: the most it may hold; ``shm_spare``: released segment files kept for
      readers to write into again (counted in the budget, not in ``shm_in_use``);
      ``shm_free``: bytes free on the store's filesystem, for every process on the machine.
    - ``records_consumed``: rows of the tasks this trainer completed (a task counts once all
      its rows were consumed); ``records_skipped``: records the source left out of those tasks
      under ``on_error="skip"``.
    - ``task_failures``: tasks this trainer's readers reported failing (a read or decode error;
      a reader that dies shows in its ``restarts`` instead).
    - ``duplicate_tasks``: tasks that arrived twice (a lease lapsed while a reader still read
      it, and another reader read it again); the second copy was dropped, so no row doubled.
    - ``regranted_tasks``, ``regranted_records``: tasks this trainer's sampler took whose lease
      lapsed (nobody renewed it for the master's ``lease_timeout``: this process or its reader
      stalled) and that the master handed to another trainer, which delivers them too; and
      their rows that this trainer delivers: those may reach training twice in their epoch
      (each task is also logged as a warning). 0 unless a lease lapsed.
    - ``epochs_started``, ``epochs_finished`` (master): epochs the master opened and finished.
      Readers lease ahead, so the master is often one epoch ahead of the loop; a job resumed
      at epoch e counts the epochs before e as started, not as finished.
    - ``quarantined_tasks`` (master): tasks that exhausted their retries, summed over epochs.
    - ``batches_delivered``, ``loop_wait_seconds``: batches the loop received and how long it
      waited for them, from asking for a batch to receiving it (``shmloader.DataLoader`` only:
      0 with a plain DataLoader, whose loop the dataset cannot see).
    - ``notes``: lines added to the printed summary; ``stats()`` leaves it empty.
    """

    readers: list[ReaderStats]
    processes: list[ProcessStats]
    shm_in_use: int
    shm_budget: int
    shm_free: int
    records_consumed: int
    records_skipped: int
    task_failures: int
    duplicate_tasks: int
    epochs_started: int
    epochs_finished: int
    quarantined_tasks: int
    # Released segments kept for readers to write into again (within the budget).
    shm_spare: int = 0
    # Measured by shmloader.DataLoader only (a plain DataLoader hides its loop from us).
    batches_delivered: int = 0
    loop_wait_seconds: float = 0.0
    # Lapsed leases whose tasks another trainer delivers too (elastic mode).
    regranted_tasks: int = 0
    regranted_records: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def total_pss(self) -> int:
        """PSS of the trainer, its DataLoader workers and its readers together."""
        return sum(p.memory.pss for p in self.processes if p.memory is not None)

    @property
    def total_memory(self) -> int:
        """What the job holds, every page once: the processes' PSS without their mappings of
        segment files, plus all segment files (in use and spare)."""
        mapped = sum(p.memory.pss_segments for p in self.processes if p.memory is not None)
        return self.total_pss - mapped + self.shm_in_use + self.shm_spare

    def __str__(self) -> str:
        mib = 1 << 20
        lines = [
            f"shm: {self.shm_in_use / mib:.1f} MiB in use of {self.shm_budget / mib:.1f} MiB "
            f"budget, {self.shm_spare / mib:.1f} MiB kept for reuse "
            f"({self.shm_free / mib:.0f} MiB free on the filesystem)",
            f"records consumed: {self.records_consumed}, skipped: {self.records_skipped}, "
            f"task failures: {self.task_failures}, quarantined: {self.quarantined_tasks}",
            f"epochs started/finished at the master: {self.epochs_started}/{self.epochs_finished}",
            f"memory (PSS) of trainer + workers + readers: {self.total_pss / mib:.1f} MiB; "
            f"with the segment files, each page once: {self.total_memory / mib:.1f} MiB",
        ]
        if self.regranted_tasks:
            lines.append(
                f"rows that may have come twice: {self.regranted_records}, of "
                f"{self.regranted_tasks} tasks whose lease lapsed and went to another trainer"
            )
        if self.batches_delivered:
            lines.append(
                f"training loop waited {self.loop_wait_seconds:.2f} s for data over "
                f"{self.batches_delivered} batches"
            )
        for r in self.readers:
            pss = f"{r.memory.pss / mib:.1f} MiB" if r.memory else "-"
            if r.memory and r.memory.pss_segments:
                # Readers keep the files they wrote mapped (shm/written.py): say how much of
                # their PSS is those files, which the total above counts once, as files.
                pss += f" ({r.memory.pss_segments / mib:.1f} MiB of it segment files)"
            lines.append(
                f"  reader {r.index} pid {r.pid}: {r.tasks} tasks, {r.records} records, "
                f"busy {r.busy_seconds:.1f} s, restarts {r.restarts}, PSS {pss}"
            )
        lines.extend(self.notes)
        return "\n".join(lines)


def memory_of(pid: int, segments_dir: str | None = None) -> Memory | None:
    """Memory of process ``pid``; with ``segments_dir``, also the PSS of its mappings of
    files in that folder (from ``/proc/PID/smaps``: milliseconds per process, tens of them
    for a trainer that maps hundreds of segments)."""
    try:
        proc = psutil.Process(pid)
        info = proc.memory_full_info()
        mapped = 0
        if segments_dir is not None and hasattr(proc, "memory_maps"):
            prefix = segments_dir.rstrip(os.sep) + os.sep  # removed files end in " (deleted)"
            maps = proc.memory_maps(grouped=True)
            mapped = sum(m.pss for m in maps if m.path.startswith(prefix))
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    pss = getattr(info, "pss", info.uss)
    return Memory(rss=info.rss, uss=info.uss, pss=pss, pss_segments=mapped)


def collect_stats(ds: SharedTaskDataset) -> Stats:
    runtime = ds.runtime
    runtime.plane.poll()  # count what workers gathered up to now, not up to the last tick
    pool = runtime.pool
    reader_infos = pool.readers if pool is not None else []
    reader_pids = {r.pid for r in reader_infos}
    handle = runtime.store.handle()
    me = os.getpid()
    processes = [ProcessStats(me, "trainer", memory_of(me, handle.path))]
    for child in psutil.Process(me).children(recursive=False):
        role = "reader" if child.pid in reader_pids else "worker"
        processes.append(ProcessStats(child.pid, role, memory_of(child.pid, handle.path)))
    measured = {p.pid: p.memory for p in processes}  # smaps is slow: read each process once
    readers = [
        ReaderStats(
            index=r.index,
            pid=r.pid,
            restarts=r.restarts,
            tasks=r.tasks,
            records=r.records,
            bytes=r.bytes,
            failures=r.failures,
            busy_seconds=r.busy_seconds,
            memory=measured[r.pid] if r.pid in measured else memory_of(r.pid, handle.path),
        )
        for r in reader_infos
    ]
    progress = runtime.master_client.progress()
    in_use = handle.in_use()
    return Stats(
        readers=readers,
        processes=processes,
        shm_in_use=in_use,
        shm_spare=handle.held() - in_use,
        shm_budget=handle.budget,
        shm_free=space(handle.base_dir).free,
        records_consumed=runtime.plane.consumed_records,
        records_skipped=runtime.plane.skipped_records,
        task_failures=len(runtime.failures),
        duplicate_tasks=runtime.plane.duplicates,
        epochs_started=progress.epochs_started,
        epochs_finished=progress.epochs_finished,
        quarantined_tasks=len(progress.quarantined),
        batches_delivered=runtime.plane.batches_delivered,
        loop_wait_seconds=runtime.plane.wait_seconds,
        regranted_tasks=runtime.plane.lapsed_leases.tasks,
        regranted_records=runtime.plane.lapsed_leases.records,
    )
