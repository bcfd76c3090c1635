"""The main job: generate a dataset, train a small model on it with shmloader, report.

Everything runs on one machine: an embedded master (a thread), reader processes that decode
record files into shared memory, and a shmloader.DataLoader that gathers batches from it, in
the training process by default (--workers 0) or in DataLoader workers.

    python examples/main_job.py [--records 200000] [--epochs 3] [--readers 2] [--workers 0]

Defaults suit a small machine: decoding is the readers' work, and gathering a batch in the
training process itself is cheaper than shipping it from a DataLoader worker (see
docs/dataset.md, "Readers and workers"); add --workers where the training step needs the
main process to itself.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import torch
from tabular import FEATURES, decode_batch, encode
from tqdm import tqdm

import shmloader


def make_dataset(folder: str, records: int, files: int, seed: int = 0) -> None:
    """A learnable problem: the label is which of 10 hidden directions x points along most."""
    rng = np.random.default_rng(seed)
    directions = rng.standard_normal((FEATURES, 10)).astype(np.float32)
    per_file = -(-records // files)
    for f in range(files):
        n = min(per_file, records - f * per_file)
        x = rng.standard_normal((n, FEATURES)).astype(np.float32)
        labels = (x @ directions).argmax(axis=1)
        path = os.path.join(folder, f"part-{f:05d}.tfrecord")
        shmloader.write_records(path, (encode(x[i], int(labels[i])) for i in range(n)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--data", help="folder for the generated data (default: a temp dir)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="shmloader-example-") as tmp:
        folder = args.data or tmp
        os.makedirs(folder, exist_ok=True)
        t0 = time.perf_counter()
        make_dataset(folder, args.records, args.files)
        print(
            f"generated {args.records} records in {args.files} files "
            f"({time.perf_counter() - t0:.1f} s)"
        )

        source = shmloader.RecordFileSource(
            os.path.join(folder, "*.tfrecord"), decode_batch=decode_batch
        )
        model = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
        )
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        loss_fn = torch.nn.CrossEntropyLoss()

        with shmloader.SharedTaskDataset(
            source,
            num_readers=args.readers,
            shuffle=True,
            seed=7,
            shm_budget="512MiB",
            epochs=args.epochs,
        ) as ds:
            loader = shmloader.DataLoader(ds, batch_size=args.batch_size, num_workers=args.workers)
            start = time.perf_counter()
            first_batch = None
            samples = 0
            for epoch in range(args.epochs):
                correct = seen = 0
                bar = tqdm(loader, desc=f"epoch {epoch}", unit="batch", mininterval=1.0)
                for batch in bar:
                    if first_batch is None:
                        first_batch = time.perf_counter() - start
                    x, y = batch["x"], batch["label"]
                    logits = model(x)
                    loss = loss_fn(logits, y)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    correct += int((logits.argmax(1) == y).sum())
                    seen += len(y)
                    bar.set_postfix(
                        loss=f"{loss.item():.3f}", acc=f"{correct / seen:.3f}", refresh=False
                    )
                samples += seen
                if seen != args.records:
                    raise SystemExit(f"epoch {epoch} delivered {seen} samples, not {args.records}")
            elapsed = time.perf_counter() - start
            print(
                f"\ntrained {args.epochs} epochs, {samples} samples in {elapsed:.1f} s: "
                f"{samples / elapsed:,.0f} samples/s (training step included); "
                f"first batch after {first_batch:.2f} s"
            )
            print(ds.stats())


if __name__ == "__main__":
    main()
