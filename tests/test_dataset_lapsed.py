"""A trainer that stalls past the lease timeout (SIGSTOP) while another shares its epoch.

Real processes, a real master over gRPC, real files. The master hands the stalled trainer's
tasks to the other trainer, which delivers them; the stalled one, once it goes on, delivers the
rows of the tasks its sampler had taken too. Those rows come twice: the stalled trainer must say
so (a warning per task naming the other trainer) and count them in ``stats()``, exactly.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import psutil
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


def test_a_stalled_trainer_warns_of_and_counts_the_rows_that_came_twice(tmp_path):
    path = str(tmp_path / "r.tfrecord")
    shmloader.write_records(path, [i.to_bytes(4, "little") for i in range(RECORDS)])
    source = shmloader.RecordFileSource(path)
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    out = tmp_path / "a.jsonl"
    out.touch()
    log = tmp_path / "a.log"
    with shmloader.Master(
        source, records_per_task=10, epochs=1, seed=1, lease_timeout=1.0, consumer_timeout=60.0
    ) as master:
        with open(log, "wb") as log_file:
            a = subprocess.Popen(
                [sys.executable, str(script), path, master.address, str(tmp_path), str(out)],
                env=subprocess_env(),
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        pids: list[int] = []
        try:
            _wait(
                "3 batches", lambda: len(out.read_text().splitlines()) >= 3 or a.poll() is not None
            )
            assert a.poll() is None, log.read_text()
            # The whole trainer stalls (its readers too): nobody renews its leases.
            pids = [a.pid, *(c.pid for c in psutil.Process(a.pid).children())]
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            _wait("a's leases to lapse", lambda: master.progress().epochs[0].leased_units == 0)
            with shmloader.SharedTaskDataset(
                source, num_readers=1, master=master.address, shm_budget="8MiB",
                shm_dir=str(tmp_path),
            ) as b:  # fmt: skip
                by_b = [
                    int.from_bytes(r, "little")
                    for batch in shmloader.DataLoader(b, batch_size=8)
                    for r in batch["record"]
                ]
                b_consumer = b.runtime.consumer
                assert b.stats().regranted_tasks == 0
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
            assert a.wait(60) == 0, log.read_text()
        finally:
            for pid in pids:  # never leave a stopped process behind
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            a.kill()
            a.wait()
            assert wait_gone(pids) == []
        lines = [json.loads(line) for line in out.read_text().splitlines()]
        by_a = [r for line in lines[:-1] for r in line]
        counted = lines[-1]
        counts = Counter(by_a + by_b)
        assert set(counts) == set(range(RECORDS)) and max(counts.values()) <= 2
        twice = sum(1 for n in counts.values() if n == 2)
        # Measured: ~190 of 240 rows came twice. Every one was counted and warned about.
        assert twice > 0 and counted["records"] == twice
        warnings = [x for x in log.read_text().splitlines() if x.startswith("WARNING")]
        about = [w for w in warnings if f"handed the task to consumer {b_consumer!r}" in w]
        assert len(about) == counted["tasks"] > 0, log.read_text()
        assert all(path in w and "may reach training twice in this epoch" in w for w in about)
        assert master.progress().finished
    assert [n for n in os.listdir(tmp_path) if n.startswith("shmloader")] == []
