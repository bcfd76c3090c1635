"""A plain DataLoader that brings its own sampler: ``DataLoader(ds, batch_size=64)``.

torch then makes a ``SequentialSampler`` (or a ``RandomSampler``, with ``shuffle=True``) over
``range(len(ds))`` and hands ``__getitems__`` lists of those positions. They name no row: the
dataset owns the order (the master's task order, shuffled across a window of tasks from
``SharedTaskDataset(shuffle=, seed=)``), and rows exist only once readers made them ready. So
the positions only say how many rows a batch takes: :class:`RowStream` hands out the next ones
of the dataset's order. Positions that do not run up one by one (torch's ``shuffle=True``, or
a ``sampler=`` of torch's) are refused with the fix: the order is the dataset's own, and a
``RandomSampler`` reads ``len(ds)`` twice in each pass, the second time once rows were
consumed, which would make it ask for rows that its pass does not have.

That is exact in the training process (``num_workers=0``): the loop gets each batch as it is
gathered, in its own thread, so the rows count as consumed then, also through a ``break`` or a
``state_dict()``. With workers it cannot be: they would gather ahead of the loop, and nothing
of torch's own sampler tells the dataset which of their batches the loop received. A worker
asked for positions returns :class:`Refused` instead of rows, which reaches the training
process as the ``ConfigError`` that names the fix, raised there by torch itself: never an
error from inside a worker, never a row lost.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from torch._utils import ExceptionWrapper

from ...errors import ConfigError, ShmloaderError
from ..core.batch import Batch
from ..core.indices import ROW_BITS
from .batch_sampler import TaskBatchSampler

WITH_WORKERS = (
    "a torch DataLoader with workers and its own sampler (no sampler= or batch_sampler= "
    "given) cannot tell SharedTaskDataset which of the batches its workers gathered ahead "
    "reached the loop, so a break or a checkpoint would lose or repeat rows. Use "
    "shmloader.DataLoader(ds, batch_size={size}, num_workers=...) instead: the same "
    "arguments less shuffle= and sampler=, which it does not take (the dataset's own "
    "SharedTaskDataset(shuffle=..., seed=...) gives the order); or give this one "
    "batch_sampler=ds.batch_sampler({size})"
)


SHUFFLED = (
    "this DataLoader's sampler draws positions in an order of its own (torch's shuffle=True "
    "makes a RandomSampler; sampler= may give another), but SharedTaskDataset gives the order "
    "itself: it shuffles the tasks of each epoch and the rows within a window of them "
    "(SharedTaskDataset(shuffle=True, seed=...), the default). Leave shuffle= and sampler= "
    "out of the DataLoader; for DDP, give the dataset rank= and world_size= (or "
    "master='torchrun') instead of a DistributedSampler"
)


def are_positions(indices: Sequence[int] | np.ndarray) -> bool:
    """Whether ``indices`` are a torch sampler's positions (below ``2**32``), not sample indices
    handed out by the dataset's sampler (``slot << 32 | row``, slots from 1)."""
    return len(indices) > 0 and int(indices[0]) < 1 << ROW_BITS


def in_sequence(positions: Sequence[int] | np.ndarray) -> bool:
    """Whether ``positions`` run up one by one, as torch's ``SequentialSampler`` gives them
    (the only sampler of torch's whose positions :class:`RowStream` can stand in for: a
    ``RandomSampler`` reads ``len(ds)`` again at the end of its pass, when rows consumed have
    made it smaller, and asks for rows the pass does not have)."""
    steps = np.diff(np.asarray(positions, dtype=np.int64))
    return bool(np.all(steps == 1))


