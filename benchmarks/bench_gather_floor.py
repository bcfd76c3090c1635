"""How far a shuffled batch can go below one copy of its rows: the floor under epochs served
from memory (``cache=True``), beside the hand-vectorised Dataset of ``peers.py``.

Run by hand (not a test), from the repository root, in the bench venv (docs/performance.md):
``python benchmarks/bench_gather_floor.py [--dataset tabular|images] [--rounds 5]
[--fixed-tasks N]``.

Per batch of a shuffled epoch, medians of the rounds, in one process and one run:

- **fixed-stride, one fancy index**: ``peers.py``'s "torch vectorised, no workers" without
  the DataLoader around it: the batch's rows taken from a memory-mapped file of fixed-size
  records in the page cache with one fancy index (one copy), columns sliced out as views.
- **copy floor**: the least any loader that hands out a batch of shuffled rows in tensors of
  their own must do: one ``take`` per column from decoded columns already in memory, with
  sorted random indices, and no bookkeeping at all.
- **shmloader cache**: whole epochs from the cache through ``shmloader.DataLoader`` without
  workers (the readers serve every task from shared memory: no read, no decode), with tasks
  sized from the data (the default) and of a fixed ``--fixed-tasks`` records.

The ratio of the fixed-stride batch to the copy floor bounds what any design that copies the
rows of a shuffled batch can gain over the hand-vectorised Dataset.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

BATCH = {"tabular": 1024, "images": 128}
RECORDS = {"tabular": 400_000, "images": 20_480}


def _per_batch(run_epoch: Callable[[], None], batches: int) -> float:
    began = time.perf_counter()
    run_epoch()
    return (time.perf_counter() - began) / batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", choices=sorted(BATCH), default="tabular")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--fixed-tasks",
        type=int,
        default=4096,
        help="records per task of the fixed-size contender (default 4096, shmloader 0.1's)",
    )
    args = parser.parse_args()

    import torch
    from _bench_decoders import DECODE_BATCH
    from _bench_peers import FixedStrideRows, Job, write_fixed_stride, write_tfrecord
    from peers import LAYOUTS

    import shmloader

    layout, batch, records = LAYOUTS[args.dataset], BATCH[args.dataset], RECORDS[args.dataset]
    batches = -(-records // batch)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as folder:
        job = Job(layout, folder, records, batch, 0, 0)
        write_fixed_stride(job)
        write_tfrecord(job)
        rows = FixedStrideRows(os.path.join(folder, "rows.bin"), layout, records)
        with open(os.path.join(folder, "rows.bin"), "rb") as f:  # into the page cache
            decoded = layout.decode_batch([f.read(layout.record_bytes) for _ in range(records)])
        columns = [np.ascontiguousarray(v) for v in decoded.values()]

        def fixed_stride() -> None:
            order = rng.permutation(records)
            for at in range(0, records, batch):
                rows.__getitems__(order[at : at + batch].tolist())

        def copy_floor() -> None:
            order = rng.permutation(records)
            for at in range(0, records, batch):
                picked = np.sort(order[at : at + batch])
                for column in columns:
                    torch.from_numpy(column.take(picked, axis=0))

        source = shmloader.RecordFileSource(
            os.path.join(folder, "data.tfrecord"), decode_batch=DECODE_BATCH[layout.name]
        )
        contenders: list[tuple[str, Callable[[], None]]] = [
            ("fixed-stride, one fancy index", fixed_stride),
            ("copy floor", copy_floor),
        ]
        with contextlib.ExitStack() as stack:
            # Both task sizes side by side (both datasets' readers idle while the other runs).
            for label, per_task in (("sized", None), (str(args.fixed_tasks), args.fixed_tasks)):
                ds = stack.enter_context(
                    shmloader.SharedTaskDataset(
                        source, records_per_task=per_task, seed=0, epochs=None, cache=True
                    )
                )
                loader = shmloader.DataLoader(ds, batch_size=batch)

                def cached(loader: shmloader.DataLoader = loader) -> None:
                    for _ in loader:
                        pass

                cached()  # the epoch that decodes and fills the cache
                cached()
                name = f"shmloader cache, tasks {label} ({ds.job.records_per_task})"
                contenders.append((name, cached))
            figures: dict[str, list[float]] = {}
            for _ in range(args.rounds):  # interleaved, so each sees the same machine state
                for name, run in contenders:
                    figures.setdefault(name, []).append(_per_batch(run, batches))
    medians = {name: statistics.median(times) for name, times in figures.items()}
    base = medians["fixed-stride, one fancy index"]
    print(f"{args.dataset}: {records:,} records, batches of {batch}, medians of {args.rounds}")
    print(f"  {'':42s} {'ms/batch':>9s} {'samples/s':>11s} {'vs fixed-stride':>16s}")
    for name, seconds in medians.items():
        print(f"  {name:42s} {1e3 * seconds:9.3f} {batch / seconds:11,.0f} {base / seconds:15.2f}x")


if __name__ == "__main__":
    main()
