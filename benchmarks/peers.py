"""shmloader side by side with the loaders users would pick instead, all in one run.

Run by hand (not a test), from the repository root, in an environment with the ``bench``
extra (see docs/performance.md for the torch/torchvision pair it needs):
``python benchmarks/peers.py [--tabular N] [--images N] [--rounds R] [--window S]
[--only NAME,NAME] [--shm-budget SIZE] [--plot docs/img/peers] [--json FILE]``; ``--plot-from
FILE --plot PREFIX`` plots a run's ``--json`` again without running anything.

Two datasets of generated records (``_bench_decoders``): *tabular* (64 float32 + an int64
label, 264 bytes, batch 1024) and *images* (3x64x64 uint8 + label, 12,296 bytes, batch 128),
each written once in every contender's own format (``_bench_peers.CONTENDERS``): plain torch
DataLoaders (one record per ``__getitem__``; a vectorised ``__getitems__`` over a
fixed-stride file), Mosaic ``streaming``, ``litdata``, ``webdataset``, Hugging Face
``datasets``, Grain, and shmloader with a per-record ``decode`` and with ``decode_batch``.
Every contender has 2 data processes (DataLoader workers, Grain workers, shmloader readers),
except "torch vectorised, no workers", which takes each batch in the loop's own process (for
large batches faster than torch's hand-over from workers); all shuffle, and all decode with
the same function.

Each run is a fresh process (its memory and CPU its own) after the files were read once.
It times the first batch from just before the library's import (torch imported before),
then iterates whole epochs until ``--window`` seconds (default 3) have passed after a 1 s
warm-up and at least two epochs are done, and gives samples/s and CPU seconds per sample
(every process of the tree) over that window, samples/s of the first epoch (after its first
batch) and of the epochs after it apart, and the peak of the
summed PSS of the tree (sampled every 0.5 s; shmloader's store files that no process maps
added). Whether the first epoch delivered every record once (its label sum and count) is
checked and printed. With ``--rounds R`` each contender runs R times, round after round, and
the table gives medians.
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
from _bench_decoders import LAYOUTS  # noqa: E402

BATCH = {"tabular": 1024, "images": 128}
WARMUP = 1.0  # seconds after the first batch before the window starts
VECTORISED = ("torch vectorised", "torch vectorised, no workers")
SHMLOADER = ("shmloader decode", "shmloader decode_batch")
CACHED = ("shmloader decode, cache", "shmloader decode_batch, cache")
# Imported after the clock starts: the first batch is timed from just before the library's
# own import (torch is imported before, as a training script has it by then).
IMPORTS = {
    "Mosaic streaming": ["streaming"],
    "LitData": ["litdata"],
    "webdataset": ["webdataset"],
    "HF datasets": ["datasets"],
    "Grain": ["grain.python", "_bench_grain"],
    "shmloader decode": ["shmloader"],
    "shmloader decode_batch": ["shmloader"],
    "shmloader decode, cache": ["shmloader"],
    "shmloader decode_batch, cache": ["shmloader"],
    **{f"{name}, tasks of 4096": ["shmloader"] for name in (*SHMLOADER, CACHED[1])},
}
FIELDS = (
    "samples_s",
    "epoch1_samples_s",
    "later_samples_s",
    "first_batch_s",
    "peak_pss_mib",
    "cpu_us_per_sample",
)


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One contender on one dataset, measured in this (fresh) process."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import importlib

    import torch.utils.data  # noqa: F401 - every contender's, before the clock
    from _bench_memory import Sampler, once
    from _bench_peers import LOADERS, Job, shmloader_loader

    layout = LAYOUTS[spec["dataset"]]
    job = Job(
        layout, spec["files"], spec["records"], spec["batch"], 2, spec["seed"], spec["shm_budget"]
    )
    # Started first: its first look at the process tree (smaps of a process that imported
    # torch: tens of milliseconds) must not fall inside the first batch's time.
    sampler = Sampler().start()
    began = time.perf_counter()
    for module in IMPORTS.get(spec["name"], []):
        importlib.import_module(module)
    closing = None
    name = spec["name"]
    if name.startswith("shmloader"):
        fixed = name.partition(", tasks of ")[2]
        batches, closing = shmloader_loader(
            job, "decode_batch" in name, ", cache" in name, int(fixed) if fixed else None
        )
    else:
        batches = LOADERS[name](job)
    first_batch = window_start = window_rows = warm_until = now = 0.0
    first_epoch: tuple[int, int] | None = None
    # Whole epochs, each timed from the end of the one before (the first from its first
    # batch, its own rows less that batch): (rows, seconds).
    epochs: list[tuple[int, float]] = []
    try:
        # Whole epochs until the window is over and at least one after the first is done.
        while not (len(epochs) >= 2 and window_start and now - window_start >= spec["window"]):
            rows = total = untimed = 0
            epoch_began = time.perf_counter()
            for batch in batches():
                now = time.perf_counter()
                labels = batch["label"]
                if not first_batch:
                    first_batch = now - began
                    warm_until = now + WARMUP
                    epoch_began, untimed = now, len(labels)
                    if closing is not None:  # its store's files, mapped or not, count once
                        sampler.shm_dir = closing.store_path
                rows += len(labels)
                total += int(labels.sum())
                if not window_start and now >= warm_until:
                    window_start = now
                    sampler.mark()  # CPU from here
                elif window_start:
                    window_rows += len(labels)
            now = time.perf_counter()
            epochs.append((rows - untimed, now - epoch_began))
            if first_epoch is None:
                first_epoch = (rows, total)
        seconds = time.perf_counter() - window_start
        peak, cpu = sampler.mark()
    finally:
        sampler.stop()
        if closing is not None:
            closing.close()
    # Every page once: the processes' PSS without their mappings of the store's files,
    # plus those files (see _bench_memory.Sampler.mark), over the whole run.
    peak_all = max(once(s) for s in sampler.samples) / (1 << 20)
    expected = (spec["records"], spec["records"] * (spec["records"] - 1) // 2)
    later_rows = sum(rows for rows, _ in epochs[1:])
    return {
        "samples_s": window_rows / seconds,
        "epoch1_samples_s": epochs[0][0] / epochs[0][1],
        "later_samples_s": later_rows / sum(s for _, s in epochs[1:]),
        "first_batch_s": first_batch,
        "peak_pss_mib": max(peak_all, peak["once"]),
        "cpu_us_per_sample": 1e6 * sum(cpu.values()) / max(window_rows, 1),
        "first_epoch_exact": first_epoch == expected if first_epoch else None,
        "epochs": len(epochs),
        "peak_parts_mib": sampler.parts_at_peak(),
    }


def write_all(folder: str, dataset: str, records: int, names: list[str]) -> dict[str, str]:
    """The files of every contender in ``names`` for ``dataset``, one folder per format;
    returns name -> folder."""
    from _bench_peers import CONTENDERS, Job

    layout = LAYOUTS[dataset]
    out = {}
    for contender in (c for c in CONTENDERS if c.name in names):
        files = os.path.join(folder, dataset, contender.files)
        if not os.path.isdir(files):
            os.makedirs(files)
            t0 = time.perf_counter()
            contender.write(Job(layout, files, records, BATCH[dataset], 2, 0))
            print(f"  wrote {dataset} for {contender.name} in {time.perf_counter() - t0:.1f} s")
        out[contender.name] = files
    for files in set(out.values()):  # into the page cache, for every contender alike
        for root, _dirs, names in os.walk(files):
            for name in names:
                with open(os.path.join(root, name), "rb") as f:
                    while f.read(1 << 24):
                        pass
    return out


def table(results: dict[str, dict[str, list[dict[str, Any]]]]) -> str:
    from _bench_peers import CONTENDERS

    lines = []
    for dataset, by_name in results.items():
        lines.append(f"\n{dataset} (batch {BATCH[dataset]}), medians of the rounds:")
        lines.append(
            f"  {'contender':30s} {'samples/s':>10s} {'epoch 1':>10s} {'epoch >= 2':>10s} "
            f"{'first batch':>12s} {'peak PSS':>9s} {'CPU/sample':>10s}  first epoch once"
        )
        for name, runs in by_name.items():
            med = {f: statistics.median(r[f] for r in runs) for f in FIELDS}
            exact = {r["first_epoch_exact"] for r in runs}
            lines.append(
                f"  {name:30s} {med['samples_s']:10,.0f} {med['epoch1_samples_s']:10,.0f} "
                f"{med['later_samples_s']:10,.0f} {med['first_batch_s']:10.2f} s "
                f"{med['peak_pss_mib']:6.0f} MiB {med['cpu_us_per_sample']:7.1f} us  "
                f"{'/'.join(str(e) for e in sorted(exact, key=str))}"
            )
        lines.extend(_memory_parts(by_name))
        if all(c.name in by_name for c in CONTENDERS):  # not with --only
            lines.extend(_ratios(by_name))
        lines.extend(_cache_ratios(by_name))
        lines.extend(_task_size_ratios(by_name))
    return "\n".join(lines)


def _memory_parts(by_name: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Where each contender's peak PSS was (medians of the rounds, MiB): the trainer, its
    DataLoader workers, shmloader's readers and their fork server, and the store's files."""
    lines = [f"  peak PSS by part: {'trainer':>8s} {'workers':>8s} {'readers':>8s} {'store':>8s}"]
    for name, runs in by_name.items():
        parts = [r["peak_parts_mib"] for r in runs if "peak_parts_mib" in r]
        if parts:
            med = {k: statistics.median(p[k] for p in parts) for k in parts[0]}
            lines.append(
                f"  {name:30s}   {med['trainer']:8.0f} {med['worker']:8.0f} "
                f"{med['reader']:8.0f} {med['store']:8.0f}"
            )
    return lines


