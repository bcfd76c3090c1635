"""What the trainer side asks of the master, of the segment store and of its accounting, as
protocols.

The data plane, the lease check, the tasks elsewhere and the outbox call the master and the store
through these: the runtime passes the real ones (``runtime/master_ops.py``'s ``MasterOps``, a
``SegmentStore``), the unit tests a dispatcher behind a lock and a store of their own. A batch
sampler reports to the trainer's accounting through one :class:`BatchReports`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np


class LeaseOps(Protocol):
    """The master calls the data plane makes (:class:`MasterOps`, or in tests a dispatcher
    behind a lock)."""

    def complete(self, lease_ids: list[int]) -> dict[int, str]:
        """Complete the leases; returns those that could not be completed, with why."""
        ...

    def epoch_tasks(self, epoch: int) -> int:
        """How many tasks this consumer gets in ``epoch``."""
        ...

    def epoch_records(self, epoch: int) -> int: ...

    def epochs_over(self, epoch: int) -> int | None:
        """The number of epochs planned, if ``epoch`` is past the last; else None."""
        ...

    def whereabouts(self, epoch: int, seqs: list[int]) -> list[str]:
        """Where tasks ``seqs`` are (``Dispatcher.whereabouts``), as this consumer sees it."""
        ...

    def mark_taken(self, lease_ids: list[int]) -> dict[int, str]:
        """This trainer took the leases' tasks into its sampler (others stop waiting)."""
        ...


class SegmentOps(Protocol):
    """What the plane asks of the segment store (a ``SegmentStore``)."""

    def rename(self, name: str, new_name: str) -> None: ...

    def release(self, name: str, *, missing_ok: bool = False, cache_as: str = "") -> None: ...

    def want(self, keys: Sequence[str]) -> None: ...


class BatchReports(Protocol):
    """What a batch sampler (``TaskBatchSampler``) reports to the trainer's accounting of the rows
    it hands out, and asks of it: the dataset's, which starts the job on the first report."""

    def dropped(self, rows: np.ndarray) -> None:
        """``drop_last``: the rows of a pass's short last batch, consumed without delivery."""
        ...

    def received(self, rows: np.ndarray) -> None:
        """The loop received the batch of ``rows``: consumed."""
        ...

    def counted_early(self, rows: np.ndarray) -> None:
        """Rows in flight counted consumed before the loop receives them (the budget is full
        with them)."""
        ...

    def pinned(self, held: int) -> bool:
        """Whether the ``held`` rows not consumed are all that keeps the task the sampler
        waits for from being read (``BudgetPressure.pinned``)."""
        ...

    def state(self, also: np.ndarray | None) -> dict[str, Any]:
        """The dataset's state, counting the sample indices ``also`` as consumed."""
        ...

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (``SharedTaskDataset.load_state_dict``)."""
        ...
