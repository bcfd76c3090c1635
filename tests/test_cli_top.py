"""`shmloader stats` and `shmloader top` against a real master over gRPC."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from shmloader.cli.main import main
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


def test_top_redraws_with_the_rate_since_the_last_frame(master, capsys) -> None:
    assert main(["top", master.address, "--interval", "0.05", "--count", "2"]) == 0
    frames = capsys.readouterr().out.strip().split("\n\n")
    assert len(frames) == 2
    assert "records/s" not in frames[0]
    assert "0 records/s done since the last frame" in frames[1]


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
        assert not ds.started
        address = ds.master_address  # asking starts it: the address is there before a batch
        assert ds.started and address is not None and address.startswith("127.0.0.1:")
        rows = [r for batch in shmloader.DataLoader(ds, batch_size=8) for r in batch["record"]]
        assert len(rows) == 40
        assert main(["stats", address, "--base", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "trainers: 1" in out and "1 live store(s)" in out
    assert "epoch 0 (" in out and "/40 records done" in out
