"""The shell of ``num_readers="auto"``: every ``SCALE_EVERY`` seconds it measures a window
(the sampler's wait, the readers' work, the cores this job left unused) and carries out what
:class:`~shmloader.dataset.runtime.reader_scaling.ReaderScaling` decides, on the reader pool. The
maintenance thread ticks it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from ...reader.pool import ReaderInfo, ReaderPool
from ...stats.probe import job_cpu_seconds, usable_cores
from ..accounting.plane import DataPlane
from .reader_scaling import SCALE_EVERY, ReaderScaling, Scale, ScalingWindow

log = logging.getLogger(__name__)


@dataclass
class _Mark:
    """The counters at a window's start."""

    at: float
    sampler_wait: float
    consumed: int
    busy: dict[int, float]  # reader index -> busy_seconds
    budget_wait: dict[int, float]  # reader index -> budget_wait_seconds
    cpu: float  # CPU seconds of this job's processes (probe.job_cpu_seconds)


@dataclass(eq=False)
class Autoscaler:
    pool: ReaderPool
    plane: DataPlane
    scaling: ReaderScaling
    _mark: _Mark | None = field(default=None, init=False)
    _cores: int = field(default_factory=usable_cores, init=False)

    def tick(self, now: float) -> Scale | None:
        """Close the window if it is over: decide, and add or retire a reader. Returns the
        decision (None: the window is not over)."""
        mark = self._mark
        if mark is not None and now - mark.at < SCALE_EVERY:
            return None
        self._mark = self._counters(now)
        if mark is None:
            return None
        running = self.pool.running()
        whole = [r for r in running if r.index in mark.busy and r.since is not None]
        seconds = now - mark.at
        window = ScalingWindow(
            # A wait counts when it ends, so one that began in the window before may count here.
            sampler_wait=min(1.0, (self._mark.sampler_wait - mark.sampler_wait) / seconds),
            reader_busy=_share(whole, mark.busy, lambda r: r.busy_seconds, seconds),
            reader_budget_wait=_share(
                whole, mark.budget_wait, lambda r: r.budget_wait_seconds, seconds
            ),
            spare_cores=max(0.0, self._cores - max(0.0, self._mark.cpu - mark.cpu) / seconds),
            rows_per_second=(self._mark.consumed - mark.consumed) / seconds,
        )
        decision = self.scaling.decide(len(running), window)
        seen = window.describe(self._cores)
        log.debug("num_readers='auto': %d readers, %s: %s", len(running), seen, decision.value)
        if decision is Scale.ADD:
            log.info("num_readers='auto': adding a reader to %d (%s)", len(running), seen)
            self.pool.add()
        elif decision is Scale.RETIRE:
            retired = self.pool.retire()
            if retired is not None:
                log.info(
                    "num_readers='auto': retiring reader %d of %d (%s)",
                    retired.index,
                    len(running),
                    seen,
                )
        return decision

    def _counters(self, now: float) -> _Mark:
        readers = self.pool.running()
        return _Mark(
            at=now,
            sampler_wait=self.plane.ready.waited_seconds,
            consumed=self.plane.figures().consumed_rows,
            busy={r.index: r.busy_seconds for r in readers},
            budget_wait={r.index: r.budget_wait_seconds for r in readers},
            cpu=job_cpu_seconds(),
        )


def _share(
    readers: list[ReaderInfo],
    before: dict[int, float],
    now_of: Callable[[ReaderInfo], float],
    seconds: float,
) -> float:
    """The readers' average share of ``seconds`` spent as ``now_of`` counts, since ``before``."""
    if not readers:
        return 0.0
    return sum(now_of(r) - before[r.index] for r in readers) / len(readers) / seconds
