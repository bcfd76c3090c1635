"""How the trainer learns that a batch reached the training loop, told by the pass's receipt.

The dataset never sees a batch reach the training loop of a plain DataLoader: workers gather
batches ahead (``prefetch_factor`` each) and torch hands them over in the main process. Counting
rows as consumed when a worker gathers them loses the prefetched batches when the loop stops
early (``break``) or saves a checkpoint. Three ways of telling are used, one per pass, chosen
as the pass begins; each batch goes out as an ``IndexBatch`` (core/receipts.py) whose
``receipt`` field names the pass's way to whichever process gathers it:

- ``Receipt.LOOP``: ``shmloader.DataLoader``'s own pass. Its loop reports each batch as it
  hands it over (after the transform), so the gather reports nothing (no ledger).
- ``Receipt.REQUESTS``: a plain DataLoader's pass whose deliveries torch's requests tell.
  torch's multiprocessing iterator asks its batch sampler for the next batch at fixed moments:
  ``prefetch_factor * num_workers`` times when it starts, then once each time it returns a
  batch to the loop, just before returning it, also after the sampler is exhausted. So the
  ``n``-th request (from 0) says that batch ``n - prefetch_factor * num_workers`` reaches the
  loop now: :class:`Requests` counts them. torch has no public way of telling a batch sampler
  which DataLoader draws from it or when a batch reaches the loop; this is how its
  iterators ask, which the support matrix checks with the oldest and newest torch the package
  declares (.ci/matrix). That holds for a map-style dataset with ``in_order=True`` (the
  default); the loader is the one a wrapper says it iterates (accelerate's ``GradientState``,
  wrappers.py), else found on the call stack when torch asks for the sampler's iterator
  (:func:`prefetch_depth`). The workers' ledger says "gathered", not "consumed" (ledger.py),
  and a row counts as consumed once it was both gathered and received.
- ``Receipt.GATHER``: a plain DataLoader's pass whose deliveries cannot be told (no workers:
  the loop gets each batch as it is gathered, in its own thread; or a loader that could not be
  identified, which :class:`~shmloader.dataset.order.batch_sampler.TaskBatchSampler` says once):
  the gather counts its rows consumed.

What a report means is the book's to decide (NOTE [exactly once on the trainer side], 2, in
accounting/book.py).
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import NamedTuple

import numpy as np
import torch.utils.data

from ..core.receipts import IndexBatch, Receipt, SampleIndices

# Frames searched above ``iter(batch_sampler)`` for the DataLoader that asks: torch creates the
# iterator two or three calls below ``DataLoader.__iter__``.
_FRAMES = 8


class Prefetch(NamedTuple):
    """How many batches the DataLoader asking for a batch sampler's iterator requests ahead of
    the one its loop receives: ``prefetch_factor * num_workers``, 0 without workers (the loop
    receives each batch as it is gathered, in the same process); None when that cannot be
    told, and ``why``."""

    depth: int | None
    why: str = ""


NOT_FOUND = "the DataLoader iterating it could not be found"


def loader_of(sampler: object) -> torch.utils.data.DataLoader[object] | None:
    """The DataLoader asking for ``sampler``'s iterator, as its ``sampler`` (torch's
    BatchSampler then draws from it), found as :func:`prefetch_depth` finds one."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(_FRAMES):
        if frame is None:
            break
        for name in ("loader", "self"):
            loader = frame.f_locals.get(name)
            if isinstance(loader, torch.utils.data.DataLoader) and loader.sampler is sampler:
                return loader
        frame = frame.f_back
    return None


def prefetch_depth(batch_sampler: object) -> Prefetch:
    """:class:`Prefetch` of the DataLoader that is asking for ``batch_sampler``'s iterator:
    found on the call stack, where torch creates the iterator two or three calls below
    ``DataLoader.__iter__`` (also under a subclass, accelerate's ``prepare`` or torchdata's
    ``StatefulDataLoader``, whose iterators torch's own code makes)."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(_FRAMES):
        if frame is None:
            break
        for name in ("loader", "self"):
            loader = frame.f_locals.get(name)
            if (
                isinstance(loader, torch.utils.data.DataLoader)
                and loader.batch_sampler is batch_sampler
            ):
                return _depth(loader)
        frame = frame.f_back
    return Prefetch(None, NOT_FOUND)


def depth_of(loader: torch.utils.data.DataLoader[object]) -> Prefetch:
    """:class:`Prefetch` of ``loader``."""
    return _depth(loader)


def _depth(loader: torch.utils.data.DataLoader[object]) -> Prefetch:
    if isinstance(loader.dataset, torch.utils.data.IterableDataset):
        return Prefetch(None, "its dataset is iterable-style")
    if not getattr(loader, "in_order", True):
        return Prefetch(None, "it was given in_order=False (batches come as workers finish)")
    if loader.num_workers == 0:
        return Prefetch(0)
    return Prefetch(int(loader.prefetch_factor or 2) * loader.num_workers)


@dataclass
class RequestCounts:
    """What torch asked of a pass's :class:`Requests`, kept apart from them: they go with
    torch's iterator, the counts stay with the batcher."""

    prefetch: int  # requests torch makes ahead as it starts
    requests: int = 0
    handed_out: int = 0  # batches torch was given
    done: bool = False  # the pass's batches ran out
    # The wrapper around the loader was asked whether its loop had the last batch as torch's
    # iterator went, when it still knew (batch_sampler.py, TaskBatchSampler._receive_held_back_in).
    asked_at_end: bool = False

    @property
    def returned_all(self) -> bool:
        """Whether torch has returned every batch of the pass: past the ``prefetch`` it asks
        for ahead, it asks once for each batch it returns."""
        return self.done and self.requests - self.prefetch >= self.handed_out


class Requests:
    """The iterator a plain DataLoader gets from a batch sampler (``TaskBatchSampler``): its
    batches, and for each request from ``depth`` on, the batch issued ``depth`` requests
    earlier handed to ``received`` (torch returns it to the loop now). Requests after the
    batches ran out still count: torch makes one per batch it returns. ``depth`` is torch's
    ``prefetch`` (the requests it makes ahead as it starts) and the batches a wrapper holds
    back from the loop (``ahead``, wrappers.py)."""

    def __init__(
        self,
        batches: Iterator[np.ndarray],
        prefetch: int,
        ahead: int,
        issued: deque[np.ndarray],
        received: Callable[[np.ndarray], None],
    ) -> None:
        self._batches = batches
        self._depth = prefetch + ahead
        self._issued = issued  # the batcher appends each batch it issues
        self._received = received
        self.counts = RequestCounts(prefetch)

    def __iter__(self) -> Requests:
        return self

    def __next__(self) -> list[int]:
        counts = self.counts
        n, counts.requests = counts.requests, counts.requests + 1
        if n >= self._depth and self._issued:
            self._received(self._issued.popleft())
        if counts.done:
            raise StopIteration
        try:
            batch = SampleIndices(IndexBatch(next(self._batches), Receipt.REQUESTS))
        except StopIteration:
            counts.done = True
            raise
        counts.handed_out += 1
        return batch
