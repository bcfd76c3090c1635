"""One rank of a job launched by torchrun, for tests/test_dataset_torchrun.py.

``python -m torch.distributed.run --standalone --nproc_per_node N tests/_torchrun_trainer.py
DATA SHM OUT EPOCHS`` (with the repo and tests/ on PYTHONPATH). Each rank iterates a train
dataset (``master="torchrun"``) for EPOCHS passes, then a second dataset made the same way
(its own master) for one pass, and writes JSON lines to ``OUT/rank{RANK}.jsonl``:
``{"ds": "train"|"val", "pass": p, "ids": [...]}`` per batch, ``{"address": ...}`` per dataset
and ``{"done": true}``. No collectives: rank 1 is slower (a sleep per batch), so rank 0 ends
first and closes its dataset while rank 1 still uses the master it hosts.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from _dataset_helpers import dataset, ids_of

import shmloader


def main(data: str, shm: str, out_dir: str, epochs: int) -> int:
    rank = int(os.environ["RANK"])
    with open(Path(out_dir) / f"rank{rank}.jsonl", "a", buffering=1) as out:
        for name, passes in (("train", epochs), ("val", 1)):
            with dataset(
                Path(data), Path(shm) / f"rank{rank}", master="torchrun", epochs=passes
            ) as ds:
                loader = shmloader.DataLoader(ds, batch_size=32)
                for p in range(passes):
                    for batch in loader:
                        out.write(json.dumps({"ds": name, "pass": p, "ids": ids_of(batch)}) + "\n")
                        if rank == 1:
                            time.sleep(0.01)  # the slow rank
                out.write(json.dumps({"ds": name, "address": ds.master_address}) + "\n")
        out.write(json.dumps({"done": True}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
