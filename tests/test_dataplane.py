"""The trainer-side data plane without processes: a real dispatcher, a real segment store, the
real sampler, plane, ledger and gatherer; "readers" are played by the test in one thread, so the
order in which tasks arrive can be chosen (and scrambled) at will."""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import pyarrow as pa
import pytest
from _dataplane_helpers import OFFSETS, SHARDS, TOTAL, DispatcherOps, announce, make

from shmloader.dataset.accounting.plane import DataPlane
from shmloader.dataset.accounting.sampler_feed import SamplerFeed
from shmloader.dataset.gather.gatherer import Gatherer
from shmloader.dataset.gather.ledger import LedgerReader, ledger_dir
from shmloader.dataset.order.sampler import TaskSampler
from shmloader.master.config import JobConfig
from shmloader.master.dispatcher import Dispatcher
from shmloader.shm.store import SegmentStore


def read_all(d, store, plane, order_seed):
    """Lease every available task, write its segment, announce in a scrambled order."""
    leases = d.lease("c", 1000, time.time())
    random.Random(order_seed).shuffle(leases)
    handle = store.handle()
    for lease in leases:
        first = OFFSETS[lease.task.path] + lease.task.start
        ids = np.arange(first, first + lease.task.num_records, dtype=np.int64)
        info = handle.write(pa.record_batch({"id": ids, "x": ids.astype(np.float32) * 2}))
        seq = lease.unit  # elastic mode: one queue, starting at 0
        plane.announce(
            epoch=lease.epoch,
            seq=seq,
            task_id=lease.task.task_id,
            lease_id=lease.lease_id,
            segment=info.name,
            num_rows=info.num_rows,
        )


def run_epoch(d, store, plane, sampler, order_seed, batch=16):
    read_all(d, store, plane, order_seed)
    gatherer = Gatherer(store.handle(), ["id", "x"])
    seen = []
    indices = list(iter(sampler))
    for i in range(0, len(indices), batch):
        out = gatherer.gather(indices[i : i + batch])
        assert np.array_equal(out["x"].numpy(), out["id"].numpy().astype(np.float32) * 2)
        seen.extend(out["id"].tolist())
    plane.read_ledger_and_send()
    return indices, seen


def test_every_record_once_per_epoch_and_segments_released(tmp_path):
    d, store, plane, sampler = make(tmp_path)
    with store:
        for epoch in range(2):
            assert len(sampler) == TOTAL
            _, seen = run_epoch(d, store, plane, sampler, order_seed=epoch)
            assert sorted(seen) == list(range(TOTAL))
        # (the dispatcher opens epoch 1 while epoch 0 is read, so check at the end)
        assert plane.contents().segments == ()
        assert store.handle().in_use() == 0
        assert d.finished
        assert plane.figures().consumed_records == 2 * TOTAL


def test_epochs_the_master_finished_are_forgotten(tmp_path):
    """A long run's memory stays flat: what the plane keeps of an epoch (announced tasks,
    admitted and completed positions, consumed ranges) goes once the master finished it and
    the sampler is past it. It grew by about 600 bytes per task per epoch."""
    d, store, plane, sampler = make(tmp_path, epochs=3)
    with store:
        for epoch in range(3):
            _, seen = run_epoch(d, store, plane, sampler, order_seed=epoch)
            assert sorted(seen) == list(range(TOTAL))
            plane.forget_finished(epoch + 1)  # the master finished it (d.finished below)
            assert min(plane.contents().epochs, default=epoch + 1) == epoch + 1
            assert all(e > epoch for e, _ in plane.contents().announced)
        assert d.finished
        assert plane.position().epoch == 3  # the position is unchanged: past the last epoch
        plane.forget_finished(0)  # nothing the master has not finished goes
        assert plane.position().epoch == 3
        # A late copy of a task of a forgotten epoch (its reader's lease lapsed while it read)
        # is a duplicate: dropped, not left ready for ever holding its segment.
        info = store.handle().write(pa.record_batch({"id": np.arange(4), "x": np.zeros(4)}))
        plane.announce(epoch=0, seq=0, task_id=0, lease_id=99999, segment=info.name, num_rows=4)
        assert plane.figures().duplicates == 1 and plane.ready.pending() == []
        assert store.handle().in_use() == 0


