"""Nothing of ours outlives the trainer: after close(), normal exit, an exception, Ctrl-C or
SIGTERM, no store is left and no reader runs; after SIGKILL the store is reaped by the next
dataset or by ``shmloader clean``."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from _dataset_helpers import (
    PYTHON,
    REPO_ROOT,
    Trainer,
    dataset,
    ids_of,
    shm_entries,
    subprocess_env,
    wait_gone,
    write_dataset,
)

import shmloader
from shmloader.shm.names import start_token


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    directory = tmp_path_factory.mktemp("data")
    return directory, write_dataset(directory, [400, 250])


def test_close_on_the_real_dev_shm_removes_everything(
    data: tuple[Path, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SHMLOADER_SHM_DIR", raising=False)  # the default: /dev/shm itself
    directory, expected = data
    ds = shmloader.SharedTaskDataset(
        _source(directory), num_readers=2, records_per_task=100, epochs=1, shm_budget="8MiB"
    )
    with ds:
        assert ds.store_path is not None
        store = Path(ds.store_path)
        assert store.parent == Path("/dev/shm") and store.name.startswith("shmloader-")
        got = [i for b in shmloader.DataLoader(ds, batch_size=50, num_workers=2) for i in ids_of(b)]
        assert sorted(got) == expected
        readers = [r.pid for r in ds.stats().readers]
        assert store.is_dir()
    assert not store.exists()
    assert wait_gone(readers) == []
    ds.close()  # idempotent


def _source(directory: Path) -> shmloader.RecordFileSource:
    from _dataset_helpers import source

    return source(directory)


@pytest.mark.parametrize(
    ("then", "signum", "code"),
    [
        ("exit", None, 0),  # the script returns without close(): interpreter exit cleans up
        ("raise", None, 1),  # an exception escapes the training loop
        ("wait", signal.SIGINT, -signal.SIGINT),  # Ctrl-C
        ("wait", signal.SIGTERM, -signal.SIGTERM),
    ],
)
def test_trainer_exit_leaves_nothing(
    tmp_path: Path, data: tuple[Path, list[int]], then: str, signum: int | None, code: int
) -> None:
    directory, _ = data
    shm_dir = tmp_path / "shm"
    trainer = Trainer(
        tmp_path,
        "trainer",
        data=str(directory),
        shm_dir=str(shm_dir),
        dataset={"epochs": None},
        loader={"num_workers": 2},
        passes=2,
        stop_at=[0, 3],
        then=then,
    )
    info = trainer.wait_for("info")["info"]
    trainer.wait_for("stopped")
    assert Path(info["store"]).is_dir()
    if signum is not None:
        os.kill(trainer.proc.pid, signum)
    assert trainer.finish() == code, trainer.output()
    assert shm_entries(shm_dir) == []
    assert wait_gone(info["readers"]) == []


def test_stores_of_sigkilled_trainers_are_reaped(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    directory, expected = data
    trainers = {
        name: Trainer(
            tmp_path,
            name,
            data=str(directory),
            shm_dir=str(tmp_path / name),
            dataset={"epochs": None},
            passes=1,
            stop_at=[0, 2],
            then="wait",
        )
        for name in ("a", "b")
    }
    stores = {}
    for name, trainer in trainers.items():
        info = trainer.wait_for("info")["info"]
        trainer.wait_for("stopped")
        stores[name] = Path(info["store"])
        os.kill(trainer.proc.pid, signal.SIGKILL)
        assert trainer.finish() == -signal.SIGKILL
        # Readers die with their trainer (they would otherwise keep leasing and writing).
        assert wait_gone(info["readers"]) == []
        assert stores[name].is_dir()

    cli = [PYTHON, "-m", "shmloader", "clean", "--base"]
    env = subprocess_env()
    dry = subprocess.run(
        [*cli, str(tmp_path / "a"), "--dry-run"], env=env, cwd=REPO_ROOT, capture_output=True
    )
    assert dry.returncode == 0 and "would remove" in dry.stdout.decode(), dry
    assert stores["a"].is_dir()

    # A new dataset under the same base directory reaps the dead trainer's store at start-up.
    with dataset(directory, tmp_path / "a", epochs=1) as ds:
        assert not stores["a"].exists()
        got = [i for b in shmloader.DataLoader(ds, batch_size=50) for i in ids_of(b)]
        assert sorted(got) == expected

    done = subprocess.run([*cli, str(tmp_path / "b")], env=env, cwd=REPO_ROOT, capture_output=True)
    assert done.returncode == 0 and "removed" in done.stdout.decode(), done
    assert not stores["b"].exists()
    assert shm_entries(tmp_path / "a") == shm_entries(tmp_path / "b") == []


def test_dataset_workers_never_close_the_store(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    """Forked workers inherit the dataset (and its finalizers) but must not remove anything
    when they exit; only the trainer does."""
    directory, expected = data
    with dataset(directory, tmp_path, epochs=None) as ds:
        dl = shmloader.DataLoader(ds, batch_size=50, num_workers=2)
        for _ in range(2):  # the first pass's workers exit before the second pass
            assert sorted(i for b in dl for i in ids_of(b)) == expected
        assert Path(ds.runtime.store.path).is_dir()
        assert all(start_token(r.pid) is not None for r in ds.stats().readers)


def test_closed_datasets_leave_no_thread_and_no_exit_hook(
    data: tuple[Path, list[int]], tmp_path: Path
) -> None:
    """A script that makes dataset after dataset (one per evaluation, say) and keeps them:
    close() ended the readers but left the master's gRPC threads waiting for work as long as
    the dataset object lived, and each dataset added an exit hook that stayed."""
    import threading

    directory, expected = data
    hooks = getattr(threading, "_threading_atexits", None)
    kept = []
    for round_ in range(3):
        ds = dataset(directory, tmp_path / "shm", epochs=None)
        got = [i for b in shmloader.DataLoader(ds, batch_size=100) for i in ids_of(b)]
        assert sorted(got) == expected
        ds.close()
        kept.append(ds)
        if round_ == 0 and hooks is not None:
            first = len(hooks)
    if hooks is not None:
        assert len(hooks) == first
    for thread in threading.enumerate():
        if thread.name.startswith("shmloader"):
            thread.join(30.0)  # idle ones end at once; a bound, not a measurement
    assert [t.name for t in threading.enumerate() if t.name.startswith("shmloader")] == []
