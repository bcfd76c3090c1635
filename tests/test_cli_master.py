"""`shmloader master` end to end, its argument errors, and source_for_paths which it plans with."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from shmloader.cli.main import main
from shmloader.errors import ConfigError
from shmloader.formats.tfrecord import write_records
from shmloader.master.client import MasterClient
from shmloader.sources import ArrowSource, ParquetSource, RecordFileSource
from shmloader.sources.factory import kind_of, source_for_paths

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def records(tmp_path: Path) -> Path:
    folder = tmp_path / "rec"
    folder.mkdir()
    for name, n in (("a", 5), ("b", 4)):
        write_records(str(folder / f"{name}.tfrecord"), [os.urandom(8) for _ in range(n)])
    return folder


def test_serves_until_sigint_then_prints_progress(records: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SHMLOADER_TOKEN": "tok"}
    cmd = [sys.executable, "-m", "shmloader", "master", str(records / "*")]
    cmd += ["--records-per-task", "2", "--epochs", "2", "--no-shuffle", "--world-size", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("shmloader master listening on 127.0.0.1:"), proc.stderr
        with MasterClient(line.split()[-1], token="tok", timeout=5, retry_for=5) as c:
            info = c.register("r1", rank=1)
            # Sidecar indexes matched by the glob are not data: 2 files, 3 + 2 tasks.
            assert (info.num_tasks, info.total_records, info.world_size) == (5, 9, 2)
            assert [os.path.basename(p) for p in info.paths] == ["a.tfrecord", "b.tfrecord"]
            assert c.epoch_info("r1", 1).num_records == 5  # pad: ceil(9 / 2)
            for x in c.lease("r1", 2).leases:
                c.complete(x.lease_id)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "stopped: 0 of 2 epoch(s) finished, 5 tasks, 9 records per epoch" in out
    assert "epoch 0 (open): 4/10 records done" in out and "completed 2" in out


# tgkill(2): deliver a signal to one thread, as the kernel may do with a process's SIGINT.
_TGKILL = {"x86_64": 234, "aarch64": 131}.get(platform.machine())


@pytest.mark.skipif(sys.platform != "linux" or _TGKILL is None, reason="needs Linux tgkill")
def test_the_last_words_of_a_long_job_name_the_last_epochs_and_every_loss() -> None:
    """A master of 20,000 short epochs printed a line for each when it stopped."""
    from shmloader.cli.master import summary
    from shmloader.master import Dispatcher, JobConfig
    from shmloader.sources.base import Shard

    d = Dispatcher([Shard("a", 4)], JobConfig(records_per_task=2, epochs=None, max_retries=0))
    d.register("c", 0.0)
    for epoch in range(10):
        for n, lease in enumerate(d.lease("c", 2, 0.0)):
            if epoch == 4 and n == 0:
                d.fail(lease.lease_id, "bad bytes", 0.0)  # quarantined: lost for epoch 4
            else:
                d.complete(lease.lease_id, 0.0)
    d.lease("c", 1, 0.0)  # epoch 10 open
    text = summary(d.progress())
    shown = [line.split()[1] for line in text.splitlines() if line.startswith("  epoch ")]
    assert shown == ["4", "8", "9", "10"], text
    assert "quarantined task 0" in text and "bad bytes" in text
    assert "(7 more finished epoch(s), every record of each done)" in text


def test_stops_when_sigint_lands_on_a_grpc_thread(records: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "shmloader", "master", str(records / "*.tfrecord")]
    proc = subprocess.Popen(
        [*cmd, "--records-per-task", "2"], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("shmloader master listening on")
        others = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid]
        assert others, "the master has no threads besides the main one"
        assert (
            ctypes.CDLL(None, use_errno=True).syscall(_TGKILL, proc.pid, others[-1], signal.SIGINT)
            == 0
        )
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0 and "stopped:" in out


def test_argument_errors(records: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = str(records / "*.tfrecord")
    assert main(["master", files, "--records-per-task", "2", "--tls-cert", "x"]) == 2
    assert "--tls-key" in capsys.readouterr().err
    assert main(["master", files, "--records-per-task", "2", "--epochs", "-1"]) == 2
    capsys.readouterr()
    assert main(["master", files, "--records-per-task", "0"]) == 1
    assert "records_per_task" in capsys.readouterr().err
    (tmp_path / "x.parquet").write_bytes(b"")
    mixed = [str(records / "a.tfrecord"), str(tmp_path / "x.parquet")]
    assert main(["master", *mixed, "--records-per-task", "2"]) == 1
    assert "mix formats" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["master", files])  # --records-per-task is required


def test_a_folder_of_one_format_is_a_source_of_that_format(records: Path, tmp_path: Path) -> None:
    jsonl = tmp_path / "jsonl"
    jsonl.mkdir()
    for part in range(2):
        (jsonl / f"part-{part}.jsonl").write_text('{"a": 1}\n{"a": 2}\n{"a": 3}\n')
    found = source_for_paths(str(jsonl))
    assert type(found).__name__ == "JSONLSource"
    assert [s.num_records for s in found.plan()] == [3, 3]
    rec = source_for_paths(str(records))  # record files beside their index files
    assert isinstance(rec, RecordFileSource) and len(rec.plan()) == 2
    (jsonl / "notes.txt").write_text("not data")  # no source reads .txt: Arrow's to refuse
    with pytest.raises(ConfigError):
        source_for_paths(str(jsonl)).plan()


def test_source_for_paths_picks_by_extension(records: Path, tmp_path: Path) -> None:
    rec = source_for_paths(str(records / "*"))
    assert isinstance(rec, RecordFileSource) and len(rec.plan()) == 2
    table = pa.table({"x": list(range(6))})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=4)
    par = source_for_paths([tmp_path / "t.parquet"], columns=["x"])
    assert isinstance(par, ParquetSource) and par.plan()[0].num_records == 6
    feather.write_feather(table, str(tmp_path / "t.arrow"))
    arr = source_for_paths(str(tmp_path / "t.arrow"))
    assert isinstance(arr, ArrowSource) and arr.plan()[0].num_records == 6

    with pytest.raises(ConfigError, match="does not take"):
        source_for_paths(str(tmp_path / "t.parquet"), decode=len)
    with pytest.raises(ConfigError, match="mix formats"):
        source_for_paths([str(tmp_path / "t.parquet"), str(tmp_path / "t.arrow")])
    with pytest.raises(ConfigError, match="cannot tell the format"):
        kind_of("data.bin")
    with pytest.raises(ConfigError, match="no paths"):
        source_for_paths([])
    assert kind_of("x/Y.TFRecord.GZ") == "records" and kind_of("s.ndjson") == "jsonl"
    assert kind_of("s-000.tar") == "webdataset" and kind_of("t.feather") == "arrow"


@pytest.mark.parametrize(
    ("module", "name", "text", "suffix"),
    [
        ("csv", "CSVSource", "a,b\n1,2\n3,4\n", ".csv"),
        ("jsonl", "JSONLSource", '{"a": 1}\n{"a": 2}\n', ".jsonl"),
    ],
)
def test_text_formats_when_their_sources_exist(
    tmp_path: Path, module: str, name: str, text: str, suffix: str
) -> None:
    if importlib.util.find_spec(f"shmloader.sources.{module}") is None:
        pytest.skip(f"shmloader.sources.{module} is not there yet")
    path = tmp_path / f"t{suffix}"
    path.write_text(text)
    source = source_for_paths(str(path))
    assert type(source).__name__ == name and source.plan()[0].num_records == 2


def test_resume_starts_at_the_state_epoch_without_the_consumed_records(
    records: Path, tmp_path: Path
) -> None:
    import json

    state = tmp_path / "state.json"
    state.write_text(json.dumps({"epoch": 1, "consumed": {"0": [[0, 2]], "3": [[0, 2]]}}))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "shmloader", "master", str(records / "*.tfrecord")]
    cmd += ["--records-per-task", "2", "--epochs", "2", "--resume", str(state)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("shmloader master listening on"), proc.stderr
        with MasterClient(line.split()[-1], timeout=5, retry_for=5) as c:
            c.register("t")
            leases = c.lease("t", 10).leases
            assert {x.epoch for x in leases} == {1}
            # 9 records in 5 tasks; tasks 0 and 3 (2 records each) were consumed before.
            assert sum(x.stop - x.start for x in leases) == 5
            assert {x.task_id for x in leases} == {1, 2, 4}
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert (
        main(
            ["master", str(records / "*.tfrecord"), "--records-per-task", "2", "--resume", str(bad)]
        )
        == 1
    )
