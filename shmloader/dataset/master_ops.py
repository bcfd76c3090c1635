"""The data plane's view of the master, through a trainer's client: this consumer's calls,
with each epoch's size asked once (the plane asks for it at every pass and checkpoint)."""

from __future__ import annotations

from typing import Any


class MasterOps:
    """The plane's view of the master: this consumer's calls."""

    def __init__(self, client: Any, consumer: str, epochs: int | None) -> None:
        self._client = client
        self._consumer = consumer
        self._epochs = epochs  # the master's, counted from 0 (None: unbounded)
        self._info: dict[int, Any] = {}

    def complete(self, lease_ids: list[int]) -> dict[int, str]:
        return dict(self._client.complete_many(lease_ids))

    def _epoch(self, epoch: int) -> Any:
        if epoch not in self._info:
            self._info[epoch] = self._client.epoch_info(self._consumer, epoch)
        return self._info[epoch]

    def _past_the_end(self, epoch: int) -> bool:
        # A pass after the last planned epoch is empty (len 0), not a master error.
        return self._epochs is not None and epoch >= self._epochs

    def epoch_tasks(self, epoch: int) -> int:
        return 0 if self._past_the_end(epoch) else int(self._epoch(epoch).num_tasks)

    def epoch_records(self, epoch: int) -> int:
        return 0 if self._past_the_end(epoch) else int(self._epoch(epoch).num_records)

    def whereabouts(self, epoch: int, seqs: list[int]) -> list[str]:
        return list(self._client.whereabouts(self._consumer, epoch, seqs))

    def mark_taken(self, lease_ids: list[int]) -> dict[int, str]:
        return dict(self._client.mark_taken(lease_ids))
