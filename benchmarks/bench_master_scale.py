"""One master against many consumers: round trips, latency, CPU, memory and journal growth.

Run by hand (not a test): ``python benchmarks/bench_master_scale.py [--consumers 64,256]
[--seconds S] [--processes P] [--journal-dir DIR] [--fsync POLICY] [--lease-ahead N]``.

The master runs alone in a process of its own (``Master`` over a plan of ``--tasks`` tasks of
4,096 records, unbounded epochs, journaled with ``fsync="batch"`` in ``--journal-dir``, default
the current directory: a real disk). ``--processes`` load processes (default 4) simulate the
consumers between them, a thread each, doing what a trainer and its readers do, over gRPC on
loopback: the consumer registers and heartbeats (``start_heartbeat``, every quarter of the
consumer timeout); each of its 4 readers leases ``--lease-ahead`` tasks (default 4) in one
call (as readers ask, ``lease_ahead``); then the trainer completes them all in one
``complete_many`` (as its outbox does). Every call is timed. ``--fsync`` sets the journal's
policy.

Figures, over ``--seconds`` after a warm-up: tasks leased and completed per second (each task
one lease + one completion, batched as above), RPCs per second, p50/p99 latency per kind of
call, the master's CPU (share of one core, and tasks per second per master core: what it
would serve given a core of its own), the master's memory (RSS) with the consumers
registered, per consumer (growth over the idle master) and per task of the plan (growth from
planning and starting it), and the journal: the most its directory held at once (the SQLite
database and its write-ahead log, which compaction bounds) and its size at the end. The load
processes share the machine's cores with the master: on a small machine the rate is bounded
by the load as much as by the master, which is why the per-core figure is given too.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import tempfile
import threading
import time
from typing import Any

import psutil

from shmloader.master import Master, MasterClient
from shmloader.sources.base import Shard

READERS = 4  # per consumer
RECORDS_PER_TASK = 4096
CONSUMER_TIMEOUT = 60.0


def _serve(tasks: int, journal: str, fsync: str, ready: Any, stop: Any) -> None:
    before = psutil.Process().memory_info().rss  # imports done, no plan yet
    shards = max(tasks // 100, 1)
    plan = [Shard(f"/data/part-{i:05d}.tfrecord", 100 * RECORDS_PER_TASK) for i in range(shards)]
    with Master(
        plan,
        records_per_task=RECORDS_PER_TASK,
        epochs=None,
        journal=journal,
        fsync=fsync,
        lease_timeout=120.0,
        consumer_timeout=CONSUMER_TIMEOUT,
    ) as master:
        ready.put((master.address, psutil.Process().memory_info().rss - before))
        stop.wait()


def _consumer(
    address: str, name: str, ahead: int, until: float, warm: float, out: list[Any]
) -> None:
    lease_s: list[float] = []
    complete_s: list[float] = []
    tasks = 0
    with MasterClient(address, timeout=30, retry_for=30) as client:
        client.register(name)
        client.start_heartbeat(name, interval=CONSUMER_TIMEOUT / 4)
        while (now := time.perf_counter()) < until:
            counted = now >= warm
            ids = []
            for _ in range(READERS):
                t0 = time.perf_counter()
                reply = client.lease(name, ahead)
                if counted:
                    lease_s.append(time.perf_counter() - t0)
                ids += [x.lease_id for x in reply.leases]
            t0 = time.perf_counter()
            problems = client.complete_many(ids)
            if counted:
                complete_s.append(time.perf_counter() - t0)
                tasks += len(ids) - len(problems)
    out.append((tasks, lease_s, complete_s))


def _load(address: str, names: list[str], args: argparse.Namespace, start: float, q: Any):
    out: list[Any] = []
    until = start + args.warmup + args.seconds
    threads = [
        threading.Thread(
            target=_consumer, args=(address, n, args.lease_ahead, until, start + args.warmup, out)
        )
        for n in names
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    q.put(out)


class JournalWatch:
    """The size of the master's journal directory, looked at every 20 ms from a thread: the
    most it held at once (the SQLite database and its write-ahead log; compaction bounds it:
    the journal does not grow with epochs) and what it holds at the end."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.most = self.last = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> JournalWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._look()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self._look()

    def _look(self) -> None:
        total = 0
        for name in os.listdir(self.directory):
            try:
                total += os.path.getsize(os.path.join(self.directory, name))
            except FileNotFoundError:  # gone meanwhile (the log at a close)
                continue
        self.most = max(self.most, total)
        self.last = total


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def run(consumers: int, args: argparse.Namespace) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    os.makedirs(args.journal_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="shmloader-scale-", dir=args.journal_dir) as tmp:
        journal = os.path.join(tmp, "journal")
        ready, stop = ctx.Queue(), ctx.Event()
        server = ctx.Process(target=_serve, args=(args.tasks, journal, args.fsync, ready, stop))
        server.start()
        address, plan_bytes = ready.get(timeout=120)
        master = psutil.Process(server.pid)
        rss_idle = master.memory_info().rss
        q = ctx.Queue()
        names = [f"consumer-{i}" for i in range(consumers)]
        start = time.perf_counter() + 2.0  # every process started and importing by then
        loads = [
            ctx.Process(
                target=_load,
                args=(address, names[p :: args.processes], args, start, q),
            )
            for p in range(args.processes)
        ]
        for p in loads:
            p.start()
        time.sleep(max(start + args.warmup - time.perf_counter(), 0))
        watch = JournalWatch(journal).start()
        cpu0, wall0 = sum(master.cpu_times()[:2]), time.time()
        time.sleep(args.seconds)
        cpu1, wall1 = sum(master.cpu_times()[:2]), time.time()
        watch.stop()
        rss = master.memory_info().rss
        results = [r for _ in loads for r in q.get(timeout=args.seconds + 300)]
        for p in loads:
            p.join()
        stop.set()
        server.join()
    tasks = sum(r[0] for r in results)
    lease_s = [x for r in results for x in r[1]]
    complete_s = [x for r in results for x in r[2]]
    rate = tasks / args.seconds
    cpu_share = (cpu1 - cpu0) / (wall1 - wall0)
    return {
        "tasks_s": rate,
        "records_s": rate * RECORDS_PER_TASK,
        "rpc_s": (len(lease_s) + len(complete_s)) / args.seconds,
        "lease_p50_ms": 1e3 * _pct(lease_s, 50),
        "lease_p99_ms": 1e3 * _pct(lease_s, 99),
        "complete_p50_ms": 1e3 * _pct(complete_s, 50),
        "complete_p99_ms": 1e3 * _pct(complete_s, 99),
        "master_cpu": cpu_share,
        "tasks_s_per_master_core": rate / cpu_share if cpu_share else 0.0,
        "rss_mib": rss / 2**20,
        "rss_per_consumer_kib": (rss - rss_idle) / consumers / 1024,
        "rss_per_task_b": plan_bytes / args.tasks,
        "journal_most_mib": watch.most / 2**20,
        "journal_end_mib": watch.last / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--consumers", default="64,256", help="comma-separated counts")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--processes", type=int, default=4, help="load processes")
    parser.add_argument("--tasks", type=int, default=10_000, help="tasks per epoch")
    parser.add_argument("--journal-dir", default=".", help="a real disk, not tmpfs")
    parser.add_argument("--fsync", default="batch", choices=["always", "batch", "never"])
    parser.add_argument("--lease-ahead", type=int, default=4, help="tasks per lease call")
    args = parser.parse_args()
    print(
        f"cpus: {os.cpu_count()}; {args.processes} load processes; {args.tasks:,} tasks/epoch; "
        f"fsync={args.fsync}; {args.lease_ahead} tasks per lease call"
    )
    for consumers in (int(c) for c in args.consumers.split(",")):
        r = run(consumers, args)
        print(
            f"-- {consumers} consumers x {READERS} readers\n"
            f"  {r['tasks_s']:,.0f} tasks/s ({r['records_s'] / 1e6:,.1f}M records/s at "
            f"{RECORDS_PER_TASK} per task), {r['rpc_s']:,.0f} RPC/s\n"
            f"  lease p50 {r['lease_p50_ms']:.1f} ms, p99 {r['lease_p99_ms']:.1f} ms; "
            f"complete_many p50 {r['complete_p50_ms']:.1f} ms, p99 {r['complete_p99_ms']:.1f} ms\n"
            f"  master CPU {r['master_cpu']:.0%} of a core: "
            f"{r['tasks_s_per_master_core']:,.0f} tasks/s per master core\n"
            f"  master RSS {r['rss_mib']:.0f} MiB: {r['rss_per_consumer_kib']:.0f} KiB per "
            f"consumer, {r['rss_per_task_b']:,.0f} B per task of the plan\n"
            f"  journal: the directory at most {r['journal_most_mib']:.1f} MiB, "
            f"{r['journal_end_mib']:.1f} MiB at the end",
            flush=True,
        )


if __name__ == "__main__":
    main()
