"""PSS and CPU time of a process tree, sampled from a thread while a benchmark runs.

PSS (proportional set size) splits every shared page among the processes that map it, so the
sum over trainer + workers + readers counts shared memory once: the honest figure for what the
job costs. Segments in /dev/shm that no process maps are in nobody's PSS; ``shm_dir`` adds
their size as a separate figure so they are not hidden.

"Every page once" adds the two without overlap: the processes' PSS minus the PSS of their
shared-memory mappings (``Pss_Shmem`` of ``/proc/PID/smaps_rollup``: the store's segments,
and in DataLoader setups a few MiB of torch's shared batches), plus the store's files.

CPU time (user + system, per role) between two marks, divided by the samples delivered, is
the cost of a sample across every process: steadier from run to run than samples/s, which on
two shared cores moves with how the scheduler places three busy processes.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

import psutil

MiB = 1 << 20


def role_of(proc: psutil.Process) -> str:
    try:
        cmdline = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "gone"
    return "reader" if "shmloader.reader" in cmdline else "worker"


def usage_by_role(
    shm_dir: str | None = None,
) -> tuple[dict[str, int], dict[str, float], dict[str, int]]:
    """PSS (bytes) and CPU seconds so far of this process ("trainer") and its descendants,
    summed per role; with ``shm_dir``, also the part of each role's PSS that maps shared
    memory."""
    pss = {"trainer": 0, "worker": 0, "reader": 0}
    cpu = {"trainer": 0.0, "worker": 0.0, "reader": 0.0}
    mapped = {"trainer": 0, "worker": 0, "reader": 0}
    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        role = "trainer" if proc is me else role_of(proc)
        if role not in pss:
            continue
        try:
            pss[role] += proc.memory_full_info().pss
            times = proc.cpu_times()
            if shm_dir:
                mapped[role] += shmem_pss(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        cpu[role] += times.user + times.system
    return pss, cpu, mapped


def shmem_pss(pid: int) -> int:
    """PSS (bytes) of a process's shared-memory mappings, from ``smaps_rollup``.

    Cheap (one short file), unlike a walk of ``smaps`` per mapping (``psutil.memory_maps``),
    which took tens of milliseconds in a trainer that maps hundreds of segments and showed
    as a quarter of its CPU time at two samples a second. Besides the store's segments it
    counts the few batches of torch shared memory a worker hands over, a few MiB.
    """
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss_Shmem:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def dir_bytes(path: str | None) -> int:
    """Bytes of the files under ``path`` (the shmloader store: tmpfs memory)."""
    if not path:
        return 0
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                continue
    return total


def once(sample: tuple[dict[str, int], int, dict[str, float], dict[str, int]]) -> int:
    """A sample's every-page-once bytes: the processes' PSS without their mappings of the
    store's files, plus those files (mapped or not, each counted once, whoever maps it)."""
    pss, files, _cpu, mapped = sample
    return sum(pss.values()) - sum(mapped.values()) + files


@dataclass
class Sampler:
    """Samples every ``interval`` seconds; ``peak()`` since the last ``mark()``."""

    interval: float = 0.5
    shm_dir: str | None = None
    samples: list[tuple[dict[str, int], int, dict[str, float], dict[str, int]]] = field(
        default_factory=list
    )
    _since: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Sampler:
        self.sample()  # the zero point of the first window's CPU time
        self._thread = threading.Thread(target=self._run, name="pss-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        pss, cpu, mapped = usage_by_role(self.shm_dir)
        self.samples.append((pss, dir_bytes(self.shm_dir), cpu, mapped))

    def mark(self) -> tuple[dict[str, float], dict[str, float]]:
        """Peak PSS per role (MiB) and of the total, over the samples since the last mark;
        and CPU seconds per role spent since the last mark."""
        before = self.samples[max(self._since - 1, 0)][2]
        self.sample()
        window, self._since = self.samples[self._since :], len(self.samples)
        peak = {role: max(s[0][role] for s in window) / MiB for role in window[-1][0]}
        peak["total"] = max(sum(s[0].values()) for s in window) / MiB
        peak["shm_files"] = max(s[1] for s in window) / MiB
        peak["once"] = max(once(s) for s in window) / MiB
        # A restarted process starts from zero again: never count negative time.
        after = window[-1][2]
        cpu = {role: max(after[role] - before.get(role, 0.0), 0.0) for role in after}
        return peak, cpu

    def parts_at_peak(self) -> dict[str, float]:
        """Where the memory of the sample with the highest every-page-once figure (over the
        whole run) was, in MiB: each role's PSS less its mappings of the store's files, and
        those files apart ("store")."""
        pss, files, _cpu, mapped = max(self.samples, key=once)
        parts = {role: (pss[role] - mapped[role]) / MiB for role in pss}
        parts["store"] = files / MiB
        return parts

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
