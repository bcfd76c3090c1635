"""``shmloader.DataLoader``: a torch DataLoader that also knows what the loop consumed.

It wires the dataset's sampler and collate in, and watches batches as the loop receives them:
a task is completed at the master only once every one of its rows reached the loop (not when
a worker gathered it), and :meth:`state_dict` records exactly the rows delivered so far, so a
resumed run delivers the rest of the epoch, each row once.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch.utils.data

from ..errors import ConfigError
from ..shm.budget import closed_error
from . import ring
from .dataset import SharedTaskDataset
from .ring import MAX_RING_SLOTS, RingBatch
from .sampler import TaskBatchSampler
from .state import loader_state, restore_state


class _RecordingBatchSampler(TaskBatchSampler):
    """The dataset's batches, remembered in the order they are issued: the loader marks each
    delivered as the loop receives it."""

    def __init__(self, dataset: SharedTaskDataset, batch_size: int, drop_last: bool) -> None:
        super().__init__(dataset.sampler(), batch_size, drop_last, **dataset._batcher_hooks())
        self.issued: deque[np.ndarray] = deque()

    def __iter__(self) -> Iterator[np.ndarray]:
        self.issued.clear()
        return super().__iter__()

    def _issue(self, batch: np.ndarray) -> np.ndarray:
        self.issued.append(batch)
        return batch

    def _in_flight(self) -> int:
        # Issued, not received: with workers, rows count as consumed only as the loop gets them.
        return sum(len(batch) for batch in self.issued)


# What shmloader.DataLoader sets itself, and where the user's choice goes instead.
_SET_BY_THE_DATASET = {
    "shuffle": "the order is the dataset's: SharedTaskDataset(..., shuffle=True, seed=...) "
    "shuffles the tasks of each epoch and the rows within a window of them",
    "sampler": "the dataset's own sampler gives the order (it knows which rows are ready)",
    "batch_sampler": "batches are drawn by the dataset's sampler (batch_size= and drop_last= "
    "choose their size)",
    "collate_fn": "the dataset builds whole batches in __getitems__; give transform= for a "
    "function of each batch, or augment each record in decode (shmloader.task_rng())",
}


class DataLoader(torch.utils.data.DataLoader[dict[str, Any]]):
    """A ``torch.utils.data.DataLoader`` over a :class:`SharedTaskDataset`.

    Takes the usual keyword arguments (``num_workers``, ``pin_memory``, ``persistent_workers``,
    ``prefetch_factor``, ``multiprocessing_context``, ...) except ``sampler``,
    ``batch_sampler``, ``shuffle`` and ``collate_fn``, which the dataset provides.

    ``transform``: a function of each batch (the dict of tensors) whose result the loop gets
    instead, called in the training process once the batch is counted delivered: for
    per-batch work such as normalising, mixing rows (mixup) or moving to a device. Per-record
    augmentation belongs in ``decode``, in the readers (``shmloader.task_rng()``).
    """

    def __init__(
        self,
        dataset: SharedTaskDataset,
        batch_size: int = 1,
        *,
        drop_last: bool = False,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if transform is not None and not callable(transform):
            raise ConfigError(f"transform must be a function of a batch, got {transform!r}")
        self.transform = transform
        if not isinstance(dataset, SharedTaskDataset):
            raise ConfigError("shmloader.DataLoader takes a SharedTaskDataset")
        if batch_size is None:  # torch's "one sample per step, no collate" mode
            raise ConfigError(
                "shmloader.DataLoader gathers whole batches and does not take batch_size=None; "
                "for one row per step use batch_size=1 (each column then has a batch axis of 1)"
            )
        for name, instead in _SET_BY_THE_DATASET.items():
            if kwargs.get(name) not in (None, False):
                raise ConfigError(
                    f"shmloader.DataLoader takes no {name}=: {instead}, so leave it out"
                )
            kwargs.pop(name, None)
        if kwargs.get("in_order") is False:
            raise ConfigError("shmloader.DataLoader needs in_order=True to know what was delivered")
        dataset._complete_on_delivery = True
        if dataset._runtime is not None:
            dataset._runtime.plane.set_complete_on_delivery(True)
        self._recorder = _RecordingBatchSampler(dataset, batch_size, drop_last)
        super().__init__(
            dataset,
            # torch hands each batch to __getitems__ unchanged, arrays as well as lists.
            batch_sampler=self._recorder,  # type: ignore[arg-type]
            collate_fn=dataset.collate,
            **kwargs,
        )

    def __iter__(self) -> Iterator[dict[str, Any]]:  # type: ignore[override]
        plane = self.dataset.runtime.plane  # type: ignore[attr-defined]
        began = time.perf_counter()  # the loop waits for data from here (workers start too) ...
        batches = self._passes()
        while True:
            plane.loop_receives = True  # rows gathered here now: consumed once received
            try:
                self._check_open()
                batch = next(batches)
            except StopIteration:
                return
            except Exception as exc:
                self._check_open(exc)
                raise
            finally:
                plane.loop_receives = False
            plane.record_wait(time.perf_counter() - began)  # ... to here
            # Workers of this loader write no ledger: rows are reported gathered here.
            plane.delivered(self._recorder.issued.popleft())
            yield batch if self.transform is None else self.transform(batch)
            began = time.perf_counter()

    def _check_open(self, cause: Exception | None = None) -> None:
        """``StoreClosedError`` once the dataset is closed (``cause``: what the iterator raised
        then), whatever ``num_workers``: a worker's batch then fails in its own way (its ring
        went with the store, or the worker was stopped), which would not say why."""
        dataset: SharedTaskDataset = self.dataset  # type: ignore[assignment]
        store = dataset._store
        if dataset._closed and store is not None:
            raise closed_error(store.path) from cause

    def _passes(self) -> Iterator[dict[str, Any]]:
        """A pass of the sampler; and, if it left the master's last epoch open (elastic mode:
        other trainers held tasks of it, which it could not wait for while batches of its own
        were in flight: TaskSampler._strays), one more, which waits for them with nothing in
        flight and delivers those that come here (a trainer that died had them)."""
        sampler = self._recorder.sampler
        while True:
            yield from self._in_process() if self._plain_in_process() else self._through_torch()
            if sampler.left_open is None:
                return

    def _plain_in_process(self) -> bool:
        # No worker and nothing to pin: torch's single-process iterator would only add its
        # per-batch bookkeeping (profiler ranges, fetcher, collate) to a gather that builds
        # the batch already.
        return self.num_workers == 0 and not self.pin_memory

    def _in_process(self) -> Iterator[dict[str, Any]]:
        getitems = self.dataset.__getitems__  # type: ignore[attr-defined]
        for indices in self._recorder:
            yield getitems(indices)

    def _through_torch(self) -> Iterator[dict[str, Any]]:
        """torch's iterator; workers hand batches over through rings of slots (ring.py),
        copied out here, unless batches are pinned (torch's pinning thread wants tensors)."""
        gatherer = self.dataset._gatherer  # type: ignore[attr-defined]
        workers = self.num_workers > 0 and gatherer is not None
        rings = workers and not self.pin_memory
        # Workers copy the gatherer when they start: set for them only, so that the workers
        # of another, plain DataLoader over this dataset use torch's transport and write the
        # ledger. A worker has at most prefetch_factor batches in flight, one more being made.
        if rings:
            gatherer.ring_slots = min((self.prefetch_factor or 2) + 2, MAX_RING_SLOTS)
        if workers:
            gatherer.write_ledger = False  # __iter__ marks rows gathered as they arrive
        try:
            batches = super().__iter__()  # starts the workers (or wakes persistent ones)
        finally:
            if workers:
                gatherer.ring_slots = 0
                gatherer.write_ledger = True
        try:
            for batch in batches:
                yield batch.materialize() if isinstance(batch, RingBatch) else batch
        finally:
            if rings and not self.persistent_workers:  # the workers are gone, their rings too
                del batches  # torch's iterator drops the batches still in flight: slots freed
                ring.forget(gatherer.store.path)

    def state_dict(self) -> dict[str, Any]:
        """Where the loop is: the epoch and the rows of it already delivered (JSON-able)."""
        return loader_state(self.dataset)  # type: ignore[arg-type]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; call before iterating (the readers start from it)."""
        restore_state(self.dataset, state)  # type: ignore[arg-type]
