"""``ds.stats()`` against known workloads, and ``Stats.advice()``: each figure checked where
its value is known (the loop waits on one slow reader, or the readers wait on a slow loop;
bytes in use within the budget; rows counted as delivered; readers that exited), and each
rule of the advice on figures that call for it and on figures that do not."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import psutil
import pytest
from _dataset_helpers import dataset, ids_of, write_dataset

import shmloader
from shmloader.stats import advice as rules
from shmloader.stats.probe import Memory, ProcessProbe, job_cpu_seconds
from shmloader.stats.stats import ProcessStats, ReaderStats, Stats

MIB = 1 << 20


def test_rows_count_as_they_are_delivered_not_when_their_task_completes(tmp_path):
    write_dataset(tmp_path / "data", [1000])
    with dataset(tmp_path / "data", tmp_path / "shm", num_readers=1, shuffle=False) as ds:
        batches = iter(shmloader.DataLoader(ds, batch_size=10))
        for _ in range(13):
            next(batches)
        stats = ds.stats()
        assert stats.records_consumed == 130
        assert stats.records_completed == 100  # the first task of 100 rows, and no other
        assert "records consumed: 130 (of completed tasks: 100)" in str(stats)


def test_one_slow_reader_makes_the_loop_wait_and_the_advice_says_add_readers(tmp_path):
    expected = write_dataset(tmp_path / "data", [600])
    with dataset(tmp_path / "data", tmp_path / "shm", num_readers=1, slow=True) as ds:
        seen = Counter(i for b in shmloader.DataLoader(ds, batch_size=10) for i in ids_of(b))
        stats = ds.stats()
    assert seen == Counter(expected)
    assert stats.loop_wait_share is not None and stats.loop_wait_share > 0.8
    assert stats.reader_wait_share is not None and stats.reader_wait_share > 0.7
    (reader,) = stats.readers
    assert reader.busy_share > 0.6 and reader.budget_wait_share < 0.05
    assert reader.room_wait_share == reader.budget_wait_share  # the deprecated name reads on
    assert stats.first_batch_seconds is not None and stats.first_batch_seconds > 0
    said = stats.advice()
    assert said and said[0].startswith("The loop waited for data"), said
    # decode_slow sleeps: this job leaves its cores free, however busy other processes keep
    # the machine (the advice reads the job's CPU, not the machine's).
    assert stats.cpu_cores - stats.cpu_job_cores >= rules.FREE_CORES, stats.cpu_job_cores
    assert "the readers are the bottleneck. Add readers (num_readers=" in said[0]


def test_a_slow_loop_hardly_waits_and_the_advice_says_the_loop_is_the_bottleneck(tmp_path):
    write_dataset(tmp_path / "data", [2000])
    budget = 4 * MIB
    with dataset(tmp_path / "data", tmp_path / "shm", num_readers=2, shm_budget=budget) as ds:
        in_use = []
        for _ in shmloader.DataLoader(ds, batch_size=50):
            time.sleep(0.02)  # the training step
            in_use.append(ds.stats().shm_in_use)
        stats = ds.stats()
    assert stats.loop_wait_share is not None and stats.loop_wait_share < 0.1
    assert max(in_use) <= stats.shm_peak <= budget
    assert stats.shm_peak > 0
    said = stats.advice()
    assert any("the loop is the bottleneck" in line for line in said), said


def test_a_reader_that_exited_keeps_its_last_figures_in_the_stats_and_the_total(tmp_path):
    write_dataset(tmp_path / "data", [3000])
    with dataset(tmp_path / "data", tmp_path / "shm", num_readers=1, epochs=1) as ds:
        batches = iter(shmloader.DataLoader(ds, batch_size=30))
        next(batches)
        (reader,) = ds.stats().readers  # measured while it runs (30 tasks: it reads on)
        assert reader.alive and reader.memory is not None
        for _ in batches:
            pass
        deadline = time.monotonic() + 30
        while reader.alive:  # it exits once the master's only epoch is over
            assert time.monotonic() < deadline, "the reader did not exit"
            time.sleep(0.2)
            (reader,) = ds.stats().readers
        stats = ds.stats()
    (reader,) = stats.readers
    assert not reader.alive and reader.memory is not None and reader.memory.pss > 0
    assert reader.tasks == 30 and reader.records == 3000
    # Every row of the only epoch consumed: they weighed what the reader wrote.
    assert abs(stats.bytes_consumed - reader.bytes) <= 30, (stats.bytes_consumed, reader.bytes)
    (process,) = [p for p in stats.processes if p.role == "reader"]
    assert not process.alive and process.memory == reader.memory
    assert stats.total_pss >= reader.memory.pss + stats.processes[0].memory.pss  # type: ignore[union-attr]
    assert f"reader 0 pid {reader.pid} (exited)" in str(stats)


def test_memory_stays_flat_across_epochs_and_no_advice_names_a_process(tmp_path):
    write_dataset(tmp_path / "data", [1000])
    with dataset(tmp_path / "data", tmp_path / "shm", epochs=None) as ds:
        loader = shmloader.DataLoader(ds, batch_size=50)
        for _ in range(5):
            for _ in loader:
                ds.stats()
            ds.stats()  # the probe measures each process at least once an epoch
        stats = ds.stats()
    trainer = stats.processes[0]
    assert trainer.role == "trainer" and len(trainer.uss_by_epoch) >= 5
    assert len(trainer.pss_by_epoch) == len(trainer.uss_by_epoch)
    # Growth of the pages only the trainer maps is what a leak shows. Not PSS: it splits every
    # shared page among the processes that map it, and other processes mapping the same
    # libraries (another test's, under pytest -n 2) moved the trainer's share by 28 MiB down
    # and 16 MiB up without the trainer holding more or less.
    after_warmup = [uss for _, uss in trainer.uss_by_epoch[1:]]
    assert max(after_warmup) - after_warmup[0] < 16 * MIB, trainer.uss_by_epoch
    assert not any(" grew from " in line for line in stats.advice())


def test_a_trainer_that_keeps_data_every_epoch_is_named_by_the_advice(tmp_path):
    write_dataset(tmp_path / "data", [400])
    kept = []
    with dataset(tmp_path / "data", tmp_path / "shm", epochs=None) as ds:
        loader = shmloader.DataLoader(ds, batch_size=50)
        for _ in range(5):
            for _ in loader:
                ds.stats()
            kept.append(np.ones(48 * MIB, dtype=np.uint8))  # touched: resident
            ds.stats()  # the probe measures each process at least once an epoch
        stats = ds.stats()
    said = [line for line in stats.advice() if " grew from " in line]
    assert said and said[0].startswith(f"The trainer pid {stats.processes[0].pid} grew"), said


def test_numpy_batches_hold_every_record_once(tmp_path):
    expected = write_dataset(tmp_path / "data", [500])
    with dataset(tmp_path / "data", tmp_path / "shm") as ds:
        seen: Counter[int] = Counter()
        for batch in shmloader.DataLoader(ds, batch_size=64, format="numpy"):
            assert isinstance(batch["id"], np.ndarray) and isinstance(batch["x"], np.ndarray)
            assert np.array_equal(batch["x"], (2 * batch["id"]).astype(np.float32))
            seen.update(batch["id"].tolist())
    assert seen == Counter(expected)


def test_an_unknown_batch_format_is_refused_with_the_ones_there_are(tmp_path):
    write_dataset(tmp_path / "data", [10])
    refused = pytest.raises(shmloader.ConfigError, match="format must be one of 'torch', 'numpy'")
    with dataset(tmp_path / "data", tmp_path / "shm") as ds, refused:
        shmloader.DataLoader(ds, batch_size=2, format="jax")  # type: ignore[arg-type]


# -- the advice's rules, on figures made for each ----------------------------------------


def reader(busy: float, room: float) -> ReaderStats:
    return ReaderStats(0, 1, 0, 10, 1000, 10_000, 0, busy * 10, None, room * 10, busy, room)


def figures(*, wait: float, on_readers: float, busy: float, room: float, **more) -> Stats:
    """A snapshot of 100 s of loop with these shares, two readers, two cores."""
    base = Stats(
        readers=[reader(busy, room), reader(busy, room)],
        processes=[],
        shm_in_use=0,
        shm_budget=64 * MIB,
        shm_free=1 << 30,
        records_consumed=100_000,
        records_skipped=0,
        task_failures=0,
        duplicate_tasks=0,
        epochs_started=1,
        epochs_finished=0,
        quarantined_tasks=0,
        batches_delivered=1000,
        loop_seconds=100.0,
        loop_wait_seconds=100.0 * wait,
        reader_wait_seconds=100.0 * on_readers,
        cpu_cores=2,
        cpu_busy_share=0.5,
        cpu_job_cores=1.0,
    )
    return dataclasses.replace(base, **more)


def test_advice_on_readers_that_do_not_keep_up_with_cores_free_or_not():
    free = figures(wait=0.6, on_readers=0.55, busy=0.95, room=0.0, cpu_job_cores=0.6)
    (line,) = free.advice()
    assert "60% of its time (55% for the readers)" in line
    assert "busy 95% of the time and this job kept 0.6 of 2 cores busy" in line
    assert "num_readers=3" in line
    full = figures(wait=0.6, on_readers=0.55, busy=0.95, room=0.0, cpu_job_cores=1.9)
    (line,) = full.advice()
    assert "decoding needs more CPU than this job's cores give" in line


def test_advice_reads_this_jobs_cpu_not_the_machines():
    """Other jobs keep the machine busy: the kernel shares the cores among processes, so a
    reader more still gets this job more of them (a second reader gave +55% on such a
    machine, where the advice had said more readers would not help)."""
    loaded = figures(
        wait=0.6, on_readers=0.55, busy=0.95, room=0.0, cpu_busy_share=1.0, cpu_job_cores=1.0
    )
    (line,) = loaded.advice()
    assert "Add readers (num_readers=3" in line


def test_advice_on_a_budget_that_holds_the_readers_back_while_the_loop_waits():
    stats = figures(wait=0.4, on_readers=0.35, busy=0.2, room=0.7, shm_peak=64 * MIB)
    (line,) = stats.advice()
    assert "waited for room in shared memory 70% of theirs" in line and "Raise shm_budget" in line
    assert "filesystem" not in line
    # A budget sized to a small /dev/shm (shm_budget="auto"): raising it needs room first.
    small = dataclasses.replace(stats, shm_free=20 * MIB)
    (line,) = small.advice()
    assert "Raise shm_budget" in line
    assert "Its filesystem has only 20 MiB free: enlarge it first (docker run --shm-size" in line


def test_advice_on_a_loop_that_is_the_bottleneck():
    stats = figures(wait=0.02, on_readers=0.0, busy=0.1, room=0.8, shm_peak=63 * MIB)
    (line,) = stats.advice()
    assert "the loop is the bottleneck" in line
    assert "Fewer readers (num_readers=1) or a smaller shm_budget than 64 MiB" in line
    roomy = figures(wait=0.02, on_readers=0.0, busy=0.1, room=0.0, shm_peak=8 * MIB)
    (line,) = dataclasses.replace(roomy, readers=roomy.readers[:1]).advice()
    assert "Feeding keeps up; nothing to change on this side." in line


def test_advice_on_a_wait_that_is_gathering_not_the_readers():
    stats = figures(wait=0.3, on_readers=0.01, busy=0.5, room=0.0)
    (line,) = stats.advice()
    assert "the rows were ready" in line and "more DataLoader workers (num_workers=1)" in line
    # As many workers as cores already: another would only share them.
    workers = [ProcessStats(7 + i, "worker", None) for i in range(2)]
    (line,) = dataclasses.replace(stats, processes=workers).advice()
    assert "more DataLoader workers" not in line and "fewer columns" in line


def test_no_advice_when_feeding_and_the_loop_are_balanced_or_nothing_was_seen():
    assert figures(wait=0.05, on_readers=0.02, busy=0.6, room=0.1).advice() == []
    few = figures(wait=0.9, on_readers=0.9, busy=1.0, room=0.0, batches_delivered=5)
    assert few.advice() == []
    plain = figures(wait=0.0, on_readers=0.0, busy=1.0, room=0.0, batches_delivered=0)
    (line,) = plain.advice()
    assert "not measured under a plain torch DataLoader" in line


def test_advice_names_a_process_whose_memory_grows_and_not_one_that_warms_up():
    memory = Memory(rss=0, uss=0, pss=400 * MIB)
    growing = ProcessStats(
        7, "worker", memory, uss_by_epoch=((0, 100 * MIB), (1, 200 * MIB), (2, 300 * MIB))
    )
    warmed = ProcessStats(
        8, "worker", memory, uss_by_epoch=((0, 100 * MIB), (1, 300 * MIB), (2, 301 * MIB))
    )
    stats = figures(wait=0.05, on_readers=0.0, busy=0.6, room=0.1, processes=[growing, warmed])
    (line,) = stats.advice()
    assert line.startswith(
        "The worker pid 7 grew from 200 MiB (USS) in epoch 1 to 300 MiB in epoch 2"
    )


def test_advice_on_restarted_readers_and_rows_that_may_have_come_twice():
    stats = figures(
        wait=0.05, on_readers=0.0, busy=0.6, room=0.1, regranted_tasks=2, regranted_records=150
    )
    stats = dataclasses.replace(stats, readers=[dataclasses.replace(stats.readers[0], restarts=3)])
    said = stats.advice()
    assert any(line.startswith("Reader 0 was restarted 3 time(s)") for line in said), said
    assert any(line.startswith("150 rows of 2 tasks may have come twice") for line in said)


def test_advice_on_a_cache_its_budget_cannot_hold():
    """cache=True: tasks decoded again past a tenth of those read again name the budget that
    keeps them all (the decoded tasks beside the peak in use); a few at an epoch's start do
    not."""
    tight = figures(
        wait=0.05,
        on_readers=0.0,
        busy=0.6,
        room=0.1,
        tasks_decoded_again=20,
        cache_wanted=300 * MIB,
        shm_peak=60 * MIB,
    )
    tight = dataclasses.replace(
        tight, readers=[dataclasses.replace(r, cached_tasks=15) for r in tight.readers]
    )
    assert tight.tasks_from_cache == 30
    (line,) = tight.advice()
    assert line.startswith("cache=True: 20 tasks were read and decoded again")
    assert "shm_budget 64 MiB cannot keep the 300 MiB" in line
    assert "A shm_budget of about 360 MiB keeps them all" in line
    roomy = dataclasses.replace(tight, tasks_decoded_again=3)  # 3 of 33 read again
    assert roomy.advice() == []


def test_a_process_that_exited_unreaped_keeps_its_last_figures_not_zeros():
    """A zombie (exited, not reaped yet) reads as RSS 0: a reader line said "PSS 0.0 MiB"."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    probe = ProcessProbe(None, interval=0.0)
    try:
        alive = probe.usage(child.pid, 0)
        assert alive is not None and alive.memory.rss > 0
        deadline = time.monotonic() + 60
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        gone = probe.usage(child.pid, 1)
        assert gone is not None and not gone.alive and gone.memory == alive.memory
    finally:
        child.wait()


def test_the_jobs_cpu_counts_its_own_processes_only():
    """``job_cpu_seconds``, what ``num_readers="auto"`` reads: a process outside the job (not
    below this one) spinning on a core does not count; this process's own CPU does."""
    spin = f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"
    outsider = int(subprocess.run(["sh", "-c", spin], capture_output=True, text=True).stdout)
    try:
        mine, other = psutil.Process(), psutil.Process(outsider)
        assert other.ppid() != os.getpid()  # not below this process: not the job's
        before, job_before = sum(mine.cpu_times()[:2]), job_cpu_seconds()
        spun_before = sum(other.cpu_times()[:2])
        begun = time.monotonic()
        while time.monotonic() - begun < 0.5:
            pass  # this process keeps a core busy, as far as the machine gives it one
        job, own = job_cpu_seconds() - job_before, sum(mine.cpu_times()[:2]) - before
        spun = sum(other.cpu_times()[:2]) - spun_before
        assert job >= own - 0.02, (job, own)
        # Had the outsider counted, the job's CPU would exceed this process's by what it spun.
        assert job - own < max(0.05, spun / 2), (job, own, spun)
    finally:
        os.kill(outsider, signal.SIGKILL)
