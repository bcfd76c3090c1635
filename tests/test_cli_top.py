"""`shmloader stats` and `shmloader top` against a real master over gRPC."""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Iterator

import pytest

from shmloader.cli.main import main
from shmloader.cli.top import RATE_WINDOW, records_rate, wrapped
from shmloader.master.client import MasterClient
from shmloader.master.server import Master
from shmloader.shm.store import SegmentStore
from shmloader.sources.base import Shard


@pytest.fixture
def master() -> Iterator[Master]:
    m = Master([Shard("a", 100), Shard("b", 50)], records_per_task=10, epochs=2).start()
    with MasterClient(m.address) as client:  # a trainer that took three tasks, finished one
        client.register("trainer-x")
        leases = client.lease("trainer-x", 3).leases
        client.complete(leases[0].lease_id)
    yield m
    m.stop()


def test_stats_prints_epochs_trainers_counters_and_stores(master, tmp_path, capsys) -> None:
    with SegmentStore.create("4MiB", base_dir=str(tmp_path)) as store:
        assert main(["stats", master.address, "--base", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        assert f"master {master.address} (running): 0 of 2 epoch(s) finished, 15 tasks" in out
        assert "epoch 0 (open): 10/150 records done, 20 leased, 0 quarantined" in out
        assert "trainers: 1" in out
        assert "trainer-x  rank -  seen" in out and "2 lease(s), 20 records" in out
        assert "completed 1" in out and "granted 3" in out
        assert "1 live store(s)" in out and store.path in out


def test_stats_json_is_the_masters_progress(master, capsys) -> None:
    assert main(["stats", master.address, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["epochs"][0]["done_records"] == 10
    assert [c["consumer"] for c in data["consumers"]] == ["trainer-x"]


def test_top_redraws_with_the_rate_over_the_last_seconds(master, capsys) -> None:
    assert main(["top", master.address, "--interval", "0.05", "--count", "2"]) == 0
    frames = capsys.readouterr().out.strip().split("\n\n")
    assert len(frames) == 2
    assert "records/s" not in frames[0]
    assert "0 records/s over the last 0 s" in frames[1]


def test_the_rate_is_taken_over_a_window_not_one_frame() -> None:
    """Tasks complete whole: per frame of 1 s the rate jumped between 0 and a task's worth."""
    seen: deque[tuple[float, int]] = deque()
    done = [0, 0, 4096, 4096, 4096, 8192, 8192, 8192, 12288, 12288, 12288, 16384, 16384]
    rates = [records_rate(seen, float(t), d) for t, d in enumerate(done)]
    assert rates[0] is None
    steady = [r for r in rates[int(RATE_WINDOW) :] if r is not None]
    assert steady and all(1000 < rate < 1700 and span >= 10 for rate, span in steady), steady


def test_long_lines_wrap_between_words_under_their_first() -> None:
    line = "  trainer-x  rank -  seen 0.1 s ago  " + "many words here " * 8
    out = wrapped(line, 60).splitlines()
    assert len(out) > 1 and all(len(x) <= 60 for x in out)
    assert all(x.startswith("    ") for x in out[1:])  # under the first line, indented
    assert " ".join(out).split() == line.split()  # no word cut


def test_top_ends_when_the_finished_jobs_master_exits(capsys, monkeypatch) -> None:
    monkeypatch.setenv("SHMLOADER_MASTER_RETRY", "1")  # each call gives up on it after 1 s
    m = Master([Shard("a", 10)], records_per_task=10, epochs=1).start()
    with MasterClient(m.address) as client:
        client.register("t")
        (lease,) = client.lease("t", 1).leases
        client.complete(lease.lease_id)
    stopper = threading.Timer(0.5, m.stop)
    stopper.start()
    try:
        code = main(["top", m.address, "--interval", "0.2", "--count", "100"])
    finally:
        stopper.join()
    assert code == 0
    out = capsys.readouterr().out
    assert f"the job at {m.address} finished, and its master has exited" in out
    assert all(line.count(m.address) <= 1 for line in out.splitlines())  # said once a line


def test_an_unreachable_master_is_an_error_not_a_hang(capsys) -> None:
    assert main(["stats", "127.0.0.1:1"]) == 1
    assert "unreachable" in capsys.readouterr().err
    assert main(["top", "127.0.0.1:1", "--count", "1"]) == 1
    assert main(["top", "127.0.0.1:1", "--interval", "0"]) == 2


def test_stats_of_a_running_dataset_with_an_embedded_master(tmp_path, capsys) -> None:
    import shmloader

    path = str(tmp_path / "r.tfrecord")
    shmloader.write_records(path, [bytes([i]) for i in range(40)])
    with shmloader.SharedTaskDataset(
        shmloader.RecordFileSource(path),
        num_readers=1,
        records_per_task=10,
        epochs=1,
        shm_budget="8MiB",
        shm_dir=str(tmp_path),
    ) as ds:
        assert not ds.started and ds.master_address is None  # asking starts nothing
        address = ds.start().master_address  # the address is there before a batch
        assert ds.started and address is not None and address.startswith("127.0.0.1:")
        rows = [r for batch in shmloader.DataLoader(ds, batch_size=8) for r in batch["record"]]
        assert len(rows) == 40
        assert main(["stats", address, "--base", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "trainers: 1" in out and "1 live store(s)" in out
    assert "epoch 0 (" in out and "/40 records done" in out
