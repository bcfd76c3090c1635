"""Tasks sized from the data where ``records_per_task`` is not given (master/task_size.py):
about 32 MiB of the files per task, and at least 8 tasks an epoch per rank.

The function is pure (plan, files' sizes, ranks); the dataset's use of it runs over real
files, a real embedded master and real readers, with the delivered ids checked.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from _dataset_helpers import dataset, ids_of, shm_entries, write_dataset
from _decoders import decode, decode_padded, encode_padded

import shmloader
from shmloader.master.client import MasterClient
from shmloader.master.config import DEFAULT_RECORDS_PER_TASK
from shmloader.master.task_size import (
    TASK_BYTES,
    TASKS_PER_RANK,
    WINDOWS_IN_BUDGET,
    file_bytes,
    records_per_task_for,
    task_bytes,
)
from shmloader.shm import space
from shmloader.shm.space import AUTO_CEILING, AUTO_SHARE, budget_bytes, nominal_budget

MiB = 1 << 20


def _plan(*counts: int) -> list[shmloader.Shard]:
    return [shmloader.Shard(f"f{i}", n) for i, n in enumerate(counts)]


def test_a_task_holds_about_its_bytes_of_the_files() -> None:
    # 264-byte rows: 32 MiB hold 127,100 of them (where there were 4096, 1 MiB a task).
    plan = _plan(6_000_000, 4_000_000)
    sizes = {"f0": 6_000_000 * 264, "f1": 4_000_000 * 264}
    assert records_per_task_for(plan, sizes, None) == TASK_BYTES // 264
    # 12 KB images: 2,728 a task (where there were 4096, 50 MiB a task).
    plan = _plan(100_000)
    assert records_per_task_for(plan, {"f0": 100_000 * 12_300}, None) == TASK_BYTES // 12_300
    # A record larger than a task's bytes is a task of its own.
    assert records_per_task_for(_plan(100), {"f0": 100 * 40 * MiB}, None) == 1


def test_an_epoch_keeps_tasks_for_each_rank() -> None:
    # 10,000 small rows would make one task: 8 an epoch instead, 8 per rank under DDP.
    plan, sizes = _plan(10_000), {"f0": 10_000 * 100}
    assert records_per_task_for(plan, sizes, None) == 10_000 // TASKS_PER_RANK
    assert records_per_task_for(plan, sizes, 4) == -(-10_000 // (4 * TASKS_PER_RANK))
    assert records_per_task_for(_plan(3), {"f0": 30}, 8) == 1


def test_a_small_budget_gets_small_tasks(tmp_path: Path) -> None:
    # A budget holds 4 shuffle windows of tasks: 1 GiB and 8 tasks a window, 32 MiB a task;
    # a container's 64 MiB /dev/shm ("auto": 48 MiB), 1.5 MiB.
    assert task_bytes(1 << 30, 8) == TASK_BYTES == (1 << 30) // (WINDOWS_IN_BUDGET * 8)
    assert task_bytes(48 * MiB, 8) == 48 * MiB // 32
    assert task_bytes(64 << 30, 8) == TASK_BYTES and task_bytes(10, 8) == 1
    rows = _plan(1_000_000)
    assert records_per_task_for(rows, {"f0": 264_000_000}, None, 48 * MiB // 32) == 5957
    # "auto" is sized for as the filesystem's size gives it, not what is free now: the same
    # tasks on every run on this machine, whatever other programs hold.
    total = space(str(tmp_path)).total
    assert nominal_budget("auto", str(tmp_path), {}) == min(AUTO_CEILING, int(total * AUTO_SHARE))
    assert nominal_budget("auto", str(tmp_path), {}) >= budget_bytes("auto", str(tmp_path), {})
    assert nominal_budget("3MiB", str(tmp_path), {"LOCAL_WORLD_SIZE": "4"}) == 3 * MiB


def test_unknown_sizes_keep_the_fixed_default(tmp_path: Path) -> None:
    assert records_per_task_for(_plan(50_000), None, None) == DEFAULT_RECORDS_PER_TASK
    assert records_per_task_for(_plan(0), {"f0": 0}, None) == DEFAULT_RECORDS_PER_TASK
    # Paths a source of the user's own made up, or files gone: not known.
    assert file_bytes(_plan(10)) is None
    (tmp_path / "a.bin").write_bytes(b"x" * 1000)
    real = [
        shmloader.Shard(str(tmp_path / "a.bin"), 5),
        shmloader.Shard(str(tmp_path / "a.bin"), 5),
    ]
    assert file_bytes(real) == {str(tmp_path / "a.bin"): 1000}
    assert file_bytes([*real, shmloader.Shard(str(tmp_path / "gone.bin"), 1)]) is None


def test_a_dataset_without_records_per_task_plans_sized_tasks_and_delivers_each_once(
    tmp_path: Path,
) -> None:
    expected = write_dataset(tmp_path / "data", [300, 200, 160])
    options = {"records_per_task": None, "shuffle_window": 2}
    with dataset(tmp_path / "data", tmp_path / "shm", **options) as ds:
        plan = ds.options.source.plan()
        size = records_per_task_for(plan, file_bytes(plan), None)
        assert ds.job.records_per_task == size == -(-660 // TASKS_PER_RANK)
        got = [i for batch in shmloader.DataLoader(ds, batch_size=32) for i in ids_of(batch)]
        client = MasterClient(ds.master_address)
        try:
            progress = client.progress()
        finally:
            client.close()
        # Every file in tasks of that size, none across two files.
        assert progress.num_tasks == sum(-(-n // size) for n in (300, 200, 160))
    assert Counter(got) == Counter(expected)
    assert shm_entries(tmp_path / "shm") == []


def test_tasks_sized_to_a_small_budget_run_within_it(tmp_path: Path) -> None:
    # Records of 40 KB, a 16 MiB budget, windows of 2 tasks: 2 MiB a task, 52 records.
    expected = write_dataset(tmp_path / "data", [300, 200, 160], encoder=encode_padded)
    src = shmloader.RecordFileSource(str(tmp_path / "data" / "*.tfrecord"), decode=decode_padded)
    options = {"records_per_task": None, "shuffle_window": 2, "shm_budget": "16MiB"}
    with dataset(tmp_path / "data", tmp_path / "shm", src=src, **options) as ds:
        plan = ds.options.source.plan()
        aim = task_bytes(16 * MiB, 2)
        assert ds.job.records_per_task == records_per_task_for(plan, file_bytes(plan), None, aim)
        assert 40 <= ds.job.records_per_task <= 60
        got = [i for batch in shmloader.DataLoader(ds, batch_size=32) for i in ids_of(batch)]
        stats = ds.stats()
        assert stats.shm_peak <= ds.options.shm_budget
    assert Counter(got) == Counter(expected)
    assert shm_entries(tmp_path / "shm") == []


def test_a_sized_job_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    expected = write_dataset(tmp_path / "data", [300, 200, 160])
    options = {"records_per_task": None, "shuffle_window": 2}
    with dataset(tmp_path / "data", tmp_path / "shm", **options) as ds:
        loader = shmloader.DataLoader(ds, batch_size=32)
        before: list[int] = []
        for batch in loader:
            before += ids_of(batch)
            if len(before) >= 200:
                break
        state = json.loads(json.dumps(loader.state_dict()))
    with dataset(tmp_path / "data", tmp_path / "shm", **options) as ds:
        loader = shmloader.DataLoader(ds, batch_size=32)
        loader.load_state_dict(state)
        after = [i for batch in loader for i in ids_of(batch)]
    assert Counter(before) + Counter(after) == Counter(expected)
    assert shm_entries(tmp_path / "shm") == []


def test_given_sizes_and_a_standalone_masters_are_kept(tmp_path: Path) -> None:
    write_dataset(tmp_path / "data", [300])
    with dataset(tmp_path / "data", tmp_path / "shm", records_per_task=7) as ds:
        assert ds.job.records_per_task == 7
    # A standalone master splits by its own size; the trainer takes its plan as it is.
    source = shmloader.RecordFileSource(str(tmp_path / "data" / "*.tfrecord"), decode=decode)
    with (
        shmloader.Master(source, records_per_task=50, epochs=1) as master,
        dataset(
            tmp_path / "data", tmp_path / "shm", records_per_task=None, master=master.address
        ) as ds,
    ):
        got = [i for batch in shmloader.DataLoader(ds, batch_size=64) for i in ids_of(batch)]
        assert master.progress().num_tasks == 6
    assert sorted(got) == list(range(300))
