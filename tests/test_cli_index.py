"""`shmloader index`: builds, reuses and checks indexes; exit status and messages."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shmloader.cli.main import main
from shmloader.formats.index import load_offsets, sidecar_path
from shmloader.formats.tfrecord import RecordFile, scan_offsets, write_records


@pytest.fixture
def files(tmp_path: Path) -> list[str]:
    paths = []
    for name, n in (("a", 3), ("b", 40), ("c", 0)):
        path = str(tmp_path / f"{name}.tfrecord")
        write_records(path, [os.urandom(50) for _ in range(n)], index=False)
        paths.append(path)
    return paths


def test_builds_then_reuses(files: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    glob = os.path.join(os.path.dirname(files[0]), "*")
    assert main(["index", glob]) == 0
    out = capsys.readouterr().out
    assert "built" in out and "43  total" in out and "3 file(s)" in out
    for path in files:
        np.testing.assert_array_equal(load_offsets(path, "tfrecord"), scan_offsets(path))
    # The glob now also matches the sidecars; they are not indexed themselves.
    assert main(["index", glob]) == 0
    out = capsys.readouterr().out
    assert out.count("cached") == 3 and "built" not in out
    assert main(["index", "--force", files[1]]) == 0
    assert "built" in capsys.readouterr().out


def test_check_passes_on_good_files(files: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["index", "--check", *files]) == 0
    assert "built" in capsys.readouterr().out
    assert main(["index", "--check", *files]) == 0
    assert capsys.readouterr().out.count("checked") == 3


def test_check_names_the_corrupt_file_and_offset(
    files: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    bad = files[1]  # 40 records of 66 bytes each
    offset = RecordFile(bad).offset(7)
    with open(bad, "r+b") as f:
        f.seek(offset + 30)
        f.write(b"\xff")
    assert main(["index", *files]) == 0  # without --check only lengths are verified
    capsys.readouterr()
    assert main(["index", "--check", *files]) == 1
    captured = capsys.readouterr()
    assert f"{bad}, record 7, byte offset {offset}" in captured.err
    assert "payload CRC" in captured.err
    assert "2 file(s) indexed, 1 failed" in captured.out


def test_stale_index_is_rebuilt(files: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["index", files[0]]) == 0
    with open(files[0], "ab") as f:
        f.write(Path(files[1]).read_bytes())
    assert main(["index", files[0]]) == 0
    out = capsys.readouterr().out
    assert "built" in out and "43  total" in out  # 3 + the 40 appended


def test_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["index", str(tmp_path / "missing.tfrecord")]) == 2
    assert "no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["index"])
    # Another format's file would read as a corrupt record file.
    (tmp_path / "rows.jsonl").write_text('{"a": 1}\n')
    assert main(["index", str(tmp_path / "rows.jsonl")]) == 2
    assert "named as a jsonl file" in capsys.readouterr().err


def test_subprocess_entry_point(files: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "shmloader", "index", "--check", *files],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "43  total" in proc.stdout
    assert all(os.path.exists(sidecar_path(p, "tfrecord")) for p in files)


def test_on_error_skip_indexes_around_damaged_framing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(tmp_path / "d.tfrecord")
    write_records(path, [bytes([i]) * 40 for i in range(10)], index=False)
    offsets = scan_offsets(path)
    with open(path, "r+b") as f:  # record 4's length field
        f.seek(int(offsets[4]) + 1)
        f.write(b"\xff")
    assert main(["index", path]) == 1
    assert "record 4" in capsys.readouterr().err
    assert main(["index", "--on-error", "skip", path]) == 1  # built, but damage was found
    captured = capsys.readouterr()
    assert "built" in captured.out and "1 with damaged framing" in captured.out
    assert f"DAMAGED  {path}, record 4, byte offset {int(offsets[4])}" in captured.err
    assert RecordFile(path, resync=True).lost.tolist() == [4]
    assert main(["index", "--on-error", "skip", path]) == 1
    captured = capsys.readouterr()
    assert "cached" in captured.out and "record(s) 4 are damaged" in captured.err
    assert main(["index", "--on-error", "skip", "--check", path]) == 1
    assert "checked" in capsys.readouterr().out
    assert main(["index", path]) == 1  # without skip the stepped-over index is not taken
    assert "length CRC" in capsys.readouterr().err
