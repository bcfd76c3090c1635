"""A trainer that stalls past the lease timeout (SIGSTOP) while another shares its epoch.

Real processes, a real master over gRPC, real files. A stall shorter than the master's
``consumer_timeout``: the tasks the stalled trainer had in hand stay its own (the master holds a
taken lease for ``consumer_timeout`` after its last renewal), the ones it had not taken go to
the other trainer and the stalled one drops its copies, so every row comes exactly once. A stall
longer than ``consumer_timeout``: the master declares the trainer dead and hands its tasks to
the other trainer; once it goes on it delivers the rows of the tasks its sampler had taken too.
Those rows come twice: it must say so (a warning per task naming the other trainer) and count
them in ``stats()``, exactly.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
from _dataset_helpers import subprocess_env, wait_gone

import shmloader

RECORDS = 240

TRAINER = """
import json, logging, sys, time, shmloader
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
source = shmloader.RecordFileSource(sys.argv[1])
ds = shmloader.SharedTaskDataset(source, num_readers=1, master=sys.argv[2], shm_budget="8MiB",
                                 shm_dir=sys.argv[3])
with open(sys.argv[4], "a") as out:
    for batch in shmloader.DataLoader(ds, batch_size=8):
        out.write(json.dumps([int.from_bytes(r, "little") for r in batch["record"]]) + "\\n")
        out.flush()
        time.sleep(0.1)  # a slow trainer: it is mid-epoch when it is stopped
    s = ds.stats()
    out.write(json.dumps({"tasks": s.regranted_tasks, "records": s.regranted_records}) + "\\n")
