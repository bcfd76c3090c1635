"""Data-plane benchmark: samples/s, memory (PSS) and time to first batch, all contenders in one run.

Run by hand (not a test), from the repository root:
``python benchmarks/bench_dataplane.py [--quick] [--tabular N] [--images N] [--epochs E]
[--rounds R]``.

Two datasets are written as TFRecord files into a temporary folder: *tabular* (64 float32 +
an int64 label per record, 264 bytes, batch 1024) and *images* (3x64x64 uint8 + an int64 label,
12,296 bytes, batch 128). Contenders, at an equal count of processes (see ``--workers-torch``,
``--readers``, ``--workers-shm``):

(a) a plain map-style torch Dataset: one record read and decoded per ``__getitem__``, default
    collate, ``shuffle=True``; (b) the same with a vectorised ``__getitems__``;
(c) ``SharedTaskDataset`` with a per-record ``decode``; (d) with ``decode_batch``; both in
    ``shmloader.DataLoader``, once more in the plain torch DataLoader (``sampler=ds.sampler()``,
    ``collate_fn=ds.collate``), and once with ``RecordFileSource(..., views=True)``;
(e) single-core ``numpy.take`` of the same shuffled rows from one in-memory array (the ceiling);
and the gather alone: decoded rows already in shared memory gathered into batches in one
process (``Gatherer.gather``, and the bare ``gather()`` copy).

Each contender runs in a fresh process after the files were read once (warm page cache);
samples/s is measured over epochs 2..E (epoch 1 includes start-up), time to first batch from
constructing the dataset to receiving batch 1. Memory is the peak of the summed PSS of the
trainer, its DataLoader workers and its readers, sampled every 0.5 s, per epoch; CPU time per
sample is their user + system time over epochs 2..E divided by the samples delivered.
With ``--rounds R`` every contender runs R times, round after round, and the tables give each
one's median run (every round's samples/s are listed too): this machine's throughput moves by
a quarter between identical runs, more than some of the margins measured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _bench_child import run_script_child  # noqa: E402
from _bench_decoders import LAYOUTS  # noqa: E402

BATCH = {"tabular": 1024, "images": 128}
FILES = 4


def write_dataset(folder: str, name: str, records: int, seed: int) -> list[str]:
    from shmloader.formats.tfrecord import write_records

    layout = LAYOUTS[name]
    paths, per_file = [], -(-records // FILES)
    for i, first in enumerate(range(0, records, per_file)):
        count = min(per_file, records - first)
        path = os.path.join(folder, f"{name}-{i:02d}.tfrecord")
        write_records(path, layout.payload_stream(first, count, seed))
        paths.append(path)
    return paths


def warm(paths: list[str]) -> None:
    """Read every file (and its index) once, so every contender finds them in the page cache."""
    for path in paths:
        for p in (path, path + ".idx"):
            if os.path.exists(p):
                with open(p, "rb") as f:
                    while f.read(1 << 24):
                        pass


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    proc = run_script_child(__file__, spec)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[7:])
            return result
    raise RuntimeError(f"contender {spec['contender']} failed:\n{proc.stdout}\n{proc.stderr}")


def steady(result: dict[str, Any]) -> float:
    """Samples/s over epochs 2..E (all epochs if there is one)."""
    eps = result["epochs"][1:] or result["epochs"]
    return sum(e["rows"] for e in eps) / sum(e["seconds"] for e in eps)


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median samples/s (the lower middle one of an even count), with every run's
    rate under ``"rounds"``."""
    ranked = sorted(runs, key=steady)
    return dict(ranked[(len(ranked) - 1) // 2], rounds=[steady(r) for r in runs])


def _jobs(c: str, base: dict[str, Any], args: Any) -> list[tuple[str, dict[str, Any]]]:
    """The runs of contender ``c``: its variants, each with its spec."""
    variants: dict[str, str | None] = (
        {
            "gather:Gatherer": "Gatherer",
            "gather:Gatherer:noledger": "Gatherer-noledger",
            "gather:gather": "gather",
            "gather:warm": "warm",
        }
        if c == "gather"
        else {"e": None, "e:sorted": "sorted"}
        if c == "e"
        else {
            c: None,
            f"{c}:batches": None,
            f"{c}:inproc": None,
            f"{c}:inproc:torch": None,
            f"{c}:inproc:views": None,
        }
        if c in ("c", "d")
        else {"b": None, "b:inproc": None}
        if c == "b"
        else {c: None}
    )
    out = []
    for key, how in variants.items():
        spec = dict(base, contender=c, how=how)
        if key == "b:inproc":  # (b) with no worker: no batch crosses processes
            spec["workers"] = 0
        elif c in ("a", "b"):
            spec["workers"] = args.workers_torch
        elif key in ("c", "d", "c:batches", "d:batches"):
            spec.update(workers=args.workers_shm, readers=args.readers)
        elif key.startswith(("c:inproc", "d:inproc")):
            # Same process count, the other split: gather in the trainer itself.
            spec.update(workers=0, readers=args.readers_inproc)
        if key.endswith(":torch"):
            spec["loader"] = "torch"
        if key.endswith(":batches"):  # a plain DataLoader given ds.batch_sampler(...)
            spec["loader"] = "torch-batches"
        if key.endswith(":views"):  # payloads as memoryviews, no copy each
            spec["views"] = True
        out.append((key, spec))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, 2 epochs (< 2 min)")
    parser.add_argument("--tabular", type=int, default=400_000, help="tabular records")
    parser.add_argument("--images", type=int, default=40_000, help="image records")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers-torch", type=int, default=2, help="DataLoader workers, (a)(b)")
    parser.add_argument("--readers", type=int, default=1, help="shmloader readers, (c)(d)")
    parser.add_argument("--workers-shm", type=int, default=1, help="DataLoader workers, (c)(d)")
    parser.add_argument(
        "--readers-inproc",
        type=int,
        default=2,
        help="readers of the (c)(d) variant that gathers in the trainer (num_workers=0)",
    )
    parser.add_argument("--budget", default="1GiB", help="shmloader shm_budget")
    parser.add_argument("--only", default="", help="comma-separated contenders (a,b,c,d,e,gather)")
    parser.add_argument("--datasets", default="tabular,images")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every contender this many times, round after round; report each one's median",
    )
    parser.add_argument("--json", help="also write every result to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        from _bench_contenders import run

        print("RESULT " + json.dumps(run(json.loads(args.child))), flush=True)
        return
    if args.quick:
        args.tabular, args.images, args.epochs = 100_000, 10_000, 2
    from _bench_report import NAMES, report

    wanted = [c for c in args.only.split(",") if c] or ["a", "b", "c", "d", "e", "gather"]
    results: dict[str, dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="shmloader-bench-") as tmp:
        for name in args.datasets.split(","):
            records = args.tabular if name == "tabular" else args.images
            t = time.perf_counter()
            paths = write_dataset(tmp, name, records, args.seed)
            print(
                f"{name}: {records} records in {len(paths)} files "
                f"({time.perf_counter() - t:.1f} s to write)",
                file=sys.stderr,
            )
            base = {
                "dataset": name,
                "paths": paths,
                "records": records,
                "label_sum": records * (records - 1) // 2,
                "batch": BATCH[name],
                "epochs": args.epochs,
                "seed": args.seed,
                "budget": args.budget,
            }
            runs: dict[str, list[dict[str, Any]]] = {}
            jobs = [(key, spec) for c in wanted for key, spec in _jobs(c, base, args)]
            # Round after round over all contenders, so that a slow spell of the machine
            # (throughput here moves by 25% within an hour) lands on every contender alike.
            for r in range(args.rounds):
                for key, spec in jobs:
                    warm(paths)
                    runs.setdefault(key, []).append(run_child(spec))
                    round_note = f" (round {r + 1})" if args.rounds > 1 else ""
                    print(
                        f"  {NAMES[key]}{round_note}: {steady(runs[key][-1]):,.0f} samples/s",
                        file=sys.stderr,
                    )
            results[name] = {key: median_run(got) for key, got in runs.items()}
            if name == "tabular" and "d" in wanted and len(paths) > 1:
                # Worker memory must not grow with the dataset: (d) again on one file of four.
                part = -(-records // FILES)
                spec = dict(
                    base,
                    contender="d",
                    paths=paths[:1],
                    records=part,
                    label_sum=part * (part - 1) // 2,
                    workers=args.workers_shm,
                    readers=args.readers,
                )
                results[name]["d:quarter"] = run_child(spec)
    report(results, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
