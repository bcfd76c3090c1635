"""One rank of a job launched by torchrun, for tests/test_dataset_torchrun.py.

``python -m torch.distributed.run --standalone --nproc_per_node N tests/_torchrun_trainer.py
DATA SHM OUT [--epochs E] [--val] [--stop-after B] [--resume]`` (with the repo and tests/ on
PYTHONPATH). Each rank iterates a train dataset (``master="torchrun"``) for E passes and
writes JSON lines to ``OUT/rank{RANK}.jsonl``: ``{"ds": "train"|"val", "pass": p, "ids":
[...]}`` per batch, ``{"ds": ..., "address": ..., "master_addr": ...}`` per dataset (its
master's address, and ``MASTER_ADDR``) and ``{"done": true}``.

``--val``: then a second dataset made the same way (its own master), one pass.
``--master-host``, ``--token``: passed to the datasets. ``--late S``: rank 1 waits S seconds
before it iterates the train dataset.
``--stop-after B``: save the loader's own state (``rank_state_dict()``) to
``OUT/state{RANK}.json`` after B batches of the first pass and stop there; ``--resume``: load
that state first.
No collectives: rank 1 is slower (a sleep per batch), so rank 0 ends first and closes its
dataset while rank 1 still uses the master it hosts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from _dataset_helpers import dataset, ids_of

import shmloader


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("data", "shm", "out"):
        parser.add_argument(name, type=Path)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--val", action="store_true")
    parser.add_argument("--stop-after", type=int)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--master-host")
    parser.add_argument("--late", type=float, default=0.0)
    parser.add_argument("--token")
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    state_path = args.out / f"state{rank}.json"
    runs = [("train", args.epochs)] + ([("val", 1)] if args.val else [])
    with open(args.out / f"rank{rank}.jsonl", "a", buffering=1) as out:
        for name, passes in runs:
            shm = args.shm / f"rank{rank}"
            with dataset(
                args.data,
                shm,
                master="torchrun",
                epochs=passes,
                master_host=args.master_host,
                token=args.token,
            ) as ds:
                loader = shmloader.DataLoader(ds, batch_size=32)
                if rank == 1 and name == "train":
                    time.sleep(args.late)  # starts once rank 0 may be done with its share
                if args.resume:
                    loader.load_state_dict(json.loads(state_path.read_text()))
                for p in range(passes):
                    for b, batch in enumerate(loader):
                        out.write(json.dumps({"ds": name, "pass": p, "ids": ids_of(batch)}) + "\n")
                        if rank == 1:
                            time.sleep(0.01)  # the slow rank
                        if args.stop_after == b + 1:
                            state_path.write_text(json.dumps(loader.rank_state_dict()))
                            out.write(json.dumps({"stopped": True}) + "\n")
                            return 0
                where = {"address": ds.master_address, "master_addr": os.environ["MASTER_ADDR"]}
                out.write(json.dumps({"ds": name, **where}) + "\n")
        out.write(json.dumps({"done": True}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