class RowStream:
    """The rows of the dataset's order for a plain DataLoader that brings its own sampler, in
    the training process: each request takes the next ``n`` of them.

    Its passes are those of a :class:`TaskBatchSampler`, gathered here and counted as gathered.
    ``len(ds)``, which torch's sampler reads as each pass starts, counts the rows the next pass
    delivers (``TaskSampler.pass_rows``), so a pass of torch's takes one of the dataset's, and
    a pass left early (``break``) goes on where it stopped. One case torch does not tell: rows
    of an epoch fewer than a batch that torch never asked for, because it drops a short last
    batch (``drop_last=True``) or because the loop left the pass before its last batch. A pass
    of them alone would be dropped again, for ever; so, once the pass has handed out its last
    batch (:meth:`look_ahead`), they come first in the next pass, which also delivers the
    next epoch (``TaskSampler``'s rule for rows left in an earlier epoch).
    """

    def __init__(self, batcher: TaskBatchSampler, consumed: Callable[[np.ndarray], None]) -> None:
        self._batcher = batcher
        self._consumed = consumed  # rows that count as consumed before they are gathered
        self._pass: Iterator[np.ndarray] | None = None
        self._ahead: deque[np.ndarray] = deque()  # batches of the pass not handed out yet

    def take(self, n: int) -> np.ndarray:
        """The next ``n`` rows, sorted (fewer when the master's epochs end first). Call
        :meth:`look_ahead` once they are gathered.

        torch counts the positions of its pass from ``len(ds)``, which may span the end of one
        of the dataset's passes (see the class docstring): the rows taken from the pass that
        ended count as consumed before the next one begins, since it begins by giving back
        every row handed out and not consumed."""
        parts: list[np.ndarray] = []
        have = 0
        while have < n:
            if not self._ahead and not self._pull(new_pass=False):
                if parts:
                    self._consumed(np.concatenate(parts))  # before the next pass gives them back
                if not self._pull(new_pass=True):
                    break
            head = self._ahead.popleft()
            if len(head) > n - have:
                head, rest = head[: n - have], head[n - have :]
                self._ahead.appendleft(rest)
            parts.append(head)
            have += len(head)
        if not parts:
            raise ShmloaderError(
                "a DataLoader asked for rows after the master's last epoch ended (its "
                "sampler counted more rows than the epoch had: records the source skipped, "
                "or tasks other trainers took); shmloader.DataLoader ends its pass where the "
                "rows end"
            )
        return np.sort(np.concatenate(parts))

    def look_ahead(self) -> None:
        """Take the pass's next batch now if none is waiting, so that a pass whose last rows
        torch does not ask for (``drop_last=True``) ends here, and ``len()`` then counts the
        next one. Called after the rows taken were gathered: they pin nothing meanwhile."""
        if not self._ahead:
            self._pull(new_pass=False)

    def _pull(self, *, new_pass: bool) -> bool:
        """One more batch of the pass into ``_ahead``; with ``new_pass``, of the next pass when
        this one has ended. False when none comes."""
        for _ in range(2):  # the pass going on, then (once) a new one
            if self._pass is None:
                if not new_pass:
                    return False
                self._pass, new_pass = self._batcher.in_process(), False
            batch = next(self._pass, None)
            if batch is not None:
                self._ahead.append(batch)
                return True
            self._pass = None
        return False


class Refused(Batch):
    """What a DataLoader worker returns for positions instead of rows (see the module
    docstring): an empty batch, which torch's ``default_collate`` passes through, whose copy in
    the training process is :class:`RefusedThere`."""

    __slots__ = ()

    def __init__(self, batch_size: int) -> None:
        super().__init__(size=batch_size)

    def __reduce__(self) -> tuple[type[RefusedThere], tuple[str]]:
        return RefusedThere, (WITH_WORKERS.format(size=self["size"]),)


class RefusedThere(ExceptionWrapper):
    """The refusal as torch's DataLoader receives it in the training process: torch re-raises
    any :class:`~torch._utils.ExceptionWrapper` a worker sent (its pinning thread passes it
    along too), and this one raises the ``ConfigError`` itself, without a worker's traceback."""

    def __init__(self, message: str) -> None:
        self.message = message
        self.exc_type = ConfigError
        self.where = "in the training process"
        self.exc_msg = message

    def reraise(self) -> None:
        raise ConfigError(self.message)
