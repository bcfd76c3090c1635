"""Failures the training loop must survive or be told about: readers SIGKILLed mid-task,
a task whose decode always raises (quarantine), a single bad record under on_error="skip"."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _dataset_helpers import dataset, ids_of, reader_pid, shm_entries, source, write_dataset

import shmloader
from shmloader.shm.names import start_token

SIZES = [600, 450]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    directory = tmp_path_factory.mktemp("data")
    return directory, write_dataset(directory, SIZES)


def relayed(ds: Any, index: int, pid: int) -> None:
    """Once reader ``index`` (``pid``) is stopped: until the pool's thread has read all it
    sent, and a moment more to apply the last of it. A fixed pause alone is a race: with the
    pool's thread starved (a loaded machine) it would still show a lease whose Ready it has
    not read, and the reader killed would hold nothing unannounced."""
    proc = ds.runtime.pool.reader_process(index)
    deadline = time.monotonic() + 30  # a bound: the pool's thread reads within milliseconds
    while proc is not None and proc.process.pid == pid and time.monotonic() < deadline:
        try:
            if not proc.conn.poll():
                break
        except OSError:  # the pool found the reader gone and closed its pipe
            break
        time.sleep(0.01)
    time.sleep(0.1)


def catch_a_reader_inside_a_lease(ds: Any, index: int, patience: float) -> tuple[int, int] | None:
    """Stop reader ``index`` while it holds a lease it has not announced; returns (pid, lease
    id) with the reader left stopped, or None if it was not seen inside one for ``patience``
    seconds (readers held back by the shuffle window sit idle while the loop takes nothing).
    What it said before it stopped is relayed before we look (:func:`relayed`)."""
    info = ds.runtime.pool.readers[index]
    deadline = time.monotonic() + patience
    while True:
        pid = reader_pid(ds, index)
        os.kill(pid, signal.SIGSTOP)
        relayed(ds, index, pid)
        lease = info.current_lease
        if lease is not None and info.pid == pid:
            return pid, lease
        os.kill(pid, signal.SIGCONT)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)


def plant_unsealed_segment(ds: Any, pid: int) -> Path:
    """What a reader killed in the middle of ``write`` leaves: ``tmp-<pid>-<start>-<hex>``."""
    token = start_token(pid)
    assert token is not None
    path = Path(ds.runtime.store.path) / f"tmp-{pid}-{token}-{'ab' * 8}"
    path.write_bytes(b"\0" * 4096)
    return path


def test_sigkilled_readers_are_restarted_and_nothing_is_lost_or_doubled(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    directory, expected = data
    with dataset(directory, tmp_path, epochs=2, slow=True, shuffle_window=2) as ds:
        dl = shmloader.DataLoader(ds, batch_size=50, num_workers=1)
        ds.start()
        old_pids = [r.pid for r in ds.stats().readers]
        killed: list[tuple[int, int]] = []
        planted: list[Path] = []
        got: list[int] = []
        for batch in dl:
            got += ids_of(batch)
            # Each reader once, early (later they may have read everything): tried for a
            # second at each batch until caught, as the first batch alone raced the readers.
            if len(killed) < 2:
                caught = catch_a_reader_inside_a_lease(ds, len(killed), patience=1.0)
                if caught is not None:
                    planted.append(plant_unsealed_segment(ds, caught[0]))
                    os.kill(caught[0], signal.SIGKILL)
                    killed.append(caught)
        assert len(killed) == 2, "the readers were never caught inside a lease"
        assert Counter(got) == Counter(expected)
        # The next epoch is whole too (restarted readers serve it). Their liveness is checked
        # at its first batch: once the last epoch is done they leave on their own.
        second: list[int] = []
        new_pids: list[int] = []
        for batch in dl:
            if not new_pids:
                new_pids = [r.pid for r in ds.stats().readers]
                assert all(start_token(p) is not None for p in new_pids)
            second += ids_of(batch)
        assert sorted(second) == expected
        stats = ds.stats()
        assert [r.restarts for r in stats.readers] == [1, 1]
        assert [r.pid for r in stats.readers] == new_pids
        assert not set(new_pids) & set(old_pids)
        assert all(start_token(p) is None for p in old_pids)
        # The killed readers' leases came back as failures the trainer reported to the master as
        # each death was seen (their tasks were read again at once), not through a duplicate.
        progress = ds.runtime.client.progress()
        assert progress.counters["failed"] >= len(killed)
        assert stats.duplicate_tasks == 0
        # Their half-written segments were removed when they died.
        assert [p.exists() for p in planted] == [False, False]
        assert not [n for n in os.listdir(ds.runtime.store.path) if n.startswith("tmp-")]


def test_a_record_decode_rejects_is_raised_as_decode_error_at_once(tmp_path: Path) -> None:
    """A decode error fails the same way every time: the loop raises the reader's DecodeError
    itself, decode's exception chained, after one try (was: TaskQuarantinedError after
    max_retries identical retries, a warning each, no cause)."""
    directory = tmp_path / "data"
    # Records 200..299 of the first file are one task (records_per_task=100); all are bad.
    expected = write_dataset(directory, [500, 300], poison=range(200, 300))
    with dataset(directory, tmp_path / "shm", epochs=1, max_retries=3) as ds:
        dl = shmloader.DataLoader(ds, batch_size=50)
        got: list[int] = []
        with pytest.raises(shmloader.DecodeError) as info:
            for batch in dl:
                got += ids_of(batch)
        error = info.value
        assert error.path == str(directory / "part-00000.tfrecord")
        assert error.index == 200 and error.offset == 200 * (16 + 9)
        assert isinstance(error.__cause__, ValueError)
        assert str(error.__cause__) == "poison record 200"
        assert "in decode" in "".join(error.__notes__)  # where decode raised it
        assert not set(got) & set(range(200, 300))
        assert len(got) == len(set(got))
        assert set(got) <= set(expected)
        stats = ds.stats()
        assert stats.task_failures == 1  # not retried
        assert stats.quarantined_tasks == 1  # the master quarantined it at once


def test_skips_count_once_per_epoch_consumed_not_per_read(tmp_path: Path) -> None:
    directory = tmp_path / "data"
    expected = write_dataset(directory, [500, 300], poison=[123, 777])
    # epochs=None: readers read on into the next epochs while the loop finishes this one.
    with dataset(directory, tmp_path / "shm", epochs=None, on_error="skip") as ds:
        dl = shmloader.DataLoader(ds, batch_size=50)
        got = [i for batch in dl for i in ids_of(batch)]
        assert sorted(got) == sorted(set(expected) - {123, 777})
        assert sum(r.records for r in ds.stats().readers) > len(got) + 2  # read ahead
        assert ds.stats().records_skipped == 2  # it was 2 for every epoch read, ahead too


def test_a_bad_record_is_skipped_and_counted(tmp_path: Path) -> None:
    directory = tmp_path / "data"
    expected = write_dataset(directory, [500, 300], poison=[123, 777])
    with dataset(directory, tmp_path / "shm", epochs=2, on_error="skip") as ds:
        dl = shmloader.DataLoader(ds, batch_size=50, num_workers=2)
        for epoch in range(2):
            got = [i for batch in dl for i in ids_of(batch)]
            assert Counter(got) == Counter(set(expected) - {123, 777}), epoch
        stats = ds.stats()
        assert stats.records_skipped == 4  # two records, two epochs
        assert stats.task_failures == 0 and stats.quarantined_tasks == 0
        skipped = sorted((s.path, s.index) for s in ds.runtime.skipped)
        first, second = (
            str(directory / "part-00000.tfrecord"),
            str(directory / "part-00001.tfrecord"),
        )
        assert skipped == [(first, 123), (first, 123), (second, 277), (second, 277)]


def test_a_task_that_kills_every_reader_is_quarantined_and_raised(tmp_path: Path) -> None:
    """No failure report ever arrives (the reader just dies): the task is quarantined by lease
    expiry at the master, and the loop must still be told instead of waiting forever."""
    directory = tmp_path / "data"
    write_dataset(directory, [300, 200], poison=[450])  # in the last task of the second file
    options = {"epochs": 1, "max_retries": 1, "lease_timeout": 1.0, "crash": True}
    with dataset(directory, tmp_path / "shm", **options) as ds:
        dl = shmloader.DataLoader(ds, batch_size=50)
        got: list[int] = []
        with pytest.raises(shmloader.TaskQuarantinedError) as info:
            for batch in dl:
                got += ids_of(batch)
        assert str(directory / "part-00001.tfrecord") in str(info.value)
        assert "records 100..200" in str(info.value)
        assert not set(got) & set(range(400, 500)) and len(got) == len(set(got))
        assert sum(r.restarts for r in ds.stats().readers) == 2


def test_a_reader_killed_after_sealing_but_before_announcing_leaves_no_segment(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    import pyarrow as pa

    from shmloader.shm import ipc_file_size

    directory, expected = data
    src = source(directory)
    one = ipc_file_size(src.read(src.plan()[0], 0, 100))
    # Room for two segments: both readers then wait for budget after saying which segment
    # they will seal, which leaves time to catch one there. One seen writing one of the first
    # two may have announced it by the time it stops: then it goes on and is caught again.
    with dataset(directory, tmp_path, shm_budget=2 * one + 1024) as ds:
        ds.start()
        info = ds.runtime.pool.readers[0]
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, "reader 0 was never caught writing a segment"
            while info.sealing is None and time.monotonic() < deadline:
                time.sleep(0.01)
            pid, orphan = reader_pid(ds, 0), info.sealing
            assert orphan is not None, "reader 0 was never seen writing a segment"
            os.kill(pid, signal.SIGSTOP)
            relayed(ds, 0, pid)
            if info.sealing == orphan and info.pid == pid:
                break
            os.kill(pid, signal.SIGCONT)
        # Exactly what a reader killed between its seal and its Ready leaves behind.
        batch = pa.record_batch({"id": pa.array([-1])})
        path = os.path.join(ds.runtime.store.path, orphan)
        with pa.OSFile(path, "wb") as f, pa.ipc.new_file(f, batch.schema) as writer:
            writer.write_batch(batch)
        os.kill(pid, signal.SIGKILL)
        got = [i for b in shmloader.DataLoader(ds, batch_size=50) for i in ids_of(b)]
        assert sorted(got) == expected  # the task was read again, the orphan never delivered
        assert orphan not in os.listdir(ds.runtime.store.path)
        assert ds.stats().readers[0].restarts == 1


def test_a_killed_reader_in_a_tiny_budget_does_not_stall_later_epochs(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    """Room for three segments, readers free to read ahead into later epochs: the task of the
    killed reader comes back (lease expiry) while the budget is full of tasks the sampler does
    not want yet. Readers leave room for the task the sampler waits for and step aside for it,
    so every epoch still completes, each record once."""
    from shmloader.shm import ipc_file_size

    directory, expected = data
    src = source(directory)
    one = ipc_file_size(src.read(src.plan()[0], 0, 100))
    with dataset(directory, tmp_path, shm_budget=3 * one, epochs=None) as ds:
        dl = shmloader.DataLoader(ds, batch_size=50)
        ds.start()
        caught = None
        for epoch in range(3):
            got: list[int] = []
            for i, batch in enumerate(dl):
                got += ids_of(batch)
                if epoch == 0 and i >= 1 and caught is None:
                    caught = catch_a_reader_inside_a_lease(ds, 0, patience=1.0)
                    if caught is not None:
                        os.kill(caught[0], signal.SIGKILL)
            assert caught is not None, "reader 0 was never caught inside a lease"
            assert sorted(got) == expected, f"epoch {epoch}"
        assert ds.stats().readers[0].restarts == 1


@pytest.mark.timeout(90)  # it hung
@pytest.mark.parametrize("kind", ["shmloader", "batch_sampler", "batch_sampler-workers"])
def test_rows_kept_for_the_next_batch_go_out_as_a_short_batch_when_they_fill_the_budget(
    tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Room for one segment; a batch of 32 leaves rows of a block's task over, whose segment
    then fills the budget while they wait for the next block to fill a batch: that block could
    never be read (the run hung). They go out as a short batch instead."""
    import torch.utils.data

    from shmloader.shm import ipc_file_size

    directory = tmp_path / "data"
    expected = write_dataset(directory, [200, 200])
    src = source(directory)
    one = ipc_file_size(src.read(src.plan()[0], 0, 100))
    with dataset(directory, tmp_path / "shm", epochs=1, shm_budget=one + 1024) as ds:
        if kind == "shmloader":
            dl: Any = shmloader.DataLoader(ds, batch_size=32)
        else:  # a plain DataLoader's workers report what they gathered themselves
            workers = 2 if kind.endswith("workers") else 0
            dl = torch.utils.data.DataLoader(
                ds, batch_sampler=ds.batch_sampler(32), collate_fn=ds.collate, num_workers=workers
            )
        batches = [ids_of(b) for b in dl]
        got = [i for b in batches for i in b]
        assert sorted(got) == expected
        assert sum(len(b) < 32 for b in batches[:-1]) >= 1  # let go before the end
    assert "handing them out as a short batch" in caplog.text


