"""How a batch's rows come to count as consumed: a value that travels with the batch.

The batch sampler chooses one :class:`Receipt` per pass (``order/delivery.py`` says how it is
chosen) and hands each batch out as an :class:`IndexBatch`, its sorted indices and that
receipt, so that whichever process gathers the batch knows whether to write the gather ledger,
without asking the trainer. The receipt is a field, never a property of the array: a copy of
the indices on the way cannot drop it. Defined here, below the gather that reads it and the
sampler that sets it, with no torch import.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


class ConsumedWhen(enum.Enum):
    """When a loader's rows count as consumed, fixed when its batcher is made: it decides who
    reports them (the book itself has no mode)."""

    #: A plain DataLoader: as a worker (through the ledger) or the training process gathers
    #: them. The dataset cannot see what the loop then receives.
    GATHERED = "gathered"
    #: ``shmloader.DataLoader``: as its loop receives each batch.
    DELIVERED = "delivered"


class Receipt(enum.Enum):
    """Who reports to the trainer that a gathered batch's rows reached the loop."""

    #: Nobody: the rows count as consumed once gathered.
    GATHER = "gather"
    #: torch's requests (:class:`Requests`): the gather marks the rows gathered only.
    REQUESTS = "requests"
    #: ``shmloader.DataLoader``'s loop, as it hands each batch over: the gather reports nothing.
    LOOP = "loop"


@dataclass(frozen=True, slots=True)
class IndexBatch:
    """A batch of sample indices as the batch sampler issued it: ``indices``, sorted int64
    (``slot << 32 | row``), and the pass's ``receipt``. What a DataLoader worker receives for
    a batch (a :class:`SampleIndices` pickles to it)."""

    indices: np.ndarray
    receipt: Receipt


class SampleIndices(list[int]):
    """A batch of sample indices as a batch sampler hands it to torch: a list of ints (torch's
    ``Sampler[list[int]]``, so a user's ``DataLoader(ds, batch_sampler=ds.batch_sampler(64))``
    type-checks), which keeps the :class:`IndexBatch` it was made from as ``batch``. The gather
    reads that, not the list: no conversion back, and the receipt travels with it. Pickled (to
    a DataLoader worker) as the ``IndexBatch`` alone: the worker only gathers it, and the list
    would be made there for nothing."""

    __slots__ = ("batch",)

    def __init__(self, batch: IndexBatch) -> None:
        super().__init__(batch.indices.tolist())
        self.batch = batch

    def __reduce__(self) -> tuple[Callable[[IndexBatch], IndexBatch], tuple[IndexBatch]]:
        return _the_batch, (self.batch,)


def _the_batch(batch: IndexBatch) -> IndexBatch:
    """What a pickled :class:`SampleIndices` becomes: its :class:`IndexBatch`."""
    return batch


def issued_batch(indices: Sequence[int] | np.ndarray | IndexBatch) -> IndexBatch | None:
    """The :class:`IndexBatch` behind a batch handed to ``__getitems__`` (a
    :class:`SampleIndices` in the trainer, an ``IndexBatch`` in a worker); None for indices
    the batch sampler did not issue (another sampler's list, torch's positions)."""
    if isinstance(indices, SampleIndices):
        return indices.batch
    if isinstance(indices, IndexBatch):
        return indices
    return None
