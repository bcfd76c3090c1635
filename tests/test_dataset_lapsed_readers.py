"""A trainer's own process stops (SIGSTOP of its pid only) while its readers run on.

Real processes, a real master over gRPC, real files. The readers of the stopped trainer fill
its shared-memory budget and wait for room with leases in hand, and they call the master under
the trainer's consumer id. Before, they renewed those leases for as long as the stall lasted,
and the master kept the trainer's taken leases as long as its consumer called: the other
trainer's pass, which waits at its end for tasks another trainer holds, never ended (measured:
not within 200 s). Now a reader stops renewing and leasing once its trainer is silent for
half a ``lease_timeout`` (shm/hints.py "alive"), and a taken lease lapses when not renewed
for ``consumer_timeout``: the other trainer's pass ends, and the stopped trainer, once it goes
on, warns of and counts the rows that came twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from collections import Counter

import psutil
import pytest
from _dataset_helpers import wait_gone
from test_dataset_lapsed import RECORDS, TRAINER, start_trainer, trainer_b, wait_for_batches

import shmloader

BUDGET = "4MiB"  # a's: four tasks of 1 MB, so its readers soon wait for room, leases in hand


def _held(d) -> list[tuple[str, list[tuple[int, bool, float]]]]:
    """Who holds what (unit, taken, deadline), for a failure's message."""
    return [
        (c.consumer, [(x.unit, x.taken, x.deadline) for x in d.leases_of(c.consumer)])
        for c in d.progress().consumers
    ]


@pytest.mark.long
def test_the_others_pass_ends_while_a_trainer_is_stopped_and_its_readers_run_on(tmp_path):
    path = str(tmp_path / "r.tfrecord")
    rows = [i.to_bytes(4, "little") + bytes(100_000) for i in range(RECORDS)]
    shmloader.write_records(path, rows)
    source = shmloader.RecordFileSource(path)
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER.replace('shm_budget="8MiB"', f'shm_budget="{BUDGET}"'))
    out, log = tmp_path / "a.jsonl", tmp_path / "a.log"
    out.touch()
    # lease_timeout: not under the master's 2-s stall floor (see test_dataset_lapsed).
    with shmloader.Master(
        source, records_per_task=10, epochs=1, seed=1, lease_timeout=2.0, consumer_timeout=3.0
    ) as master:
        a = start_trainer(script, path, master.address, tmp_path, out, log)
        readers: list[int] = []
        try:
            wait_for_batches(a, out, log, 3)
            readers = [c.pid for c in psutil.Process(a.pid).children()]
            assert readers
            os.kill(a.pid, signal.SIGSTOP)  # the trainer only: its readers run on
            by_b: list[int] = []
            b_consumer: list[str] = []
            b = threading.Thread(
                target=trainer_b,
                args=(source, master.address, tmp_path, by_b, b_consumer, []),
            )
            b.start()
            b.join(90)
            # b's pass ended while a is still stopped and its readers still run.
            assert not b.is_alive(), (b_consumer, master.dispatcher_call(_held))
            assert psutil.Process(a.pid).status() == psutil.STATUS_STOPPED
            assert all(psutil.pid_exists(pid) for pid in readers)
            assert master.progress().finished
            os.kill(a.pid, signal.SIGCONT)
            assert a.wait(60) == 0, log.read_text()
        finally:
            with contextlib.suppress(ProcessLookupError):  # never leave a stopped process
                os.kill(a.pid, signal.SIGCONT)
            a.kill()
            a.wait()
            assert wait_gone(readers) == []
    assert [n for n in os.listdir(tmp_path) if n.startswith("shmloader")] == []
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    by_a, counted = [r for line in lines[:-1] for r in line], lines[-1]
    counts = Counter(by_a + by_b)
    assert set(counts) == set(range(RECORDS)) and max(counts.values()) <= 2, log.read_text()
    # Every row that came twice was counted and warned about by the trainer that stalled, once.
    twice = sum(1 for n in counts.values() if n == 2)
    assert twice > 0 and counted["records"] == twice, log.read_text()
    warned = [
        w
        for w in log.read_text().splitlines()
        if w.startswith("WARNING") and f"handed the task to consumer {b_consumer[0]!r}" in w
    ]
    assert len(warned) == counted["tasks"] > 0, log.read_text()
