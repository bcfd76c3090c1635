"""The examples run as documented (small sizes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_elastic_trainers_share_epochs_and_survive_a_kill() -> None:
    done = subprocess.run(
        [sys.executable, "elastic.py", "--trainers", "3", "--records", "12000", "--kill"],
        cwd=EXAMPLES,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "killed trainer 0 after" in out
    assert "12,000 records x 2 epochs: 0 records short" in out
    assert "master: 2 of 2 epochs finished" in out
