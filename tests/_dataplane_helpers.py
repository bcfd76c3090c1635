"""A trainer's data plane over an in-process dispatcher, for tests without processes."""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from shmloader.dataset.accounting.plane import DataPlane
from shmloader.dataset.accounting.sampler_feed import SamplerFeed
from shmloader.dataset.gather.ledger import LedgerReader, ledger_dir
from shmloader.dataset.order.sampler import TaskSampler
from shmloader.errors import LeaseError, NotActive
from shmloader.master.config import JobConfig
from shmloader.master.dispatcher import Dispatcher
from shmloader.master.tasks import build_schedule
from shmloader.shm.store import SegmentStore
from shmloader.sources.base import Shard

SHARDS = [Shard("/data/a", 23), Shard("/data/b", 7), Shard("/data/c", 40)]
OFFSETS = {"/data/a": 0, "/data/b": 23, "/data/c": 30}
TOTAL = 70


class DispatcherOps:
    """The plane's master calls, served by an in-process dispatcher."""

    def __init__(self, d: Dispatcher, consumer: str) -> None:
        self.d = d
        self.consumer = consumer

    def complete(self, lease_ids: list[int]) -> dict[int, str]:
        problems = {}
        for lease_id in lease_ids:
            try:
                self.d.complete(lease_id, time.time())
            except LeaseError as exc:
                problems[lease_id] = NotActive.of_error(exc)
        return problems

    def _queue(self, epoch: int) -> tuple[int, int]:
        c = self.d.config
        s = build_schedule(
            self.d.table,
            epoch,
            seed=c.seed,
            shuffle=c.shuffle,
            world_size=c.world_size,
            policy=c.ddp_policy,
        )
        return int(s.bounds[1] - s.bounds[0]), int(s.lengths()[s.bounds[0] : s.bounds[1]].sum())

    def epoch_tasks(self, epoch: int) -> int:
        return self._queue(epoch)[0]

    def epoch_records(self, epoch: int) -> int:
        return self._queue(epoch)[1]

    def epochs_over(self, epoch: int) -> int | None:
        epochs = self.d.config.epochs
        return epochs if epochs is not None and epoch >= epochs else None

    def whereabouts(self, epoch: int, seqs: list[int]) -> list[str]:
        return self.d.whereabouts(self.consumer, epoch, seqs)  # elastic mode: seq == unit

    def mark_taken(self, lease_ids: list[int]) -> dict[int, str]:
        return self.d.mark_taken(lease_ids, time.time())


def make(tmp_path, *, shuffle=True, seed=3, epochs=2, window=2, budget="64MiB"):
    d = Dispatcher(SHARDS, JobConfig(records_per_task=8, epochs=epochs, shuffle=shuffle, seed=seed))
    store, plane, sampler = trainer(d, "c", tmp_path, shuffle=shuffle, seed=seed, window=window)
    return d, store, plane, sampler


def trainer(
    d,
    consumer,
    tmp_path,
    *,
    shuffle=True,
    seed=3,
    window=2,
    budget="64MiB",
    lease_timeout=None,
    taken_over=None,
):
    """A trainer's store, plane and sampler, registered with ``d`` as ``consumer``;
    ``lease_timeout``: the plane checks ready tasks' leases (dataset/lease_check.py);
    ``taken_over``: records a loaded checkpoint handed over (dataset/handover.py)."""
    d.register(consumer, time.time())
    tmp_path.mkdir(parents=True, exist_ok=True)
    store = SegmentStore.create(budget, base_dir=str(tmp_path))
    handle = store.handle()
    plane = DataPlane(
        consumer=consumer,
        master=DispatcherOps(d, consumer),
        segments=handle,
        ledger=LedgerReader(ledger_dir(handle.path)),
        lease_timeout=lease_timeout,
        taken_over=taken_over,
    )
    feed = SamplerFeed(plane, DispatcherOps(d, consumer))
    sampler = TaskSampler(lambda: feed, shuffle=shuffle, seed=seed, window=window)
    return store, plane, sampler


def announce(store, plane, lease, confirmed: float | None = None) -> str:
    """What a reader does with a lease: write the task's segment, announce it (``confirmed``:
    when the reader last knew the lease active); returns the segment's name."""
    first = OFFSETS[lease.task.path] + lease.task.start
    ids = np.arange(first, first + lease.task.num_records, dtype=np.int64)
    info = store.handle().write(pa.record_batch({"id": ids}))
    plane.announce(
        epoch=lease.epoch,
        seq=lease.unit,  # elastic mode: one queue, seq == unit
        task_id=lease.task.task_id,
        lease_id=lease.lease_id,
        segment=info.name,
        num_rows=info.num_rows,
        start=lease.task.start,
        stop=lease.task.stop,
        consumed=lease.consumed,  # handed back by a trainer that left
        path=lease.task.path,
        confirmed=confirmed,
    )
    return info.name
