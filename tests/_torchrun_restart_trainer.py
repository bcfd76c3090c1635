"""One rank of a torchrun job that checkpoints every step, for the restart test.

``python -m torch.distributed.run --nproc_per_node 2 --max-restarts 1
tests/_torchrun_restart_trainer.py DATA SHM OUT`` (with the repo and tests/ on PYTHONPATH).

Each rank trains one epoch of a ``master="torchrun"`` dataset, as a job that must survive a
rank's death does: after every step it saves the loader's state (written whole, then renamed
over the last one), and on start it loads the state its rank saved before, if any. It
appends JSON lines to ``OUT/rank{RANK}.jsonl``: ``{"round": r, "pid": pid}`` on start (``r``:
torchrun's restart count), ``{"round": r, "step": s, "ids": [...]}`` per step, before the
state that counts it is saved, and ``{"round": r, "done": true}``. A step whose line is
written but whose state is not (the rank died between) was not trained on: the state saved
before it says where the loop resumes, so ``trained()`` counts the lines of each round up to
the step the next round resumed from.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from _dataset_helpers import dataset, ids_of

import shmloader


def main() -> int:
    data, shm, out = (Path(a) for a in sys.argv[1:4])
    rank = int(os.environ["RANK"])
    round_ = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    state_path = out / f"state{rank}.json"
    with open(out / f"rank{rank}.jsonl", "a", buffering=1) as log:

        def emit(**line: object) -> None:
            log.write(json.dumps({"round": round_, **line}) + "\n")

        emit(pid=os.getpid())
        with dataset(data, shm / f"rank{rank}", master="torchrun", epochs=1) as ds:
            loader = shmloader.DataLoader(ds, batch_size=16)
            step = 0
            if state_path.exists():
                saved = json.loads(state_path.read_text())
                loader.load_state_dict(saved["loader"])
                step = saved["steps"]
            emit(resumed_at=step)
            for batch in loader:
                emit(step=step, ids=ids_of(batch))
                time.sleep(0.05)  # the training step
                step += 1
                tmp = state_path.with_suffix(".tmp")
                tmp.write_text(json.dumps({"loader": loader.state_dict(), "steps": step}))
                os.replace(tmp, state_path)
        emit(done=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
