"""``Stats``: one snapshot of what a dataset is doing and what it costs.

Memory is measured with psutil per process (RSS, USS, and PSS, which splits shared pages among
the processes mapping them: the honest figure for "how much does this job use", since shared
memory segments are mapped by several processes at once). Segment files are memory whether
or not anyone maps them, gathering processes keep mappings of released segments for reuse
(``shm/spare_maps.py``) and readers keep mappings of the files they wrote (``shm/written.py``),
so :attr:`Stats.total_memory` counts the store's files once, as files, and the processes' PSS
without their mappings of them.

The figures are made by ``collect.py``; what they mean for tuning, in words, by
``advice.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..master.figures import TrainerFigures
from . import advice as rules
from .probe import Memory

MIB = rules.MIB  # one definition, in the rules (which cannot import this module)


@dataclass(frozen=True)
class ProcessStats:
    """One process of the job: its role, memory (None: never measured, e.g. access denied)
    and CPU. A reader that exited keeps its last figures, with ``alive`` False."""

    pid: int
    role: str  # "trainer", "reader", "worker", "reader server" (forkserver.py)
    memory: Memory | None
    cpu_seconds: float = 0.0  # user + system, over its life
    cpu_share: float = 0.0  # cores it kept busy on average over its life (1.0: one core)
    alive: bool = True
    # The last PSS measured in each epoch of the loop, oldest first: (epoch, bytes). Measured
    # when stats() is called, so it holds the epochs in which it was.
    pss_by_epoch: tuple[tuple[int, int], ...] = ()
    # The same of USS, the pages only this process maps: what a leak grows, whatever other
    # processes map the same libraries (which moves PSS, splitting shared pages among them).
    uss_by_epoch: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class ReaderStats:
    """One reader slot: what its readers (the first and any restarted in its place) did."""

    index: int
    pid: int
    restarts: int
    tasks: int
    records: int
    bytes: int
    failures: int
    busy_seconds: float  # reading, decoding and writing tasks
    memory: Memory | None
    budget_wait_seconds: float = 0.0  # waiting for room in the shm budget
    # busy_seconds and budget_wait_seconds as shares of the slot's time since it began its first
    # task (until its last reader exited).
    busy_share: float = 0.0
    budget_wait_share: float = 0.0
    alive: bool = True
    cpu_share: float = 0.0  # the current reader's, as ProcessStats.cpu_share
    cached_tasks: int = 0  # of tasks, those served from the cache (cache=True): not read

    @property
    def room_wait_seconds(self) -> float:
        """Deprecated: ``budget_wait_seconds``."""
        return self.budget_wait_seconds

    @property
    def room_wait_share(self) -> float:
        """Deprecated: ``budget_wait_share``."""
        return self.budget_wait_share


@dataclass(frozen=True)
class Stats:
    """What ``SharedTaskDataset.stats()`` saw at one moment; ``print()`` it for a summary and
    :meth:`advice` for what to change.

    Counts marked "master" are the whole job's (every trainer of a shared master); the others
    are this trainer's, since it started. Memory and CPU figures are at most a second old
    (``probe.py``); counts are exact at the call.

    - ``readers``: one ``ReaderStats`` per reader slot (pid, restarts, tasks, records, bytes,
      failures, busy and budget-wait seconds and shares, memory); ``processes``: the trainer,
      its DataLoader workers and readers, with their ``Memory`` and CPU. Readers that exited
      keep their last figures (``alive`` False) and count in the totals.
    - ``shm_in_use``: bytes of segments in the store now, written or being written;
      ``shm_peak``: the most it held at once; ``shm_budget``: the most it may hold;
      ``shm_spare``: released segment files kept for readers to write into again (counted in
      the budget, not in ``shm_in_use``); ``shm_cached``: decoded tasks kept for the next
      epochs (``cache=True``; counted in the budget, not in ``shm_in_use``); ``shm_free``:
      bytes free on the store's filesystem, for every process on the machine.
      ``tasks_from_cache``: tasks the readers served from that cache, without reading;
      ``tasks_decoded_again``: tasks read and decoded again because the cache no longer held
      them (a budget too small to keep them all); ``cache_wanted``: the bytes of every task
      decoded so far, what the cache needs to keep them all.
    - ``records_consumed``: rows this trainer's loop consumed, counted as they are (delivered
      to the loop under ``shmloader.DataLoader`` or a plain DataLoader given
      ``batch_sampler=``; gathered by a worker under a plain one given ``sampler=``).
      ``bytes_consumed``: what those rows weigh in shared memory (each row its segment's
      share of the segment's size). ``records_completed``: rows of the tasks completed at
      the master (a task counts once all its rows were consumed). ``records_skipped``:
      records the source left out of those tasks under ``on_error="skip"``.
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
    - ``batches_delivered``, ``loop_wait_seconds``, ``loop_seconds``: batches the loop
      received, how long it waited for them (from asking for a batch to receiving it), and how
      long its steps took, waits included; ``first_batch_seconds``: the wait for the very
      first batch (start-up: readers starting, the first task read), left out of the other
      two. ``shmloader.DataLoader`` only: 0 and None with a plain DataLoader, whose loop the
      dataset cannot see. :attr:`loop_wait_share` is the wait over the steps' time.
      ``reader_wait_seconds``: of the wait, how long the sampler waited for tasks the readers
      had not made ready yet (the rest is gathering batches and handing them over);
      :attr:`reader_wait_share` over the steps' time too.
    - ``cpu_cores``: the cores this process may run on (its CPU affinity), which its readers
      and workers share; ``cpu_job_cores``: how many of them this job's processes (the
      trainer, its DataLoader workers, the readers and their fork server) kept busy on
      average since the dataset started; ``cpu_busy_share``: the share of the machine's time
      that was busy, any process's. Advice reads the job's figure: on a machine other jobs
      load, more readers of this job still get it a larger share of the cores.
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
    shm_spare: int = 0
    shm_cached: int = 0
    tasks_decoded_again: int = 0
    cache_wanted: int = 0
    shm_peak: int = 0
    records_completed: int = 0
    bytes_consumed: int = 0
    batches_delivered: int = 0
    loop_wait_seconds: float = 0.0
    loop_seconds: float = 0.0
    first_batch_seconds: float | None = None
    reader_wait_seconds: float = 0.0
    regranted_tasks: int = 0
    regranted_records: int = 0
    cpu_cores: int = 1
    cpu_busy_share: float = 0.0
    cpu_job_cores: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def loop_wait_share(self) -> float | None:
        """The share of the loop's time spent waiting for data (None: no loop seen)."""
        if self.batches_delivered < 2 or self.loop_seconds <= 0:
            return None
        return min(1.0, self.loop_wait_seconds / self.loop_seconds)

    @property
    def reader_wait_share(self) -> float | None:
        """The share of the loop's time spent waiting on the readers (None: no loop seen)."""
        if self.loop_wait_share is None:
            return None
        return min(1.0, self.reader_wait_seconds / self.loop_seconds)

    @property
    def tasks_from_cache(self) -> int:
        """Tasks the readers served from the cache (``cache=True``), without reading."""
        return sum(r.cached_tasks for r in self.readers)

    @property
    def total_pss(self) -> int:
        """PSS of the trainer, its DataLoader workers and its readers together."""
        return sum(p.memory.pss for p in self.processes if p.memory is not None)

    @property
    def total_memory(self) -> int:
        """What the job holds, every page once: the processes' PSS without their mappings of
        segment files, plus all segment files (in use, spare and cached)."""
        mapped = sum(p.memory.pss_segments for p in self.processes if p.memory is not None)
        return self.total_pss - mapped + self.shm_in_use + self.shm_spare + self.shm_cached

    def figures(self) -> TrainerFigures:
        """What a trainer's heartbeat carries to its master, for the master's ``/metrics``."""
        by_role: dict[str, int] = {}
        for p in self.processes:
            if p.memory is not None:
                by_role[p.role] = by_role.get(p.role, 0) + p.memory.pss
        return TrainerFigures(
            records_consumed=self.records_consumed,
            bytes_consumed=self.bytes_consumed,
            bytes_read=sum(r.bytes for r in self.readers),
            batches=self.batches_delivered,
            loop_seconds=self.loop_seconds,
            loop_wait_seconds=self.loop_wait_seconds,
            reader_wait_seconds=self.reader_wait_seconds,
            shm_in_use_bytes=self.shm_in_use,
            shm_budget_bytes=self.shm_budget,
            pss_bytes=by_role,
            readers=sum(r.alive for r in self.readers),
            records_skipped=self.records_skipped,
        )

    def advice(self) -> list[str]:
        """What to change, in plain words, each backed by the figures it quotes; empty when
        nothing stands out. See ``shmloader/stats/advice.py`` for the rules."""
        return rules.advice(self)

    def _cache_lines(self) -> list[str]:
        """The cache's line of the summary (``cache=True``), none when nothing is cached."""
        served = self.tasks_from_cache
        if not self.shm_cached and not served:
            return []
        tasks = sum(r.tasks for r in self.readers)
        again = f", {self.tasks_decoded_again} decoded again" if self.tasks_decoded_again else ""
        return [
            f"cache: {self.shm_cached / MIB:.1f} MiB of decoded tasks kept (of "
            f"{self.cache_wanted / MIB:.1f} MiB decoded); {served} of {tasks} tasks served "
            f"from it, not read{again}"
        ]

    def __str__(self) -> str:
        lines = [
            f"shm: {self.shm_in_use / MIB:.1f} MiB in use (peak {self.shm_peak / MIB:.1f}) of "
            f"{self.shm_budget / MIB:.1f} MiB budget, {self.shm_spare / MIB:.1f} MiB kept for "
            f"reuse ({self.shm_free / MIB:.0f} MiB free on the filesystem)",
            *self._cache_lines(),
            f"records consumed: {self.records_consumed} (of completed tasks: "
            f"{self.records_completed}), skipped: {self.records_skipped}, "
            f"task failures: {self.task_failures}, quarantined: {self.quarantined_tasks}",
            f"epochs at the master: {self.epochs_finished} finished, {self.epochs_started} "
            "begun (readers lease ahead of the loop)",
            f"memory (PSS) of trainer + workers + readers: {self.total_pss / MIB:.1f} MiB; "
            f"with the segment files, each page once: {self.total_memory / MIB:.1f} MiB",
            f"CPU: this job kept {self.cpu_job_cores:.1f} of {self.cpu_cores} cores busy since "
            f"the start (the machine's were {self.cpu_busy_share:.0%} busy, any process)",
        ]
        if self.regranted_tasks:
            lines.append(
                f"rows that may have come twice: {self.regranted_records}, of "
                f"{self.regranted_tasks} tasks whose lease lapsed and went to another trainer"
            )
        share = self.loop_wait_share
        if share is not None:
            first = self.first_batch_seconds or 0.0
            lines.append(
                f"training loop: waited {first:.2f} s for its first batch (from its first "
                f"ask), then {self.loop_wait_seconds:.2f} s for data over "
                f"{self.batches_delivered - 1} batches: {share:.0%} of its time, "
                f"{self.reader_wait_share or 0.0:.0%} waiting for the readers"
            )
        for r in self.readers:
            pss = f"{r.memory.pss / MIB:.1f} MiB" if r.memory else "-"
            if r.memory and r.memory.pss_segments:
                # Readers keep the files they wrote mapped (shm/written.py): say how much of
                # their PSS is those files, which the total above counts once, as files.
                pss += f" ({r.memory.pss_segments / MIB:.1f} MiB of it segment files)"
            lines.append(
                f"  reader {r.index} pid {r.pid}{'' if r.alive else ' (exited)'}: "
                f"{r.tasks} tasks, {r.records} records, busy {r.busy_seconds:.1f} s "
                f"({r.busy_share:.0%}), waiting for room {r.budget_wait_share:.0%}, "
                f"restarts {r.restarts}, PSS {pss}"
            )
        lines.extend(self.notes)
        return "\n".join(lines)
