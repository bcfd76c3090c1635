"""Augmentation: random flips and crops per record in decode, a per-batch transform in the loop.

Written as a plain script (decode at the top level, no ``if __name__ == "__main__":`` guard):
readers get ``decode`` by value. ``shmloader.task_rng()`` gives each record the same random
numbers in every run with the same seed, and other numbers in each epoch; ``transform=`` runs
on each batch in the training process.

    python examples/augment.py [--records 4000] [--epochs 2] [--seed 7]

It runs the job twice with the same seed and prints whether the runs saw the same images
(they do), and whether the epochs of one run did (they do not).
"""

import argparse
import hashlib
import os
import tempfile
from typing import Any

import numpy as np
import torch

import shmloader

SIZE, CROP = 16, 12  # images of SIZE x SIZE x 3, random crops of CROP x CROP


def decode(payload: bytes) -> dict[str, Any]:
    """One record: its id (8 bytes), then the image. Flipped for about half the records and
    cropped at a random place, both drawn from task_rng()."""
    record_id = int.from_bytes(payload[:8], "little")
    image = np.frombuffer(payload, np.uint8, offset=8).reshape(SIZE, SIZE, 3)
    rng = shmloader.task_rng()
    if rng.random() < 0.5:
        image = image[:, ::-1]
    top, left = rng.integers(0, SIZE - CROP + 1, size=2)
    crop = np.ascontiguousarray(image[top : top + CROP, left : left + CROP])
    return {"id": record_id, "image": crop}


def normalise(batch: dict[str, Any]) -> dict[str, Any]:
    """Per batch, in the training process: uint8 HWC -> float CHW in [0, 1]."""
    batch["image"] = batch["image"].permute(0, 3, 1, 2).float() / 255
    return batch


def run(files: str, epochs: int, seed: int) -> list[dict[int, str]]:
    """Each epoch's images, by record id, as digests."""
    src = shmloader.RecordFileSource(files, decode=decode)
    seen: list[dict[int, str]] = []
    with shmloader.SharedTaskDataset(
        src, num_readers=2, records_per_task=500, seed=seed, epochs=epochs
    ) as ds:
        loader = shmloader.DataLoader(ds, batch_size=128, transform=normalise)
        for _ in range(epochs):
            digests: dict[int, str] = {}
            for batch in loader:
                assert batch["image"].shape[1:] == (3, CROP, CROP)
                assert batch["image"].dtype == torch.float32
                for record_id, image in zip(batch["id"].tolist(), batch["image"], strict=True):
                    digests[record_id] = hashlib.sha1(image.numpy().tobytes()).hexdigest()
            seen.append(digests)
    return seen


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--records", type=int, default=4000)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--seed", type=int, default=7)
args = parser.parse_args()

with tempfile.TemporaryDirectory(prefix="shmloader-augment-") as tmp:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(args.records, SIZE, SIZE, 3), dtype=np.uint8)
    path = os.path.join(tmp, "images.tfrecord")
    shmloader.write_records(
        path, (i.to_bytes(8, "little") + images[i].tobytes() for i in range(args.records))
    )
    first = run(path, args.epochs, args.seed)
    again = run(path, args.epochs, args.seed)

every = all(len(epoch) == args.records for epoch in first + again)
print(f"{args.records} records x {args.epochs} epochs, each record once per epoch: {every}")
print(f"two runs with seed {args.seed} saw the same augmented images: {first == again}")
differ = sum(first[0][i] != first[1][i] for i in range(args.records)) if args.epochs > 1 else 0
print(f"records augmented differently in epoch 1 than in epoch 0: {differ} of {args.records}")
