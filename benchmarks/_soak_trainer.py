"""One elastic trainer of ``benchmarks/soak.py``: trains until the master's epochs are over.

``python benchmarks/_soak_trainer.py CONFIG.json``. It appends JSON lines to ``config["out"]``:
``{"start": pid}``, ``{"ids": [...]}`` per batch, ``{"saved": n}`` once its state (saved every
``save_every`` batches, atomically) is on disk. While the file ``config["arm"]`` exists it stops
right after its next save (``{"armed": n}``) and waits to be SIGKILLed, so that a kill lands
where a checkpoint was just taken: the soak counts what a killed trainer delivered up to its
last save, and a trainer resumed from that state must deliver the rest, each row once. Once
the file ``config["leave"]`` exists it leaves the job after its next batch: it closes its
dataset mid-epoch (what its loop received is handed back) and ends with ``{"done": true}``.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time
from typing import Any

import torch.utils.data

import shmloader


def main(config_path: str) -> int:
    with open(config_path) as f:
        cfg: dict[str, Any] = json.load(f)
    source = shmloader.RecordFileSource(sorted(glob.glob(os.path.join(cfg["data"], "*.tfrecord"))))
    ds = shmloader.SharedTaskDataset(
        source,
        master=cfg["master"],
        num_readers=cfg["readers"],
        shm_budget="64MiB",
        shm_dir=cfg["shm_dir"],
        shuffle_window=4,
        cache=cfg.get("cache", False),
    )
    workers = cfg.get("workers", 0)
    dl: Any
    if cfg.get("loader", "shmloader") == "shmloader":
        dl = shmloader.DataLoader(ds, batch_size=cfg["batch_size"], num_workers=workers)
    else:  # a plain DataLoader: the dataset learns its deliveries from its requests
        dl = torch.utils.data.DataLoader(
            ds,
            batch_sampler=ds.batch_sampler(cfg["batch_size"]),
            collate_fn=ds.collate,
            num_workers=workers,
        )
    state_path = cfg["state"]
    if os.path.exists(state_path):
        with open(state_path) as f:
            ds.load_state_dict(json.load(f))
    with open(cfg["out"], "a", buffering=1) as out:

        def emit(**line: Any) -> None:
            out.write(json.dumps(line) + "\n")

        emit(start=os.getpid())
        batches = 0
        while True:  # passes until one is empty: the master's epochs are over
            got = 0
            for batch in dl:
                emit(ids=[int.from_bytes(r, "little") for r in batch["record"]])
                if os.path.exists(cfg["leave"]):
                    break
                got += 1
                batches += 1
                if batches % cfg["save_every"] == 0:
                    with open(state_path + ".tmp", "w") as f:
                        json.dump(ds.state_dict(), f)
                    os.replace(state_path + ".tmp", state_path)
                    emit(saved=batches)
                    if os.path.exists(cfg["arm"]):
                        emit(armed=batches)
                        while True:  # the soak SIGKILLs it here
                            time.sleep(0.05)
                time.sleep(cfg["step_seconds"])
            if got == 0 or os.path.exists(cfg["leave"]):
                break
        # cache=True: how many tasks its readers served from the cache, not read.
        emit(done=True, from_cache=ds.stats().tasks_from_cache if cfg.get("cache") else 0)
    ds.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
