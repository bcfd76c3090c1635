"""``num_readers="auto"`` against fixed reader counts, side by side in one run.

Run by hand (not a test), from the repository root:
``python benchmarks/bench_auto_readers.py [--records N] [--seconds S] [--rounds R]
[--readers 1,2,3]``.

On the data-plane datasets (``bench_dataplane.py``: *tabular*, 264-byte records in batches of
1024, and *images*, 12 KB records in batches of 128), each with a per-record ``decode`` and a
``decode_batch``, a ``SharedTaskDataset`` runs passes through ``shmloader.DataLoader`` (no
workers) for ``--seconds`` with each fixed reader count and with ``"auto"``, each in a fresh
process, round after round. samples/s is over the passes that begin in the second half of
the run (after start-up, and after "auto" found its count); the table gives medians over the
rounds, auto's ratio to the best fixed count, and the readers auto ran at the end.
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

from _bench_child import run_script_child  # noqa: E402
from _bench_decoders import DECODE, DECODE_BATCH  # noqa: E402
from bench_dataplane import BATCH, warm, write_dataset  # noqa: E402

RECORDS_PER_TASK = 4096


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One configuration, in this (fresh) process: samples/s of each epoch after the first."""
    import shmloader

    fn = (DECODE if spec["decode"] == "decode" else DECODE_BATCH)[spec["dataset"]]
    source = shmloader.RecordFileSource(spec["paths"], **{spec["decode"]: fn})
    readers = spec["readers"] if spec["readers"] == "auto" else int(spec["readers"])
    rates = []
    with shmloader.SharedTaskDataset(
        source, num_readers=readers, records_per_task=RECORDS_PER_TASK, epochs=None, seed=0
    ) as ds:
        loader = shmloader.DataLoader(ds, batch_size=BATCH[spec["dataset"]])
        start = time.perf_counter()
        while time.perf_counter() - start < spec["seconds"]:
            rows, began = 0, time.perf_counter()
            for batch in loader:
                rows += len(batch["label"])
            if began - start >= spec["seconds"] / 2:
                rates.append(rows / (time.perf_counter() - began))
        running = sum(r.alive for r in ds.stats().readers)
    return {"rate": statistics.median(rates), "readers_at_end": running}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000, help="per dataset (tabular)")
    parser.add_argument("--seconds", type=float, default=20.0, help="per configuration")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--readers", default="1,2,3", help="fixed counts to compare")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    counts = [*args.readers.split(","), "auto"]
    table: dict[tuple[str, str], dict[str, list[Any]]] = {}
    with tempfile.TemporaryDirectory() as folder:
        paths = {
            "tabular": write_dataset(folder, "tabular", args.records, 0),
            "images": write_dataset(folder, "images", args.records // 8, 0),
        }
        for files in paths.values():
            warm(files)
        for _ in range(args.rounds):
            for dataset, files in paths.items():
                for decode in ("decode", "decode_batch"):
                    for readers in counts:
                        spec = {
                            "dataset": dataset,
                            "decode": decode,
                            "readers": readers,
                            "paths": files,
                            "seconds": args.seconds,
                        }
                        done = run_script_child(__file__, spec)
                        if done.returncode != 0:
                            raise SystemExit(done.stdout + done.stderr)
                        result = json.loads(done.stdout.strip().splitlines()[-1])
                        cell = table.setdefault((dataset, decode), {})
                        cell.setdefault(readers, []).append(result)
    print(
        f"\nsamples/s, medians of {args.rounds} rounds, over the second half of "
        f"{args.seconds:.0f} s per run ({os.cpu_count()} cores):\n"
    )
    header = " | ".join(f"{c} readers" if c != "auto" else "auto" for c in counts)
    print(f"| dataset, decode | {header} | auto / best fixed | auto's readers at the end |")
    print("|---" * (len(counts) + 3) + "|")
    for (dataset, decode), cells in table.items():
        rates = {c: statistics.median(r["rate"] for r in cells[c]) for c in counts}
        best = max(rates[c] for c in counts if c != "auto")
        ends = sorted(r["readers_at_end"] for r in cells["auto"])
        row = " | ".join(f"{rates[c]:,.0f}" for c in counts)
        print(f"| {dataset}, {decode} | {row} | {rates['auto'] / best:.2f} | {ends} |")


if __name__ == "__main__":
    main()
