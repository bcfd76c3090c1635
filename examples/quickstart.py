"""From a folder of record files to a training loop (docs/getting-started.md).

    python examples/quickstart.py

It writes 20,000 records into a temporary folder, then trains a linear model
on them for two epochs: readers decode the records into shared memory, and
shmloader.DataLoader hands the loop shuffled batches of tensors. Lines stay
under 80 characters: the docs page shows the file as it is.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch

import shmloader

FEATURES = 16


def encode(x: np.ndarray, label: int) -> bytes:
    """One record: 16 float32 features, then the label as int64."""
    return x.astype("<f4").tobytes() + np.int64(label).tobytes()


def decode(payload: bytes) -> dict[str, object]:
    """The record back as columns; it runs in the reader processes."""
    x = np.frombuffer(payload, dtype="<f4", count=FEATURES)
    label = int(np.frombuffer(payload, dtype="<i8", offset=4 * FEATURES)[0])
    return {"x": x, "label": label}


def write_data(folder: Path, records: int = 20_000, files: int = 4) -> None:
    """A learnable problem: is the features' sum above zero?"""
    rng = np.random.default_rng(0)
    per_file = records // files
    for f in range(files):
        x = rng.standard_normal((per_file, FEATURES)).astype(np.float32)
        rows = (encode(row, int(row.sum() > 0)) for row in x)
        shmloader.write_records(folder / f"part-{f}.tfrecord", rows)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_data(folder)

        files = str(folder / "*.tfrecord")
        source = shmloader.RecordFileSource(files, decode=decode)
        model = torch.nn.Linear(FEATURES, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loss_of = torch.nn.functional.cross_entropy
        with shmloader.SharedTaskDataset(
            source,
            num_readers=2,
            seed=7,
            epochs=2,  # the passes below: readers decode nothing past them
        ) as ds:
            loader = shmloader.DataLoader(ds, batch_size=256)
            for epoch in range(2):
                correct = seen = 0
                # batch: {"x": Tensor[256, 16], "label": Tensor[256]}
                for batch in loader:
                    x, label = batch["x"], batch["label"]
                    logits = model(x)
                    loss = loss_of(logits, label)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    correct += int((logits.argmax(1) == label).sum())
                    seen += len(label)
                accuracy = f"accuracy {correct / seen:.2f}"
                print(f"epoch {epoch}: {seen} records,", accuracy)
            # Where the loop is: save it with your checkpoint.
            state = loader.state_dict()
            print(f"next epoch to deliver: {state['epoch']}")
            # What the job did and costs; advice() says what to change.
            stats = ds.stats()
            print(stats)
            for line in stats.advice():
                print("advice:", line)


if __name__ == "__main__":
    main()
