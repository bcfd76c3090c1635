"""One rank of a torchrun job that checkpoints every step as the docs' recipe does.

``python -m torch.distributed.run [torchrun's options] tests/_torchrun_restart_trainer.py
DATA SHM OUT [--epochs E] [--ddp] [--step-seconds S]`` (with the repo and tests/ on
PYTHONPATH).

Each rank trains ``E`` (default 1) epochs of a ``master="torchrun"`` dataset, as a job that
must survive a rank's death, or torchrun's restart with more or fewer ranks, does: after every
step every rank takes the loader's state (the whole job's), and rank 0 saves it (written
whole, then renamed over the last one); on start every rank loads that one file, whatever
the number of ranks now. ``--ddp``: each step also all-reduces a tensor over a gloo process
group, as DDP's backward does, so a rank that died fails the others' next step, and torchrun
starts a new round. ``--dcp`` (with ``--ddp``): the state goes through
``torch.distributed.checkpoint`` instead, ``dcp.save({"data": shmloader.DCPState(loader),
"steps": ...})`` by every rank into ``OUT/dcp/<step>``, whose name rank 0 then writes to
``OUT/dcp/latest``; a round loads that one with ``dcp.load``.

It appends JSON lines to ``OUT/rank{RANK}.jsonl``: ``{"round": a, "pid": pid}`` on start,
``{"round": a, "resumed_at": s, "world": n}``, ``{"round": a, "step": s, "ids": [...]}`` per
step (passes until an empty one), written before the state that counts it is saved, and
``{"round": a, "done": true}``. ``a`` names the round: the address of the master its rank 0
started (a new one each round), or ``"?"`` before the first batch. A step done by a round
that died before its state was saved is done again by the next round (which resumed before
it), so the step's deliveries that count are those of the last round that did it:
``tests/test_dataset_torchrun.py``'s ``trained()``.
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
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--ddp", action="store_true")
    parser.add_argument("--dcp", action="store_true")
    parser.add_argument("--step-seconds", type=float, default=0.05)
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    state_path = args.out / "state.json"
    if args.ddp:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
    with open(args.out / f"rank{rank}.jsonl", "a", buffering=1) as log:
        round_ = "?"

        def emit(**line: object) -> None:
            log.write(json.dumps({"round": round_, "t": time.time(), **line}) + "\n")

        emit(pid=os.getpid())
        with dataset(
            args.data, args.shm / f"rank{rank}", master="torchrun", epochs=args.epochs
        ) as ds:
            loader = shmloader.DataLoader(ds, batch_size=16)
            step = 0
            latest = args.out / "dcp" / "latest"
            if args.dcp and latest.exists():
                import torch.distributed.checkpoint as dcp

                loaded = {"data": shmloader.DCPState(loader), "steps": 0}
                dcp.load(loaded, checkpoint_id=args.out / "dcp" / latest.read_text())
                step = loaded["steps"]
            elif state_path.exists():
                saved = json.loads(state_path.read_text())
                loader.load_state_dict(saved["loader"])
                step = saved["steps"]
            got = 1
            while got:  # passes until an empty one: the epochs are over
                got = 0
                for got, batch in enumerate(loader, 1):  # noqa: B007
                    if round_ == "?":
                        round_ = str(ds.master_address)
                        emit(resumed_at=step, world=world)
                    emit(step=step, ids=ids_of(batch))
                    if args.ddp:
                        dist.all_reduce(torch.ones(1))  # the gradients' all-reduce
                    time.sleep(args.step_seconds)  # the training step
                    step += 1
                    if args.dcp:
                        import torch.distributed.checkpoint as dcp

                        mine = {"data": shmloader.DCPState(loader), "steps": step}
                        dcp.save(mine, checkpoint_id=args.out / "dcp" / str(step))
                        if rank == 0:
                            (args.out / "dcp" / "latest.tmp").write_text(str(step))
                            os.replace(args.out / "dcp" / "latest.tmp", latest)
                        continue
                    state = loader.state_dict()  # every rank: the whole job's state
                    if rank == 0:
                        tmp = state_path.with_suffix(".tmp")
                        tmp.write_text(json.dumps({"loader": state, "steps": step}))
                        os.replace(tmp, state_path)
        emit(done=True)
    if args.ddp:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
