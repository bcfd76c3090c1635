"""Ray Train: a ``TorchTrainer`` of two workers on a local Ray cluster, each with a
``master="torchrun"`` dataset (Ray Train sets torchrun's variables and serves the process
group's store where they point). Workers SIGKILLed mid-epoch, Ray restarts the group from the
last ``ray.train.Checkpoint`` (``FailureConfig``), and every record comes once per epoch.
examples/ray_train.py runs here too (tests/test_examples.py runs only the examples it names)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from _dataset_helpers import (
    REPO_ROOT,
    TESTS_DIR,
    dataset,
    finish_group,
    ids_of,
    shm_entries,
    subprocess_env,
    write_dataset,
)

pytestmark = pytest.mark.long  # the long tier: .ci/run runs it after the README's command

ray = pytest.importorskip("ray", reason="needs Ray Train: pip install 'ray[train]'")
ray_train_torch = pytest.importorskip("ray.train.torch", reason="ray lacks its train extra")

from ray.train import (  # noqa: E402
    Checkpoint,
    CheckpointConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
)
from test_dataset_torchrun import check_epochs  # noqa: E402

import shmloader  # noqa: E402

EPOCHS = 2
CHECKPOINT_EVERY = 3  # steps
# (rank, step): in the first round to get there, that rank stops after logging that step and
# waits to be SIGKILLed, as a worker dying at any point would. Step 10 is in epoch 0, step 50
# in epoch 1 (each rank has 37 steps per epoch); the first death is rank 1's, the second that
# of rank 0, which hosts the master and the process group's store. max_failures=2 allows both.
KILLS = [(1, 10), (0, 50)]
DEADLINE = 240.0  # seconds: a bound for a loaded machine, not a measurement
# What the recipe needs of the launcher: torchrun's variables, with a TCPStore at MASTER_ADDR:
# MASTER_PORT (that of torch.distributed's env:// process group, initialized first).
LAUNCHER_ENV = (
    *("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK"),
    *("MASTER_ADDR", "MASTER_PORT"),
)


def train_loop(config: dict[str, Any]) -> None:
    """One Ray Train worker (the docs' checkpoint recipe under a launcher): every
    ``CHECKPOINT_EVERY`` steps every rank takes the loader's state (the whole job's), and rank 0
    reports it in a ``ray.train.Checkpoint``; a restarted group loads it on every rank.

    Appends JSON lines to ``out/rank{RANK}.jsonl`` as tests/_torchrun_restart_trainer.py does,
    for ``test_dataset_torchrun.check_epochs``: ``{"round": a, "pid": pid, ...}`` on start,
    ``{"round": a, "resumed_at": s, "world": n}``, ``{"round": a, "step": s, "ids": [...]}``
    per step (written before the state that counts it is saved) and ``{"round": a, "done":
    true}``; ``a``: a name rank 0 draws for this start of the group."""
    import torch
    import torch.distributed as dist

    context = ray.train.get_context()
    rank = context.get_world_rank()
    out = Path(config["out"])
    box = [uuid.uuid4().hex if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    round_ = box[0]
    with open(out / f"rank{rank}.jsonl", "a", buffering=1) as log:

        def emit(**line: object) -> None:
            log.write(json.dumps({"round": round_, "t": time.time(), **line}) + "\n")

        emit(
            pid=os.getpid(),
            env={name: os.environ.get(name) for name in LAUNCHER_ENV},
            process_group=dist.is_initialized() and dist.get_backend(),
        )
        model = ray_train_torch.prepare_model(torch.nn.Linear(1, 1))  # DDP
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        shm = Path(config["shm"]) / f"rank{rank}"
        with dataset(Path(config["data"]), shm, master="torchrun", epochs=EPOCHS) as ds:
            loader = shmloader.DataLoader(ds, batch_size=16)
            step = 0
            checkpoint = ray.train.get_checkpoint()
            if checkpoint is not None:
                with checkpoint.as_directory() as folder:
                    saved = json.loads((Path(folder) / "state.json").read_text())
                loader.load_state_dict(saved["loader"])
                step = saved["steps"]
            emit(resumed_at=step, world=context.get_world_size())
            got = 1
            while got:  # passes until an empty one: the epochs are over
                got = 0
                for got, batch in enumerate(loader, 1):  # noqa: B007
                    emit(step=step, ids=ids_of(batch))
                    _killed_here(out, rank, step)
                    loss = model(batch["x"].reshape(-1, 1)).square().mean()
                    optimizer.zero_grad()
                    loss.backward()  # DDP all-reduces the gradients
                    optimizer.step()
                    step += 1
                    if step % CHECKPOINT_EVERY == 0:
                        _checkpoint(loader.state_dict(), step, rank)  # state: every rank
        emit(done=True)


def _checkpoint(state: dict[str, Any], step: int, rank: int) -> None:
    """Rank 0 reports the whole job's state in a checkpoint; every rank reports."""
    if rank != 0:
        ray.train.report({"step": step})
        return
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "state.json").write_text(json.dumps({"loader": state, "steps": step}))
        ray.train.report({"step": step}, checkpoint=Checkpoint.from_directory(folder))


def _killed_here(out: Path, rank: int, step: int) -> None:
    """At a step of ``KILLS``, the first time: say so with this pid, and wait for the test's
    SIGKILL (no timing: the test kills when it reads the file)."""
    if (rank, step) not in KILLS:
        return
    try:
        with open(out / f"kill-{rank}-{step}", "x") as marker:
            marker.write(str(os.getpid()))
    except FileExistsError:
        return  # an earlier round stopped here and was killed
    time.sleep(DEADLINE)
    raise AssertionError(f"rank {rank} waited at step {step}, and the test never killed it")


