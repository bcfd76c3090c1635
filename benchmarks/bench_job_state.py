"""What the whole job's state costs under torchrun: ``loader.state_dict()`` (every rank's own
state, gathered through torchrun's store and merged) beside ``loader.rank_state_dict()``.

    python -m torch.distributed.run --standalone --nproc_per_node 2 \\
        benchmarks/bench_job_state.py [--records 40000] [--calls 200]

Every rank makes a ``master="torchrun"`` dataset of ``--records`` records (tasks of 1000),
takes a few batches so that tasks are in hand, then times ``--calls`` calls of each, the two
kinds alternating, every rank at the same call. Rank 0 prints the median and the 90th
percentile of each, in milliseconds, and their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import shmloader


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--records", type=int, default=40_000)
    p.add_argument("--calls", type=int, default=200)
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    # The same file for every rank: each writes it whole beside, then renames it into place.
    path = Path(tempfile.gettempdir()) / f"shmloader-bench-job-state-{args.records}.tfrecord"
    mine = path.with_suffix(f".{rank}")
    shmloader.write_records(mine, (i.to_bytes(8, "little") for i in range(args.records)))
    os.replace(mine, path)
    with tempfile.TemporaryDirectory() as tmp:
        source = shmloader.RecordFileSource(str(path))
        with shmloader.SharedTaskDataset(
            source, master="torchrun", records_per_task=1000, shm_dir=tmp
        ) as ds:
            loader = shmloader.DataLoader(ds, batch_size=64)
            batches = iter(loader)
            for _ in range(5):
                next(batches)
            times: dict[str, list[float]] = {"rank_state_dict": [], "state_dict": []}
            for _ in range(args.calls):
                for name in times:
                    began = time.perf_counter()
                    getattr(loader, name)()
                    times[name].append((time.perf_counter() - began) * 1000)
            for _ in batches:  # the rest of the epoch, so rank 0's master can close
                pass
    if rank == 0:
        world = os.environ["WORLD_SIZE"]
        medians = {}
        for name, ms in times.items():
            medians[name] = statistics.median(ms)
            p90 = statistics.quantiles(ms, n=10)[-1]
            print(f"{name:16} median {medians[name]:7.2f} ms  p90 {p90:7.2f} ms  ({world} ranks)")
        ratio = medians["state_dict"] / medians["rank_state_dict"]
        print(f"whole job / own: {ratio:.1f}x")


if __name__ == "__main__":
    main()
