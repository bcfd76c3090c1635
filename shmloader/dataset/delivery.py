"""What a plain ``torch.utils.data.DataLoader`` with workers delivered, told by its requests.

The dataset never sees a batch reach the training loop of a plain DataLoader: workers gather
batches ahead (``prefetch_factor`` each) and torch hands them over in the main process. Counting
rows as consumed when a worker gathers them loses the prefetched batches when the loop stops
early (``break``) or saves a checkpoint. But torch's multiprocessing iterator asks its batch
sampler for the next batch at fixed moments: ``prefetch_factor * num_workers`` times when it
starts, then once each time it returns a batch to the loop, just before returning it, also
after the sampler is exhausted. So the ``n``-th request (from 0) says that batch
``n - prefetch_factor * num_workers`` reaches the loop now: :class:`Requests` counts them.

That holds for a map-style dataset with ``in_order=True`` (the default); the loader is found
on the call stack when torch asks for the sampler's iterator (:func:`prefetch_depth`). Batches
of such a pass travel as :class:`TrackedBatch` so that the workers' ledger says "gathered", not
"consumed" (ledger.py), and a row counts as consumed once it was both gathered and received.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Iterator
from types import FrameType

import numpy as np
import torch.utils.data

# Frames searched above ``iter(batch_sampler)`` for the DataLoader that asks: torch creates the
# iterator two or three calls below ``DataLoader.__iter__``.
_FRAMES = 8


class TrackedBatch(np.ndarray):
    """A batch of sample indices whose rows count as consumed when the loop receives the batch
    (told by torch's requests, :class:`Requests`), not when a worker gathers it. A plain int64
    array otherwise; pickled to workers as this class."""


def tracked(batch: np.ndarray) -> TrackedBatch:
    return batch.view(TrackedBatch)


def prefetch_depth(batch_sampler: object) -> int | None:
    """How many batches the DataLoader that is asking for ``batch_sampler``'s iterator has
    requested ahead of the one its loop receives: ``prefetch_factor * num_workers``; 0 without
    workers (the loop receives each batch as it is gathered, in the same process). None when
    that cannot be told: no DataLoader found asking, an iterable-style dataset, or
    ``in_order=False`` (batches come in the order workers finish them)."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(_FRAMES):
        if frame is None:
            return None
        for name in ("loader", "self"):
            loader = frame.f_locals.get(name)
            if (
                isinstance(loader, torch.utils.data.DataLoader)
                and loader.batch_sampler is batch_sampler
            ):
                return _depth(loader)
        frame = frame.f_back
    return None


def _depth(loader: torch.utils.data.DataLoader[object]) -> int | None:
    if isinstance(loader.dataset, torch.utils.data.IterableDataset):
        return None
    if not getattr(loader, "in_order", True):
        return None
    if loader.num_workers == 0:
        return 0
    return int(loader.prefetch_factor or 2) * loader.num_workers


class Requests:
    """The iterator a plain DataLoader gets from a batch sampler (``TaskBatchSampler``): its
    batches, and for each request from ``depth`` on, the batch issued ``depth`` requests
    earlier handed to ``received`` (torch returns it to the loop now). Requests after the
    batches ran out still count: torch makes one per batch it returns."""

    def __init__(
        self,
        batches: Iterator[np.ndarray],
        depth: int,
        issued: deque[np.ndarray],
        received: Callable[[np.ndarray], None],
    ) -> None:
        self._batches = batches
        self._depth = depth
        self._issued = issued  # the batcher appends each batch it issues
        self._received = received
        self._requests = 0
        self._done = False

    def __iter__(self) -> Requests:
        return self

    def __next__(self) -> np.ndarray:
        n, self._requests = self._requests, self._requests + 1
        if n >= self._depth and self._issued:
            self._received(self._issued.popleft())
        if self._done:
            raise StopIteration
        try:
            return next(self._batches)
        except StopIteration:
            self._done = True
            raise
