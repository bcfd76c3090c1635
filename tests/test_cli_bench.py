"""`shmloader bench` on real files: real readers, an embedded master, the figures it prints."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

import shmloader
from shmloader.cli.main import main


def test_bench_prints_epochs_first_batch_memory_and_advice(tmp_path, capsys) -> None:
    path = str(tmp_path / "r.tfrecord")
    shmloader.write_records(path, [bytes([i % 256]) * 8 for i in range(300)])
    args = [path, "--readers", "1", "--records-per-task", "50", "--shm-budget", "8MiB"]
    assert main(["bench", *args, "--epochs", "2", "--batch-size", "32"]) == 0
    out = capsys.readouterr().out
    assert "1 reader(s), 0 worker(s), batch 32, tasks of 50 records; first batch " in out
    assert "s after ds.start() (the readers and the master starting included)" in out
    assert "training loop: waited" in out and "for its first batch (from its first ask)" in out
    assert "epoch 0: 300 samples in" in out and "epoch 1: 300 samples in" in out
    assert "records consumed: 600" in out  # the dataset's own stats
    assert "is the most these settings deliver here" in out  # --step-ms 0
    assert main(["bench", *args, "--epochs", "1", "--step-ms", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [e["samples"] for e in result["epochs"]] == [300]
    assert result["step_ms"] == 1 and result["first_batch_seconds"] > 0
    assert isinstance(result["advice"], list)
    # Tasks sized from the data where --records-per-task is left out: the size it came to.
    sized = [path, "--readers", "1", "--shm-budget", "8MiB", "--epochs", "1", "--json"]
    assert main(["bench", *sized]) == 0
    assert isinstance(json.loads(capsys.readouterr().out)["records_per_task"], int)
    # Enough batches for the dataset's advice (stats.advice()), printed after its stats.
    assert main(["bench", *args, "--epochs", "1", "--batch-size", "8", "--step-ms", "5"]) == 0
    assert "\nadvice: " in capsys.readouterr().out


def test_bench_refuses_what_does_not_fit(tmp_path, capsys) -> None:
    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": [1, 2, 3]}), table)
    assert main(["bench", str(table), "--decode", "json:loads"]) == 1
    assert "ParquetSource does not take these options ['decode']" in capsys.readouterr().err
    assert main(["bench", str(table), "--decode", "json.loads"]) == 1
    assert "give MODULE:FUNCTION" in capsys.readouterr().err
    assert main(["bench", str(table), "--decode", "no_such_module_x:f"]) == 1
    assert "No module named" in capsys.readouterr().err
    assert main(["bench", str(table), "--decode", "json:JSONDecoder.no_such"]) == 1
    assert "no attribute 'no_such'" in capsys.readouterr().err
    assert main(["bench", str(table), "--epochs", "0"]) == 2


def test_a_decode_batch_module_in_the_current_folder_is_found(tmp_path) -> None:
    """Through the installed console script, whose sys.path does not hold the current folder
    (``python -m`` adds it): ``--decode-batch mod:func`` of ./mod.py is imported all the same,
    by the trainer and by its readers."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    shmloader.write_records(str(tmp_path / "r.tfrecord"), [bytes([i % 256]) * 8 for i in range(60)])
    (tmp_path / "my_batches.py").write_text(
        "import numpy as np\n"
        "def decode_batch(payloads):\n"
        "    return {'b': np.frombuffer(b''.join(payloads), np.uint8).reshape(-1, 8)[:, 0]}\n"
    )
    script = Path(sys.executable).with_name("shmloader")
    if not script.exists():  # the package is not installed with its console script here
        import pytest

        pytest.skip("no shmloader console script beside this Python")
    args = [str(script), "bench", "r.tfrecord", "--decode-batch", "my_batches:decode_batch"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [*args, "--readers", "1", "--records-per-task", "20", "--epochs", "1", "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert [e["samples"] for e in json.loads(done.stdout)["epochs"]] == [60]


def test_bench_with_the_cache_serves_later_epochs_from_it(tmp_path, capsys) -> None:
    path = str(tmp_path / "r.tfrecord")
    shmloader.write_records(path, [bytes([i % 256]) * 8 for i in range(300)])
    args = [path, "--readers", "1", "--records-per-task", "50", "--shm-budget", "8MiB"]
    assert main(["bench", *args, "--epochs", "3", "--cache", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["cache"] is True
    assert [e["samples"] for e in result["epochs"]] == [300, 300, 300]
    assert result["epochs"][-1]["tasks_from_cache"] > 0
    assert "cache: " in result["stats"]
