"""The budget holds across processes: writers wait instead of overrunning it."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from shmloader.shm import SegmentInfo, SegmentStore, StoreHandle, ipc_file_size, reap_stale
from shmloader.shm import budget as shm_budget
from shmloader.shm.names import parse_temp_name

SPAWN = mp.get_context("spawn")
ROWS = 2000


def _batch(seed: int) -> pa.RecordBatch:
    return pa.record_batch({"x": pa.array(np.full(ROWS, seed, dtype=np.int64))})


def _writer(handle: StoreHandle, seeds: list[int], out: mp.Queue) -> None:
    for seed in seeds:
        out.put(handle.write(_batch(seed), timeout=60))


def _reserve_and_hang(handle: StoreHandle, nbytes: int, out: mp.Queue) -> None:
    # Exactly the state of a reader killed mid-write: reserved, partly written, not sealed.
    out.put(shm_budget.reserve(handle.path, nbytes, handle.budget))
    time.sleep(120)


class _Monitor(threading.Thread):
    """Samples bytes held (in use and spare) under the store's lock, as often as it can."""

    def __init__(self, store: SegmentStore) -> None:
        super().__init__(daemon=True)
        self.store = store
        self.max_seen = 0
        self.samples = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.max_seen = max(self.max_seen, self.store.held())
            self.samples += 1
            time.sleep(0.0002)  # leave the two shared cores to the writers


def test_concurrent_writers_never_exceed_the_budget(tmp_path: Path) -> None:
    seg = ipc_file_size(_batch(0))
    with SegmentStore.create(3 * seg, base_dir=tmp_path) as store:
        queue = SPAWN.Queue()
        writers = [
            SPAWN.Process(
                target=_writer, args=(store.handle(), [w * 10 + i for i in range(3)], queue)
            )
            for w in range(4)
        ]
        monitor = _Monitor(store)
        monitor.start()
        for p in writers:
            p.start()
        # Take three segments without releasing: the budget is full, nine writes remain.
        held = [queue.get(timeout=60) for _ in range(3)]
        assert store.in_use() == 3 * seg
        time.sleep(
            0.3
        )  # give the writers every chance to overrun (correctness does not depend on it)
        assert queue.empty(), "a fourth segment was written into a full budget"
        assert store.in_use() == 3 * seg
        # Now consume: read and release the oldest segment per arrival until all twelve came.
        seen: list[SegmentInfo] = list(held)
        values: list[int] = []
        for oldest in range(12):
            info = seen[oldest]
            values.append(store.open(info.name).column("x")[0].as_py())
            store.release(info.name)
            if len(seen) < 12:
                seen.append(queue.get(timeout=60))
        for p in writers:
            p.join(timeout=60)
            assert p.exitcode == 0
        monitor.done.set()
        monitor.join()
        assert sorted(values) == sorted(w * 10 + i for w in range(4) for i in range(3))
        assert monitor.samples > 0
        assert monitor.max_seen <= store.budget
        assert {i.nbytes for i in seen} == {seg}
        assert store.in_use() == 0


def test_dead_writer_leaves_a_temp_segment_that_reap_removes(tmp_path: Path) -> None:
    batch = _batch(1)
    seg = ipc_file_size(batch)
    with SegmentStore.create(seg, base_dir=tmp_path) as store:
        queue = SPAWN.Queue()
        proc = SPAWN.Process(target=_reserve_and_hang, args=(store.handle(), seg, queue))
        proc.start()
        temp = queue.get(timeout=60)
        assert temp is not None and os.path.dirname(temp) == store.path
        writer = parse_temp_name(os.path.basename(temp))
        assert writer is not None and writer[0] == proc.pid
        assert store.in_use() == seg
        assert reap_stale(tmp_path).removed == []  # its writer is alive: kept
        assert os.path.exists(temp)

        os.kill(proc.pid, signal.SIGKILL)
        proc.join(timeout=60)
        assert proc.exitcode == -signal.SIGKILL
        assert os.path.exists(temp)  # half-written, left behind

        dry = reap_stale(tmp_path, dry_run=True)
        assert [(e.path, e.action) for e in dry.removed] == [(temp, "would remove")]
        assert os.path.exists(temp)
        report = reap_stale(tmp_path)
        assert [(e.path, e.action) for e in report.removed] == [(temp, "removed")]
        assert [e.path for e in report.left] == [store.path]  # the live owner's store stays
        assert not os.path.exists(temp)
        assert store.in_use() == 0


