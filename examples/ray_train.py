"""Ray Train: TorchTrainer workers that read with shmloader, restarted from a checkpoint exactly.

    pip install "shmloader[ray]"        # or: pip install "ray[train]"
    python examples/ray_train.py [--records 8000] [--epochs 2] [--checkpoint-every 10]
                                 [--crash-at-step 30]    # -1: no crash

It writes a small dataset of numbered records to a temporary folder, starts a Ray cluster of
this machine, and trains a tiny linear model with ``ray.train.torch.TorchTrainer`` on 2 CPU
workers. Ray Train starts each worker with torchrun's variables (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) and sets up the
``env://`` process group before the train function runs, so each worker builds the same
``SharedTaskDataset`` with ``master="torchrun"``: rank 0's dataset hosts the master, and the
other workers find its address in the process group's store.

Every ``--checkpoint-every`` steps every worker calls ``loader.state_dict()``, which returns the
whole job's data state (the same on every rank), and rank 0 reports it in the
``ray.train.Checkpoint`` with the model and optimizer. To show a restart, worker 1 kills itself
(SIGKILL, as a lost machine dies) at step ``--crash-at-step`` once; Ray restarts the worker
group (``FailureConfig(max_failures=1)``), and each worker loads ``ray.train.get_checkpoint()``
before its first batch: the epoch goes on where the checkpoint left it. The checkpoint also
counts how many times the model trained on each record, and the script ends by checking that
every record counted once per epoch. DDP pads each epoch's schedule to equal shares, so a few
records count once more (at most ``workers - 1`` per schedule: each epoch's, and the rest of an
epoch a restart resumed).

Ray Train's controller takes a worker's report when it polls the workers (every 2 s,
``$RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``), and a worker's next report waits until it took the one
before: checkpoint every few hundred steps, not every few as this small example does.

On a real cluster, call ``ray.init()`` with its address, put the data where every node reads it
(a shared file system or ``s3://...``), and give ``RunConfig`` a ``storage_path`` every node
reaches.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import tempfile
from typing import Any

import numpy as np
import ray
import ray.train
import torch
import torch.distributed as dist
from ray.train import Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer, prepare_model

import shmloader

FEATURES = 8


def encode(record_id: int, x: np.ndarray, y: float) -> bytes:
    return np.int64(record_id).tobytes() + x.astype("<f4").tobytes() + np.float32(y).tobytes()


def decode(payload: bytes) -> dict[str, object]:
    values = np.frombuffer(payload, dtype="<f4", offset=8)
    return {"id": int.from_bytes(payload[:8], "little"), "x": values[:FEATURES], "y": values[-1]}


def make_dataset(folder: str, records: int, files: int = 4) -> None:
    rng = np.random.default_rng(0)
    weights = rng.standard_normal(FEATURES)
    per_file = -(-records // files)
    for f in range(files):
        ids = range(f * per_file, min(records, (f + 1) * per_file))
        xs = rng.standard_normal((len(ids), FEATURES))
        payloads = [encode(i, x, float(x @ weights)) for i, x in zip(ids, xs, strict=True)]
        shmloader.write_records(os.path.join(folder, f"part-{f:02d}.tfrecord"), payloads)


def first_time(marker: str) -> bool:
    """Whether ``marker`` was not there yet (it is now): one machine's way to crash once."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False


