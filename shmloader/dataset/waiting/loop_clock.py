"""How long the training loop waited for its batches: the figures ``ds.stats()`` reports.

``shmloader.DataLoader`` times each batch it hands the loop: the wait for it, and the step
since the batch before (waits included). The first batch's wait is the start-up (readers
starting, the first task read), kept apart from the steady figures; so is what the sampler
waited for tasks until then, so that ``reader_wait_seconds`` covers the same steps.
"""

from __future__ import annotations

import threading

from .ready import ReadyTasks


class LoopClock:
    """The loop's waits and steps, counted as ``shmloader.DataLoader`` hands batches over."""

    def __init__(self, ready: ReadyTasks) -> None:
        self._ready = ready
        self._lock = threading.Lock()
        self.first_batch_seconds: float | None = None
        self._reader_wait_before = 0.0  # the sampler's wait for tasks until the first batch
        self.wait_seconds = 0.0
        self.loop_seconds = 0.0
        self.batches_delivered = 0

    @property
    def reader_wait_seconds(self) -> float:
        """How long the sampler waited for tasks that the readers had not made ready, after
        the loop's first batch (as ``wait_seconds``)."""
        return self._ready.waited_seconds - self._reader_wait_before

    def record_wait(self, seconds: float, step: float) -> None:
        """The loop waited ``seconds`` for its next batch, in a step of ``step`` seconds since
        it got the one before (or since its pass began)."""
        with self._lock:
            self.batches_delivered += 1
            if self.first_batch_seconds is None:
                self.first_batch_seconds = seconds
                self._reader_wait_before = self._ready.waited_seconds
                return
            self.wait_seconds += seconds
            self.loop_seconds += step