def _lines(out: Path) -> list[list[dict]]:
    """Every rank file's whole lines (a killed rank may have left half of one)."""
    return [
        [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]
        for path in sorted(out.glob("rank*.jsonl"))
    ]


def _rounds(ranks: list[list[dict]]) -> list[int]:
    """The step each round resumed at, in the order they began."""
    starts = sorted(
        (line["t"], line["round"], line["resumed_at"])
        for lines in ranks
        for line in lines
        if "resumed_at" in line
    )
    seen: dict[str, int] = {}
    for _, name, at in starts:
        seen.setdefault(name, at)
    return list(seen.values())


@pytest.fixture
def local_ray(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A Ray cluster of this machine (address="local": never one another job started), whose
    workers import the repo and tests/ (the train loop lives in this module)."""
    # Ray Train's controller polls the workers every 2 s by default, and a worker's report
    # waits for the poll to take its previous one: checkpoints every 3 steps wait at each.
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
    path = os.pathsep.join([str(REPO_ROOT), str(TESTS_DIR)])
    # ray.init installs SIGTERM and SIGINT handlers of its own in this process and shutdown
    # leaves them: the tests after this one must find the handlers they started with.
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    ray.init(
        address="local",
        num_cpus=4,  # logical: a worker takes 1, and Ray Train before its V2 gives its trainer 1
        include_dashboard=False,
        object_store_memory=100 * 1024**2,
        runtime_env={"env_vars": {"PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}},
    )
    try:
        yield
    finally:
        ray.shutdown()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def test_workers_killed_mid_epoch_are_restarted_from_the_checkpoint_exactly_once(
    tmp_path: Path, local_ray: Any
) -> None:
    directory = tmp_path / "data"
    expected = write_dataset(directory, [700, 455])  # 1155: two ranks need 1 of padding
    out = tmp_path / "out"
    out.mkdir()
    trainer = ray_train_torch.TorchTrainer(
        train_loop,
        train_loop_config={"data": str(directory), "shm": str(tmp_path / "shm"), "out": str(out)},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(
            name="shmloader",
            storage_path=str(tmp_path / "ray"),
            failure_config=FailureConfig(max_failures=len(KILLS)),
            checkpoint_config=CheckpointConfig(num_to_keep=2),
        ),
    )
    fitted: list[Any] = []  # the Result, or what fit() raised

    def run() -> None:
        try:
            fitted.append(trainer.fit())
        except BaseException as exc:
            fitted.append(exc)

    fit = threading.Thread(target=run, daemon=True)
    fit.start()
    deadline = time.monotonic() + DEADLINE
    for rank, step in KILLS:
        marker = out / f"kill-{rank}-{step}"
        while not (marker.exists() and marker.read_text()):
            assert fit.is_alive(), f"the run ended before rank {rank} got to step {step}"
            assert time.monotonic() < deadline, f"rank {rank} never got to step {step}"
            time.sleep(0.05)
        os.kill(int(marker.read_text()), signal.SIGKILL)
    fit.join(max(1.0, deadline - time.monotonic()))
    assert not fit.is_alive(), "the run did not end"
    (result,) = fitted
    assert not isinstance(result, BaseException), result
    assert result.error is None, result.error

    ranks = _lines(out)
    assert len(ranks) == 2
    starts = [line for lines in ranks for line in lines if "pid" in line]
    assert len(starts) == 2 * (len(KILLS) + 1)  # each round started both ranks afresh
    for line in starts:  # what master="torchrun" needs, set by Ray Train before the loop
        assert line["process_group"] == "gloo", line
        assert all(line["env"][name] for name in LAUNCHER_ENV), line
    # Each restart resumed from a checkpoint of the round before it, taken before its death.
    resumed = _rounds(ranks)
    assert len(resumed) == len(KILLS) + 1, resumed
    assert resumed[0] == 0 and all(
        earlier < later <= step
        for earlier, later, (_, step) in zip(resumed, resumed[1:], KILLS, strict=False)
    ), resumed
    for lines in ranks:
        assert "done" in lines[-1], lines[-3:]
    # Every record twice, at most one more per schedule (DDP pads each to an even count):
    # each epoch's, and the rest of an epoch a round resumed in.
    check_epochs(ranks, expected, EPOCHS, padded=EPOCHS + len(KILLS))
    # What the killed ranks left in shared memory, their next round removed.
    for r in range(2):
        assert shm_entries(tmp_path / "shm" / f"rank{r}") == []


def test_the_ray_train_example_resumes_from_its_checkpoint_exactly_once(tmp_path: Path) -> None:
    (tmp_path / "shm").mkdir()
    env = subprocess_env()
    env["SHMLOADER_SHM_DIR"] = str(tmp_path / "shm")
    env["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = "0.2"  # reports every 4 steps: see above
    options = ("--records", "2001", "--checkpoint-every", "4", "--crash-at-step", "9")
    # Its own session: the Ray cluster it starts goes with it if it must be killed.
    proc = subprocess.Popen(
        [sys.executable, "ray_train.py", *options],
        cwd=REPO_ROOT / "examples",
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    out = finish_group(proc, DEADLINE)
    assert proc.returncode == 0, out
    # Worker 1 died at step 9, after the checkpoints of steps 4 and 8 (Ray may not have taken
    # the second yet); 2001 records: one of padding per schedule.
    assert "the workers resumed from a checkpoint 1 time(s), the last from step" in out, out
    assert re.search(
        r"2,001 records x 2 epochs: each record trained on 2 to \d times, "
        r"\d more of DDP padding; ok",
        out,
    ), out
    assert shm_entries(tmp_path / "shm") == []
