"""What ``ds.stats()`` costs: the time of one call, and what calling it every step costs the
loop, side by side in one run.

Run by hand (not a test): ``python benchmarks/bench_stats.py [--records N] [--rounds R]``.

Per round, over the same files: one epoch through ``shmloader.DataLoader`` without calling
``stats()``, and one calling it after every batch (the loop's samples/s of each, and their
ratio); then 200 calls in a row, of which the first measures every process (memory maps,
CPU) and the rest answer from the probe's last figures (``shmloader/stats/probe.py``), and
one call with every process measured afresh. Medians over the rounds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import shmloader

FEATURES = 64


def decode_batch(payloads: list[bytes]) -> dict[str, np.ndarray]:
    raw = np.frombuffer(b"".join(payloads), dtype="<f4").reshape(len(payloads), FEATURES)
    return {"x": raw.copy(), "label": raw[:, 0].astype(np.int64)}


def epoch(ds: shmloader.SharedTaskDataset, *, call_stats: bool) -> float:
    """Samples/s of one pass, calling ``stats()`` after every batch or not."""
    rows = 0
    began = time.perf_counter()
    for batch in shmloader.DataLoader(ds, batch_size=256):
        rows += len(batch["label"])
        if call_stats:
            ds.stats()
    return rows / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rng = np.random.default_rng(0)
        rows = rng.standard_normal((args.records, FEATURES)).astype("<f4")
        shmloader.write_records(Path(tmp) / "part.tfrecord", (r.tobytes() for r in rows))
        source = shmloader.RecordFileSource(f"{tmp}/*.tfrecord", decode_batch=decode_batch)
        plain, with_stats, cached, fresh = [], [], [], []
        with shmloader.SharedTaskDataset(source, num_readers=2, epochs=None) as ds:
            epoch(ds, call_stats=False)  # warm up: readers, page cache
            for _ in range(args.rounds):
                plain.append(epoch(ds, call_stats=False))
                with_stats.append(epoch(ds, call_stats=True))
                time.sleep(1.1)  # past the probe's interval: the next call measures afresh
                began = time.perf_counter()
                ds.stats()
                fresh.append(time.perf_counter() - began)
                began = time.perf_counter()
                for _ in range(200):
                    ds.stats()
                cached.append((time.perf_counter() - began) / 200)
            print(ds.stats())
    median = statistics.median
    print(f"\n{args.records:,} records, batch 256, 2 readers, medians of {args.rounds} rounds:")
    print(f"  loop without stats():        {median(plain):,.0f} samples/s")
    print(f"  loop calling it every batch: {median(with_stats):,.0f} samples/s")
    ratio = median(w / p for w, p in zip(with_stats, plain, strict=True))
    print(f"  ratio:                       {ratio:.2f}")
    print(f"  one call, figures cached:    {median(cached) * 1e3:.2f} ms")
    print(f"  one call, every process measured: {median(fresh) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