def test_order_depends_on_seed_not_on_arrival(tmp_path):
    runs = []
    for order_seed in (1, 2):
        d, store, plane, sampler = make(tmp_path / str(order_seed), epochs=1)
        with store:
            _, seen = run_epoch(d, store, plane, sampler, order_seed)
        runs.append(seen)
    assert runs[0] == runs[1]
    d, store, plane, sampler = make(tmp_path / "other", epochs=1, seed=4)
    with store:
        _, other = run_epoch(d, store, plane, sampler, 1)
    assert other != runs[0] and sorted(other) == sorted(runs[0])


def test_no_shuffle_keeps_plan_order(tmp_path):
    d, store, plane, sampler = make(tmp_path, shuffle=False, epochs=1)
    with store:
        _, seen = run_epoch(d, store, plane, sampler, order_seed=5)
    assert seen == list(range(TOTAL))


def test_abandoned_pass_is_finished_by_the_next_one(tmp_path):
    d, store, plane, sampler = make(tmp_path, epochs=2, window=1)
    with store:
        read_all(d, store, plane, 0)
        gatherer = Gatherer(store.handle(), ["id"])
        it = iter(sampler)
        first = [next(it) for _ in range(12)]
        got = gatherer.gather(first[:5])["id"].tolist()  # 7 yielded rows never gathered
        del it
        rest = list(iter(sampler))  # same epoch, continued
        got += gatherer.gather(rest)["id"].tolist()
        plane.read_ledger_and_send()
        assert sorted(got) == list(range(TOTAL))
        assert sampler.feed.epoch_to_iterate() == 1


def test_duplicate_announcement_is_dropped(tmp_path):
    d, store, plane, _ = make(tmp_path, epochs=1)
    with store:
        lease = d.lease("c", 1, time.time())[0]
        handle = store.handle()
        batch = pa.record_batch({"id": np.arange(lease.task.num_records)})
        for _ in range(2):
            info = handle.write(batch)
            plane.announce(
                epoch=0,
                seq=lease.unit,
                task_id=lease.task.task_id,
                lease_id=lease.lease_id,
                segment=info.name,
                num_rows=info.num_rows,
            )
        assert plane.figures().duplicates == 1
        assert len(handle.segments()) == 1


def test_gather_rejects_empty_batch(tmp_path):
    _, store, _, _ = make(tmp_path)
    with store, pytest.raises(Exception, match="empty batch"):
        Gatherer(store.handle(), ["id"]).gather([])


def test_position_for_checkpoints(tmp_path):
    d, store, plane, sampler = make(tmp_path, epochs=1, window=1)
    with store:
        read_all(d, store, plane, 0)
        gatherer = Gatherer(store.handle(), ["id"])
        it = iter(sampler)
        taken = [next(it) for _ in range(12)]
        gatherer.gather(taken)
        plane.read_ledger_and_send()
        at = plane.position()
        epoch, done, partial = at.epoch, at.completed, at.partial
        assert epoch == 0
        assert len(done) == 1  # the first task (8 rows) is consumed
        assert sum(len(v) for v in partial.values()) == 4


def test_a_checkpoint_asks_the_master_outside_the_plane_lock(tmp_path):
    """A checkpoint needs each epoch's task count from the master; while that call is slow (a
    master restarting), a reader's announcement must not wait on it."""
    asked, answer = threading.Event(), threading.Event()

    class SlowMaster(DispatcherOps):
        slow = False

        def epoch_tasks(self, epoch: int) -> int:
            if self.slow:
                asked.set()
                assert answer.wait(30), "the announcement waited for the master's answer"
            return super().epoch_tasks(epoch)

    d = Dispatcher(SHARDS, JobConfig(records_per_task=8, epochs=2, shuffle=False))
    d.register("c", time.time())
    master = SlowMaster(d, "c")
    with SegmentStore.create("64MiB", base_dir=str(tmp_path)) as store:
        handle = store.handle()
        plane = DataPlane(
            consumer="c",
            master=master,
            segments=handle,
            ledger=LedgerReader(ledger_dir(handle.path)),
        )
        sampler = TaskSampler(lambda: SamplerFeed(plane, master), shuffle=False, seed=0, window=2)
        first, second = d.lease("c", 2, time.time())
        announce(store, plane, first)
        next(iter(sampler))  # the first task admitted: its epoch is kept
        master.slow = True
        states = []
        checkpoint = threading.Thread(target=lambda: states.append(plane.loop_state()))
        checkpoint.start()
        assert asked.wait(30)
        announce(store, plane, second)  # waited for ever under a lock the call held
        answer.set()
        checkpoint.join(30)
        assert not checkpoint.is_alive() and states[0].position is not None
        assert len(plane.ready) == 1  # the second task, ready beside the first's admitted rows
