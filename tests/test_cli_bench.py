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
    assert "1 reader(s), 0 worker(s), batch 32, tasks of 50 records; first batch after" in out
    assert "epoch 0: 300 samples in" in out and "epoch 1: 300 samples in" in out
    assert "records consumed: 600" in out  # the dataset's own stats
    assert "is the most these settings deliver here" in out  # --step-ms 0
    assert main(["bench", *args, "--epochs", "1", "--step-ms", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [e["samples"] for e in result["epochs"]] == [300]
    assert result["step_ms"] == 1 and result["first_batch_seconds"] > 0


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
