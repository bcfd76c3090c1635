"""Tables of the data-plane benchmark (Markdown, so they go into docs/performance.md as printed)."""

from __future__ import annotations

import os
import platform
from typing import Any

LOADERS = (
    "a",
    "b",
    "b:inproc",
    "c",
    "c:batches",
    "c:inproc",
    "c:inproc:torch",
    "c:inproc:views",
    "d",
    "d:batches",
    "d:inproc",
    "d:inproc:torch",
    "d:inproc:views",
)
NAMES = {
    "a": "(a) torch Dataset, `__getitem__`",
    "b": "(b) torch Dataset, `__getitems__`",
    "b:inproc": "(b) torch Dataset, `__getitems__`, no worker",
    "c": "(c) shmloader, `decode`",
    "c:batches": "(c) shmloader, `decode`, torch's DataLoader given `ds.batch_sampler()`",
    "c:inproc": "(c) shmloader, `decode`, gather in the trainer",
    "c:inproc:torch": "(c) shmloader, `decode`, gather in the trainer, torch's DataLoader",
    "c:inproc:views": "(c) shmloader, `decode`, gather in the trainer, `views=True`",
    "d": "(d) shmloader, `decode_batch`",
    "d:batches": "(d) shmloader, `decode_batch`, torch's DataLoader given `ds.batch_sampler()`",
    "d:inproc": "(d) shmloader, `decode_batch`, gather in the trainer",
    "d:inproc:torch": "(d) shmloader, `decode_batch`, gather in the trainer, torch's DataLoader",
    "d:inproc:views": "(d) shmloader, `decode_batch`, gather in the trainer, `views=True`",
    "e": "(e) `numpy.take`, in memory, 1 core",
    "e:sorted": "(e) `numpy.take`, in memory, 1 core, each batch's indices sorted",
    "gather:Gatherer": "gather alone, `Gatherer.gather`",
    "gather:Gatherer:noledger": "gather alone, `Gatherer.gather`, no ledger (our loader's workers)",
    "gather:gather": "gather alone, `gather()` copy only",
    "gather:warm": "gather alone, `gather()`, segments pre-mapped",
    "d:quarter": "(d) on 1/4 of the data",
}


def machine() -> str:
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import numpy
    import pyarrow
    import torch

    return (
        f"{os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), {model}; "
        f"Python {platform.python_version()}, torch {torch.__version__}, "
        f"numpy {numpy.__version__}, pyarrow {pyarrow.__version__}"
    )


def _rate(result: dict[str, Any]) -> float:
    eps = result["epochs"][1:] or result["epochs"]
    return sum(e["rows"] for e in eps) / sum(e["seconds"] for e in eps)


def _procs(key: str, args: Any) -> str:
    if key == "b:inproc":
        return "1"
    if key in ("a", "b"):
        return f"1 + {args.workers_torch} workers"
    if key in ("c", "d", "d:quarter"):
        return f"1 + {args.readers} reader + {args.workers_shm} worker"
    if key.startswith(("c:inproc", "d:inproc")):
        return f"1 + {args.readers_inproc} readers + 0 workers"
    return "1"


def _ratio(x: float, base: float | None) -> str:
    return f"{x / base:.2f}x" if base else "-"


def report(results: dict[str, dict[str, dict[str, Any]]], args: Any) -> None:
    print(f"\nMachine: {machine()}")
    print("shmloader and the benchmark modules byte-compiled first, as an installed package is")
    print(f"Epochs per contender: {args.epochs} (samples/s over epochs 2..{args.epochs})\n")
    targets: list[str] = []
    for name, res in results.items():
        rates = {k: _rate(v) for k, v in res.items()}
        a, b, e = rates.get("a"), rates.get("b"), rates.get("e")
        b_best = max((rates[k] for k in ("b", "b:inproc") if k in rates), default=None)
        print(f"### {name}: {res[next(iter(res))]['epochs'][0]['rows']:,} records\n")
        print(
            "| contender | processes | samples/s | vs (a) | vs (b) | vs (e) "
            "| first batch | peak PSS | shm files | peak memory, each page once |"
        )
        print("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|")
        for key, r in res.items():
            pss = [ep["pss"] for ep in r["epochs"] if "pss" in ep]
            peak = f"{max(p['total'] for p in pss):,.0f} MiB" if pss else "-"
            shm = f"{max(p['shm_files'] for p in pss):,.0f} MiB" if pss else "-"
            once = f"{max(p['once'] for p in pss):,.0f} MiB" if pss else "-"
            ttfb = f"{r['ttfb']:.2f} s" if "ttfb" in r else "-"
            print(
                f"| {NAMES[key]} | {_procs(key, args)} | {rates[key]:,.0f} "
                f"| {_ratio(rates[key], a)} | {_ratio(rates[key], b)} | {_ratio(rates[key], e)} "
                f"| {ttfb} | {peak} | {shm} | {once} |"
            )
        print()
        _rounds_table(res)
        _memory_table(res)
        _cpu_table(res)
        _targets(name, rates, res, a, b_best, e, targets)
    print("Targets:")
    for line in targets:
        print(f"- {line}")


