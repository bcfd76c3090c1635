"""``shmloader.DataLoader``: a torch DataLoader that also knows what the loop consumed.

It wires the dataset's sampler and collate in, and watches batches as the loop receives them:
a task is completed at the master only once every one of its rows reached the loop (not when
a worker gathered it), and :meth:`state_dict` records exactly the rows delivered so far, so a
resumed run delivers the rest of the epoch, each row once.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterator
from typing import Any, Literal, get_args

import torch.utils.data

from .._keywords import suggest_keywords
from ..errors import ConfigError
from ..shm.budget import closed_error
from .dataset import SharedTaskDataset
from .gather import ring
from .gather.ring import MAX_RING_SLOTS

# What a batch's tensor columns are: torch tensors, or NumPy arrays over the same memory.
BatchFormat = Literal["torch", "numpy"]
# What len() counts: the batches the next pass delivers, or those of the whole epoch it is in.
Length = Literal["rest", "epoch"]


def ring_slots(prefetch_factor: int | None) -> int:
    """Slots of each worker's batch ring: a worker has at most ``prefetch_factor`` batches in
    flight, and one more being made."""
    return min((prefetch_factor or 2) + 2, MAX_RING_SLOTS)


class _WorkerInit:
    """``worker_init_fn`` of shmloader.DataLoader's workers: their copy of the dataset hands
    batches over through rings (``Gatherer.use_ring``); then the user's
    ``worker_init_fn``. A plain DataLoader's workers over the same dataset keep torch's
    transport. Whether a batch's gather writes the ledger travels with the batch
    (delivery.py), so a wrapper that rebuilds this loader as a torch DataLoader (accelerate's
    ``prepare``) keeps the rings and still reports its gathers."""

    def __init__(self, slots: int, then: Callable[[int], None] | None) -> None:
        self.slots = slots
        self.then = then

    def __call__(self, worker_id: int) -> None:
        info = torch.utils.data.get_worker_info()
        assert info is not None  # torch calls it in a worker
        dataset: SharedTaskDataset = info.dataset  # type: ignore[assignment]
        dataset.use_ring(self.slots)
        if self.then is not None:
            self.then(worker_id)


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


def _torch_options() -> list[str]:
    """The keyword arguments of torch's DataLoader, which this one passes on (or, for those
    the dataset sets, refuses with what to do instead)."""
    return list(inspect.signature(torch.utils.data.DataLoader.__init__).parameters)[1:]


class DataLoader(torch.utils.data.DataLoader[dict[str, Any]]):
    """A ``torch.utils.data.DataLoader`` over a :class:`SharedTaskDataset` that knows which
    rows reached the loop: exact through a ``break`` and a checkpoint, with any workers.

    Args:
        dataset: The dataset to iterate; each full pass is one epoch.
        batch_size: Rows per batch; ``1`` gives each column a batch axis of 1 (``None`` is
            refused: the dataset gathers whole batches).
        drop_last: Drop each pass's short last batch; its rows stay owed to the epoch.
        transform: Function of each batch (the dict of tensors) whose result the loop gets,
            called in the training process: normalising, mixup, moving to a device. A batch
            counts as delivered once it returned; if it raises, the batch's rows come again.
            Per-record augmentation belongs in ``decode`` (``shmloader.task_rng()``).
        format: ``"torch"`` (tensors) or ``"numpy"`` (arrays over the same memory, for JAX,
            TensorFlow or NumPy loops). Columns held as lists stay lists.
        length: What ``len()`` counts: ``"rest"``, the batches the next pass delivers (after
            a ``break`` or a resume, what is left); ``"epoch"``, the whole epoch's, as torch
            counts and as Lightning expects of a resumed epoch.
        **kwargs: torch's ``DataLoader`` arguments (``num_workers``, ``pin_memory``,
            ``persistent_workers``, ``prefetch_factor``, ``multiprocessing_context``, ...),
            except ``sampler``, ``batch_sampler``, ``shuffle`` and ``collate_fn``, which the
            dataset provides.
    """

    @suggest_keywords(also=_torch_options)
    def __init__(
        self,
        dataset: SharedTaskDataset,
        batch_size: int = 1,
        *,
        drop_last: bool = False,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        format: BatchFormat = "torch",
        length: Length = "rest",
        **kwargs: Any,
    ) -> None:
        if transform is not None and not callable(transform):
            raise ConfigError(f"transform must be a function of a batch, got {transform!r}")
        if format not in get_args(BatchFormat):
            raise ConfigError(
                f"format must be one of {', '.join(map(repr, get_args(BatchFormat)))}, "
                f"got {format!r}"
            )
        if length not in get_args(Length):
            raise ConfigError(
                f"length must be one of {', '.join(map(repr, get_args(Length)))}, got {length!r}"
            )
        self.transform = transform
        self.format = format
        self.length = length
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
        # Its batches, remembered in the order they are issued (``issued``): __iter__ reports
        # each delivered as the loop receives it, for the passes it claims (``claimed``).
        self._recorder = dataset.batch_sampler(batch_size, drop_last=drop_last)
        # Workers copy the dataset when they start; rings where torch's pinning thread does not
        # want tensors.
        slots = 0 if kwargs.get("pin_memory") else ring_slots(kwargs.get("prefetch_factor"))
        kwargs["worker_init_fn"] = _WorkerInit(slots, kwargs.get("worker_init_fn"))
        super().__init__(
            dataset,
            batch_sampler=self._recorder,
            collate_fn=dataset.collate,
            **kwargs,
        )

    def __iter__(self) -> Iterator[dict[str, Any]]:  # type: ignore[override]
        plane = self.dataset.start().runtime.plane  # type: ignore[attr-defined]
        began = time.perf_counter()  # the loop waits for data from here (workers start too) ...
        step_began = began  # ... and its step began when it got the batch before
        batches = self._passes()
        while True:
            try:
                self._check_open()
                batch = next(batches)
            except StopIteration:
                return
            except Exception as exc:
                self._check_open(exc)
                raise
            now = time.perf_counter()
            plane.loop_clock.record_wait(now - began, now - step_began)  # ... to here
            step_began = now
            indices = self._recorder.issued.popleft()
            handed = self._handed(batch)  # if the transform raises, the rows are not delivered
            # Workers of this loader write no ledger: rows are reported gathered here (NOTE
            # [exactly once on the trainer side], 2, in accounting/book.py).
            plane.reports.delivered(indices)
            yield handed
            began = time.perf_counter()

    def __len__(self) -> int:
        if self.length == "rest":
            return super().__len__()
        rows = self._recorder.sampler.epoch_rows()
        size = self._recorder.batch_size
        return rows // size if self._recorder.drop_last else -(-rows // size)

    def _handed(self, batch: dict[str, Any]) -> Any:
        """What the loop gets for ``batch``: in the format asked for, transformed."""
        if self.format == "numpy":
            batch = as_numpy(batch)
        return batch if self.transform is None else self.transform(batch)

    def _check_open(self, cause: Exception | None = None) -> None:
        """``StoreClosedError`` once the dataset is closed (``cause``: what the iterator raised
        then), whatever ``num_workers``: a worker's batch then fails in its own way (its ring
        went with the store, or the worker was stopped), which would not say why."""
        dataset: SharedTaskDataset = self.dataset  # type: ignore[assignment]
        path = dataset.store_path
        if dataset.closed and path is not None:
            raise closed_error(path) from cause

    def _passes(self) -> Iterator[dict[str, Any]]:
        """A pass of the sampler; and, if it left the master's last epoch open (elastic mode:
        other trainers held tasks of it, which it could not wait for while batches of its own
        were in flight: TaskSampler._wait_for_elsewhere), one more, which waits for them with
        nothing in flight and delivers those that come here (a trainer that died had them)."""
        sampler = self._recorder.sampler
        while True:
            yield from self._through_torch() if self.num_workers else self._in_process()
            if sampler.left_open is None:
                return

    def _in_process(self) -> Iterator[dict[str, Any]]:
        """Batches gathered here, without torch's single-process iterator (its per-batch
        bookkeeping would only add to a gather that builds the batch already). The rows count
        as consumed once ``__iter__`` hands the batch to the loop."""
        dataset: SharedTaskDataset = self.dataset  # type: ignore[assignment]
        pin = self.pin_memory and torch.cuda.is_available()  # as torch: pinning needs a GPU
        for indices in self._recorder.loop_pass():  # this loop reports each batch it hands over
            batch = dataset.gather(indices, consumed=False)
            yield _pinned(batch) if pin else batch

    def _through_torch(self) -> Iterator[dict[str, Any]]:
        """torch's iterator; workers hand batches over through rings of slots (ring.py),
        which arrive here as batches, unless batches are pinned (torch's pinning thread would
        copy each batch once more)."""
        with self._recorder.claimed():  # this loop reports each batch it hands over
            batches = super().__iter__()  # starts the workers (or wakes persistent ones)
        try:
            yield from batches
        finally:
            if not self.pin_memory and not self.persistent_workers:
                del batches  # torch's iterator drops the batches still in flight: slots freed
                path = self.dataset.store_path  # type: ignore[attr-defined]
                if path is not None:
                    ring.forget(path)

    def state_dict(self) -> dict[str, Any]:
        """Where the loop is: the epoch and the rows of it already delivered (JSON-able).
        Under torchrun, the whole job's: call it on every rank at the same step, save it from
        rank 0, load it into every rank of a job of any size
        (``SharedTaskDataset.state_dict``)."""
        return self.dataset.state_dict()  # type: ignore[attr-defined]

    @property
    def started(self) -> bool:
        """Whether its dataset has started (``SharedTaskDataset.started``): on the first batch."""
        return bool(self.dataset.started)  # type: ignore[attr-defined]

    def rank_state_dict(self) -> dict[str, Any]:
        """This rank's own state (``SharedTaskDataset.rank_state_dict``): for
        ``shmloader.merge_states``, or to resume the same rank of a job of the same size."""
        return self.dataset.rank_state_dict()  # type: ignore[attr-defined]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; call before iterating (the readers start from it)."""
        self.dataset.load_state_dict(state)  # type: ignore[attr-defined]


def as_numpy(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch with each tensor column as a NumPy array over the same memory (the array
    keeps the tensor alive); other columns as they are."""
    return {
        name: value.numpy() if isinstance(value, torch.Tensor) else value
        for name, value in batch.items()
    }


def _pinned(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch with its tensors in pinned memory (for ``pin_memory=True`` without workers),
    still the dataset's batch type."""
    for name, value in batch.items():
        if isinstance(value, torch.Tensor):
            batch[name] = value.pin_memory()
    return batch
