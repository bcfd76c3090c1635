"""Hugging Face accelerate: a loader given to ``Accelerator.prepare``, exactly once.

accelerate rebuilds the loader as a torch DataLoader (so shmloader.DataLoader's own loop is
not the one iterating) and takes the next batch from it before it yields the current one.
The dataset learns receipts from torch's requests one batch later, and the last batch from
accelerate's ``end_of_dataloader`` (dataset/wrappers.py): a ``break`` and a checkpoint
(``save_state`` with the dataset registered for checkpointing) are exact. Sharding across
processes would draw batches for nothing and is refused with the fix; the fix, each process
iterating its own share, is run under ``accelerate launch --num_processes 2`` on CPU.

Real trainer processes (tests/_accelerate_trainer.py), real readers, real files.
"""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _dataset_helpers import PYTHON, TESTS_DIR, Trainer, shm_entries
from _dataset_helpers import write_dataset as write

pytest.importorskip("accelerate")

BATCH = 32
SIZES = [230, 170]  # 400 records: 13 batches, the last of 16


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    directory = tmp_path_factory.mktemp("data")
    return directory, write(directory, SIZES)


def start(tmp_path: Path, name: str, launch: int = 0, **config: Any) -> Trainer:
    """tests/_accelerate_trainer.py in a subprocess (``launch``: under accelerate launch with
    that many processes)."""
    launcher: tuple[str, ...] = (PYTHON,)
    if launch:
        # --multi_gpu picks accelerate's torchrun launcher; the script's Accelerator(cpu=True)
        # then runs its processes on CPU (gloo).
        launcher = (
            *(PYTHON, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_machines", "1"),
            *("--num_processes", str(launch), "--mixed_precision", "no"),
            *("--dynamo_backend", "no"),
        )
    script = TESTS_DIR / "_accelerate_trainer.py"
    return Trainer(tmp_path, name, script=script, launcher=launcher, **config)


def finish(trainer: Trainer) -> None:
    assert trainer.finish(timeout=240) == 0, trainer.output()


def common(data: tuple[Path, list[int]], tmp_path: Path, **config: Any) -> dict[str, Any]:
    return {
        "data": str(data[0]),
        "shm_dir": str(tmp_path / "shm"),
        "batch_size": BATCH,
        "dataset": {"epochs": 1},
        **config,
    }


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("kind", "workers", "breaks"),
    [
        ("shmloader", 2, [5, 2]),
        ("shmloader", 0, [1]),
        ("batch_sampler", 2, [12]),
        ("batch_sampler", 0, [3]),
    ],
)
def test_a_prepared_loader_is_exact_through_break(
    tmp_path: Path, data: tuple[Path, list[int]], kind: str, workers: int, breaks: list[int]
) -> None:
    run = start(
        tmp_path, "run", **common(data, tmp_path, kind=kind, num_workers=workers, breaks=breaks)
    )
    finish(run)
    for p, stop in enumerate(breaks):
        assert len(run.ids(pass_=p)) == stop * BATCH
    assert Counter(run.ids()) == Counter(data[1])
    assert shm_entries(tmp_path / "shm" / "0") == []


@pytest.mark.long
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("kind", "workers", "step"), [("shmloader", 2, 4), ("batch_sampler", 0, 12)]
)
def test_save_state_then_kill_then_load_state_resumes_exactly(
    tmp_path: Path, data: tuple[Path, list[int]], kind: str, workers: int, step: int
) -> None:
    saved = tmp_path / "saved"
    config = common(data, tmp_path, kind=kind, num_workers=workers)
    first = start(tmp_path, "first", **config, stop_at=step, save_state=str(saved))
    first.wait_for("stopped")
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait()
    second = start(tmp_path, "second", **config, load_state=str(saved))
    finish(second)
    assert len(first.ids()) == step * BATCH
    assert Counter(first.ids() + second.ids()) == Counter(data[1])
    assert shm_entries(tmp_path / "shm" / "0") == []


@pytest.mark.long
@pytest.mark.timeout(400)
def test_two_processes_each_iterate_their_own_share(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    """``accelerate launch --num_processes 2``: prepare() of the loader is refused (accelerate
    would shard batches that are already each rank's own); the loader iterated as it is gives
    each rank its share, every record once."""
    refused = start(tmp_path, "refused", launch=2, **common(data, tmp_path, kind="shmloader"))
    finish(refused)
    for rank in (0, 1):
        (error,) = [line["error"] for line in refused.lines(rank) if "error" in line]
        assert "shards this DataLoader's batches across its 2 processes" in error
        assert refused.ids(rank=rank) == []
    run = start(
        tmp_path,
        "shares",
        launch=2,
        **common(data, tmp_path / "b", kind="shmloader", num_workers=2, prepare=False),
    )
    finish(run)
    first, second = run.ids(rank=0), run.ids(rank=1)
    assert len(first) == len(second) > 0  # DDP: equal steps
    assert Counter(first + second) == Counter(data[1])


@pytest.mark.timeout(300)
def test_skip_first_batches_is_refused_with_the_fix(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    """It would draw batches and drop them; the dataset resumes from its own state."""
    run = start(tmp_path, "run", **common(data, tmp_path, kind="shmloader", skip=3))
    finish(run)
    (error,) = [line["error"] for line in run.lines() if "error" in line]
    assert "skip_first_batches() would draw 3 batches" in error
    assert "register_for_checkpointing(ds)" in error
    assert run.ids() == []


@pytest.mark.long
@pytest.mark.timeout(300)
def test_use_stateful_dataloader_says_to_register_the_dataset_instead(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    """With use_stateful_dataloader=True, prepare() makes torchdata's iterator to take a first
    state, which starts the dataset before load_state() can give it the saved one: the
    resumed run is told what to do instead, and delivers nothing twice."""
    pytest.importorskip("torchdata")
    saved = tmp_path / "saved"
    config = common(data, tmp_path, kind="batch_sampler", num_workers=2, stateful=True)
    first = start(tmp_path, "first", **config, stop_at=3, save_state=str(saved))
    first.wait_for("stopped")
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait()
    second = start(tmp_path, "second", **config, load_state=str(saved))
    finish(second)
    (error,) = [line["error"] for line in second.lines() if "error" in line]
    assert "use_stateful_dataloader=True" in error
    assert "accelerator.register_for_checkpointing(ds)" in error
    assert second.ids() == []
