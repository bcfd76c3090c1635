"""What the trainer side asks of the master and of the segment store, as protocols.

The data plane, the lease check, the strays and the outbox call the master and the store
through these: the runtime passes the real ones (``runtime/master_ops.py``'s ``MasterOps``, a
``SegmentStore``), the unit tests a dispatcher behind a lock and a store of their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


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
