"""``ProcessProbe``: the memory and CPU of a job's processes, cheap enough to ask every step.

Reading a process's memory maps (``/proc/PID/smaps``, for PSS) takes milliseconds, tens of
them for a trainer that maps hundreds of segments; listing a process's children scans
``/proc``. So the probe measures each process at most once per ``interval`` (and never more
often than keeps measuring each under 1% of the time) and answers from its last figures in
between: ``ds.stats()`` may be called every step. It keeps the last figures of a process
that exited, so a reader that finished still shows what it used, and each process's PSS per
epoch, so growth across epochs can be seen (``Stats.advice``).
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from dataclasses import dataclass, field

import psutil

# Seconds between two measurements of one process (and two listings of the children), at
# least; and at least this many times what measuring it took, so that measuring each process
# takes at most 1% of the time of a loop that calls stats() every step.
PROBE_INTERVAL = 1.0
COST_FACTOR = 100


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), which its job shares."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def job_cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and every live process below it: the
    trainer, its DataLoader workers, the readers' fork server and the readers. What other
    processes on the machine use is not counted: a job that shares the machine competes for
    the cores, and more processes of its own get it a larger share of them."""
    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return total


# In /proc/PID/smaps: each mapping's header line (its path last), and its Pss line.
_MAPPING = re.compile(rb"^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \S+ *(.*)$", re.MULTILINE)
_PSS = re.compile(rb"^Pss: +(\d+) kB$", re.MULTILINE)


def pss_of_mappings(pid: int, folder: str) -> int:
    """Bytes of process ``pid``'s PSS that map files in ``folder``, from ``/proc/PID/smaps``
    (read with two regular expressions: psutil's ``memory_maps`` parses it line by line in
    Python, some 20 ms for a process that maps a thousand segment files)."""
    with open(f"/proc/{pid}/smaps", "rb") as f:
        text = f.read()
    paths, pss = _MAPPING.findall(text), _PSS.findall(text)
    if len(paths) != len(pss):  # a format this does not know: count nothing rather than lie
        return 0
    # Removed files end in " (deleted)": a prefix match still finds them.
    prefix = (folder.rstrip(os.sep) + os.sep).encode()
    return 1024 * sum(int(k) for path, k in zip(paths, pss, strict=True) if path.startswith(prefix))


@dataclass(frozen=True)
class Memory:
    """One process's memory, in bytes: RSS, USS (pages only it maps), and PSS (each shared page
    split among the processes mapping it: the honest share of a job's memory)."""

    rss: int
    uss: int
    pss: int
    # The part of ``pss`` that maps this dataset's segment files.
    pss_segments: int = 0


@dataclass(frozen=True)
class Usage:
    """What the probe last measured of one process."""

    memory: Memory
    cpu_seconds: float  # user + system, over the process's life
    cpu_share: float  # cpu_seconds over its lifetime: cores it kept busy, on average
    alive: bool = True
    # The last PSS measured in each epoch of the loop, oldest first: (epoch, bytes).
    pss_by_epoch: tuple[tuple[int, int], ...] = field(default=())
    # The same of USS (the pages only this process maps): what a leak grows.
    uss_by_epoch: tuple[tuple[int, int], ...] = field(default=())


@dataclass
class _Seen:
    usage: Usage
    at: float  # time.monotonic() of the measurement
    cost: float = 0.0  # seconds it took
    epoch: int = 0  # the loop's epoch then


