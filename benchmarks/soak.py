"""Fault-injection soak: elastic trainers that come and go, a journaled standalone master,
random SIGKILLs.

Run by hand (not a test): ``python benchmarks/soak.py [--rounds R] [--seed S] [--cache]``
(``--cache``: every trainer's dataset keeps decoded tasks across epochs, ``cache=True``).

Each round writes a dataset of ``--records`` records (ids 0..N-1) in ``--files`` record files,
starts ``shmloader master --journal`` (``--epochs`` epochs, short lease and consumer timeouts)
and ``--trainers`` elastic trainers (``benchmarks/_soak_trainer.py``: shmloader.DataLoader, or
with ``--loader batch_sampler`` a plain torch DataLoader given ``ds.batch_sampler(...)``; with
``--workers`` DataLoader workers; a state saved every few batches). Then, at random intervals
drawn from ``random.Random(seed + round)``, one of these happens:

- ``reader``: SIGKILL of a reader of a random trainer (the trainer's pool starts another);
- ``trainer``: SIGKILL of a trainer right after it saved its state (it is told to stop there),
  restarted at once from that state: well within ``consumer_timeout``, while the master
  still counts it alive;
- ``late``: the same, restarted only after ``consumer_timeout`` and more: the master declared
  it dead, its leases lapsed and the other trainers took its tasks over meanwhile;
- ``master``: SIGKILL of the master, restarted on the same port from its journal (after up to
  ``--master-down`` seconds down; the trainers' clients retry meanwhile);
- ``join``: a new trainer joins the job (up to ``--max-trainers`` at once);
- ``leave``: a trainer leaves the job after its next batch, closing mid-epoch (one at least
  stays).

``--kills reader=3,trainer=2,late=1,master=1,join=1,leave=1`` (the default) weighs them;
``--kills master=1`` kills only the master, with every trainer alive all along.

A round ends when every trainer has exited 0 (or fails after ``--round-timeout``: a hang).
What a killed trainer delivered counts up to its last save (its later steps died with it);
over the round every id must then come exactly ``--epochs`` times. The report gives rounds,
kills of each kind, records lost and duplicated (silently: in rounds where every trainer
exited 0), hung rounds, rounds where a trainer's loop raised (with the exception classes: a
loud failure, whose round is not counted as lost), tasks trainers warned may come twice (a
lease that lapsed while its trainer stalled, handed to another), and shared memory left. A
round that went wrong keeps its folder (logs, states, journal) and prints its path.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

import shmloader
from shmloader.shm.reap import reap_stale

HERE = Path(__file__).resolve().parent
CONSUMER_TIMEOUT = 5.0  # the master's; a "late" restart comes after it
# What happens at each event: a kill (reader, trainer restarted at once, trainer restarted
# after the master declared it dead, master), or a trainer that joins or leaves the job.
KINDS = ("reader", "trainer", "late", "master", "join", "leave")
TRAINER = HERE / "_soak_trainer.py"


@dataclass
class Totals:
    rounds: int = 0
    kills: Counter[str] = field(default_factory=Counter)
    deliveries: int = 0
    lost: int = 0
    duplicated: int = 0
    hung: int = 0
    warned: int = 0  # tasks trainers warned may come twice (a lapsed lease, regranted)
    failed: int = 0  # rounds where a trainer's loop raised (loud: not counted as lost)
    errors: Counter[str] = field(default_factory=Counter)  # what they raised, by class
    shm_left: int = 0
    from_cache: int = 0  # --cache: tasks served from the cache by trainers that finished
    seconds: float = 0.0


class Master:
    """``shmloader master`` in a process of its own, restarted on its port and journal."""

    def __init__(self, args: argparse.Namespace, data: Path, journal: Path) -> None:
        self.argv = [
            sys.executable,
            "-m",
            "shmloader",
            "master",
            str(data / "*.tfrecord"),
            "--records-per-task",
            str(args.records_per_task),
            "--epochs",
            str(args.epochs),
            "--journal",
            str(journal),
            "--lease-timeout",
            "2",
            "--consumer-timeout",
            str(CONSUMER_TIMEOUT),
            # A lease that lapses counts as a failed try of its task (a task that kills its
            # reader must end quarantined). Trainers die here far more often than in any job,
            # and a restart slower than the lease timeout lets their readers' leases lapse:
            # with the default 3 tries a task leased by four killed trainers was quarantined.
            "--max-retries",
            str(args.max_retries),
        ]
        self.port = 0
        self.proc = self._start()

    def _start(self) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [*self.argv, "--port", str(self.port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            found = re.search(r"listening on (\S+):(\d+)", line)
            if found:
                self.port = int(found.group(2))
                return proc
        raise RuntimeError(f"the master exited with {proc.wait()} before listening")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def kill_and_restart(self, down: float = 0.0) -> None:
        """SIGKILL, stay down ``down`` seconds (clients retry meanwhile), start again."""
        self.proc.kill()
        self.proc.wait()
        time.sleep(down)
        self.proc = self._start()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Trainer:
    """One trainer slot: its incarnations, what each delivered, restarts from its state."""

    def __init__(self, args: argparse.Namespace, work: Path, index: int, master: str) -> None:
        self.work = work
        self.index = index
        self.arm = work / f"arm-{index}"
        self.leave_file = work / f"leave-{index}"
        self.restart_at: float | None = None  # killed, restarted from its state at this time
        self.leaving = False  # told to leave the job: never killed, never restarted
        self.config = {
            "data": str(work / "data"),
            "master": master,
            "readers": args.readers,
            "shm_dir": str(work / "shm"),
            "batch_size": args.batch_size,
            "loader": args.loader,
            "workers": args.workers,
            "cache": args.cache,
            "save_every": args.save_every,
            "step_seconds": args.step_seconds,
            "state": str(work / f"state-{index}.json"),
            "arm": str(self.arm),
            "leave": str(self.leave_file),
        }
        self.counted: list[int] = []  # deliveries that count: finished or up to a save
        self.incarnation = 0
        self._start()

    def _start(self) -> None:
        self.incarnation += 1
        self.out = self.work / f"trainer-{self.index}-{self.incarnation}.jsonl"
        config = self.work / f"trainer-{self.index}-{self.incarnation}.json"
        config.write_text(json.dumps({**self.config, "out": str(self.out)}))
        log = open(self.work / f"trainer-{self.index}-{self.incarnation}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, str(TRAINER), str(config)], stdout=log, stderr=log
        )
        log.close()

    def lines(self) -> list[dict[str, Any]]:
        if not self.out.exists():
            return []
        return [json.loads(x) for x in self.out.read_text().splitlines() if x.endswith("}")]

    def readers(self) -> list[int]:
        try:
            children = psutil.Process(self.proc.pid).children()
        except psutil.NoSuchProcess:
            return []
        return [c.pid for c in children if "shmloader.reader" in " ".join(_cmdline(c))]

    @property
    def running(self) -> bool:
        """Its process runs, or it was killed and waits to be started again."""
        return self.proc.poll() is None or self.restart_at is not None

    def restart_if_due(self, now: float) -> None:
        if self.restart_at is not None and now >= self.restart_at:
            self.restart_at = None
            self._start()

    def leave(self) -> None:
        """Leave the job after its next batch (it closes mid-epoch, handing back)."""
        self.leaving = True
        self.leave_file.touch()

    def kill_after_save(self, timeout: float = 10.0, restart_in: float = 0.0) -> bool:
        """SIGKILL right after its next save, and start it again from that state, at once or
        ``restart_in`` seconds later; False if it saved no more in ``timeout`` (its epochs
        are ending)."""
        self.arm.touch()
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline and self.proc.poll() is None:
                if any("armed" in line for line in self.lines()):
                    break
                time.sleep(0.02)
            else:
                return False
        finally:
            self.arm.unlink()
        self.proc.kill()
        self.proc.wait()
        self._count(killed=True)
        if restart_in > 0:
            self.restart_at = time.monotonic() + restart_in
        else:
            self._start()
        return True

    def _count(self, *, killed: bool) -> None:
        counted: list[int] = []
        pending: list[int] = []
        for line in self.lines():
            if "ids" in line:
                pending += line["ids"]
            elif "saved" in line or "done" in line:
                counted, pending = counted + pending, []
        self.counted += counted if killed else counted + pending

    def errors(self) -> list[str]:
        """The exception classes that ended its incarnations (last line of each log)."""
        out = []
        for log in self.work.glob(f"trainer-{self.index}-*.log"):
            lines = log.read_text(errors="replace").strip().splitlines()
            if lines and re.match(r"[\w.]+(Error|Exception)\b", lines[-1]):
                out.append(lines[-1].split(":", 1)[0].rsplit(".", 1)[-1])
        return out

    def warned_twice(self) -> int:
        """Tasks its incarnations warned may reach training twice (a lease of theirs lapsed
        while stalled and went to another trainer): duplicates said, not silent."""
        return sum(
            log.read_text(errors="replace").count("may reach training twice")
            for log in self.work.glob(f"trainer-{self.index}-*.log")
        )

    def from_cache(self) -> int:
        """Tasks its incarnations that finished served from the cache (``--cache``)."""
        return sum(
            json.loads(line).get("from_cache", 0)
            for out in self.work.glob(f"trainer-{self.index}-*.jsonl")
            for line in out.read_text().splitlines()
            if '"done"' in line
        )

    def finish(self) -> None:
        self._count(killed=False)


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


@contextlib.contextmanager
def _workdir(keep: bool) -> Iterator[Path]:
    """A round's folder (data, journal, states, logs), removed afterwards unless ``keep``, or
    the round went wrong (a file ``KEEP`` in it): then its logs show what happened."""
    path = Path(tempfile.mkdtemp(prefix="shmloader-soak-"))
    try:
        yield path
    finally:
        if not keep and not (path / "KEEP").exists():
            shutil.rmtree(path, ignore_errors=True)


def one_round(args: argparse.Namespace, index: int, totals: Totals) -> None:
    rng = random.Random(args.seed + index)
    with _workdir(args.keep) as work:
        data = work / "data"
        data.mkdir()
        (work / "shm").mkdir()
        per_file = -(-args.records // args.files)
        for f in range(args.files):
            ids = range(f * per_file, min(args.records, (f + 1) * per_file))
            shmloader.write_records(
                data / f"part-{f:03d}.tfrecord", (i.to_bytes(8, "little") for i in ids)
            )
        master = Master(args, data, work / "journal")
        trainers = [Trainer(args, work, i, master.address) for i in range(args.trainers)]
        began = time.monotonic()
        hung = False
        try:
            while any(t.running for t in trainers):
                if time.monotonic() - began > args.round_timeout:
                    hung = True
                    break
                time.sleep(rng.uniform(0.5, 2.0))
                for t in trainers:
                    t.restart_if_due(time.monotonic())
                live = [t for t in trainers if t.proc.poll() is None and not t.leaving]
                if not live:
                    continue  # killed ones wait to be restarted, leaving ones finish
                kind = rng.choices(KINDS, weights=[args.kills.get(k, 0) for k in KINDS])[0]
                if kind == "reader":
                    pids = rng.choice(live).readers()
                    if pids:
                        os.kill(rng.choice(pids), signal.SIGKILL)
                        totals.kills["reader"] += 1
                elif kind in ("trainer", "late"):
                    # "late": restarted once the master declared it dead (consumer_timeout
                    # passed) and its leases lapsed: others took its tasks meanwhile.
                    later = CONSUMER_TIMEOUT + 2.0 if kind == "late" else 0.0
                    if rng.choice(live).kill_after_save(restart_in=later):
                        totals.kills[kind] += 1
                elif kind == "master":
                    master.kill_and_restart(rng.uniform(0.0, args.master_down))
                    totals.kills["master"] += 1
                elif kind == "join":
                    staying = [t for t in trainers if t.running and not t.leaving]
                    if len(staying) < args.max_trainers:
                        trainers.append(Trainer(args, work, len(trainers), master.address))
                        totals.kills["join"] += 1
                elif len([t for t in trainers if t.running and not t.leaving]) > 1:
                    # "leave": one trainer at least stays for the rest (restarts count)
                    rng.choice(live).leave()
                    totals.kills["leave"] += 1
        finally:
            for t in trainers:
                t.restart_at = None
                if t.proc.poll() is None:
                    t.proc.kill()
                    hung = True
                t.proc.wait()
                t.finish()
            master.stop()
        failed = [t.index for t in trainers if t.proc.returncode != 0]
        errors = sorted({e for t in trainers for e in t.errors()})
        delivered = Counter(i for t in trainers for i in t.counted)
        want = args.epochs
        lost = sum(max(0, want - delivered[i]) for i in range(args.records))
        duplicated = sum(max(0, n - want) for n in delivered.values())
        warned = sum(t.warned_twice() for t in trainers)
        totals.warned += warned
        totals.from_cache += sum(t.from_cache() for t in trainers)
        if failed:  # a loud failure: the loop raised (and its trainer handed nothing over)
            totals.failed += 1
            totals.errors.update(errors)
            lost = duplicated = 0
        time.sleep(1.0)  # readers of killed trainers follow them
        reap_stale(work / "shm")
        left = len(os.listdir(work / "shm"))
        wrong = bool(lost or duplicated or hung or failed or left)
        if wrong:
            (work / "KEEP").touch()
        totals.rounds += 1
        totals.deliveries += sum(delivered.values())
        totals.lost += lost
        totals.duplicated += duplicated
        totals.hung += hung
        totals.shm_left += left
        print(
            f"round {index}{f' ({work})' if args.keep or wrong else ''}: "
            f"{time.monotonic() - began:.0f} s, kills {dict(totals.kills)} so far, "
            f"lost {lost}, duplicated {duplicated} (tasks warned of: {warned}), hung {hung}, "
            f"failed trainers {failed} "
            f"{errors}, shm left {left}",
            flush=True,
        )


def _weights(text: str) -> dict[str, float]:
    """``reader=3,master=1`` as weights by kind; a kind left out is never killed."""
    weights: dict[str, float] = {}
    for part in text.split(","):
        kind, _, weight = part.partition("=")
        if kind not in KINDS or not weight:
            raise argparse.ArgumentTypeError(f"{part!r}: give KIND=WEIGHT, KIND one of {KINDS}")
        weights[kind] = float(weight)
    if not any(weights.values()):
        raise argparse.ArgumentTypeError("give at least one kind a weight above 0")
    return weights


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--records", type=int, default=3000)
    p.add_argument("--files", type=int, default=3)
    p.add_argument("--records-per-task", type=int, default=100)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--trainers", type=int, default=2, help="trainers at the start")
    p.add_argument("--max-trainers", type=int, default=4, help="at most, with joins")
    p.add_argument("--readers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument(
        "--loader",
        choices=("shmloader", "batch_sampler"),
        default="shmloader",
        help="shmloader.DataLoader, or a plain torch DataLoader given ds.batch_sampler(...)",
    )
    p.add_argument("--workers", type=int, default=0, help="each trainer's DataLoader workers")
    p.add_argument(
        "--cache", action="store_true", help="SharedTaskDataset(cache=True) in every trainer"
    )
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--step-seconds", type=float, default=0.01, help="sleep per batch")
    p.add_argument("--round-timeout", type=float, default=300.0)
    p.add_argument("--max-retries", type=int, default=10, help="the master's")
    p.add_argument(
        "--kills",
        type=_weights,
        default=_weights("reader=3,trainer=2,late=1,master=1,join=1,leave=1"),
        help="what happens at each event, with weights (the default: "
        "reader=3,trainer=2,late=1,master=1,join=1,leave=1)",
    )
    p.add_argument(
        "--master-down",
        type=float,
        default=0.0,
        help="a killed master stays down a random time up to this many seconds",
    )
    p.add_argument("--first-round", type=int, default=0, help="rounds are seeded seed + round")
    p.add_argument("--keep", action="store_true", help="keep each round's files (logs, states)")
    args = p.parse_args()
    totals = Totals()
    began = time.monotonic()
    for r in range(args.first_round, args.first_round + args.rounds):
        one_round(args, r, totals)
    totals.seconds = time.monotonic() - began
    print(
        json.dumps(
            {
                "rounds": totals.rounds,
                "kills": dict(totals.kills),
                "deliveries": totals.deliveries,
                "lost": totals.lost,
                "duplicated": totals.duplicated,
                "hung_rounds": totals.hung,
                "warned_twice_tasks": totals.warned,
                "tasks_from_cache": totals.from_cache,
                "failed_rounds": totals.failed,
                "errors": dict(totals.errors),
                "shm_entries_left": totals.shm_left,
                "seconds": round(totals.seconds),
                "seed": args.seed,
            }
        )
    )


if __name__ == "__main__":
    main()
