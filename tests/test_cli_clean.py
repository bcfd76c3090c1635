"""``shmloader clean``: removes stores of dead owners, lists and keeps live ones."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_shm_lifecycle import owner_process

from shmloader.cli.main import main


def test_clean_removes_dead_and_keeps_live(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The live owner first: a store's creation reaps dead ones, so the dead one comes second.
    with owner_process(tmp_path) as (_live, live):
        with owner_process(tmp_path) as (proc, dead):
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
        assert main(["clean", "--dry-run", "--base", str(tmp_path)]) == 0
        out = capsys.readouterr().out.splitlines()
        assert os.path.isdir(dead)
        assert any(line.startswith("would remove") and dead in line for line in out), out
        assert any(line.startswith("left") and live in line and "is alive" in line for line in out)
        assert out[-1].startswith("1 to remove (would free ")

        assert main(["clean", "--base", str(tmp_path)]) == 0
        out = capsys.readouterr().out.splitlines()
        assert not os.path.exists(dead)
        assert os.path.isdir(live)
        removed = [line for line in out if line.startswith("removed")]
        assert len(removed) == 1 and dead in removed[0] and "owner pid" in removed[0]
        assert " KiB " in removed[0]  # its size: the lock file is empty, the segment is not
        assert out[-1].startswith("1 removed (freed ") and ", 1 left (" in out[-1]

        assert main(["clean", "--base", str(tmp_path)]) == 0
        out = capsys.readouterr().out.splitlines()
        assert not any(line.startswith("removed") for line in out)


def test_clean_on_an_empty_base_and_via_the_entry_point(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "shmloader", "clean", "--base", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert run.stdout.strip() == f"nothing of shmloader in {tmp_path}"


def test_clean_reads_the_env_base(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SHMLOADER_SHM_DIR", str(tmp_path))
    assert main(["clean"]) == 0
    assert str(tmp_path) in capsys.readouterr().out
