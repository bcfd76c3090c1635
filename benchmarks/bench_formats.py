"""Throughput of the TFRecord layer: index build, whole-file reads, indexed range reads.

Run by hand (not a test): ``python benchmarks/bench_formats.py [--records N] [--size BYTES]``.
Numbers depend on the page cache: the file is written first, so reads are from memory and
measure the per-record CPU cost, which is what this layer controls.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from collections.abc import Callable

from shmloader.formats.tfrecord import RecordFile, read_records, scan_offsets, write_records


def _timed(fn: Callable[[], int], repeat: int) -> tuple[float, int]:
    """Best of ``repeat`` runs (least disturbed by other work on the machine)."""
    best = float("inf")
    result = 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--size", type=int, default=264, help="payload bytes per record")
    parser.add_argument("--range", type=int, default=4096, help="records per range read")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    payload = os.urandom(args.size)
    with tempfile.TemporaryDirectory(prefix="shmloader-bench-") as tmp:
        path = os.path.join(tmp, "bench.tfrecord")
        t0 = time.perf_counter()
        write_records(path, (payload for _ in range(args.records)))
        write_s = time.perf_counter() - t0
        size_mb = os.path.getsize(path) / 1e6

        scan_s, n_offsets = _timed(lambda: len(scan_offsets(path)) - 1, args.repeat)
        read_s, n_read = _timed(lambda: sum(1 for _ in read_records(path)), args.repeat)
        rf = RecordFile(path)
        starts = list(range(0, args.records - args.range + 1, args.range))
        random.Random(0).shuffle(starts)

        def ranges() -> int:
            return sum(sum(1 for _ in rf.read_range(s, s + args.range)) for s in starts)

        range_s, n_range = _timed(ranges, args.repeat)
        assert n_offsets == n_read == args.records, (n_offsets, n_read)

    rows = [
        ("write_records (with index)", args.records / write_s, size_mb / write_s),
        ("index build (scan, no sidecar)", n_offsets / scan_s, size_mb / scan_s),
        ("read_records (whole file, verify)", n_read / read_s, size_mb / read_s),
        (f"RecordFile.read_range ({args.range} rec)", n_range / range_s, None),
    ]
    print(f"{args.records} records x {args.size} B payload, file {size_mb:.1f} MB")
    print(f"{'operation':<40} {'records/s':>12} {'MB/s':>9}")
    for name, rps, mbps in rows:
        mb = f"{mbps:9.0f}" if mbps is not None else f"{'':>9}"
        print(f"{name:<40} {rps:12,.0f} {mb}")


if __name__ == "__main__":
    main()
