"""``shmloader bench``: how fast shmloader feeds a training loop from your files, here.

Runs a ``SharedTaskDataset`` over the files with an embedded master and real readers, and a
``shmloader.DataLoader`` whose loop stands in for training: it counts the rows and sleeps
``--step-ms`` per batch. It prints samples/s per epoch, the time to the first batch, the share
of the loop's time spent waiting for the next batch, and the memory of every process. With
``--step-ms 0`` it measures the most this machine delivers with these settings; with your
training step's time it tells whether feeding keeps up. Try the knobs (readers, workers, task
size, budget, a decode function, ``--cache``) before training with them.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from ..errors import ShmloaderError
from ..sources.factory import source_for_paths
from ._help import plain

WAITED_TOO_LONG = 0.10  # share of the loop's time spent waiting that calls for more feeding


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench",
        help="measure how fast shmloader feeds a loop from these files",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="files, globs or folders")
    p.add_argument("--decode", metavar="MODULE:FUNC", help="per-record decode (record files)")
    p.add_argument(
        "--decode-batch", metavar="MODULE:FUNC", help="decode of a list of records (record files)"
    )
    p.add_argument("--readers", type=int, default=2, help="reader processes (default 2)")
    p.add_argument("--workers", type=int, default=0, help="DataLoader workers (default 0)")
    p.add_argument("--batch-size", type=int, default=256, help="rows per batch (default 256)")
    p.add_argument(
        "--records-per-task",
        type=int,
        default=None,
        help="records per task (default: sized from the data, as the dataset's)",
    )
    p.add_argument("--epochs", type=int, default=3, help="passes to measure (default 3)")
    p.add_argument(
        "--shm-budget",
        default="auto",
        help="most bytes of segments at once (default auto: 1GiB, or less where /dev/shm is "
        "smaller)",
    )
    p.add_argument("--views", action="store_true", help="memoryview payloads (record files)")
    p.add_argument(
        "--cache",
        action="store_true",
        help="keep decoded tasks in shared memory across epochs (cache=True)",
    )
    p.add_argument(
        "--step-ms",
        type=float,
        default=0.0,
        help="the training step per batch, in ms, slept (default 0)",
    )
    p.add_argument("--json", action="store_true", help="the figures as JSON")
    p.set_defaults(func=run)


def _function(spec: str, option: str) -> Callable[..., Any]:
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ShmloaderError(f"{option} {spec!r}: give MODULE:FUNCTION, e.g. my_decoders:decode")
    # As `python -m` would: a module in the current folder is found (a console script's
    # sys.path starts with its own bin folder instead); readers get the same sys.path.
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    try:
        found: Any = importlib.import_module(module)
        for part in name.split("."):  # MODULE:OBJECT.METHOD too
            found = getattr(found, part)
        function: Callable[..., Any] = found
    except (ImportError, AttributeError) as exc:
        raise ShmloaderError(f"{option} {spec!r}: {exc}") from exc
    return function


def run(args: argparse.Namespace) -> int:
    if min(args.epochs, args.readers, args.batch_size) < 1 or min(args.workers, args.step_ms) < 0:
        print(
            "shmloader bench: --epochs, --readers, --batch-size >= 1; --workers, --step-ms >= 0",
            file=sys.stderr,
        )
        return 2
    try:
        result = measure(args)
    except (ShmloaderError, OSError) as exc:
        print(f"shmloader bench: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(report(result))
    return 0


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import shmloader  # torch comes with it: only when measuring

    options: dict[str, Any] = {}
    if args.decode:
        options["decode"] = _function(args.decode, "--decode")
    if args.decode_batch:
        options["decode_batch"] = _function(args.decode_batch, "--decode-batch")
    if args.views:
        options["views"] = True
    source = source_for_paths(args.sources, **options)  # refuses options its class lacks
    epochs: list[dict[str, Any]] = []
    step = args.step_ms / 1000
    with shmloader.SharedTaskDataset(
        source,
        num_readers=args.readers,
        records_per_task=args.records_per_task,
        shm_budget=args.shm_budget,
        epochs=args.epochs,
        cache=args.cache,
    ) as ds:
        records_per_task = ds.job.records_per_task  # sized from the data where not given
        loader = shmloader.DataLoader(ds, batch_size=args.batch_size, num_workers=args.workers)
        started = time.perf_counter()
        first_batch = None
        ds.start()  # readers and master start here: counted in the first batch's time
        for epoch in range(args.epochs):
            waited = ds.stats().loop_wait_seconds
            began = time.perf_counter()
            rows = 0
            for batch in loader:
                if first_batch is None:
                    first_batch = time.perf_counter() - started
                rows += len(next(iter(batch.values())))
                if step:
                    time.sleep(step)
            seconds = time.perf_counter() - began
            stats = ds.stats()
            waited = stats.loop_wait_seconds - waited
            epochs.append(
                {
                    "epoch": epoch,
                    "samples": rows,
                    "seconds": seconds,
                    "waited": waited,
                    "tasks_from_cache": stats.tasks_from_cache,  # so far
                }
            )
    return {
        "sources": args.sources,
        "readers": args.readers,
        "workers": args.workers,
        "batch_size": args.batch_size,
        "step_ms": args.step_ms,
        "records_per_task": records_per_task,
        "cache": args.cache,
        "first_batch_seconds": first_batch,
        "epochs": epochs,
        "memory_pss_bytes": stats.total_pss,
        "memory_each_page_once_bytes": stats.total_memory,
        "stats": str(stats),
        "advice": stats.advice(),
    }


def report(result: dict[str, Any]) -> str:
    lines = [
        f"{result['readers']} reader(s), {result['workers']} worker(s), batch "
        f"{result['batch_size']}, tasks of {result['records_per_task']} records"
        f"{', cache=True' if result.get('cache') else ''}; first batch "
        f"{result['first_batch_seconds']:.2f} s after ds.start() (the readers and the master "
        "starting included)"
    ]
    for e in result["epochs"]:
        rate = e["samples"] / e["seconds"] if e["seconds"] else 0.0
        share = e["waited"] / e["seconds"] if e["seconds"] else 0.0
        lines.append(
            f"epoch {e['epoch']}: {e['samples']:,} samples in {e['seconds']:.2f} s: "
            f"{rate:,.0f} samples/s; the loop waited {share:.0%} of it for the next batch"
        )
    lines.append(result["stats"])
    lines.extend(f"advice: {line}" for line in result.get("advice", []))
    lines.append(advice(result["epochs"], result["step_ms"]))
    return "\n".join(lines)


def advice(epochs: list[dict[str, Any]], step_ms: float) -> str:
    """From the epochs after the first (start-up aside), whether feeding keeps up."""
    steady = epochs[1:] or epochs
    seconds = sum(e["seconds"] for e in steady)
    share = sum(e["waited"] for e in steady) / seconds if seconds else 0.0
    if not step_ms:
        rate = sum(e["samples"] for e in steady) / seconds if seconds else 0.0
        return (
            f"with a loop that does nothing else (--step-ms 0), {rate:,.0f} samples/s after the "
            "first epoch is the most these settings deliver here (its wait includes the "
            "gather); give --step-ms your training step's time to see whether they keep up"
        )
    if share > WAITED_TOO_LONG:
        return (
            f"the loop waited {share:.0%} of its time for data (after the first epoch): feeding "
            "is the bottleneck here; try more --readers, a --decode-batch function, or "
            "--workers, and a larger --shm-budget if readers wait for room"
        )
    return (
        f"the loop waited {share:.0%} of its time for data (after the first epoch): feeding "
        f"keeps up with a training step of {step_ms:g} ms per batch"
    )