def test_waiting_writer_reclaims_a_dead_writers_reservation(tmp_path: Path) -> None:
    batch = _batch(2)
    seg = ipc_file_size(batch)
    with SegmentStore.create(seg, base_dir=tmp_path) as store:
        queue = SPAWN.Queue()
        proc = SPAWN.Process(target=_reserve_and_hang, args=(store.handle(), seg, queue))
        proc.start()
        temp = queue.get(timeout=60)
        proc.kill()
        proc.join(timeout=60)
        info = store.write(batch, timeout=30)  # the budget is full of the dead writer's bytes
        assert info is not None
        assert not os.path.exists(temp)
        assert store.segments() == {info.name: seg}


def test_a_blocked_writer_is_told_only_while_it_lives(tmp_path) -> None:
    from shmloader.shm import hints

    folder = str(tmp_path)
    assert not hints.writer_blocked(folder)
    (tmp_path / "blocked.999999999-12345").touch()  # a writer that died while blocked
    assert not hints.writer_blocked(folder)
    hints.set_blocked(folder, True)
    assert hints.writer_blocked(folder)
    hints.set_blocked(folder, False)
    assert not hints.writer_blocked(folder)


def test_a_writer_says_it_waits_for_room_while_it_does(tmp_path: Path) -> None:
    """The stall warning (dataset/maintenance.py) passes over readers that wait for room and
    warns of the others, however long they have been on a task."""
    from shmloader.shm import hints

    with SegmentStore.create(4096 * 3, base_dir=str(tmp_path)) as store:
        path = store.handle().path
        first = shm_budget.reserve(path, 4096 * 2, store.handle().budget)
        assert first is not None and hints.waiting_writers(path) == set()  # it fitted at once
        got: list[str | None] = []
        stop = threading.Event()
        waiter = threading.Thread(
            target=lambda: got.append(
                shm_budget.reserve(path, 4096 * 2, store.handle().budget, should_stop=stop.is_set)
            )
        )
        waiter.start()
        deadline = time.monotonic() + 30
        while hints.waiting_writers(path) != {os.getpid()}:
            assert time.monotonic() < deadline, "the waiting writer was never listed"
            time.sleep(0.01)
        stop.set()
        waiter.join(30)
        assert got == [None] and hints.waiting_writers(path) == set()
    (tmp_path / "waiting.999999999-12345").touch()  # a writer that died while waiting
    assert hints.waiting_writers(str(tmp_path)) == set()


def test_writers_leave_room_for_the_largest_segment_seen_not_only_present(tmp_path: Path) -> None:
    """Only small segments present (a next epoch's short tasks, read ahead), a large one seen
    before: a writer the consumer does not wait for leaves room for the large one, so that it
    can come when it is waited for. It left room for the largest present only."""
    from shmloader.shm import hints

    def not_waited_for() -> bool:
        return False

    small, large = 1000, 5000
    with SegmentStore.create(small + large + 500, base_dir=tmp_path) as store:
        path = store.handle().path
        first = shm_budget.reserve(path, small, store.handle().budget, urgent=not_waited_for)
        assert first is not None  # small + (room for the largest present: small) fits
        hints.set_largest(path, large)
        try:
            shm_budget.reserve(
                path, small, store.handle().budget, urgent=not_waited_for, timeout=0.3
            )
        except TimeoutError:
            pass
        else:
            raise AssertionError("a second small segment took the large one's room")
        # The one waited for still fits.
        assert shm_budget.reserve(path, large, store.handle().budget, urgent=lambda: True)