class ProcessProbe:
    """Measures processes (memory with the PSS of their mappings of ``segments_dir``, and
    CPU), at most once per ``interval`` each; the machine's CPU since the probe was made."""

    def __init__(self, segments_dir: str | None, *, interval: float = PROBE_INTERVAL) -> None:
        self.segments_dir = segments_dir
        self.interval = interval
        self._seen: dict[int, _Seen] = {}
        # pid -> epoch -> the last (PSS, USS) measured in it
        self._epochs: dict[int, dict[int, tuple[int, int]]] = {}
        self._children: tuple[float, list[int]] = (-float("inf"), [])
        self._cpu_start = psutil.cpu_times()
        self._cpu_last: tuple[float, float] = (0.0, 0.0)  # (busy share, at)
        # For job_busy_cores: when the probe began, the trainer's own CPU seconds before it,
        # and those of processes forgotten since (workers of earlier passes).
        self._started = time.monotonic()
        self._own_cpu_before = sum(psutil.Process().cpu_times()[:2])
        self._forgotten_cpu = 0.0

    def usage(self, pid: int, epoch: int) -> Usage | None:
        """Process ``pid``'s figures, measured now unless they are recent (under ``interval``
        old, and of this ``epoch``: each epoch gets a measurement of its own); the last ones if
        it exited since (``alive`` False); None if it was never measured."""
        now = time.monotonic()
        seen = self._seen.get(pid)
        if seen is not None and (
            not seen.usage.alive
            or (seen.epoch == epoch and now - seen.at < max(self.interval, COST_FACTOR * seen.cost))
        ):
            return seen.usage
        measured = self._measure(pid)
        if measured is None:
            return None if seen is None else self.exited(pid)
        memory, cpu_seconds, lifetime = measured
        by_epoch = self._epochs.setdefault(pid, {})
        by_epoch[epoch] = (memory.pss, memory.uss)
        measured_epochs = sorted(by_epoch.items())
        usage = Usage(
            memory,
            cpu_seconds,
            cpu_seconds / lifetime if lifetime > 0 else 0.0,
            pss_by_epoch=tuple((e, pss) for e, (pss, _) in measured_epochs),
            uss_by_epoch=tuple((e, uss) for e, (_, uss) in measured_epochs),
        )
        self._seen[pid] = _Seen(usage, now, time.monotonic() - now, epoch)
        return usage

    def exited(self, pid: int) -> Usage | None:
        """Process ``pid`` is gone: its last figures, kept, with ``alive`` False (None if it
        was never measured)."""
        seen = self._seen.get(pid)
        if seen is None:
            return None
        if seen.usage.alive:
            seen.usage = dataclasses.replace(seen.usage, alive=False)
        return seen.usage

    def children(self) -> list[int]:
        """Pids of this process's children, listed at most once per ``interval``."""
        now = time.monotonic()
        at, pids = self._children
        if now - at >= self.interval:
            pids = [c.pid for c in psutil.Process(os.getpid()).children(recursive=False)]
            self._children = (now, pids)
        return pids

    def forget(self, keep: set[int]) -> None:
        """Drop the figures of processes not in ``keep`` (workers of an earlier pass)."""
        for pid in [p for p in self._seen if p not in keep]:
            self._forgotten_cpu += self._seen[pid].usage.cpu_seconds
            del self._seen[pid]
            self._epochs.pop(pid, None)

    def job_busy_cores(self, cpu_seconds: float) -> float:
        """Cores this job kept busy on average since the probe was made: ``cpu_seconds`` of
        its processes measured now (the trainer's included) and of those forgotten since, less
        what the trainer used before."""
        elapsed = time.monotonic() - self._started
        used = cpu_seconds + self._forgotten_cpu - self._own_cpu_before
        return max(0.0, used / elapsed) if elapsed > 0 else 0.0

    def machine_busy_share(self) -> float:
        """The share of the machine's CPU time that was busy (any process) since the probe was
        made, refreshed at most once per ``interval``."""
        now = time.monotonic()
        share, at = self._cpu_last
        if at and now - at < self.interval:
            return share
        end = psutil.cpu_times()
        total = sum(end) - sum(self._cpu_start)
        idle = (end.idle + getattr(end, "iowait", 0.0)) - (
            self._cpu_start.idle + getattr(self._cpu_start, "iowait", 0.0)
        )
        share = max(0.0, min(1.0, 1.0 - idle / total)) if total > 0 else 0.0
        self._cpu_last = (share, now)
        return share

    def _measure(self, pid: int) -> tuple[Memory, float, float] | None:
        """(memory, CPU seconds, seconds alive) of ``pid``, or None if it is gone or hidden."""
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                info = proc.memory_full_info()
                cpu = proc.cpu_times()
                lifetime = time.time() - proc.create_time()
            mapped = 0 if self.segments_dir is None else pss_of_mappings(pid, self.segments_dir)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            return None
        if info.rss == 0:
            # A process that exited and was not reaped yet (a zombie) reads as empty: its
            # figures are the last ones measured, not zeros ("PSS 0.0 MiB").
            return None
        pss = getattr(info, "pss", info.uss)
        memory = Memory(rss=info.rss, uss=info.uss, pss=pss, pss_segments=mapped)
        return memory, cpu.user + cpu.system, lifetime
