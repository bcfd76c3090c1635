"""An image folder (train/<class>/<image>) read as it is, one record per file
(docs/sources.md, "FileSource", shows its middle part).

    python examples/image_folder.py

It writes 600 small images in three class folders into a temporary folder,
then trains a small model on them for two epochs: readers read and decode the
files into shared memory, and shmloader.DataLoader hands the loop shuffled
batches, each image once per epoch (checked). The label is the folder's name,
as torchvision's ImageFolder gives it.

The images are numpy ``.npy`` files, so that the example needs no image
library; for JPEG or PNG files, decode with Pillow instead (in ``decode``).
Lines stay under 80 characters: the docs page shows part of the file.
"""

from __future__ import annotations

import io
import os
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import torch

import shmloader

CLASSES = ["bird", "cat", "dog"]
PER_CLASS = 200
SIZE = 16  # images of SIZE x SIZE x 3


def write_images(root: Path) -> None:
    """A learnable problem: each class's images are brightest in one colour."""
    rng = np.random.default_rng(0)
    for label, name in enumerate(CLASSES):
        (root / "train" / name).mkdir(parents=True)
        for n in range(PER_CLASS):
            image = rng.integers(0, 128, (SIZE, SIZE, 3), dtype=np.uint8)
            image[..., label] += 100
            np.save(root / "train" / name / f"{name}_{n:03d}.npy", image)


# --8<-- [start:files]
def decode(data: bytes, path: str) -> dict[str, object]:
    """One file's bytes and path -> the record's columns, in the readers."""
    # JPEG or PNG: np.asarray(PIL.Image.open(io.BytesIO(data)).convert("RGB"))
    image = np.load(io.BytesIO(data))
    folder = os.path.basename(os.path.dirname(path))
    return {
        "image": image,  # uint8, 16 x 16 x 3
        "label": CLASSES.index(folder),
        "name": os.path.basename(path),
    }


def train(root: Path) -> None:
    source = shmloader.FileSource(str(root / "train/*/*.npy"), decode=decode)
    inputs, classes = SIZE * SIZE * 3, len(CLASSES)
    flatten = torch.nn.Flatten()
    model = torch.nn.Sequential(flatten, torch.nn.Linear(inputs, classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_of = torch.nn.functional.cross_entropy
    with shmloader.SharedTaskDataset(source, num_readers=2, seed=7, epochs=2) as ds:
        loader = shmloader.DataLoader(ds, batch_size=32)
        for epoch in range(2):
            names: Counter[str] = Counter()
            correct = 0
            for batch in loader:
                x = batch["image"].permute(0, 3, 1, 2).float() / 255
                label = batch["label"]
                logits = model(x)
                loss = loss_of(logits, label)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                correct += int((logits.argmax(1) == label).sum())
                names.update(batch["name"])
            # every image of the folder, and each one once
            once = len(names) == classes * PER_CLASS == names.total()
            print(
                f"epoch {epoch}: {names.total()} images, each once: {once},"
                f" accuracy {correct / names.total():.2f}"
            )


# --8<-- [end:files]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        write_images(Path(tmp))
        train(Path(tmp))


if __name__ == "__main__":
    main()
