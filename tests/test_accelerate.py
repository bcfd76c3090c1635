"""Hugging Face accelerate: a loader given to ``Accelerator.prepare``, exactly once.

accelerate rebuilds the loader as a torch DataLoader (so shmloader.DataLoader's own loop is
not the one iterating) and takes the next batch from it before it yields the current one.
The dataset tells receipts from torch's requests one batch later, and the last batch from
accelerate's ``end_of_dataloader`` (dataset/wrappers.py): a ``break`` and a checkpoint
(``save_state`` with the dataset registered for checkpointing) are exact. Sharding across
processes would draw batches for nothing and is refused with the fix; the fix, each process
iterating its own share, is run under ``accelerate launch --num_processes 2`` on CPU.

Real trainer processes (tests/_accelerate_trainer.py), real readers, real files.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _dataset_helpers import PYTHON, REPO_ROOT, TESTS_DIR, shm_entries, subprocess_env
from _dataset_helpers import write_dataset as write

pytest.importorskip("accelerate")

BATCH = 32
SIZES = [230, 170]  # 400 records: 13 batches, the last of 16


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    directory = tmp_path_factory.mktemp("data")
    return directory, write(directory, SIZES)


class Run:
    """tests/_accelerate_trainer.py in a subprocess (``launch``: under accelerate launch with
    that many processes), and what each of its processes reported."""

    def __init__(self, tmp_path: Path, name: str, launch: int = 0, **config: Any) -> None:
        self.out = tmp_path / f"{name}.jsonl"
        self.log = tmp_path / f"{name}.log"
        config["out"] = str(self.out)
        config_path = tmp_path / f"{name}.json"
        config_path.write_text(json.dumps(config))
        script = str(TESTS_DIR / "_accelerate_trainer.py")
        command = [PYTHON, script, str(config_path)]
        if launch:
            command = [
                # --multi_gpu picks accelerate's torchrun launcher; the script's
                # Accelerator(cpu=True) then runs its processes on CPU (gloo).
                *(PYTHON, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_machines", "1"),
                *("--num_processes", str(launch), "--mixed_precision", "no"),
                *("--dynamo_backend", "no", script, str(config_path)),
            ]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                command, cwd=str(REPO_ROOT), env=subprocess_env(), stdout=log, stderr=log
            )

    def lines(self, rank: int = 0) -> list[dict[str, Any]]:
        path = Path(f"{self.out}.{rank}")
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]

    def ids(self, rank: int = 0, pass_: int | None = None) -> list[int]:
        return [
            i
            for line in self.lines(rank)
            if "ids" in line and (pass_ is None or line["pass"] == pass_)
            for i in line["ids"]
        ]

    def wait_for(self, key: str, timeout: float = 180.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines():
                if key in line:
                    return line
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"never reported {key!r}:\n{self.log.read_text(errors='replace')}")

    def finish(self, timeout: float = 240.0) -> None:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(self.log.read_text(errors="replace")) from None
        assert code == 0, self.log.read_text(errors="replace")


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
    run = Run(
        tmp_path, "run", **common(data, tmp_path, kind=kind, num_workers=workers, breaks=breaks)
    )
    run.finish()
    for p, stop in enumerate(breaks):
        assert len(run.ids(pass_=p)) == stop * BATCH
    assert Counter(run.ids()) == Counter(data[1])
    assert shm_entries(tmp_path / "shm" / "0") == []


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("kind", "workers", "step"), [("shmloader", 2, 4), ("batch_sampler", 0, 12)]
)
def test_save_state_then_kill_then_load_state_resumes_exactly(
    tmp_path: Path, data: tuple[Path, list[int]], kind: str, workers: int, step: int
) -> None:
    saved = tmp_path / "saved"
    config = common(data, tmp_path, kind=kind, num_workers=workers)
    first = Run(tmp_path, "first", **config, stop_at=step, save_state=str(saved))
    first.wait_for("stopped")
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait()
    second = Run(tmp_path, "second", **config, load_state=str(saved))
    second.finish()
    assert len(first.ids()) == step * BATCH
    assert Counter(first.ids() + second.ids()) == Counter(data[1])
    assert shm_entries(tmp_path / "shm" / "0") == []


@pytest.mark.timeout(400)
def test_two_processes_each_iterate_their_own_share(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    """``accelerate launch --num_processes 2``: prepare() of the loader is refused (accelerate
    would shard batches that are already each rank's own); the loader iterated as it is gives
    each rank its share, every record once."""
    refused = Run(tmp_path, "refused", launch=2, **common(data, tmp_path, kind="shmloader"))
    refused.finish()
    for rank in (0, 1):
        (error,) = [line["error"] for line in refused.lines(rank) if "error" in line]
        assert "shards this DataLoader's batches across its 2 processes" in error
        assert refused.ids(rank) == []
    run = Run(
        tmp_path,
        "shares",
        launch=2,
        **common(data, tmp_path / "b", kind="shmloader", num_workers=2, prepare=False),
    )
    run.finish()
    first, second = run.ids(0), run.ids(1)
    assert len(first) == len(second) > 0  # DDP: equal steps
    assert Counter(first + second) == Counter(data[1])


@pytest.mark.timeout(300)
def test_skip_first_batches_is_refused_with_the_fix(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    """It would draw batches and drop them; the dataset resumes from its own state."""
    run = Run(tmp_path, "run", **common(data, tmp_path, kind="shmloader", skip=3))
    run.finish()
    (error,) = [line["error"] for line in run.lines() if "error" in line]
    assert "skip_first_batches() would draw 3 batches" in error
    assert "register_for_checkpointing(ds)" in error
    assert run.ids() == []


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
    first = Run(tmp_path, "first", **config, stop_at=3, save_state=str(saved))
    first.wait_for("stopped")
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait()
    second = Run(tmp_path, "second", **config, load_state=str(saved))
    second.finish()
    (error,) = [line["error"] for line in second.lines() if "error" in line]
    assert "use_stateful_dataloader=True" in error
    assert "accelerator.register_for_checkpointing(ds)" in error
    assert second.ids() == []
