"""Records/s of RecordFileSource.read: framing + decode + conversion to one Arrow batch.

Run by hand (not a test): ``python benchmarks/bench_sources.py [--records N] [--range R]
[--dim D]``. Each record is ``D`` float32 (64 by default) + one int64 label (264 bytes, numpy
``tobytes``; ``--dim 3072`` makes 12 KB records, the size of the data-plane benchmark's
images). ``decode`` calls ``np.frombuffer`` per record; ``decode_batch`` does one
``np.frombuffer`` over the joined payloads; each also runs with ``views=True`` (payloads as
memoryviews of the blocks read, not ``bytes`` copies). The file is written first, so reads
come from the page cache: this measures CPU.
Every range of ``--range`` records is read once per pass; the best of ``--repeat`` passes is
reported (least disturbed by other work on the machine).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from shmloader.formats.tfrecord import write_records
from shmloader.sources.records import RecordFileSource

DIM = 64


def decode(payload: bytes) -> Mapping[str, Any]:
    dim = (len(payload) - 8) // 4
    return {
        "x": np.frombuffer(payload, np.float32, dim),
        "y": np.frombuffer(payload, np.int64, 1, dim * 4)[0],
    }


def decode_batch(payloads: list[bytes]) -> Mapping[str, Any]:
    raw = np.frombuffer(b"".join(payloads), np.uint8).reshape(len(payloads), -1)
    dim = (raw.shape[1] - 8) // 4
    return {"x": raw[:, : dim * 4].view(np.float32), "y": raw[:, dim * 4 :].view(np.int64)[:, 0]}


def _pass(source: RecordFileSource, rng: int) -> tuple[float, int]:
    shard = source.plan()[0]
    t0 = time.perf_counter()
    rows = 0
    for start in range(0, shard.num_records, rng):
        rows += source.read(shard, start, min(start + rng, shard.num_records)).num_rows
    return time.perf_counter() - t0, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--range", type=int, default=4096, help="records per read")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dim", type=int, default=DIM, help="float32 values per record")
    args = parser.parse_args()
    size = args.dim * 4 + 8
    rng = np.random.default_rng(0)
    payloads = [
        rng.standard_normal(args.dim, dtype=np.float32).tobytes() + np.int64(i).tobytes()
        for i in range(args.records)
    ]
    with tempfile.TemporaryDirectory(prefix="shmloader-bench-") as tmp:
        path = f"{tmp}/data.tfrecord"
        write_records(path, payloads)
        for label, kwargs in (
            ("raw (no decode)", {}),
            ("decode (per record)", {"decode": decode}),
            ("decode, views=True", {"decode": decode, "views": True}),
            ("decode_batch", {"decode_batch": decode_batch}),
            ("decode_batch, views=True", {"decode_batch": decode_batch, "views": True}),
        ):
            source = RecordFileSource(path, **kwargs)
            source.plan()
            source.read(source.plan()[0], 0, 1)  # index loaded, schema inferred
            best, rows = min(_pass(source, args.range) for _ in range(args.repeat))
            print(
                f"{label:26s} {rows / best:>12,.0f} records/s  "
                f"{rows * size / best / 1e6:>8.1f} MB/s  ({rows} records, ranges of {args.range})"
            )


if __name__ == "__main__":
    main()