def _median(runs: list[dict[str, Any]], field: str) -> float:
    return statistics.median(r[field] for r in runs)


def _ratios(by_name: dict[str, list[dict[str, Any]]]) -> list[str]:
    from _bench_peers import CONTENDERS

    peers = [c.name for c in CONTENDERS if c.peer or c.name == "torch per sample"]
    best = max(peers, key=lambda n: _median(by_name[n], "samples_s"))
    per_record = _median(by_name["shmloader decode"], "samples_s")
    batch = _median(by_name["shmloader decode_batch"], "samples_s")
    vectorised = max(_median(by_name[n], "samples_s") for n in VECTORISED)
    plain_pss = _median(by_name["torch per sample"], "peak_pss_mib")
    pss = {n: _median(by_name[n], "peak_pss_mib") / plain_pss for n in SHMLOADER}
    return [
        f"  shmloader decode / best of the libraries and torch per sample ({best}): "
        f"{per_record / _median(by_name[best], 'samples_s'):.2f}",
        f"  shmloader decode_batch / the faster torch vectorised: {batch / vectorised:.2f}",
        "  peak PSS / torch per sample: " + ", ".join(f"{n} {r:.2f}" for n, r in pss.items()),
    ]


def _cache_ratios(by_name: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Each ``cache=True`` contender's epochs against the hand-vectorised Dataset without
    workers and against itself without the cache, where the run has them."""
    lines = []
    base = "torch vectorised, no workers"
    for cached in (n for n in CACHED if n in by_name):
        plain = cached.removesuffix(", cache")
        for field, what in (("epoch1_samples_s", "epoch 1"), ("later_samples_s", "epoch >= 2")):
            mine = _median(by_name[cached], field)
            parts = [
                f"/ {other} {mine / _median(by_name[other], field):.2f}"
                for other in (base, plain)
                if other in by_name
            ]
            if parts:
                lines.append(f"  {cached}, {what}: " + ", ".join(parts))
    return lines


def _task_size_ratios(by_name: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Each shmloader contender with tasks sized from the data against itself with the fixed
    4096 records a task of shmloader 0.1, where the run has both."""
    lines = []
    for sized in (*SHMLOADER, CACHED[1]):
        fixed = f"{sized}, tasks of 4096"
        if sized not in by_name or fixed not in by_name:
            continue
        parts = [
            f"{what} {_median(by_name[sized], f) / _median(by_name[fixed], f):.2f}"
            for f, what in (
                ("epoch1_samples_s", "epoch 1"),
                ("later_samples_s", "epochs >= 2"),
                ("first_batch_s", "first batch"),
                ("peak_pss_mib", "peak PSS"),
            )
        ]
        lines.append(f"  {sized}, tasks sized / tasks of 4096: " + ", ".join(parts))
    return lines


def plot(results: dict[str, dict[str, list[dict[str, Any]]]], prefix: str) -> None:
    """One PNG per figure (samples/s, of epoch 1 and of the epochs after it, first batch,
    peak PSS), both datasets side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    titles = {
        "samples_s": "samples/s (higher is better)",
        "epoch1_samples_s": "samples/s, epoch 1 (higher is better)",
        "later_samples_s": "samples/s, epochs after the first (higher is better)",
        "first_batch_s": "first batch, s (lower is better)",
        "peak_pss_mib": "peak summed PSS, MiB (lower is better)",
    }
    for field, title in titles.items():
        # Wide enough for the longest contender names beside each axis.
        fig, axes = plt.subplots(1, len(results), figsize=(7.5 * len(results), 4.5))
        for ax, (dataset, by_name) in zip(axes, results.items(), strict=True):
            names = list(by_name)
            values = [_median(by_name[n], field) for n in names]
            colours = ["tab:orange" if n.startswith("shmloader") else "tab:blue" for n in names]
            ax.barh(names, values, color=colours)
            ax.invert_yaxis()
            ax.set_title(f"{dataset} (batch {BATCH[dataset]})")
        fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(f"{prefix}-{field.replace('_', '-')}.png", dpi=90, bbox_inches="tight")
        plt.close(fig)


def _chosen(only: str, names: list[str]) -> set[str]:
    """The contenders ``--only`` names: names separated by commas, where a name may hold a
    comma itself ("torch vectorised, no workers"): the longest name that fits is taken."""
    pieces = [part.strip() for part in only.split(",")]
    by_length = sorted(([p.strip() for p in n.split(",")] for n in names), key=len, reverse=True)
    chosen: set[str] = set()
    at = 0
    while at < len(pieces):
        found = next((n for n in by_length if pieces[at : at + len(n)] == n), None)
        if found is None:
            raise SystemExit(f"--only: no contender named {pieces[at]!r}; they are {names}")
        chosen.add(", ".join(found))
        at += len(found)
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tabular", type=int, default=204_800)
    parser.add_argument("--images", type=int, default=20_480)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=float, default=3.0)
    parser.add_argument("--only", help="comma-separated contender names")
    parser.add_argument(
        "--shm-budget", help="shmloader's shm_budget (default: SharedTaskDataset's own)"
    )
    parser.add_argument("--plot", help="write PNGs to PREFIX-<figure>.png")
    parser.add_argument("--json", help="write every run's figures here")
    parser.add_argument(
        "--plot-from", help="plot the figures a run wrote with --json (with --plot), run nothing"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    if args.plot_from:
        if not args.plot:
            raise SystemExit("--plot-from needs --plot PREFIX")
        with open(args.plot_from) as f:
            plot(json.load(f), args.plot)
        return
    from _bench_peers import CONTENDERS

    names = [c.name for c in CONTENDERS]
    if args.only:
        chosen = _chosen(args.only, names)
        names = [n for n in names if n in chosen]
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for dataset, records in (("tabular", args.tabular), ("images", args.images)):
            if records % BATCH[dataset]:
                raise SystemExit(f"--{dataset}: a multiple of the batch ({BATCH[dataset]})")
            files = write_all(folder, dataset, records, names)
            results[dataset] = {n: [] for n in names}
            for r in range(args.rounds):
                for name in names:
                    spec = {
                        "dataset": dataset,
                        "name": name,
                        "files": files[name],
                        "records": records,
                        "batch": BATCH[dataset],
                        "seed": r,
                        "window": args.window,
                        "shm_budget": args.shm_budget,
                    }
                    done = run_script_child(__file__, spec)
                    if done.returncode != 0:
                        raise SystemExit(f"{name} on {dataset}:\n{done.stdout}{done.stderr}")
                    run = json.loads(done.stdout.strip().splitlines()[-1])
                    results[dataset][name].append(run)
                    print(f"  {dataset} round {r + 1} {name}: {run['samples_s']:,.0f}/s")
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
