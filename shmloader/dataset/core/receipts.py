"""How a batch's rows come to count as consumed: values the batch of indices itself carries.

The batch sampler chooses one :class:`Receipt` per pass (``order/delivery.py`` says how it is
chosen) and marks each batch of indices with it, so that whichever process gathers the batch
knows whether to write the gather ledger, without asking the trainer. The marks are numpy
subclasses (pickled to DataLoader workers as such), defined here, below the gather that reads
them and the sampler that sets them, with no torch import.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence

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
    """Who tells the trainer that a gathered batch's rows reached the loop."""

    #: Nobody: the rows count as consumed once gathered.
    GATHER = "gather"
    #: torch's requests (:class:`Requests`): the gather marks the rows gathered only.
    REQUESTS = "requests"
    #: ``shmloader.DataLoader``'s loop, as it hands each batch over: the gather reports nothing.
    LOOP = "loop"


class TrackedBatch(np.ndarray):
    """A batch of sample indices whose rows count as consumed when the loop receives the batch
    (told by torch's requests, :class:`Requests`), not when a worker gathers it. A plain int64
    array otherwise; pickled to workers as this class."""


class LoopBatch(np.ndarray):
    """A batch of sample indices of ``shmloader.DataLoader``'s own pass, whose loop reports it
    gathered and consumed as it hands it over. A plain int64 array otherwise."""


def tracked(batch: np.ndarray) -> TrackedBatch:
    return batch.view(TrackedBatch)


def of_the_loop(batch: np.ndarray) -> LoopBatch:
    return batch.view(LoopBatch)


class SampleIndices(list[int]):
    """A batch of sample indices as a batch sampler hands it to torch: a list of ints (torch's
    ``Sampler[list[int]]``, so a user's ``DataLoader(ds, batch_sampler=ds.batch_sampler(64))``
    type-checks), which keeps the sorted int64 array it was made from as ``array``, with its
    receipt's mark. The gather reads the array, not the list: no conversion back, and the mark
    travels with it. Pickled (to a DataLoader worker) as the array alone, which arrives as
    that array: the worker only gathers it, and the list would be made there for nothing."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        super().__init__(array.tolist())
        self.array = array

    def __reduce__(self) -> tuple[Callable[[np.ndarray], np.ndarray], tuple[np.ndarray]]:
        return _the_array, (self.array,)


def _the_array(array: np.ndarray) -> np.ndarray:
    """What a pickled :class:`SampleIndices` becomes: its array (with its mark)."""
    return array


def as_array(indices: Sequence[int] | np.ndarray) -> Sequence[int] | np.ndarray:
    """The array a :class:`SampleIndices` was made from; anything else as it is."""
    return indices.array if isinstance(indices, SampleIndices) else indices


def receipt_of(indices: Sequence[int] | np.ndarray) -> Receipt:
    """How the rows of ``indices`` (a batch handed to ``__getitems__``, its array: see
    :func:`as_array`) are told consumed."""
    if isinstance(indices, TrackedBatch):
        return Receipt.REQUESTS
    if isinstance(indices, LoopBatch):
        return Receipt.LOOP
    return Receipt.GATHER