def _rounds_table(res: dict[str, dict[str, Any]]) -> None:
    """Every round's samples/s when contenders ran more than once (the tables show medians)."""
    if all(len(r.get("rounds", ())) < 2 for r in res.values()):
        return
    print("Samples/s of each round (the tables above and below show the median round's):\n")
    print("| contender | rounds | spread |")
    print("|---|--:|--:|")
    for key, r in res.items():
        got = r.get("rounds", [])
        if got:
            cells = ", ".join(f"{x:,.0f}" for x in got)
            print(f"| {NAMES[key]} | {cells} | {max(got) / min(got):.2f}x |")
    print()


def _memory_table(res: dict[str, dict[str, Any]]) -> None:
    print("Peak PSS per epoch, MiB (trainer / workers / readers = total; shm files):\n")
    print(
        "| contender | "
        + " | ".join(f"epoch {i + 1}" for i in range(max(len(r["epochs"]) for r in res.values())))
        + " |"
    )
    print("|---|" + "--:|" * max(len(r["epochs"]) for r in res.values()))
    for key, r in res.items():
        if key not in (*LOADERS, "d:quarter"):
            continue
        cells = []
        for ep in r["epochs"]:
            p = ep["pss"]
            cells.append(
                f"{p['trainer']:.0f} / {p['worker']:.0f} / {p['reader']:.0f} = {p['total']:.0f}"
                f"; {p['shm_files']:.0f}"
            )
        print(f"| {NAMES[key]} | " + " | ".join(cells) + " |")
    print()


def _cpu_table(res: dict[str, dict[str, Any]]) -> None:
    """CPU time per delivered sample, all processes: the cost of a sample, whatever the speed."""
    print(
        "CPU time per sample over epochs 2 on, µs (trainer / workers / readers = total; the "
        "trainer's includes the 0.5 s memory sampler):\n"
    )
    print("| contender | CPU µs per sample |")
    print("|---|--:|")
    for key, r in res.items():
        eps = [ep for ep in r["epochs"][1:] if "cpu" in ep]
        if key not in (*LOADERS, "d:quarter") or not eps:
            continue
        rows = sum(ep["rows"] for ep in eps)
        per = {
            role: sum(ep["cpu"][role] for ep in eps) / rows * 1e6
            for role in ("trainer", "worker", "reader")
        }
        print(
            f"| {NAMES[key]} | {per['trainer']:.2f} / {per['worker']:.2f} / {per['reader']:.2f}"
            f" = {sum(per.values()):.2f} |"
        )
    print()


def _targets(
    name: str,
    rates: dict[str, float],
    res: dict[str, dict[str, Any]],
    a: float | None,
    b: float | None,
    e: float | None,
    out: list[str],
) -> None:
    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    def best(key: str) -> tuple[float, str] | None:
        # Either split of the same process count is a fair (c) / (d), with the same decode
        # function and any public option (``views=True``); report the best.
        keys = (key, f"{key}:inproc", f"{key}:inproc:torch", f"{key}:inproc:views")
        found = [(rates[k], k) for k in keys if k in rates]
        return max(found) if found else None

    c, d = best("c"), best("d")
    if a and c:
        x = c[0] / a
        out.append(f"{name}: (c) >= 3x (a): {x:.2f}x ({NAMES[c[1]]}), {verdict(x >= 3)}")
    if b and d:
        x = d[0] / b
        out.append(
            f"{name}: (d) >= (b) at its best (either split): {x:.2f}x ({NAMES[d[1]]}), "
            f"{verdict(x >= 1)}"
        )
    # The gather reads each batch's rows sorted, so it is held to the faster of the two
    # ceilings: the plain shuffled take and the same take with each batch sorted.
    ceiling = max((rates[k], k) for k in ("e", "e:sorted") if k in rates) if e else None
    for key in ("gather:Gatherer", "gather:Gatherer:noledger", "gather:gather", "gather:warm"):
        if ceiling and key in rates:
            x = rates[key] / ceiling[0]
            out.append(
                f"{name}: {NAMES[key]} >= 50% of (e): {x:.0%} of {NAMES[ceiling[1]]}, "
                f"{verdict(x >= 0.5)}"
            )
    for key in LOADERS[3:]:  # the shmloader contenders
        if key in res:
            t = res[key]["ttfb"]
            out.append(f"{name}: {NAMES[key]} first batch < 1 s: {t:.2f} s, {verdict(t < 1)}")
            if res[key].get("readers_import_torch"):
                out.append(f"{name}: {NAMES[key]}: readers imported torch (decode not importable?)")
