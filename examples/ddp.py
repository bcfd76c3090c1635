"""DDP under torchrun: rank 0's dataset hosts the master, and every rank gets an equal share.

    torchrun --standalone --nproc_per_node 2 examples/ddp.py [--records 40000] [--epochs 2]

Every rank builds the same ``SharedTaskDataset`` with ``master="torchrun"``: rank 0 starts the
embedded master (with the job's world size) and publishes its address in torchrun's store, and
the other ranks read it from there; nobody starts a master by hand or passes an address. A
small model trains with ``DistributedDataParallel`` (gloo, on the CPU). After each epoch the
ranks gather the labels their loops received, and rank 0 checks that every record came once,
plus the few records of padding that make the shares equal (``ddp_policy="pad"``), and that
every rank ran the same number of steps.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections import Counter

import numpy as np
import torch
import torch.distributed as dist
from tabular import FEATURES, decode_batch, encode

import shmloader


def make_dataset(folder: str, records: int, files: int = 4) -> None:
    rng = np.random.default_rng(0)
    per_file = -(-records // files)
    for f in range(files):
        labels = range(f * per_file, min(records, (f + 1) * per_file))
        payloads = [encode(rng.standard_normal(FEATURES), label) for label in labels]
        shmloader.write_records(os.path.join(folder, f"part-{f:02d}.tfrecord"), payloads)


def shared_folder(records: int) -> str:
    """Rank 0 writes the data; every rank gets the folder's path (one machine here)."""
    box: list[str | None] = [None]
    if dist.get_rank() == 0:
        folder = tempfile.mkdtemp(prefix="shmloader-ddp-")
        make_dataset(folder, records)
        box[0] = folder
    dist.broadcast_object_list(box, src=0)
    assert box[0] is not None
    return box[0]


def check_epoch(epoch: int, labels: np.ndarray, steps: int, records: int) -> bool:
    """Every rank's labels and step count to rank 0, which says whether the epoch was whole."""
    gathered: list[tuple[np.ndarray, int] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (labels, steps))
    if dist.get_rank() != 0:
        return True
    seen: Counter[int] = Counter()
    for got in gathered:
        assert got is not None
        seen.update(got[0].tolist())
    missing = records - len([label for label in seen if 0 <= label < records])
    padding = sum(seen.values()) - len(seen)
    step_counts = [got[1] for got in gathered if got is not None]
    ok = missing == 0 and len(set(step_counts)) == 1
    print(
        f"epoch {epoch}: steps per rank {step_counts}; {records:,} records, {missing} missing, "
        f"padding rows: {padding}; {'ok' if ok else 'WRONG'}",
        flush=True,
    )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=40_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    folder = shared_folder(args.records)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(FEATURES, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    source = shmloader.RecordFileSource(
        os.path.join(folder, "*.tfrecord"), decode_batch=decode_batch
    )
    ok = True
    with shmloader.SharedTaskDataset(
        source,
        num_readers=1,
        records_per_task=1000,
        epochs=args.epochs,
        seed=7,
        shm_budget="128MiB",
        master="torchrun",  # rank 0 hosts it; rank and world size come from torchrun
    ) as ds:
        loader = shmloader.DataLoader(ds, batch_size=args.batch_size)
        start = time.perf_counter()
        for epoch in range(args.epochs):
            labels, steps = [], 0
            for batch in loader:
                loss = torch.nn.functional.cross_entropy(model(batch["x"]), batch["label"] % 2)
                optimizer.zero_grad()
                loss.backward()  # an all-reduce: every rank must take as many steps
                optimizer.step()
                labels.append(batch["label"].numpy().copy())
                steps += 1
            ok &= check_epoch(epoch, np.concatenate(labels), steps, args.records)
        if rank == 0:
            print(
                f"{dist.get_world_size()} ranks, master at {ds.master_address}, "
                f"{args.epochs} epochs in {time.perf_counter() - start:.1f} s",
                flush=True,
            )
    dist.barrier()
    if rank == 0:
        shutil.rmtree(folder)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
