"""``num_readers="auto"``: how many readers a trainer runs, decided from what it sees.

The decision is a pure function of the figures of windows of a few seconds
(:class:`ScalingWindow`), so it can be read, and tested, apart from the thread that gathers
them and starts or retires readers (``autoscale.py``). It climbs:

- **add** a reader when the sampler waited for the readers in over ``WAITED`` of the window,
  the readers were busy (reading, not waiting for room) over ``BUSY`` of theirs, and this
  job left at least ``FREE_CORES`` of the cores it may run on unused. The job's own use, not
  the machine's idle time: where other jobs load the machine, the kernel shares its cores
  among the processes, and one reader more gets this job a larger share;
- **keep it** only if it paid: ``COOLDOWN_WINDOWS`` after adding, the loop must consume at
  least ``GAIN`` more rows per second than in the window before; otherwise the reader is
  **retired** again, and the count it had is the ceiling for ``CEILING_WINDOWS`` windows
  (the readers were short of something more readers do not bring: cores, memory bandwidth,
  the master);
- **retire** one when, for ``IDLE_WINDOWS`` windows in a row, the sampler hardly waited
  (under ``HARDLY``) and the others could do the readers' work busy under ``TAKE_OVER`` of
  their time (busy share times n, over n - 1): the loop does not need that many;
- otherwise hold. Windows in which the loop consumed nothing (between epochs, evaluating,
  saving) say nothing and are passed over.

Readers waiting for room in the budget are not short of CPU: more of them would only wait
too, so they are never a reason to add one. The count stays within ``[low, high]``:
1 and the number of cores this process may run on (``auto_bounds``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ...stats.probe import usable_cores

SCALE_EVERY = 2.0  # seconds of a window
WAITED = 0.10
BUSY = 0.60
FREE_CORES = 0.25
GAIN = 0.05
COOLDOWN_WINDOWS = 1
CEILING_WINDOWS = 30
HARDLY = 0.02
TAKE_OVER = 0.80
IDLE_WINDOWS = 2


class Scale(enum.Enum):
    ADD = "add"
    RETIRE = "retire"
    HOLD = "hold"


@dataclass(frozen=True)
class ScalingWindow:
    """What one window showed. Shares are of the window's time (readers': averaged over the
    readers that ran all of it)."""

    sampler_wait: float  # the sampler waited for tasks the readers had not made ready
    reader_busy: float
    reader_budget_wait: float
    spare_cores: float  # of the cores this process may run on, those the job left unused
    rows_per_second: float  # what the loop consumed

    def describe(self, cores: int) -> str:
        """The window in words, for the log."""
        return (
            f"the sampler waited {self.sampler_wait:.0%} of the last window for the readers, "
            f"which were busy {self.reader_busy:.0%} and waited for room "
            f"{self.reader_budget_wait:.0%}; this job left {self.spare_cores:.1f} of {cores} "
            f"cores unused; the loop took {self.rows_per_second:,.0f} rows/s"
        )


def auto_bounds() -> tuple[int, int]:
    """The fewest and most readers ``num_readers="auto"`` runs: 1, and the cores this process
    may run on."""
    return 1, usable_cores()


@dataclass
class ReaderScaling:
    """Decides, window by window, whether to add a reader, retire one, or hold."""

    low: int
    high: int
    _cooldown: int = 0
    _idle: int = 0
    _before: float | None = None  # rows/s in the window before the last reader was added
    _ceiling: int | None = None  # what adding failed to pass, for _ceiling_left windows
    _ceiling_left: int = 0

    def decide(self, readers: int, window: ScalingWindow) -> Scale:
        if window.rows_per_second <= 0:
            self._idle = 0
            return Scale.HOLD
        if self._ceiling_left > 0:
            self._ceiling_left -= 1
            if self._ceiling_left == 0:
                self._ceiling = None
        if self._cooldown > 0:
            self._cooldown -= 1
            return Scale.HOLD
        if self._before is not None:  # the first window after adding one: did it pay?
            before, self._before = self._before, None
            if window.rows_per_second < before * (1 + GAIN) and readers > self.low:
                self._ceiling, self._ceiling_left = readers - 1, CEILING_WINDOWS
                return self._changed(Scale.RETIRE)
        most = self.high if self._ceiling is None else min(self.high, self._ceiling)
        if (
            readers < most
            and window.sampler_wait > WAITED
            and window.reader_busy > BUSY
            and window.spare_cores >= FREE_CORES
        ):
            self._before = window.rows_per_second
            return self._changed(Scale.ADD)
        if (
            readers > self.low
            and window.sampler_wait < HARDLY
            and window.reader_busy * readers / (readers - 1) < TAKE_OVER
        ):
            self._idle += 1
            if self._idle >= IDLE_WINDOWS:
                return self._changed(Scale.RETIRE)
            return Scale.HOLD
        self._idle = 0
        return Scale.HOLD

    def _changed(self, scale: Scale) -> Scale:
        self._cooldown = COOLDOWN_WINDOWS
        self._idle = 0
        return scale
