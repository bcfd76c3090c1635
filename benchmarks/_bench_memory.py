"""PSS of a process tree, sampled from a thread while a benchmark runs.

PSS (proportional set size) splits every shared page among the processes that map it, so the
sum over trainer + workers + readers counts shared memory once: the honest figure for what the
job costs. Segments in /dev/shm that no process maps are in nobody's PSS; ``shm_dir`` adds
their size as a separate figure so they are not hidden.
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


def pss_by_role() -> dict[str, int]:
    """PSS (bytes) of this process ("trainer") and its descendants, summed per role."""
    me = psutil.Process()
    out = {"trainer": me.memory_full_info().pss, "worker": 0, "reader": 0}
    for child in me.children(recursive=True):
        role = role_of(child)
        try:
            pss = child.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if role in out:
            out[role] += pss
    return out


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


@dataclass
class Sampler:
    """Samples every ``interval`` seconds; ``peak()`` since the last ``mark()``."""

    interval: float = 0.5
    shm_dir: str | None = None
    samples: list[tuple[dict[str, int], int]] = field(default_factory=list)
    _since: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, name="pss-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        self.samples.append((pss_by_role(), dir_bytes(self.shm_dir)))

    def mark(self) -> dict[str, float]:
        """Peak PSS per role (MiB) and of the total, over the samples since the last mark."""
        self.sample()
        window, self._since = self.samples[self._since :], len(self.samples)
        peak = {role: max(s[0][role] for s in window) / MiB for role in window[-1][0]}
        peak["total"] = max(sum(s[0].values()) for s in window) / MiB
        peak["shm_files"] = max(s[1] for s in window) / MiB
        return peak

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
