"""shmloader under Hugging Face accelerate and Lightning Fabric (docs/how-to/frameworks.md).

    python examples/frameworks.py

It writes 4,000 records, then:

- accelerate: trains on a loader given to ``Accelerator.prepare``, saves the job with
  ``accelerator.save_state`` after 15 steps and stops there, as a preempted job would; a new
  run (a new dataset and Accelerator) loads it with ``load_state`` and finishes the epoch.
- Fabric: a loader given to ``fabric.setup_dataloaders``, left after 10 steps (``break``) and
  iterated again, which finishes the epoch.

Each checks that every record came once in the epoch. Install them with
``pip install accelerate lightning``.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

import shmloader

RECORDS = 4_000
BATCH = 100
FEATURES = 8


def decode(payload: bytes) -> dict[str, Any]:
    """One record: its id (int64), then 8 float32 features."""
    record_id = int(np.frombuffer(payload, dtype="<i8", count=1)[0])
    return {"id": record_id, "x": np.frombuffer(payload, dtype="<f4", offset=8)}


def write_data(folder: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((RECORDS, FEATURES)).astype("<f4")
    shmloader.write_records(
        folder / "train.tfrecord",
        (np.int64(i).tobytes() + x[i].tobytes() for i in range(RECORDS)),
    )


def dataset(folder: Path) -> shmloader.SharedTaskDataset:
    source = shmloader.RecordFileSource(str(folder / "*.tfrecord"), decode=decode)
    return shmloader.SharedTaskDataset(source, num_readers=2, records_per_task=500, epochs=1)


def accelerate_run(folder: Path, checkpoint: Path, *, stop_after: int | None) -> list[int]:
    """One run of the accelerate loop: the ids it trained on."""
    from accelerate import Accelerator

    seen: list[int] = []
    # --8<-- [start:accelerate]
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with dataset(folder) as ds:
        # The dataset's position goes into accelerate's checkpoints, and comes back from them.
        accelerator.register_for_checkpointing(ds)
        loader = shmloader.DataLoader(ds, batch_size=BATCH, num_workers=2)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        if checkpoint.exists():
            accelerator.load_state(str(checkpoint))  # before the first batch
        for step, batch in enumerate(loader):
            loss = model(batch["x"]).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            seen += batch["id"].tolist()
            if step + 1 == stop_after:  # a preemption: save, and stop here
                accelerator.save_state(str(checkpoint))
                break
    # --8<-- [end:accelerate]
    return seen


def fabric_run(folder: Path) -> list[int]:
    """A Fabric loop that leaves its first pass after 10 steps, then finishes the epoch."""
    from lightning.fabric import Fabric

    seen: list[int] = []
    # --8<-- [start:fabric]
    fabric = Fabric(accelerator="cpu", devices=1)
    fabric.launch()
    model = torch.nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = fabric.setup(model, optimizer)
    with dataset(folder) as ds:
        # Fabric wraps the loader it is given (one in, one out: typed as that one).
        loader = cast(
            shmloader.DataLoader,
            fabric.setup_dataloaders(shmloader.DataLoader(ds, batch_size=BATCH)),
        )
        for step, batch in enumerate(loader):
            seen += batch["id"].tolist()
            if step + 1 == 10:
                break  # the next pass delivers the rest of the epoch
        for batch in loader:
            loss = model(batch["x"]).pow(2).mean()
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            seen += batch["id"].tolist()
    # --8<-- [end:fabric]
    return seen


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_data(folder)
        checkpoint = folder / "checkpoint"
        first = accelerate_run(folder, checkpoint, stop_after=15)
        print(f"accelerate: first run stopped after {len(first) // BATCH} steps, saved")
        second = accelerate_run(folder, checkpoint, stop_after=None)
        once = Counter(first + second) == Counter(range(RECORDS))
        print(f"accelerate: resumed run, {len(second)} records; each record once: {once}")
        seen = fabric_run(folder)
        once = Counter(seen) == Counter(range(RECORDS))
        print(f"fabric: {len(seen)} records over a break and a second pass; each once: {once}")


if __name__ == "__main__":
    main()
