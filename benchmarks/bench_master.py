"""The master's costs: RPC round trips, a million tasks in memory, and the journal's price.

Run by hand (not a test): ``python benchmarks/bench_master.py [--seconds S] [--tasks N]``.

1. lease + complete round trips per second over loopback gRPC, with 1 and 8 client processes
   (each asks ``lease(max_tasks=1)`` then ``complete``, in a loop, for ``--seconds``); the
   master runs in this process. Processes share the machine's cores with the master, so
   with few cores the 8-client figure measures contention as much as the master.
2. ``--tasks`` (default 1,000,000) tasks planned and dispatched in-process, straight on the
   Dispatcher (no network): time to build it, to lease and complete every task in batches of
   1000, and the process's peak RSS (VmHWM) before and after, in a fresh process.
3. The same lease + complete loop in-process, without a journal and with the journal (in
   ``--journal-dir``, default: the current directory) under each fsync policy ("always"
   pays one fsync per request, so it runs a tenth of the operations).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import tempfile
import time
from collections.abc import Callable
from typing import Any

from shmloader.master import Dispatcher, JobConfig, Journal, Master, MasterClient
from shmloader.master.service import MasterService
from shmloader.sources.base import Shard


def _rss_mib() -> float:
    """Peak RSS of this process. VmHWM belongs to the address space, so unlike ru_maxrss it
    does not inherit the parent's peak through fork + exec."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux units: kB


def _client_loop(address: str, name: str, seconds: float, out: Any) -> None:
    with MasterClient(address, timeout=10, retry_for=10) as c:
        c.register(name)
        for _ in range(50):  # warm up the channel
            (x,) = c.lease(name, 1).leases
            c.complete(x.lease_id)
        n = 0
        stop = time.perf_counter() + seconds
        while time.perf_counter() < stop:
            (x,) = c.lease(name, 1).leases
            c.complete(x.lease_id)
            n += 1
        out.put(n)


def bench_rpc(clients: int, seconds: float) -> float:
    plan = [Shard(f"s{i}", 100_000) for i in range(10)]  # 1,000,000 one-record tasks
    ctx = mp.get_context("spawn")
    with Master(plan, records_per_task=1, epochs=None, shuffle=True) as m:
        out = ctx.Queue()
        procs = [
            ctx.Process(target=_client_loop, args=(m.address, f"c{i}", seconds, out))
            for i in range(clients)
        ]
        for p in procs:
            p.start()
        total = sum(out.get(timeout=seconds + 120) for _ in procs)
        for p in procs:
            p.join()
    return total / seconds


def _million(tasks: int, out: Any) -> None:
    base = _rss_mib()
    shards = 1000
    plan = [Shard(f"/data/part-{i:05d}.tfrecord", tasks // shards * 10) for i in range(shards)]
    t0 = time.perf_counter()
    d = Dispatcher(plan, JobConfig(records_per_task=10, epochs=1))
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    shape = MasterService(d).shape(0)  # what EpochInfo computes for an epoch
    shaped = time.perf_counter() - t0
    d.register("c", 0.0)
    t0 = time.perf_counter()
    now = 1.0
    while leases := d.lease("c", 1000, now):
        for lease in leases:
            d.complete(lease.lease_id, now)
        now += 0.001
    dispatched = time.perf_counter() - t0
    assert d.finished and shape.bounds[-1] == len(d.table) == tasks
    out.put((len(d.table), built, shaped, dispatched, _rss_mib() - base, _rss_mib()))


def bench_million(tasks: int) -> tuple[int, float, float, float, float, float]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=_million, args=(tasks, out))
    p.start()
    result: tuple[int, float, float, float, float, float] = out.get(timeout=600)
    p.join()
    return result


def _loop(d: Dispatcher, n: int) -> float:
    d.register("c", time.time())
    t0 = time.perf_counter()
    for _ in range(n):
        (lease,) = d.lease("c", 1, time.time())
        d.complete(lease.lease_id, time.time())
    return n / (time.perf_counter() - t0)


def bench_journal(n: int, where: str) -> dict[str, float]:
    plan = [Shard("s", 1_000_000)]
    config = JobConfig(records_per_task=1, epochs=None)
    rates = {"no journal": _loop(Dispatcher(plan, config), n)}
    for policy in ("never", "batch", "always"):
        count = n if policy != "always" else max(n // 10, 100)
        with tempfile.TemporaryDirectory(prefix="shmloader-bench-journal-", dir=where) as tmp:
            journal = Journal.open(tmp, plan, config, time.time(), fsync=policy)
            try:
                rates[f"fsync={policy}"] = _loop(journal.dispatcher, count)
            finally:
                journal.close()
    return rates


def _timed(label: str, fn: Callable[[], Any]) -> Any:
    print(f"-- {label}", flush=True)
    return fn()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per RPC measurement")
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--journal-ops", type=int, default=20_000)
    parser.add_argument(
        "--journal-dir", default=".", help="where the journal goes (a real disk, not tmpfs)"
    )
    args = parser.parse_args()
    print(f"cpus: {os.cpu_count()}, pid {os.getpid()}")
    for clients in (1, 8):
        print(f"-- {clients} client process(es)", flush=True)
        rate = bench_rpc(clients, args.seconds)
        print(f"  lease+complete round trips: {rate:,.0f}/s ({2 * rate:,.0f} RPC/s)")
    n, built, shaped, dispatched, rss, peak = _timed(
        f"{args.tasks:,} tasks in-process", lambda: bench_million(args.tasks)
    )
    print(f"  plan -> Dispatcher: {built:.2f}s; epoch schedule shape: {shaped:.2f}s")
    print(f"  lease+complete all {n:,} (batches of 1000): {dispatched:.2f}s")
    print(f"  peak RSS: {peak:.0f} MiB ({peak - rss:.0f} MiB after imports, +{rss:.0f} MiB)")
    rates = _timed(
        "journal overhead (in-process lease+complete)",
        lambda: bench_journal(args.journal_ops, args.journal_dir),
    )
    for name, rate in rates.items():
        print(f"  {name:>14}: {rate:,.0f} lease+complete/s")


if __name__ == "__main__":
    main()
