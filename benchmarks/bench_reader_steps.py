"""Where a reader's time goes, step by step, per record: read, decode, write.

Run by hand (not a test), from the repository root:
``python benchmarks/bench_reader_steps.py [--dataset images|tabular] [--records N]``.

Writes the data-plane benchmark's dataset (``bench_dataplane.py``: same layouts, same decode
functions), then does in one process what a reader does for each task of 4096 records:
``RecordFileSource.read_result`` and ``StoreHandle.write`` of its content into a shared-memory
segment, and ``release`` of the segment written ``WINDOW`` tasks before (it becomes a spare for
the next writes, as in a real run). Inside that, the clock is split three ways:

1. ``read_runs``: ``RecordFile.read_runs`` reads the file's blocks, checks every frame against
   the index and its CRCs, and hands out the payloads (``bytes`` copies, or ``memoryview``
   slices with ``views``);
2. ``decode_batch``: the benchmark's function (joins the payloads, one ``numpy.frombuffer``),
   with the check that its columns are fixed-width;
3. ``write``: the rest: reserving the segment, copying the columns into it, sealing it.

Two ways of handing the columns over are compared: ``block`` is what readers do, each block
of the file (``formats/_framing.BLOCK``) decoded and copied into the segment before the next is
read (``sources/streamed.py``); ``task`` decodes the whole task first
(``StreamedColumns.collect``), then writes it. The first task of each size is built into an
Arrow batch and written; the others are copied straight into the segment, by the layout the
first one taught (``shm/template.py``).

Each configuration runs in a fresh interpreter, because ``keep_freed_memory`` (what reader
processes call at start-up, ``shmloader/reader/heap.py``) changes the whole process's
allocator: ``default`` is a plain Python process, ``reader`` one that called it. The best of
``--repeat`` passes over all tasks is printed, in µs per record.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

RECORDS_PER_TASK = 4096
WINDOW = 8  # segments in use at once, as in the sampler's default shuffle window
STEPS = ("read_runs", "decode_batch", "write")


class Clock:
    """Seconds spent in the instrumented steps since the last :meth:`take`."""

    def __init__(self) -> None:
        self.spent = collections.Counter[str]()

    def timed_call(self, step: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[step] += time.perf_counter() - t0

        return call

    def timed_iter(self, step: str, fn: Callable[..., Iterator[Any]]) -> Callable[..., Any]:
        def iterate(*args: Any, **kwargs: Any) -> Iterator[Any]:
            items = fn(*args, **kwargs)
            while True:
                t0 = time.perf_counter()
                item = next(items, None)
                self.spent[step] += time.perf_counter() - t0
                if item is None:
                    return
                yield item

        return iterate

    def take(self) -> dict[str, float]:
        out = dict(self.spent)
        self.spent.clear()
        return out


def measure(
    paths: list[str], dataset: str, views: bool, whole: bool, repeat: int
) -> dict[str, float]:
    """Seconds per record of each step, best of ``repeat`` passes over every task."""
    from _bench_decoders import DECODE_BATCH

    from shmloader.formats.tfrecord import RecordFile
    from shmloader.shm.store import SegmentStore
    from shmloader.sources import Shard
    from shmloader.sources.records import RecordFileSource
    from shmloader.sources.streamed import StreamedColumns

    clock = Clock()
    # Instrumented in this process only: the time spent reading blocks, and in the decoder.
    RecordFile.read_runs = clock.timed_iter("read_runs", RecordFile.read_runs)  # type: ignore[method-assign]
    decode_batch = clock.timed_call("decode_batch", DECODE_BATCH[dataset])
    source = RecordFileSource(paths, decode_batch=decode_batch, views=views)
    tasks = [
        (shard, a, min(a + RECORDS_PER_TASK, shard.num_records))
        for shard in source.plan()
        for a in range(0, shard.num_records, RECORDS_PER_TASK)
    ]
    records = sum(b - a for _, a, b in tasks)
    best = dict.fromkeys(STEPS, float("inf"))
    with SegmentStore.create(budget="1GiB") as store:
        handle = store.handle()
        in_use: collections.deque[str] = collections.deque()
        for _ in range(repeat):
            clock.take()
            total = 0.0
            for shard, a, b in tasks:
                t0 = time.perf_counter()
                content = source.read_result(Shard(shard.path, shard.num_records), a, b).content
                assert isinstance(content, StreamedColumns)
                info = handle.write(content.collect() if whole else content)
                assert info is not None  # None only when told to stop waiting
                in_use.append(info.name)
                if len(in_use) > WINDOW:  # released as the trainer does, a window later
                    handle.release(in_use.popleft())
                total += time.perf_counter() - t0
            spent = clock.take()
            spent["write"] = total - spent["read_runs"] - spent["decode_batch"]
            for step in STEPS:
                best[step] = min(best[step], spent[step] / records)
    return best


def child(spec: dict[str, Any]) -> None:
    if spec["heap"] == "reader":
        from shmloader.reader.heap import keep_freed_memory

        if not keep_freed_memory():
            print(json.dumps(None))  # not glibc: nothing to compare
            return
    args = (spec["paths"], spec["dataset"], spec["views"], spec["whole"], spec["repeat"])
    print(json.dumps(measure(*args)))


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
        print(f"\n| process | payloads | decoded a | {' | '.join(STEPS)} | total |")
        print("|---|---|---|" + "--:|" * (len(STEPS) + 1))
        configs = itertools.product(("default", "reader"), (False, True), (True, False))
        for heap, views, whole in configs:
            spec = dict(
                paths=paths,
                dataset=args.dataset,
                views=views,
                whole=whole,
                heap=heap,
                repeat=args.repeat,
            )
            proc = run_script_child(__file__, spec)
            if proc.returncode:
                raise RuntimeError(f"{spec} failed:\n{proc.stdout}\n{proc.stderr}")
            result = json.loads(proc.stdout)
            if result is None:
                print(f"| {heap} | - | - | (no glibc: keep_freed_memory does nothing) |")
                continue
            cells = " | ".join(f"{result[s] * 1e6:.2f}" for s in STEPS)
            total = sum(result.values()) * 1e6
            kind = "memoryview" if views else "bytes"
            print(f"| {heap} | {kind} | {'task' if whole else 'block'} | {cells} | {total:.2f} |")


if __name__ == "__main__":
    main()
