"""``cache=True``: decoded tasks kept in shared memory across epochs.

The store keeps a released segment under its task's key (``cached-<key>``, also while the
segment is still read), a reader of the same task takes it back instead of reading, and the
budget treats what is cached as room that gives way to segments in use. The tests check the
store alone, then whole datasets: every record once per epoch from the cache, through a
reader's SIGKILL, a trainer's SIGKILL and resume, a file changed under the job and a decode
that draws random numbers, and the budget never exceeded.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from _dataset_helpers import Trainer, dataset, ids_of, wait_gone, write_dataset
from _decoders import (
    DECODED_ENV,
    GATE_ENV,
    PADDED,
    SCHEMA,
    decode_augmented,
    decode_counted,
    decode_gated,
    decode_padded,
    encode_padded,
)

import shmloader
from shmloader.reader.cache_key import cache_key
from shmloader.reader.unchanged import FileIdentity
from shmloader.shm import SegmentInfo, SegmentStore, ipc_file_size
from shmloader.shm.names import new_segment_name

ROWS = 1000
SIZES = [500, 300, 200]  # 10 tasks of 100


def _batch(seed: int) -> pa.RecordBatch:
    return pa.record_batch({"x": pa.array(np.arange(ROWS, dtype=np.int64) + seed)})


def _key(n: int) -> str:
    return cache_key("/data/part.tfrecord", n * 100, (n + 1) * 100, None)


# -- the store ----------------------------------------------------------------------------


def _read_twice(store: SegmentStore, seed: int) -> tuple[SegmentInfo, SegmentInfo]:
    """A segment written and cached, and the same taken back from the cache while the first
    is still read (the next epoch's copy of the task): both names of one file."""
    first = store.write(_batch(seed))
    assert first is not None
    store.cache(first.name, _key(0))
    found = store.take_cached(_key(0), new_segment_name())
    assert found is not None
    return first, found[0]


def test_a_released_segment_is_taken_back_whole_by_its_key(tmp_path: Path) -> None:
    seg = ipc_file_size(_batch(0))
    with SegmentStore.create(4 * seg, base_dir=tmp_path) as store:
        info = store.write(_batch(7))
        assert info is not None
        store.cache(info.name, _key(0))
        # Read under two names, one file: counted once, as in use.
        assert store.occupancy() == (seg, 0, 0)
        store.release(info.name, cache_as=_key(0))
        assert store.occupancy() == (0, 0, seg)
        assert store.take_cached(_key(1), new_segment_name()) is None  # another task's key
        again = store.take_cached(_key(0), new_segment_name())
        assert again is not None
        taken, schema = again
        assert (taken.num_rows, taken.nbytes) == (ROWS, seg)
        assert schema == _batch(0).schema
        assert store.open(taken.name).equals(_batch(7))
        assert store.occupancy() == (seg, 0, 0)
        assert store.take_cached(_key(0), new_segment_name()) is None  # taken already


def test_a_task_cached_while_its_segment_is_read_is_shared_not_copied(tmp_path: Path) -> None:
    """The next epoch's reader of a task takes its cached name while the epoch before still
    reads the segment: one file, counted once, never written over while either name reads it,
    and cached again when both are released."""
    seg = ipc_file_size(_batch(0))
    with SegmentStore.create(3 * seg, base_dir=tmp_path) as store:
        first, second = _read_twice(store, 1)
        assert store.occupancy() == (seg, 0, 0)
        # Writers fill the rest of the budget: the shared file is not theirs to take.
        others = [store.write(_batch(10 + i), timeout=5) for i in range(2)]
        assert store.open(first.name).equals(_batch(1))
        assert store.open(second.name).equals(_batch(1))
        store.release(first.name, cache_as=_key(0))
        assert store.occupancy() == (3 * seg, 0, 0)  # still read under its other name
        store.release(second.name, cache_as=_key(0))
        assert store.occupancy() == (2 * seg, 0, seg)
        for other in others:
            assert other is not None
            store.release(other.name)
        assert store.occupancy() == (0, 2 * seg, seg)


def test_writers_write_over_cached_segments_only_when_out_of_room(tmp_path: Path) -> None:
    seg = ipc_file_size(_batch(0))
    with SegmentStore.create(3 * seg, base_dir=tmp_path) as store:
        for n in range(2):
            info = store.write(_batch(n))
            assert info is not None
            store.cache(info.name, _key(n))
            store.release(info.name, cache_as=_key(n))
        assert store.occupancy() == (0, 0, 2 * seg)
        third = store.write(_batch(2))  # room left without the cache: both stay
        assert third is not None
        assert store.occupancy() == (seg, 0, 2 * seg)
        fourth = store.write(_batch(3))  # none left: one cached task gives way
        assert fourth is not None
        assert store.occupancy() == (2 * seg, 0, seg)
        assert store.held() <= store.budget
        kept = [n for n in range(2) if store.take_cached(_key(n), new_segment_name())]
        assert len(kept) == 1
        assert store.open(fourth.name).equals(_batch(3))


def test_a_cached_task_is_taken_as_a_write_would_be_leaving_room_for_one_more(
    tmp_path: Path,
) -> None:
    """A reader ahead in a later epoch takes a cached task only where a write would fit:
    room for one more segment stays, unless the sampler waits for this very task. Taken
    regardless, cached tasks of a later epoch filled the budget while the task waited for,
    not cached, had no room to be decoded into (a ShmSpaceError dead end)."""
    seg = ipc_file_size(_batch(0))
    with SegmentStore.create(4 * seg, base_dir=tmp_path) as store:
        pinned = [store.write(_batch(10 + i)) for i in range(2)]  # ready, not taken yet
        for n in range(2):
            info = store.write(_batch(n))
            assert info is not None
            store.cache(info.name, _key(n))
            store.release(info.name, cache_as=_key(n))
        assert store.occupancy() == (2 * seg, 0, 2 * seg)
        later = lambda: False  # noqa: E731 - not the task the sampler waits for
        first = store.take_cached(_key(0), new_segment_name(), urgent=later)
        assert first is not None  # 3 in use: the fourth's room stays
        assert store.take_cached(_key(1), new_segment_name(), urgent=later) is None
        assert store.occupancy() == (3 * seg, 0, seg)
        # The task waited for is written, over the cached one left.
        waited = store.write(_batch(5), timeout=5, urgent=lambda: True)
        assert waited is not None and store.held() <= store.budget
        # And a cached task the sampler waits for is taken into the last room.
        assert all(p is not None for p in pinned)
        store.release(waited.name, cache_as=_key(1))
        assert store.take_cached(_key(1), new_segment_name(), urgent=lambda: True) is not None
        assert store.occupancy() == (4 * seg, 0, 0)


def test_a_segment_released_without_its_key_keeps_its_other_name(tmp_path: Path) -> None:
    """A reader killed after taking a cached task, before announcing it: its segment is
    released as a spare would be, and the copy the epoch before still reads stays whole."""
    seg = ipc_file_size(_batch(0))
    with SegmentStore.create(2 * seg, base_dir=tmp_path) as store:
        first, second = _read_twice(store, 5)
        store.release(second.name)
        assert store.occupancy() == (seg, 0, 0)
        store.write(_batch(6), timeout=5)
        assert store.open(first.name).equals(_batch(5))


def test_the_key_names_file_range_and_identity() -> None:
    one = FileIdentity(size=10, mtime_ns=1, inode=2, device=3)
    keys = {
        cache_key("/a", 0, 100, one),
        cache_key("/b", 0, 100, one),
        cache_key("/a", 100, 200, one),
        cache_key("/a", 0, 100, FileIdentity(size=10, mtime_ns=2, inode=2, device=3)),
        cache_key("/a", 0, 100, None),
    }
    assert len(keys) == 5
    assert cache_key("/a", 0, 100, one) == cache_key("/a", 0, 100, one)
    assert all(len(k) == 32 and set(k) <= set("0123456789abcdef") for k in keys)  # hex digits


# -- whole datasets -----------------------------------------------------------------------


@pytest.fixture
def counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file decode_counted appends each decoded id to (readers inherit the variable)."""
    path = tmp_path / "decoded.txt"
    path.touch()
    monkeypatch.setenv(DECODED_ENV, str(path))
    return path


def _decoded(path: Path) -> Counter[int]:
    return Counter(int(line) for line in path.read_text().split())


def _counted_source(directory: Path) -> Any:
    return shmloader.RecordFileSource(
        str(directory / "*.tfrecord"), decode=decode_counted, schema=SCHEMA
    )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_cached_epochs_deliver_every_record_once_without_decoding_it_again(
    tmp_path: Path, counted: Path, num_workers: int
) -> None:
    directory = tmp_path / "data"
    expected = write_dataset(directory, SIZES)
    epochs = 4
    src = _counted_source(directory)
    with dataset(directory, tmp_path / "shm", src=src, epochs=epochs, cache=True) as ds:
        assert ds.options.cache is True
        dl = shmloader.DataLoader(ds, batch_size=64, num_workers=num_workers)
        for _ in range(epochs):
            assert Counter(i for batch in dl for i in ids_of(batch)) == Counter(expected)
        stats = ds.stats()
    # Every task a reader served was decoded or taken from the cache, never both: the
    # records decoded are exactly those of the tasks not served from the cache.
    decoded = _decoded(counted)
    served = sum(r.tasks for r in stats.readers)
    assert served == epochs * len(expected) // 100
    assert sum(decoded.values()) == (served - stats.tasks_from_cache) * 100
    assert set(decoded) == set(expected)  # the first epoch decodes each record
    assert stats.tasks_from_cache >= len(expected) // 100  # an epoch's worth, at least
    assert "cache:" in str(stats)


def test_a_reader_killed_in_a_cached_epoch_loses_and_doubles_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "data"
    expected = write_dataset(directory, SIZES)
    with dataset(directory, tmp_path / "shm", epochs=3, cache=True, shuffle_window=2) as ds:
        dl = shmloader.DataLoader(ds, batch_size=50)
        assert sorted(i for batch in dl for i in ids_of(batch)) == expected
        old = [r.pid for r in ds.stats().readers]
        for p in range(1, 3):
            got: list[int] = []
            for batch in dl:
                got += ids_of(batch)
                if p == 1 and len(got) == 100:  # whatever they do now: the cache's epoch
                    for pid in old:
                        os.kill(pid, signal.SIGKILL)
            assert Counter(got) == Counter(expected), p
        stats = ds.stats()
        assert all(r.restarts >= 1 for r in stats.readers)
        assert stats.duplicate_tasks == 0
        assert stats.tasks_from_cache > 0
    assert wait_gone(old) == []


def test_a_trainer_killed_in_a_cached_epoch_resumes_exactly(tmp_path: Path) -> None:
    """SIGKILLed mid-epoch 1 (served from the cache) after saving its state: the resumed
    trainer, in a fresh process with a cold cache, delivers exactly the rest."""
    directory = tmp_path / "data"
    expected = write_dataset(directory, SIZES)
    state = tmp_path / "state.json"
    common: dict[str, Any] = {
        "data": str(directory),
        "shm_dir": str(tmp_path / "shm"),
        "dataset": {"epochs": 3, "cache": True, "shuffle_window": 3},
        "batch_size": 50,
    }
    first = Trainer(
        tmp_path, "first", **common, passes=3, stop_at=[1, 7], save_state=str(state), then="wait"
    )
    readers = first.wait_for("info")["info"]["readers"]
    first.wait_for("stopped")
    os.kill(first.proc.pid, signal.SIGKILL)
    first.finish()
    assert wait_gone(readers) == []
    assert sorted(first.ids(0)) == expected
    before = first.ids(1)
    assert len(before) == 7 * 50
    second = Trainer(tmp_path, "second", **common, passes=2, load_state=str(state))
    assert second.finish(timeout=120) == 0, second.output()
    rest = second.ids(0)
    assert Counter(before + rest) == Counter(expected)
    assert sorted(second.ids(1)) == expected


def test_a_file_changed_after_an_epoch_is_refused_not_served_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file changes while the only reader is inside the last task of epoch 0 (in order:
    no shuffle), so every task of epoch 1 is leased after it; those of the changed file are in
    the cache, and are refused, not served, naming the file."""
    directory = tmp_path / "data"
    expected = write_dataset(directory, SIZES)
    changed = directory / "part-00001.tfrecord"
    gate = tmp_path / "gate"
    gate.mkdir()
    monkeypatch.setenv(GATE_ENV, str(gate))

    def change_when_the_reader_waits() -> None:
        while not (gate / "waiting").exists():
            time.sleep(0.005)
        changed.write_bytes(changed.read_bytes())  # the same bytes: another file all the same
        os.utime(changed, ns=(time.time_ns(), time.time_ns() + 10**9))
        (gate / "go").touch()

    src = shmloader.RecordFileSource(
        str(directory / "*.tfrecord"), decode=decode_gated, schema=SCHEMA
    )
    options = {"epochs": 2, "cache": True, "shuffle": False, "num_readers": 1}
    with dataset(directory, tmp_path / "shm", src=src, **options) as ds:
        dl = shmloader.DataLoader(ds, batch_size=50)
        changer = threading.Thread(target=change_when_the_reader_waits, daemon=True)
        changer.start()
        assert sorted(i for batch in dl for i in ids_of(batch)) == expected
        changer.join()
        with pytest.raises(shmloader.DataError, match="changed while the dataset ran") as info:
            for _ in dl:
                pass
        assert info.value.path == str(changed)
        assert ds.stats().tasks_from_cache > 0  # those of the files not changed


def test_a_decode_that_draws_random_numbers_is_not_cached_and_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "data"
    expected = write_dataset(directory, SIZES)
    src = shmloader.RecordFileSource(
        str(directory / "*.tfrecord"), decode=decode_augmented, schema=SCHEMA
    )
    xs: list[dict[int, float]] = []
    with (
        caplog.at_level(logging.WARNING, logger="shmloader"),
        dataset(directory, tmp_path / "shm", src=src, epochs=2, cache=True) as ds,
    ):
        dl = shmloader.DataLoader(ds, batch_size=50)
        for _ in range(2):
            seen: dict[int, float] = {}
            for batch in dl:
                seen.update(zip(batch["id"].tolist(), batch["x"].tolist(), strict=True))
            assert sorted(seen) == expected
            xs.append(seen)
        assert ds.stats().tasks_from_cache == 0
    said = [r for r in caplog.records if "task_rng" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert xs[0] != xs[1]  # each epoch its own numbers


def test_a_cache_larger_than_the_budget_never_exceeds_it(tmp_path: Path) -> None:
    """Ten tasks of 4 MB in a budget of 16 MiB: the cache keeps what fits, gives way to the
    segments read, and every epoch is whole."""
    directory = tmp_path / "data"
    expected = write_dataset(directory, SIZES, encoder=encode_padded)
    src = shmloader.RecordFileSource(str(directory / "*.tfrecord"), decode=decode_padded)
    with dataset(
        directory, tmp_path / "shm", src=src, epochs=3, cache=True, shuffle_window=2
    ) as ds:
        dl = shmloader.DataLoader(ds, batch_size=50)
        ds.start()
        store = ds.runtime.store
        most = [0]
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                most[0] = max(most[0], store.held())
                time.sleep(0.001)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            for _ in range(3):
                got = [i for batch in dl for i in batch["id"].tolist()]
                assert Counter(got) == Counter(expected)
        finally:
            done.set()
            watcher.join()
        assert 0 < most[0] <= store.budget
        stats = ds.stats()
        assert stats.shm_in_use + stats.shm_spare + stats.shm_cached <= store.budget
        # Twenty tasks read again, and room for four at most: most were decoded again, and
        # the advice names a budget for all ten (40 MB and more).
        assert stats.tasks_decoded_again > 0
        assert stats.cache_wanted >= len(expected) * PADDED
        assert any(line.startswith("cache=True: ") for line in stats.advice()), stats.advice()