# --8<-- [start:train-loop]
def train_loop(config: dict[str, Any]) -> None:
    """One worker of the TorchTrainer (every worker runs it)."""
    rank = ray.train.get_context().get_world_rank()
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Linear(FEATURES, 1))  # DistributedDataParallel
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    source = shmloader.RecordFileSource(os.path.join(config["data"], "*.tfrecord"), decode=decode)
    with shmloader.SharedTaskDataset(
        source,
        num_readers=1,
        records_per_task=500,
        epochs=config["epochs"],
        seed=7,
        shm_budget="64MiB",
        master="torchrun",  # rank 0 hosts it; rank and world size come from Ray Train
    ) as ds:
        loader = shmloader.DataLoader(ds, batch_size=config["batch_size"])
        # Where the run stands; "trained" (rank 0's): how many times the model trained on each
        # record, which the script checks at the end.
        progress: dict[str, Any] = {"step": 0, "restarts": 0, "resumed_at": None}
        trained = np.zeros(config["records"], np.int64)
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is not None:  # Ray restarted the worker group: go on from there
            with checkpoint.as_directory() as folder:
                weights = torch.load(os.path.join(folder, "model.pt"))
                with open(os.path.join(folder, "progress.json")) as f:
                    progress = json.load(f)
                trained = np.load(os.path.join(folder, "trained.npy"))
            model.load_state_dict(weights["model"])
            optimizer.load_state_dict(weights["optimizer"])
            loader.load_state_dict(progress.pop("loader"))  # before the first batch
            progress.update(restarts=progress["restarts"] + 1, resumed_at=progress["step"])
        pending: list[np.ndarray] = []  # the ids trained on since the last checkpoint

        def save(**metrics: object) -> None:
            """Every worker, at the same step: the whole job's data state, and the ids trained
            on since the last checkpoint to rank 0, which reports them in a checkpoint."""
            state = loader.state_dict()  # the whole job's: every worker must call it
            ids = np.concatenate(pending) if pending else np.zeros(0, np.int64)
            everyone: list[np.ndarray | None] = [None] * dist.get_world_size()
            dist.gather_object(ids, everyone if rank == 0 else None, dst=0)
            pending.clear()
            if rank != 0:
                ray.train.report(metrics)  # every worker reports; rank 0's has the checkpoint
                return
            for got in everyone:
                if got is not None:
                    np.add.at(trained, got, 1)
            metrics.update(progress, trained=int(trained.sum()))
            metrics.update(trained_min=int(trained.min()), trained_max=int(trained.max()))
            with tempfile.TemporaryDirectory() as folder:
                torch.save(
                    {"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                    os.path.join(folder, "model.pt"),
                )
                with open(os.path.join(folder, "progress.json"), "w") as f:
                    json.dump({**progress, "loader": state}, f)
                np.save(os.path.join(folder, "trained.npy"), trained)
                ray.train.report(metrics, checkpoint=Checkpoint.from_directory(folder))

        loss = torch.zeros(())
        while True:  # a pass is (the rest of) an epoch; an empty one: the epochs are over
            start = progress["step"]
            for batch in loader:
                step = progress["step"]
                if rank == 1 and step == config["crash_at_step"] and first_time(config["marker"]):
                    os.kill(os.getpid(), signal.SIGKILL)  # no cleanup runs: a lost machine
                loss = torch.nn.functional.mse_loss(model(batch["x"]).squeeze(1), batch["y"])
                optimizer.zero_grad()
                loss.backward()  # DDP all-reduces the gradients
                optimizer.step()
                pending.append(batch["id"].numpy().copy())
                progress["step"] = step + 1
                if progress["step"] % config["checkpoint_every"] == 0:
                    save(loss=loss.item())
            if progress["step"] == start:
                break
        save(loss=loss.item(), finished=True)  # not "done": Ray Tune takes that as a stop


# --8<-- [end:train-loop]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=8000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--checkpoint-every", type=int, default=10, help="steps")
    parser.add_argument("--crash-at-step", type=int, default=30, help="-1: no crash")
    args = parser.parse_args()

    folder = tempfile.mkdtemp(prefix="shmloader-ray-")
    try:
        make_dataset(folder, args.records)
        # A cluster of this machine (never one found at $RAY_ADDRESS: the data is local), of
        # logical CPUs: a worker takes 1, and Ray Train before its V2 gives its trainer 1. Ray's
        # own logs at ERROR: without ray[default] its placement group cleaner warns every second
        # that the State API is missing. Ray Train still says when a worker dies and restarts.
        ray.init(
            address="local",
            num_cpus=max(4, os.cpu_count() or 1),
            include_dashboard=False,
            logging_config=ray.LoggingConfig(log_level="ERROR"),
        )
        trainer = TorchTrainer(
            train_loop,
            train_loop_config={
                "data": folder,
                "records": args.records,
                "epochs": args.epochs,
                "batch_size": args.batch_size,
                "checkpoint_every": args.checkpoint_every,
                "crash_at_step": args.crash_at_step,
                "marker": os.path.join(folder, "crashed"),  # the crash happens once
            },
            scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
            run_config=RunConfig(
                name="shmloader-example",
                storage_path=os.path.join(folder, "ray_results"),
                failure_config=FailureConfig(max_failures=1),
                checkpoint_config=CheckpointConfig(num_to_keep=2),
            ),
        )
        result = trainer.fit()
        m: dict[str, Any] = result.metrics or {}  # rank 0's last report
        padding = m["trained"] - args.epochs * args.records
        # DDP pads each schedule (each epoch's, and the rest of one a restart resumed) so
        # that the 2 workers get equal shares: one record more at most.
        most = args.epochs + m["restarts"]
        ok = m.get("finished") and m["trained_min"] == args.epochs and 0 <= padding <= most
        print(
            f"the workers resumed from a checkpoint {m['restarts']} time(s), the last from "
            f"step {m['resumed_at']}; {m['step']} steps per worker",
            flush=True,
        )
        print(
            f"{args.records:,} records x {args.epochs} epochs: each record trained on "
            f"{m['trained_min']} to {m['trained_max']} times, {padding} more of DDP padding; "
            f"{'ok' if ok else 'WRONG'}",
            flush=True,
        )
        return 0 if ok else 1
    finally:
        ray.shutdown()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
