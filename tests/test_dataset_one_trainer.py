"""One trainer and its readers: stats, reader lifetimes, the loader's hand-over."""

from __future__ import annotations

import os

import shmloader


def test_stats_count_what_the_loop_received_and_waited(tmp_path):
    path = str(tmp_path / "r.tfrecord")
    shmloader.write_records(path, [bytes([i]) for i in range(40)])
    source = shmloader.RecordFileSource(path)
    with shmloader.SharedTaskDataset(
        source,
        num_readers=1,
        records_per_task=10,
        epochs=2,  # one is consumed: the reader is still there (reading the next) for stats
        shm_budget="8MiB",
        shm_dir=str(tmp_path),
    ) as ds:
        loader = shmloader.DataLoader(ds, batch_size=8)
        batches = list(loader)
        stats = ds.stats()
    assert stats.batches_delivered == len(batches) == 5
    assert stats.loop_wait_seconds > 0
    assert stats.records_consumed == 40
    assert "waited" in str(stats)
    # The trainer gathered and the reader wrote, so both map segment files (and keep them
    # mapped for reuse): counted once, as files, in the job's memory.
    mapped = {p.role: p.memory.pss_segments for p in stats.processes if p.memory is not None}
    assert mapped["trainer"] > 0 and mapped["reader"] > 0
    held = stats.shm_in_use + stats.shm_spare
    assert held > 0
    assert stats.total_memory == stats.total_pss - sum(mapped.values()) + held
    (reader,) = stats.readers
    assert reader.memory is not None and reader.memory.pss_segments == mapped["reader"]
    assert "MiB of it segment files" in str(stats)
    assert "each page once" in str(stats)


def test_readers_outlive_the_thread_that_started_the_dataset(tmp_path):
    # Readers die with their parent *thread* (Linux parent-death signal): the pool must start
    # them from its own long-lived thread, not from the caller's.
    import threading
    import time

    path = str(tmp_path / "r.tfrecord")
    shmloader.write_records(path, [bytes([i]) for i in range(30)])
    ds = shmloader.SharedTaskDataset(
        shmloader.RecordFileSource(path),
        num_readers=2,
        records_per_task=10,
        epochs=1,
        shm_budget="8MiB",
        shm_dir=str(tmp_path),
    )
    try:

        def start_then_end() -> None:
            ds.start()
            time.sleep(1.5)  # the readers are up (signal armed) when this thread ends

        starter = threading.Thread(target=start_then_end)
        starter.start()
        starter.join()
        time.sleep(0.5)  # a reader killed with its starting thread would be restarted by now
        pool = ds.runtime.pool
        assert pool is not None
        assert [r.restarts for r in pool.readers] == [0, 0]
        assert sorted(r for b in shmloader.DataLoader(ds, batch_size=4) for r in b["record"]) == [
            bytes([i]) for i in range(30)
        ]
    finally:
        ds.close()


def test_our_loader_hands_sorted_arrays_and_the_trainer_skips_the_ledger(tmp_path):
    import numpy as np

    path = str(tmp_path / "r.tfrecord")
    shmloader.write_records(path, [i.to_bytes(2, "little") for i in range(300)])
    source = shmloader.RecordFileSource(path)
    seen = []
    with shmloader.SharedTaskDataset(
        source,
        num_readers=2,
        records_per_task=32,
        epochs=1,
        shm_budget="8MiB",
        shm_dir=str(tmp_path),
        seed=5,
    ) as ds:
        gather = ds.gather

        def spy(indices, **options):
            seen.append(indices)
            return gather(indices, **options)

        ds.gather = spy  # what shmloader.DataLoader calls without workers
        rows = [r for batch in shmloader.DataLoader(ds, batch_size=64) for r in batch["record"]]
        ledger = os.path.join(ds.store_path, "ledger")
        assert not os.path.exists(ledger) or os.listdir(ledger) == []  # reported directly
        assert ds.stats().shm_in_use == 0
    assert sorted(int.from_bytes(r, "little") for r in rows) == list(range(300))
    assert all(isinstance(i, np.ndarray) and (np.diff(i) > 0).all() for i in seen)
    assert [len(i) for i in seen] == [64, 64, 64, 64, 44]


def test_misuse_is_named(tmp_path):
    import pytest

    path = str(tmp_path / "r.tfrecord")
    shmloader.write_records(path, [bytes([i]) for i in range(40)])
    source = shmloader.RecordFileSource(path)
    options = dict(num_readers=1, records_per_task=10, shm_budget="8MiB", shm_dir=str(tmp_path))
    with (
        shmloader.SharedTaskDataset(source, columns=["record", "nope"], **options) as ds,
        pytest.raises(shmloader.ConfigError, match=r"columns= names 'nope'.*its columns: record"),
    ):
        next(iter(shmloader.DataLoader(ds, batch_size=8)))
    with shmloader.SharedTaskDataset(source, **options) as ds:
        for size in (0, 2.5):
            with pytest.raises(shmloader.ConfigError, match="batch_size must be a positive int"):
                shmloader.DataLoader(ds, batch_size=size)
        with pytest.raises(shmloader.ConfigError, match=r"batch_size=None.*use batch_size=1"):
            shmloader.DataLoader(ds, batch_size=None)
        with pytest.raises(shmloader.ConfigError, match="batch_size"):
            ds.batch_sampler(-1)
        ds.start()
        with pytest.raises(FileNotFoundError, match=r"never handed it out"):
            ds.__getitems__([7 << 32])  # a sample index of a slot not admitted
