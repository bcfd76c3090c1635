"""The data plane's view of the master, through a trainer's client: this consumer's calls,
with each epoch's size asked once (the plane asks for it at every pass and checkpoint)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...master.client import EpochInfo, MasterClient

# Epoch sizes kept: the plane asks about the epoch it iterates and the next, so a few suffice;
# a size asked again after it went is one more EpochInfo call. Unbounded, the cache would grow
# with every epoch for the life of the trainer.
EPOCHS_KEPT = 8


class MasterOps:
    """The plane's view of the master: this consumer's calls."""

    def __init__(self, client: MasterClient, consumer: str, epochs: int | None) -> None:
        self._client = client
        self._consumer = consumer
        self._epochs = epochs  # the master's, counted from 0 (None: unbounded)
        self._info: OrderedDict[int, EpochInfo] = OrderedDict()
        self._lock = threading.Lock()  # the training loop and the maintenance thread ask

    @property
    def epochs_known(self) -> int:
        """How many epochs' sizes are kept (at most ``EPOCHS_KEPT``): the cache is bounded,
        whatever the number of epochs a trainer runs."""
        with self._lock:
            return len(self._info)

    def complete(self, lease_ids: list[int]) -> dict[int, str]:
        return dict(self._client.complete_many(lease_ids))

    def _epoch(self, epoch: int) -> EpochInfo:
        with self._lock:
            info = self._info.get(epoch)
            if info is not None:
                self._info.move_to_end(epoch)
                return info
        info = self._client.epoch_info(self._consumer, epoch)  # not under the lock: a call
        with self._lock:
            self._info[epoch] = info
            while len(self._info) > EPOCHS_KEPT:
                self._info.popitem(last=False)
        return info

    def _past_the_end(self, epoch: int) -> bool:
        # A pass after the last planned epoch is empty (len 0), not a master error.
        return self._epochs is not None and epoch >= self._epochs

    def epochs_over(self, epoch: int) -> int | None:
        """The number of epochs the master plans, if ``epoch`` comes after the last of them
        (a pass over it is empty); None while epochs are left (or there is no last)."""
        return self._epochs if self._past_the_end(epoch) else None

    def epoch_tasks(self, epoch: int) -> int:
        return 0 if self._past_the_end(epoch) else int(self._epoch(epoch).num_tasks)

    def epoch_records(self, epoch: int) -> int:
        return 0 if self._past_the_end(epoch) else int(self._epoch(epoch).num_records)

    def whereabouts(self, epoch: int, seqs: list[int]) -> list[str]:
        return list(self._client.whereabouts(self._consumer, epoch, seqs))

    def mark_taken(self, lease_ids: list[int]) -> dict[int, str]:
        return dict(self._client.mark_taken(lease_ids))