ds.close()
"""


def _wait(what: str, done, timeout: float = 60.0) -> None:
    give_up = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < give_up, f"timed out waiting for {what}"
        time.sleep(0.05)


def start_trainer(
    script: Path, path: str, address: str, shm: Path, out: Path, log: Path
) -> subprocess.Popen[bytes]:
    """Trainer A (``TRAINER``) in its own process: ids to ``out``, its output to ``log``."""
    with open(log, "wb") as log_file:
        return subprocess.Popen(
            [sys.executable, str(script), path, address, str(shm), str(out)],
            env=subprocess_env(),
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )


def wait_for_batches(a: subprocess.Popen[bytes], out: Path, log: Path, n: int) -> None:
    """Until A has written ``n`` batches; fails (with A's output) if A exits first."""
    _wait(f"{n} batches", lambda: len(out.read_text().splitlines()) >= n or a.poll() is not None)
    assert a.poll() is None, log.read_text()


def trainer_b(
    source: shmloader.RecordFileSource,
    address: str,
    shm: Path,
    by_b: list[int],
    b_consumer: list[str],
    b_stats: list[shmloader.Stats],
) -> None:
    """Trainer B, in a thread: one pass, its ids into ``by_b``, its consumer id and stats."""
    with shmloader.SharedTaskDataset(
        source, num_readers=1, master=address, shm_budget="8MiB", shm_dir=str(shm)
    ) as b:
        b_consumer.append(b.start().runtime.consumer)
        for batch in shmloader.DataLoader(b, batch_size=8):
            by_b.extend(int.from_bytes(r, "little") for r in batch["record"])
        b_stats.append(b.stats())


def _b_has_all(master, b_consumer: list[str]) -> bool:
    """b's readers leased every task left, and b's sampler took them all."""

    def check(d) -> bool:
        todo = d.progress().epochs[0].todo_units
        return todo == 0 and all(x.taken for x in d.leases_of(b_consumer[0]))

    return bool(b_consumer) and master.dispatcher_call(check)


def _run(tmp_path, *, consumer_timeout: float, declared_dead: bool):
    """Trainer a (a subprocess) stops after 3 batches; once the master let its untaken leases
    lapse (and, with ``declared_dead``, declared it dead), trainer b delivers all it can get;
    then a goes on, and b's pass ends. Returns a's rows, b's rows, a's count of regranted rows,
    a's warnings about b, a's log.
    """
    path = str(tmp_path / "r.tfrecord")
    shmloader.write_records(path, [i.to_bytes(4, "little") for i in range(RECORDS)])
    source = shmloader.RecordFileSource(path)
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    out = tmp_path / "a.jsonl"
    out.touch()
    log = tmp_path / "a.log"
    with shmloader.Master(
        source,
        records_per_task=10,
        epochs=1,
        seed=1,
        # Not under the master's 2-s stall floor (server.stall_threshold): a pause of this
        # process (master and trainer b) of 1-2 s would expire b's leases too.
        lease_timeout=2.0,
        consumer_timeout=consumer_timeout,
    ) as master:
        a = start_trainer(script, path, master.address, tmp_path, out, log)
        pids: list[int] = []
        try:
            wait_for_batches(a, out, log, 3)
            # The whole trainer stalls (its readers too): nobody renews its leases.
            # Its readers are children of its readers' fork server: recursive.
            pids = [a.pid, *(c.pid for c in psutil.Process(a.pid).children(recursive=True))]
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            stopped = time.monotonic()

            def lapsed() -> bool:  # what a holds is only what its sampler took, or nothing
                progress = master.progress()
                held = [x for c in progress.consumers for x in c.leases]
                kept = master.dispatcher_call(lambda d: [x for x in held if d.get_lease(x).taken])
                return held == ([] if declared_dead else kept) and len(progress.consumers) == (
                    0 if declared_dead else 1
                )

            _wait("a's leases to lapse", lapsed)
            by_b: list[int] = []
            b_consumer: list[str] = []
            b_stats: list[shmloader.Stats] = []
            b = threading.Thread(
                target=trainer_b,
                args=(source, master.address, tmp_path, by_b, b_consumer, b_stats),
            )
            b.start()
            try:
                # b delivers all it can get. It waits at the end of its pass for the tasks a
                # has in hand (a is silent: it may be dead), so a goes on while b waits.
                _wait(
                    "b to take what a does not hold",
                    lambda: _b_has_all(master, b_consumer),
                    timeout=120.0,
                )
                stall = time.monotonic() - stopped
                assert (stall > consumer_timeout) == declared_dead, stall  # the case it tests
            finally:
                for pid in pids:
                    os.kill(pid, signal.SIGCONT)
                b.join(120)
            assert not b.is_alive() and b_consumer
            assert b_stats[0].regranted_tasks == 0  # b delivered nothing of a lease it lost
            assert a.wait(60) == 0, log.read_text()
        finally:
            for pid in pids:  # never leave a stopped process behind
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            a.kill()
            a.wait()
            assert wait_gone(pids) == []
        assert master.progress().finished
    assert [n for n in os.listdir(tmp_path) if n.startswith("shmloader")] == []
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    by_a = [r for line in lines[:-1] for r in line]
    warnings = [x for x in log.read_text().splitlines() if x.startswith("WARNING")]
    about = [w for w in warnings if f"handed the task to consumer {b_consumer[0]!r}" in w]
    return by_a, by_b, lines[-1], about, log.read_text()


@pytest.mark.long
def test_a_trainer_stalled_for_less_than_consumer_timeout_delivers_every_row_once(tmp_path):
    # consumer_timeout: well past the stall, which lasts until b has started and taken the
    # rest (_run waits up to 120 s for that). The whole test took 10 s here, 34 s with CPU
    # hogs beside it: 60 s left too little room on a loaded machine.
    by_a, by_b, counted, about, log = _run(tmp_path, consumer_timeout=180.0, declared_dead=False)
    counts = Counter(by_a + by_b)
    # Measured before taken leases were kept: ~190 of 240 rows came twice.
    assert set(counts) == set(range(RECORDS)), log  # no loss
    assert [r for r, n in counts.items() if n > 1] == [], log  # no duplicate
    assert by_a and by_b  # both delivered a share
    assert counted == {"tasks": 0, "records": 0} and about == [], log


@pytest.mark.long
def test_a_trainer_stalled_past_consumer_timeout_warns_of_and_counts_the_rows_that_came_twice(
    tmp_path,
):
    by_a, by_b, counted, about, log = _run(tmp_path, consumer_timeout=3.0, declared_dead=True)
    counts = Counter(by_a + by_b)
    assert set(counts) == set(range(RECORDS)) and max(counts.values()) <= 2
    twice = sum(1 for n in counts.values() if n == 2)
    # Every row that came twice was counted and warned about.
    assert twice > 0 and counted["records"] == twice, log
    assert len(about) == counted["tasks"] > 0, log
    assert all("may reach training twice in this epoch" in w for w in about)
