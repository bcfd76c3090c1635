"""A trainer of a standalone master: what the pods of train-elastic.yaml run.

    python train.py [--batch-size 256] [--readers 4] [--shm-budget 1GiB]

The job comes from the environment, which train-elastic.yaml sets:

    SHMLOADER_MASTER   the master's host:port (its Service, shmloader-master:50051)
    SHMLOADER_TOKEN    the master's token (shmloader reads it from there)
    SHMLOADER_TLS_CA   the CA certificate that signed the master's (likewise)
    DATA               the records: the same glob or URLs as the master's
    EPOCHS             the master's --epochs
    CHECKPOINT         this trainer's checkpoint file, loaded at start if it exists

Trainers connect without ``world_size`` (elastic mode): they share each epoch, as many as
run. The records are tf.train.Example with the features ``id`` (int64), ``x`` (16 floats)
and ``label`` (int64); a linear model learns ``label`` from ``x``.

The checkpoint (the loader's position, the model, the optimizer) is saved every
``--save-every`` steps, after each epoch and on SIGTERM: then the step in progress finishes,
the checkpoint is saved, the dataset closes (the master hears what the loop consumed) and the
process exits with 143. Started again on the same checkpoint, it goes on where it stopped.

``--ids-log FILE`` appends the ids of each batch's records to FILE (a JSON line per batch),
to check that every record came once per epoch; ``--step-seconds`` stands in for a bigger
model's step.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch

import shmloader
from shmloader.formats.example import ExampleBatchDecoder, FixedLenFeature

FEATURES = 16
SPEC = {
    "id": FixedLenFeature((), "int64"),
    "x": FixedLenFeature((FEATURES,), "float32"),
    "label": FixedLenFeature((), "int64"),
}
SIGTERM_EXIT = 128 + signal.SIGTERM

preempted = False


def on_sigterm(signum: int, frame: Any) -> None:
    global preempted
    preempted = True


def save(path: Path, loader: Any, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    """The checkpoint, whole or not at all: written beside ``path``, then renamed."""
    state = {"data": loader.state_dict(), "model": model.state_dict(), "opt": opt.state_dict()}
    partial = path.with_name(path.name + ".partial")
    torch.save(state, partial)
    os.replace(partial, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--shm-budget", default="1GiB")
    parser.add_argument("--save-every", type=int, default=200, help="steps between checkpoints")
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--ids-log", help="append each batch's record ids to this file")
    args = parser.parse_args()

    # A handler of our own: the loop finishes its step and saves (docs/lifecycle.md).
    signal.signal(signal.SIGTERM, on_sigterm)
    checkpoint = Path(os.environ["CHECKPOINT"])
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    epochs = int(os.environ["EPOCHS"])
    decoder = ExampleBatchDecoder(SPEC)
    source = shmloader.RecordFileSource(
        os.environ["DATA"], decode_batch=decoder, schema=decoder.schema
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ids_log = open(args.ids_log, "a", buffering=1) if args.ids_log else None  # noqa: SIM115

    with shmloader.SharedTaskDataset(
        source,
        master=os.environ["SHMLOADER_MASTER"],  # the token and CA: from the environment
        num_readers=args.readers,
        shm_budget=args.shm_budget,
    ) as ds:
        loader = shmloader.DataLoader(ds, batch_size=args.batch_size)
        if checkpoint.exists():
            saved = torch.load(checkpoint, weights_only=True)
            loader.load_state_dict(saved["data"])
            model.load_state_dict(saved["model"])
            opt.load_state_dict(saved["opt"])
            print(f"resumed from {checkpoint} in epoch {saved['data']['epoch']}", flush=True)
        while True:
            # The master's epoch: a trainer that joins late starts in the master's.
            epoch = loader.state_dict()["epoch"]
            save(checkpoint, loader, model, opt)  # after each epoch, at the end, on SIGTERM
            if preempted:
                print(f"SIGTERM: saved {checkpoint}", flush=True)
                return SIGTERM_EXIT
            if epoch >= epochs:
                return 0
            steps = rows = 0
            for batch in loader:
                loss = torch.nn.functional.cross_entropy(model(batch["x"]), batch["label"])
                opt.zero_grad()
                loss.backward()
                opt.step()
                time.sleep(args.step_seconds)
                steps += 1
                rows += len(batch["id"])
                if ids_log is not None:
                    ids = batch["id"].tolist()
                    ids_log.write(json.dumps({"epoch": epoch, "ids": ids}) + "\n")
                if preempted:
                    break
                if steps % args.save_every == 0:
                    save(checkpoint, loader, model, opt)
            print(f"epoch {epoch}: {steps} steps, {rows} records", flush=True)


if __name__ == "__main__":
    sys.exit(main())
