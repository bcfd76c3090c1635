"""Where a reader's time goes, step by step, per record: read, decode, convert, write.

Run by hand (not a test), from the repository root:
``python benchmarks/bench_reader_steps.py [--dataset images|tabular] [--records N]``.

Writes the data-plane benchmark's dataset (``bench_dataplane.py``: same layouts, same decode
functions), then does in one process what a reader does for each task of 4096 records:

1. ``RecordFile.read_runs``: read the blocks, check every frame against the index and its
   CRCs, hand out the payloads (``bytes`` copies, or ``memoryview`` slices with ``views``);
2. the benchmark's ``decode_batch`` (joins the payloads, one ``numpy.frombuffer``);
3. ``BatchBuilder.fixed_columns``: the columns checked against the schema, not converted
   (the benchmark's are fixed-width; other columns would be built into an Arrow batch here);
4. ``StoreHandle.write`` into a shared-memory segment, and ``release`` of the segment
   written ``WINDOW`` tasks before (it becomes a spare for the next writes, as in a real run).
   The first task of each size is built into an Arrow batch and written; the others are
   copied from the strided arrays straight into the segment, by the layout the first one
   taught (``shm/template.py``).

Each configuration runs in a fresh interpreter, because ``keep_freed_memory`` (what reader
processes call at start-up, ``shmloader/reader/heap.py``) changes the whole process's
allocator: ``default`` is a plain Python process, ``reader`` one that called it. The best of
``--repeat`` passes over all tasks is printed, in µs per record.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

RECORDS_PER_TASK = 4096
WINDOW = 8  # segments in use at once, as in the sampler's default shuffle window
STEPS = ("read_runs", "decode_batch", "fixed_columns", "write")


def measure(paths: list[str], dataset: str, views: bool, repeat: int) -> dict[str, float]:
    """Seconds per record of each step, best of ``repeat`` passes over every task."""
    from _bench_decoders import DECODE_BATCH

    from shmloader.formats.tfrecord import RecordFile, Run
    from shmloader.shm.store import SegmentStore
    from shmloader.sources.columns import BatchBuilder
    from shmloader.sources.records import RecordFileSource

    decode_batch = DECODE_BATCH[dataset]
    source = RecordFileSource(paths, decode_batch=decode_batch)
    builder = BatchBuilder(source.schema)
    files = [RecordFile(p) for p in paths]
    tasks = [
        (rf, a, min(a + RECORDS_PER_TASK, rf.num_records))
        for rf in files
        for a in range(0, rf.num_records, RECORDS_PER_TASK)
    ]
    records = sum(b - a for _, a, b in tasks)
    best = dict.fromkeys(STEPS, float("inf"))
    with SegmentStore.create(budget="1GiB") as store:
        handle = store.handle()
        in_use: collections.deque[str] = collections.deque()
        for _ in range(repeat):
            spent = dict.fromkeys(STEPS, 0.0)
            for rf, a, b in tasks:
                t0 = time.perf_counter()
                runs = rf.read_runs(a, b, views=views)  # on_error="raise": Runs only
                payloads = [p for run in runs if isinstance(run, Run) for p in run.payloads]
                t1 = time.perf_counter()
                columns = decode_batch(payloads)
                t2 = time.perf_counter()
                batch = builder.fixed_columns(columns, len(payloads))
                assert batch is not None  # the benchmark's columns are fixed-width
                t3 = time.perf_counter()
                info = handle.write(batch)
                assert info is not None  # None only when told to stop waiting
                in_use.append(info.name)
                if len(in_use) > WINDOW:  # released as the trainer does, a window later
                    handle.release(in_use.popleft())
                t4 = time.perf_counter()
                for step, dt in zip(STEPS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                    spent[step] += dt
                del payloads, columns, batch
            for step in STEPS:
                best[step] = min(best[step], spent[step] / records)
    return best


def child(spec: dict[str, Any]) -> None:
    if spec["heap"] == "reader":
        from shmloader.reader.heap import keep_freed_memory

        if not keep_freed_memory():
            print(json.dumps(None))  # not glibc: nothing to compare
            return
    print(json.dumps(measure(spec["paths"], spec["dataset"], spec["views"], spec["repeat"])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=("images", "tabular"), default="images")
    parser.add_argument("--records", type=int, default=None, help="default: 40,000 / 400,000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    from _bench_child import run_script_child
    from bench_dataplane import write_dataset

    records = args.records or (40_000 if args.dataset == "images" else 400_000)
    with tempfile.TemporaryDirectory(prefix="shmloader-bench-") as tmp:
        paths = write_dataset(tmp, args.dataset, records, seed=7)
        print(f"{args.dataset}: {records:,} records, tasks of {RECORDS_PER_TASK}; µs per record")
        print(f"\n| process | payloads | {' | '.join(STEPS)} | total |")
        print("|---|---|" + "--:|" * (len(STEPS) + 1))
        for heap in ("default", "reader"):
            for views in (False, True):
                spec = dict(
                    paths=paths, dataset=args.dataset, views=views, heap=heap, repeat=args.repeat
                )
                proc = run_script_child(__file__, spec)
                if proc.returncode:
                    raise RuntimeError(f"{spec} failed:\n{proc.stdout}\n{proc.stderr}")
                result = json.loads(proc.stdout)
                if result is None:
                    print(f"| {heap} | - | (no glibc: keep_freed_memory does nothing) |")
                    continue
                cells = " | ".join(f"{result[s] * 1e6:.2f}" for s in STEPS)
                total = sum(result.values()) * 1e6
                kind = "memoryview" if views else "bytes"
                print(f"| {heap} | {kind} | {cells} | {total:.2f} |")


if __name__ == "__main__":
    main()
