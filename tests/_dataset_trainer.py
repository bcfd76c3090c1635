"""A training loop in a process of its own, for tests that kill it, signal it or resume it.

``python tests/_dataset_trainer.py CONFIG.json`` (with the repo and tests/ on PYTHONPATH).
The config says which dataset and loader (``"kind"``: shmloader.DataLoader, or a plain one as
``data_loader`` builds it) to build and what to do; the script appends JSON
lines to ``config["out"]`` as it goes, so the test sees what was delivered even if the process
dies: ``{"info": {...}}`` once the dataset has started (store path, reader pids),
``{"pass": p, "ids": [...]}`` per batch, ``{"state": ...}`` when it saves a checkpoint.

``"sleep": s``: each step takes ``s`` seconds more (a trainer slower than another).
``"pause_at": [p, b, path]``: after ``b`` batches of pass ``p`` the step waits until the file
``path`` exists (``{"paused": true}``), holding its leases as a slow step would.

``"preempt": [k, n]``: a preemption handler (it sets a flag, as schedulers' users write them)
is installed before the dataset; after ``k`` batches of the first pass the step waits for
SIGTERM (``{"waiting": true}``), then, once the flag is seen (``{"preempted": true}``), the
loop finishes the step with ``n`` more batches and stops as at ``stop_at``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from _dataset_helpers import data_loader, dataset, ids_of

import shmloader


def main(config_path: str) -> int:
    # Tests send SIGINT as Ctrl-C would. A shell's background job (``pytest ... &``) starts with
    # SIGINT ignored, children inherit that, and Python then installs no KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with open(config_path) as f:
        cfg: dict[str, Any] = json.load(f)
    out = open(cfg["out"], "a", buffering=1)  # noqa: SIM115 - lines must reach the test at once

    def emit(**line: Any) -> None:
        out.write(json.dumps(line) + "\n")

    preempt = cfg.get("preempt")
    preempted = [False]
    if preempt is not None:

        def on_sigterm(signum: int, frame: Any) -> None:
            preempted[0] = True

        signal.signal(signal.SIGTERM, on_sigterm)

    ds = dataset(Path(cfg["data"]), Path(cfg["shm_dir"]), **cfg.get("dataset", {}))
    kind = cfg.get("kind", "shmloader")  # a plain DataLoader: see data_loader
    if kind == "shmloader":
        dl = shmloader.DataLoader(ds, batch_size=cfg.get("batch_size", 64), **cfg.get("loader", {}))
    else:
        dl = data_loader(ds, kind, cfg.get("batch_size", 64), **cfg.get("loader", {}))
    keeper = dl if hasattr(dl, "state_dict") else ds  # a plain DataLoader has no state
    if cfg.get("load_state"):
        with open(cfg["load_state"]) as f:
            keeper.load_state_dict(json.load(f))

    def info() -> None:
        pool = ds.runtime.pool
        assert pool is not None
        emit(info={"store": ds.store_path, "readers": pool.pids(), "pid": os.getpid()})

    # torchdata's StatefulDataLoader gives the dataset a state it loaded only as iteration
    # begins, which must find the dataset not started yet.
    if kind != "stateful":
        ds.start()
        info()
    stop_at = cfg.get("stop_at")  # [pass, batches]: stop after that many batches of that pass
    for p in range(cfg.get("passes", 1)):
        for b, batch in enumerate(dl):
            if kind == "stateful" and p == 0 and b == 0:
                info()
            emit(**{"pass": p, "ids": ids_of(batch)})
            time.sleep(cfg.get("sleep", 0.0))
            pause = cfg.get("pause_at")
            if pause is not None and [p, b + 1] == pause[:2]:
                emit(paused=True)
                while not os.path.exists(pause[2]):
                    time.sleep(0.02)
            if stop_at is not None and [p, b + 1] == stop_at:
                return stop(cfg, ds, keeper, emit)
            if preempt is not None and p == 0 and b + 1 == preempt[0]:
                emit(waiting=True)
                while not preempted[0]:  # a training step, during which SIGTERM comes
                    time.sleep(0.02)
                emit(preempted=True)
            if preempt is not None and p == 0 and b + 1 == sum(preempt):
                return stop(cfg, ds, keeper, emit)
    emit(done=True)
    ds.close()
    return 0


def stop(cfg: dict[str, Any], ds: Any, keeper: Any, emit: Any) -> int:
    """What the trainer does at ``stop_at``, still inside the training loop (``keeper``: what
    has the state, the loader or the dataset)."""
    then = cfg.get("then", "close")
    if cfg.get("save_state"):
        state = keeper.state_dict()
        with open(cfg["save_state"], "w") as f:
            json.dump(state, f)
    emit(stopped=then)
    if then == "close":
        ds.close()
        return 0
    if then == "exit":  # no close: interpreter exit must clean up
        return 0
    if then == "raise":
        raise RuntimeError("the training loop failed")
    if then == "wait":  # for a signal from the test
        while True:
            time.sleep(0.05)
    raise ValueError(f"unknown then={then!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
