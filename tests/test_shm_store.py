"""Writing, opening (zero-copy) and releasing segments, in one process and across processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from shmloader.errors import ShmSpaceError, StoreClosedError
from shmloader.shm import SegmentInfo, SegmentStore, StoreHandle, ipc_file_size
from shmloader.shm.hints import PEAK_NAME

SPAWN = mp.get_context("spawn")


def make_batch(rows: int, seed: int = 0) -> pa.RecordBatch:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 255, size=(rows, 4, 3), dtype=np.uint8)
    return pa.record_batch(
        {
            "id": pa.array(np.arange(rows, dtype=np.int64) + seed * 1000),
            "label": pa.array([f"r{seed}-{i}" for i in range(rows)]),
            "image": pa.FixedShapeTensorArray.from_numpy_ndarray(images),
        }
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SegmentStore]:
    with SegmentStore.create("8MiB", base_dir=tmp_path) as s:
        yield s


def _write_batches(handle: StoreHandle, seeds: list[int], out: mp.Queue) -> None:
    for seed in seeds:
        out.put(handle.write(make_batch(100, seed)))


def test_round_trip_with_tensor_column(store: SegmentStore) -> None:
    batch = make_batch(50, seed=3)
    info = store.write(batch)
    assert info is not None
    assert info == SegmentInfo(info.name, 50, ipc_file_size(batch))
    assert os.path.getsize(os.path.join(store.path, info.name)) == info.nbytes
    got = store.open(info.name)
    assert got.equals(batch)
    assert isinstance(got.column("image").type, pa.FixedShapeTensorType)
    np.testing.assert_array_equal(
        got.column("image").to_numpy_ndarray(), batch.column("image").to_numpy_ndarray()
    )
    assert store.open(info.name) is got  # cached mapping
    assert store.in_use() == info.nbytes
    assert store.segments() == {info.name: info.nbytes}
    store.release(info.name)
    assert got.equals(batch)  # arrays taken before the release stay readable
    assert store.in_use() == 0
    assert store.segments() == {}


def _mapped_ranges(path: str, inode: int | None = None) -> list[tuple[int, int]]:
    """Where ``path`` is mapped; by ``inode`` instead, if given (the file may be renamed)."""
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) < 6:
                continue
            if (int(fields[4]) == inode) if inode is not None else (fields[5] == path):
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((lo, hi))
    return ranges


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc")
def test_open_is_zero_copy(store: SegmentStore) -> None:
    info = store.write(make_batch(2000, seed=1))
    assert info is not None
    got = store.open(info.name)
    ranges = _mapped_ranges(os.path.join(store.path, info.name))
    assert ranges, "the segment is not memory-mapped"
    buffers = [buf for column in got.columns for buf in column.buffers() if buf is not None]
    assert len(buffers) == 4  # id values, label offsets + bytes, image values (no nulls)
    for buf in buffers:
        assert any(lo <= buf.address and buf.address + buf.size <= hi for lo, hi in ranges), (
            f"buffer at {buf.address:#x} lies outside the mapping: it was copied"
        )
    # The mapping is read-only: writing through it must not be possible.
    with pytest.raises((TypeError, ValueError, BufferError)):
        np.frombuffer(buffers[0], dtype=np.uint8)[0:1] = 1


def test_mapping_cache_drop_and_lru(tmp_path: Path) -> None:
    with SegmentStore.create("8MiB", base_dir=tmp_path, max_open=2) as store:
        infos = [store.write(make_batch(10, seed)) for seed in range(3)]
        names = [i.name for i in infos if i is not None]
        path = os.path.join(store.path, names[0])
        store.written.clear()  # the writer's own mappings (test_shm_written.py) aside
        for name in names:
            store.open(name)
        assert store.mapped_segments == names[1:]  # least recently used went out
        store.drop(names[1])
        store.drop("seg-" + "0" * 32)  # unknown names are fine
        assert store.mapped_segments == names[2:]
        other = store.handle()
        other.open(names[0])
        inode = os.stat(path).st_ino
        store.release(names[0])  # the file stays, as a spare under another name
        assert _mapped_ranges(path, inode), "still mapped by the other handle"
        assert other.drop_missing() == 1
        assert _mapped_ranges(path, inode) == []
        store.drop_all()
        assert store.mapped_segments == []


def test_errors_for_unknown_and_released_segments(store: SegmentStore) -> None:
    info = store.write(make_batch(5))
    assert info is not None
    store.release(info.name)
    with pytest.raises(FileNotFoundError, match="released twice"):
        store.release(info.name)
    store.release(info.name, missing_ok=True)
    with pytest.raises(FileNotFoundError, match=r"seg-.* is not in the store"):
        store.open(info.name)
    for bad in ("../x", ".lock", "tmp-1-2-ab", "seg-xyz"):
        with pytest.raises(ValueError, match="not a segment name"):
            store.open(bad)


def test_batch_larger_than_budget_is_a_clear_error(tmp_path: Path) -> None:
    with SegmentStore.create(4096, base_dir=tmp_path) as store:
        with pytest.raises(ShmSpaceError, match=r"cannot fit in shm_budget 4\.0 KiB.*even when"):
            store.write(make_batch(1000))
        assert store.in_use() == 0


def test_waiting_writer_times_out_or_stops(tmp_path: Path) -> None:
    batch = make_batch(100)
    with SegmentStore.create(ipc_file_size(batch), base_dir=tmp_path) as store:
        first = store.write(batch)
        assert first is not None
        with pytest.raises(TimeoutError, match="budget stay in use"):
            store.write(batch, timeout=0.05)
        stop = threading.Event()
        stop.set()
        assert store.write(batch, should_stop=stop) is None
        assert store.write(batch, should_stop=lambda: True) is None
        assert store.in_use() == first.nbytes  # nothing reserved by the failed attempts

        # A writer blocked on a full budget proceeds once the segment is released.
        stop.clear()
        results: list[SegmentInfo | None] = []
        waiter = threading.Thread(target=lambda: results.append(store.write(batch, timeout=30)))
        waiter.start()
        store.release(first.name)
        waiter.join()
        assert results and results[0] is not None
        assert store.segments() == {results[0].name: first.nbytes}


def test_pickled_owner_is_a_plain_handle(store: SegmentStore) -> None:
    copy = pickle.loads(pickle.dumps(store))
    assert type(copy) is StoreHandle
    assert (copy.path, copy.budget, copy.max_open) == (store.path, store.budget, store.max_open)
    del copy  # a collected copy must not delete anything
    assert os.path.isdir(store.path)


def test_closed_store(tmp_path: Path) -> None:
    store = SegmentStore.create("1MiB", base_dir=tmp_path)
    handle = store.handle()
    info = store.write(make_batch(5))
    assert info is not None
    store.close()
    store.close()  # idempotent
    assert store.closed and not os.path.exists(store.path)
    with pytest.raises(StoreClosedError, match="no longer exists"):
        handle.write(make_batch(5))
    with pytest.raises(StoreClosedError):
        handle.open(info.name)
    with pytest.raises(StoreClosedError):
        handle.release(info.name)


def test_spawned_writers_on_real_dev_shm() -> None:
    """The real /dev/shm: segments written by spawned processes, then nothing left behind."""
    before = {n for n in os.listdir("/dev/shm") if n.startswith("shmloader")}
    with SegmentStore.create("16MiB", base_dir="/dev/shm", reap=False) as store:
        assert store.path.startswith("/dev/shm/shmloader-")
        queue = SPAWN.Queue()
        procs = [
            SPAWN.Process(target=_write_batches, args=(store.handle(), [s, s + 10], queue))
            for s in (1, 2)
        ]
        for p in procs:
            p.start()
        infos = [queue.get(timeout=60) for _ in range(4)]
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
        for info in infos:
            got = store.open(info.name)
            assert got.equals(make_batch(100, seed=got.column("id")[0].as_py() // 1000))
        store.release(infos[0].name)
        assert len(store.segments()) == 3
    after = {n for n in os.listdir("/dev/shm") if n.startswith("shmloader")}
    assert after <= before


def _files(store: SegmentStore) -> dict[str, tuple[int, int]]:
    """Every file of the store but the lock and the peak: name -> (inode, size)."""
    out = {}
    for entry in os.scandir(store.path):
        if entry.is_file() and entry.name not in (".lock", PEAK_NAME):
            st = entry.stat()
            out[entry.name] = (st.st_ino, st.st_size)
    return out


def test_released_segments_are_reused_by_the_next_writer(tmp_path: Path) -> None:
    with SegmentStore.create("8MiB", base_dir=tmp_path) as store:
        first = store.write(make_batch(3000, seed=1))
        assert first is not None
        inode = _files(store)[first.name][0]
        store.release(first.name)
        (spare,) = _files(store)
        assert spare.startswith("spare-") and store.in_use() == 0
        assert store.held() == first.nbytes
        # A smaller segment takes the spare over: same file, cut to its own size.
        second = store.write(make_batch(100, seed=2))
        assert second is not None
        assert _files(store) == {second.name: (inode, second.nbytes)}
        got = store.open(second.name)
        assert got.column("id").to_pylist() == list(range(2000, 2100))
        assert store.held() == store.in_use() == second.nbytes


def test_writers_take_the_spare_released_last(tmp_path: Path) -> None:
    # Gathering processes keep their mappings of the files they released last (spare_maps.py).
    with SegmentStore.create("8MiB", base_dir=tmp_path) as store:
        infos = [store.write(make_batch(500, seed=s)) for s in range(3)]
        inodes = []
        for info in infos:
            assert info is not None
            inodes.append(_files(store)[info.name][0])
            store.release(info.name)
        for want in reversed(inodes):
            again = store.write(make_batch(500, seed=7))
            assert again is not None
            assert _files(store)[again.name][0] == want


def test_spares_give_way_so_the_budget_holds(tmp_path: Path) -> None:
    one = ipc_file_size(make_batch(2000))
    with SegmentStore.create(4 * one, base_dir=tmp_path) as store:
        infos = [store.write(make_batch(2000, seed=s)) for s in range(4)]
        for info in infos:
            assert info is not None
            store.release(info.name)
        assert store.in_use() == 0 and store.held() == 4 * one
        # Twice as large: one spare is extended, another removed to make room.
        big = store.write(make_batch(4000, seed=9))
        assert big is not None
        assert store.in_use() == big.nbytes
        assert store.held() <= 4 * one
        assert sum(1 for name in _files(store) if name.startswith("spare-")) < 3
        assert store.open(big.name).column("id").to_pylist()[-1] == 9000 + 3999
    assert not os.path.exists(store.path)  # spares go with the store


def test_writers_that_are_not_urgent_leave_room_for_one_that_is(tmp_path: Path) -> None:
    one = ipc_file_size(make_batch(500))
    with SegmentStore.create(3 * one, base_dir=tmp_path) as store:
        store.want(["0:7"])
        assert store.wanted() == {"0:7"}
        assert store.write(make_batch(500), urgent=lambda: False) is not None
        assert store.write(make_batch(500), urgent=lambda: False) is not None
        # A third would leave no room for the segment the consumer waits for: it waits.
        with pytest.raises(TimeoutError):
            store.write(make_batch(500), urgent=lambda: False, timeout=0.2)
        # The one it waits for fits; writers that do not say (urgent=None) use it all too.
        assert store.write(make_batch(500), urgent=lambda: "0:7" in store.wanted()) is not None
        assert store.in_use() == 3 * one
        store.want([])
        assert store.wanted() == set()
