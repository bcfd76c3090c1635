"""One round of the fault-injection soak (benchmarks/soak.py), so that it keeps running: real
trainers, readers and a journaled standalone master, SIGKILLed at random (seeded) points;
every id delivered exactly once per epoch, no hang, no shared memory left."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from _dataset_helpers import REPO_ROOT, subprocess_env

pytestmark = pytest.mark.long  # the long tier: .ci/run runs it after the README's command


def test_a_round_of_random_kills_loses_and_repeats_nothing() -> None:
    run = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "benchmarks" / "soak.py"),
            "--rounds",
            "1",
            "--records",
            "1500",
            "--step-seconds",
            "0.1",  # a round of several seconds: time for several kills
            "--seed",
            "3",
            "--round-timeout",
            "240",
            "--kills",
            "reader=3,trainer=2,late=1,master=1,join=1,leave=1",
        ],
        cwd=str(REPO_ROOT),
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout.splitlines()[-1])
    assert report["rounds"] == 1 and sum(report["kills"].values()) >= 1, report
    assert report["deliveries"] == 2 * 1500, report
    assert (report["lost"], report["duplicated"]) == (0, 0), report
    assert (report["hung_rounds"], report["failed_rounds"]) == (0, 0), report
    assert report["shm_entries_left"] == 0, report
