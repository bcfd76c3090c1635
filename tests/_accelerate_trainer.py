"""A training loop under Hugging Face accelerate, in a process of its own.

``python tests/_accelerate_trainer.py CONFIG.json`` (the repo and tests/ on PYTHONPATH), or
under ``accelerate launch``. The config says which loader to build (``"kind"``:
``"shmloader"``, shmloader.DataLoader; ``"batch_sampler"``, a plain DataLoader given
``ds.batch_sampler(...)``), whether ``Accelerator.prepare`` wraps it (``"prepare"``, default
true) and what to do; the script appends JSON lines to ``config["out"]`` (rank ``r`` > 0:
``OUT.r``): ``{"pass": p, "ids": [...]}`` per batch the loop gets, ``{"stopped": true}`` once
it saved.

``"breaks": [k, ...]``: pass ``i`` stops after ``k`` batches (``break``); then one pass to the
end. ``"stop_at": k``: after ``k`` batches of the first pass, ``accelerator.save_state(dir)``
(the dataset registered with ``register_for_checkpointing``) and wait to be killed.
``"load_state": dir``: ``accelerator.load_state(dir)`` before the loop. ``"stateful":
true``: ``DataLoaderConfiguration(use_stateful_dataloader=True)``, and the dataset not
registered (accelerate saves the loader's state). ``"skip": n``: iterate
``accelerator.skip_first_batches(loader, n)``. A ``ConfigError`` that ``prepare`` or the first
batch raised is reported as ``{"error": "..."}``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from _dataset_helpers import data_loader, dataset, ids_of
from accelerate import Accelerator

import shmloader


def main(config_path: str) -> int:
    with open(config_path) as f:
        cfg: dict[str, Any] = json.load(f)
    rank = int(os.environ.get("RANK", "0"))
    path = cfg["out"] if rank == 0 else f"{cfg['out']}.{rank}"
    out = open(path, "a", buffering=1)  # noqa: SIM115 - lines must reach the test at once

    def emit(**line: Any) -> None:
        out.write(json.dumps(line) + "\n")

    from accelerate.utils import DataLoaderConfiguration

    stateful = cfg.get("stateful", False)  # accelerate keeps the loader's state itself
    config = DataLoaderConfiguration(use_stateful_dataloader=stateful)
    accelerator = Accelerator(cpu=True, dataloader_config=config)
    options = dict(cfg.get("dataset", {}))
    if accelerator.num_processes > 1:
        options["master"] = "torchrun"  # each process its own share; rank 0 hosts the master
    ds = dataset(Path(cfg["data"]), Path(cfg["shm_dir"]) / str(rank), **options)
    loader = data_loader(ds, cfg["kind"], cfg["batch_size"], cfg.get("num_workers", 0))
    if not stateful:
        accelerator.register_for_checkpointing(ds)
    model = torch.nn.Linear(1, 1)
    model = accelerator.prepare(model)
    try:
        dl = accelerator.prepare(loader) if cfg.get("prepare", True) else loader
        if cfg.get("skip"):
            dl = accelerator.skip_first_batches(dl, cfg["skip"])
        if cfg.get("load_state"):
            accelerator.load_state(cfg["load_state"])
        p = 0
        for p, stop in enumerate([*cfg.get("breaks", []), None]):
            for b, batch in enumerate(dl):
                assert type(batch) is not shmloader.dataset.gather.ring.RingBatch
                emit(**{"pass": p, "ids": ids_of(batch)})
                if cfg.get("stop_at") == b + 1 and p == 0:
                    accelerator.save_state(cfg["save_state"])
                    emit(stopped=True)
                    while True:  # until the test kills this process
                        time.sleep(0.05)
                if stop == b + 1:
                    break
    except shmloader.ConfigError as exc:
        emit(error=str(exc))
    emit(done=True)
    ds.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
