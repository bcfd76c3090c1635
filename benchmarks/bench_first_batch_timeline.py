"""Where the time to the first batch goes: the trainer's own timeline, stage by stage.

Run by hand (not a test), from the repository root:
``python benchmarks/bench_first_batch_timeline.py [--records N] [--rounds R] [--readers K]``.

Writes the data-plane benchmark's *tabular* dataset (264-byte records, ``bench_dataplane.py``)
once, then per round, in a fresh process: a ``SharedTaskDataset`` with a per-record
``decode`` and ``--readers`` readers (2), and ``shmloader.DataLoader`` (batch 1024, no
workers). It prints, in seconds from just before ``SharedTaskDataset(...)`` (torch and
shmloader imported before), when the runtime had started, when a reader leased its first task
(``Started``), when that task was announced ready, and when the first batch reached the loop;
then the summed PSS of the readers and of their fork server, if any, after that batch
(``ds.stats()``: a reader's memory before it has read much).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

STAGES = ("runtime started", "first lease", "first task ready", "first batch")


def child(spec: dict[str, Any]) -> dict[str, float]:
    """One timeline, in this (fresh) process, over ``spec["paths"]``."""
    # torch before the clock, as a training script has it: shmloader's own modules load it
    # only with the dataset (the data plane imports no torch).
    import torch  # noqa: F401
    from _bench_decoders import DECODE

    import shmloader
    import shmloader.dataset.accounting.plane as plane_module
    import shmloader.dataset.runtime.runtime as runtime_module
    import shmloader.reader.pool as pool_module
    from shmloader.reader.messages import Started

    marks: dict[str, float] = {}
    began = time.perf_counter()

    def mark(name: str) -> None:
        marks.setdefault(name, time.perf_counter() - began)

    announce = plane_module.DataPlane.announce
    handle = pool_module.ReaderPool._handle
    start = runtime_module.Runtime.__init__

    def announced(self: Any, **kwargs: Any) -> None:
        mark("first task ready")
        announce(self, **kwargs)

    def handled(self: Any, info: Any, message: Any) -> None:
        if isinstance(message, Started):
            mark("first lease")
        handle(self, info, message)

    def started(self: Any, *args: Any, **kwargs: Any) -> None:
        start(self, *args, **kwargs)
        mark("runtime started")

    plane_module.DataPlane.announce = announced  # type: ignore[method-assign]
    pool_module.ReaderPool._handle = handled  # type: ignore[method-assign]
    runtime_module.Runtime.__init__ = started  # type: ignore[method-assign]
    began = time.perf_counter()
    source = shmloader.RecordFileSource(spec["paths"], decode=DECODE["tabular"])
    with shmloader.SharedTaskDataset(source, num_readers=spec["readers"], epochs=None) as ds:
        next(iter(shmloader.DataLoader(ds, batch_size=1024)))
        mark("first batch")
        processes = ds.stats().processes
    for role in ("reader", "reader server"):
        pss = [p.memory.pss for p in processes if p.role == role and p.memory is not None]
        marks[f"{role} PSS MiB"] = sum(pss) / (1 << 20)
    return marks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    from _bench_child import run_script_child
    from bench_dataplane import warm, write_dataset

    with tempfile.TemporaryDirectory() as folder:
        paths = write_dataset(folder, "tabular", args.records, 0)
        warm(paths)
        runs = []
        for _ in range(args.rounds):
            done = run_script_child(__file__, {"paths": paths, "readers": args.readers})
            if done.returncode != 0:
                raise SystemExit(done.stdout + done.stderr)
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    runs_said = f"{args.readers} readers, medians of {args.rounds} runs"
    print(f"\nseconds from SharedTaskDataset(...), {runs_said}:")
    for stage in (*STAGES, "reader PSS MiB", "reader server PSS MiB"):
        values = [run[stage] for run in runs]
        spread = f"{min(values):.3f}-{max(values):.3f}"
        print(f"  {stage:22s} {statistics.median(values):.3f} ({spread})")


if __name__ == "__main__":
    main()