def test_under_ddp_rows_kept_for_the_next_batch_make_no_short_batch() -> None:
    import numpy as np

    from shmloader.dataset.order.batch_sampler import TaskBatchSampler
    from shmloader.dataset.order.sampler import SHORT_BATCH

    class Blocks:  # the sampler's side: one block of 40 rows, then only SHORT_BATCH
        def chunks(self, walk: Any = None) -> Any:
            yield np.arange(40, dtype=np.int64)
            yield SHORT_BATCH

    class Reports:  # the dataset's side: a wanted reader is blocked, and only 8 rows pin
        def pinned(self, held: int) -> bool:
            return held == 8

    batcher = TaskBatchSampler(Blocks(), 32, False, Reports(), short_batches=False)  # type: ignore[arg-type]
    batches = iter(batcher)
    assert len(next(batches)) == 32
    assert batcher.stuck()  # the 8 rows held are all that is not consumed
    with pytest.raises(shmloader.ShmSpaceError, match="under DDP a short batch"):
        next(batches)


def test_a_reader_long_on_one_task_is_warned_of(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A decode that never returns kept its lease renewed, silently, for ever; here a task of
    # 600 records at 2 ms each stands for it, against a threshold of 0.3 s. Readers are looked
    # at every 0.02 s, not every second: the task's time past the threshold (under a second)
    # could fall between two looks, and did on a loaded machine.
    monkeypatch.setattr("shmloader.dataset.runtime.maintenance.STALL_SECONDS", 0.3)
    monkeypatch.setattr("shmloader.dataset.runtime.maintenance.STALL_CHECK_SECONDS", 0.02)
    directory = tmp_path / "data"
    expected = write_dataset(directory, [600])
    with (
        caplog.at_level("WARNING", logger="shmloader.dataset.runtime"),
        dataset(directory, tmp_path / "shm", records_per_task=600, num_readers=1, slow=True) as ds,
    ):
        got = [i for b in shmloader.DataLoader(ds, batch_size=50) for i in ids_of(b)]
        pid = ds.stats().readers[0].pid
    assert sorted(got) == expected
    assert "reader 0 (pid" in caplog.text and f"py-spy dump --pid {pid}" in caplog.text


@pytest.mark.timeout(90)  # it hung
def test_batches_in_flight_that_fill_the_budget_are_a_named_error(tmp_path: Path) -> None:
    """shmloader.DataLoader's workers: their rows count as consumed only when the loop gets
    them, which it cannot while the sampler waits for room they hold. Nothing to let go:
    an error that says what to raise, not a hang."""
    from shmloader.shm import ipc_file_size

    directory = tmp_path / "data"
    write_dataset(directory, [200, 200])
    src = source(directory)
    one = ipc_file_size(src.read(src.plan()[0], 0, 100))
    with (
        dataset(directory, tmp_path / "shm", epochs=1, shm_budget=one + 1024) as ds,
        pytest.raises(shmloader.ShmSpaceError, match=r"batches in flight.*raise shm_budget"),
    ):
        for _ in shmloader.DataLoader(ds, batch_size=32, num_workers=2):
            pass


@pytest.mark.long
def test_a_slow_task_with_room_for_it_is_waited_for_not_cut_short(tmp_path: Path) -> None:
    """Room for the task the sampler waits for, which is just slow to read: the rows kept for
    the next batch wait for it (they were let go, and under DDP that raised)."""
    import torch.utils.data

    from shmloader.shm import ipc_file_size

    directory = tmp_path / "data"
    expected = write_dataset(directory, [1000, 1000, 1000])
    src = source(directory)
    one = ipc_file_size(src.read(src.plan()[0], 0, 1000))
    options = dict(epochs=1, records_per_task=1000, num_readers=1, slow=True)  # 2 s a task
    with dataset(directory, tmp_path / "shm", shm_budget=int(2.5 * one), **options) as ds:
        batcher = ds.batch_sampler(64)
        batcher.short_batches = False  # as under DDP
        dl = torch.utils.data.DataLoader(ds, batch_sampler=batcher, collate_fn=ds.collate)
        batches = [ids_of(b) for b in dl]
    assert sorted(i for b in batches for i in b) == expected
    assert [len(b) for b in batches[:-1]] == [64] * (len(batches) - 1)


@pytest.mark.timeout(120)  # it hung
def test_short_tasks_read_ahead_do_not_starve_a_large_task_of_room(tmp_path: Path) -> None:
    """Tasks of 1000 and 300 records (each file's tail), room for 1.5 large segments, readers
    reading ahead into the next epoch: they filled the budget with the next epoch's short tasks
    (they left room only for the largest segment *present*), and the large task the sampler
    waited for never fit (hung; later a ShmSpaceError). Writers now leave room for the largest
    segment seen (test_shm_budget checks that exactly); here the whole run goes through."""
    from shmloader.shm import ipc_file_size

    directory = tmp_path / "data"
    expected = write_dataset(directory, [1300] * 6)
    src = source(directory)
    big = ipc_file_size(src.read(src.plan()[0], 0, 1000))
    options = dict(records_per_task=1000, epochs=None, shm_budget=int(1.5 * big) + 1024)
    with dataset(directory, tmp_path / "shm", **options) as ds:
        dl = shmloader.DataLoader(ds, batch_size=32)
        for _ in range(3):
            assert sorted(i for b in dl for i in ids_of(b)) == expected


def test_a_wait_that_cannot_end_is_a_named_error() -> None:
    # Starved, nothing ready, a wanted reader blocked and nothing handed out to consume.
    from shmloader.dataset.core.tasks import Pressure
    from shmloader.dataset.waiting.ready import ReadyTasks

    with pytest.raises(shmloader.ShmSpaceError, match="read ahead into a later epoch"):
        ReadyTasks().take(0, [3], pressure=lambda: Pressure.DEAD_END, patience=0.05)


def test_a_blocked_reader_of_the_task_waited_for_starves_the_sampler() -> None:
    """Early in a run the trainer has seen only short segments (each file's tail, read
    first), so the room it estimates looks ample, while the reader of the large task the
    sampler waits for has none: the sampler must take the later tasks that are ready, which
    frees room, rather than wait for ever (the end-to-end test above hung now and then)."""
    from shmloader.dataset.core.tasks import Pressure, ReadyTask
    from shmloader.dataset.waiting.ready import ReadyTasks

    ready = ReadyTasks()
    ready.put(ReadyTask(0, 4, 4, "seg-a", 300, 104))
    took = ready.take(0, [0], pressure=lambda: Pressure.BLOCKED, later=[1, 2, 3, 4], patience=30)
    assert took is not None and [t.seq for t in took] == [4]


@pytest.mark.long
def test_a_master_gone_for_good_is_one_error_and_a_prompt_close(
    tmp_path: Path, data: tuple[Path, list[int]], monkeypatch: pytest.MonkeyPatch, capfd: Any
) -> None:
    """Readers that give up on the master tell the trainer, which raises from the sampler;
    they are not restarted and print no traceback, and close() does not wait ``retry_for``
    again for each call it makes (it took 4 such waits and a reader's stop timeout before).
    The bound is just under one such wait, not a measurement: a loaded machine closes slowly."""
    directory, _ = data
    monkeypatch.setenv("SHMLOADER_MASTER_RETRY", "10")  # readers inherit it
    with shmloader.Master(source(directory), records_per_task=20, epochs=None) as master:
        ds = dataset(
            directory,
            tmp_path,
            master=master.address,
            records_per_task=20,
            epochs=None,
            shm_budget="1MiB",
        )
        loader = shmloader.DataLoader(ds, batch_size=16)
        next(iter(loader))
        master.stop(grace=None)
        with pytest.raises(shmloader.errors.MasterError, match="unreachable"):
            for _ in range(1000):  # passes (epochs) until the error
                for _batch in loader:
                    pass
        readers = ds.runtime.pool.readers
        began = time.monotonic()
        ds.close()
        closing = time.monotonic() - began
    assert closing < 9.0
    assert all(r.restarts == 0 for r in readers)
    assert "Traceback" not in capfd.readouterr().err


def test_ctrl_c_with_the_master_unreachable_exits_at_once(
    tmp_path: Path, data: tuple[Path, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job is going down: close() tries each call to the master once, where it waited
    ``retry_for`` for the completions and again for the leave (a minute by default)."""
    directory, _ = data
    monkeypatch.setenv("SHMLOADER_MASTER_RETRY", "60")  # a bound, not a measurement, below
    with shmloader.Master(source(directory), records_per_task=20, epochs=None) as master:
        ds = dataset(directory, tmp_path, master=master.address, records_per_task=20, epochs=None)
        loader = shmloader.DataLoader(ds, batch_size=16)
        with pytest.raises(KeyboardInterrupt), ds:
            next(iter(loader))
            master.stop(grace=None)
            began = time.monotonic()
            raise KeyboardInterrupt
    assert time.monotonic() - began < 40.0
    assert not shm_entries(tmp_path)
