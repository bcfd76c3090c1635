"""``master="torchrun"``: rank 0's dataset hosts the master and the other ranks find its address
in torchrun's store; tried with torchrun itself, and the launcher's variables checked."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from _dataset_helpers import (
    REPO_ROOT,
    TESTS_DIR,
    TORCHRUN,
    dataset,
    ids_of,
    shm_entries,
    subprocess_env,
    write_dataset,
)

import shmloader
from shmloader.dataset.runtime.launcher import rendezvous_from_env

TORCHRUN_ENV = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    directory = tmp_path_factory.mktemp("data")
    return directory, write_dataset(directory, [700, 455])  # 1155: two ranks need 1 of padding


def torchrun_trainers(
    tmp_path: Path, directory: Path, *options: str, machines: int = 1
) -> list[list[dict]]:
    """Two ranks of ``_torchrun_trainer.py`` under torchrun; each rank's JSON lines.
    ``machines=2``: as on two machines, two torchrun agents with a rank each, meeting through
    a c10d rendezvous on this one."""
    script = [str(TESTS_DIR / "_torchrun_trainer.py"), str(directory), str(tmp_path / "shm")]
    script += [str(tmp_path), *options]
    if machines == 1:
        launches = [[*TORCHRUN, "--standalone", "--nproc_per_node", "2", *script]]
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        rendezvous = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
        agent = [*TORCHRUN, "--nnodes", "2", "--nproc_per_node", "1", *rendezvous]
        launches = [[*agent, "--rdzv-id", tmp_path.name, *script]] * machines
    procs = [
        subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for command in launches
    ]
    for proc in procs:
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0, out
    return [
        [json.loads(line) for line in (tmp_path / f"rank{r}.jsonl").read_text().splitlines()]
        for r in range(2)
    ]


def delivered(lines: list[dict], name: str, pass_: int) -> list[int]:
    return [
        i
        for line in lines
        if (line.get("ds"), line.get("pass")) == (name, pass_)
        for i in line["ids"]
    ]


def check_shares(got: list[list[int]], expected: list[int]) -> None:
    """Equal shares that together hold every record once, plus the padding."""
    share = math.ceil(len(expected) / 2)
    assert [len(g) for g in got] == [share, share]
    seen = Counter(got[0] + got[1])
    assert set(seen) == set(expected)
    assert sum(seen.values()) - len(seen) == 2 * share - len(expected)


def test_two_ranks_under_torchrun_get_equal_shares_of_every_record(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    directory, expected = data
    # Rank 1 starts late and is slow: rank 0 is done long before, and keeps its master up.
    ranks = torchrun_trainers(tmp_path, directory, "--epochs", "2", "--val", "--late", "2")
    assert all(lines[-1] == {"done": True} for lines in ranks)
    for name, passes in (("train", 2), ("val", 1)):
        # Both ranks used the master rank 0 hosted for this dataset (the val dataset's ranks
        # found their own master's address, not the closed train master's).
        addresses = {
            line["address"]
            for lines in ranks
            for line in lines
            if "address" in line and line["ds"] == name
        }
        assert len(addresses) == 1, addresses
        for p in range(passes):
            check_shares([delivered(lines, name, p) for lines in ranks], expected)


def test_a_torchrun_job_resumes_from_each_ranks_state(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    # Each rank saves its state after 5 batches; a new job (new master on the new rank 0)
    # loads them and delivers the rest of epoch 0, then epoch 1.
    directory, expected = data
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    first = torchrun_trainers(tmp_path / "first", directory, "--stop-after", "5")
    for r in range(2):
        (tmp_path / "second" / f"state{r}.json").write_text(
            (tmp_path / "first" / f"state{r}.json").read_text()
        )
    second = torchrun_trainers(tmp_path / "second", directory, "--resume")
    assert all(lines[-1] == {"done": True} for lines in second)
    assert [len(delivered(lines, "train", 0)) for lines in first] == [5 * 32, 5 * 32]
    check_shares(
        [
            delivered(a, "train", 0) + delivered(b, "train", 0)
            for a, b in zip(first, second, strict=True)
        ],
        expected,
    )
    check_shares([delivered(lines, "train", 1) for lines in second], expected)


def trained(lines: list[dict]) -> list[int]:
    """The ids a rank of ``_torchrun_restart_trainer.py`` trained on, over every round: each
    round's steps up to where the next round resumed (the state saved after its last step)."""
    rounds = sorted({line["round"] for line in lines})
    resumed = {line["round"]: line["resumed_at"] for line in lines if "resumed_at" in line}
    ids = []
    for r in rounds:
        end = resumed.get(r + 1, math.inf)
        ids += [
            i
            for line in lines
            if line["round"] == r and line.get("step", end) < end
            for i in line["ids"]
        ]
    return ids


def test_a_rank_killed_mid_epoch_is_restarted_and_the_epoch_stays_exactly_once(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    directory, expected = data
    script = [str(TESTS_DIR / "_torchrun_restart_trainer.py"), str(directory)]
    script += [str(tmp_path / "shm"), str(tmp_path)]
    command = [*TORCHRUN, "--standalone", "--nproc_per_node", "2", "--max-restarts", "1"]
    proc = subprocess.Popen(
        [*command, *script],
        cwd=REPO_ROOT,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    log = tmp_path / "rank1.jsonl"
    try:
        deadline = time.monotonic() + 120
        while True:  # rank 1 well into its share of the epoch: then SIGKILL it
            text = log.read_text() if log.exists() else ""
            lines = [json.loads(x) for x in text.splitlines() if x.endswith("}")]  # whole ones
            if sum("step" in line for line in lines) >= 8:
                break
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.02)
        os.kill(lines[0]["pid"], signal.SIGKILL)
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out
    ranks = [
        [json.loads(x) for x in (tmp_path / f"rank{r}.jsonl").read_text().splitlines()]
        for r in range(2)
    ]
    for lines in ranks:  # the group was restarted once, and the second round finished
        assert {line["round"] for line in lines} == {0, 1}, lines[-3:]
        assert lines[-1] == {"round": 1, "done": True}
    resumed_at = [line for line in ranks[1] if line.get("round") == 1 and "resumed_at" in line]
    assert resumed_at[0]["resumed_at"] >= 7  # what the dead rank trained on counts, once
    check_shares([trained(lines) for lines in ranks], expected)
    assert shm_entries(tmp_path / "shm" / "rank0") == shm_entries(tmp_path / "shm" / "rank1") == []


def test_ranks_on_two_machines_reach_rank_0s_master_on_every_interface(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    # LOCAL_WORLD_SIZE=1 < WORLD_SIZE=2: rank 0's master listens on 0.0.0.0 (with a token), and
    # rank 1 is given MASTER_ADDR, where torchrun put node 0.
    directory, expected = data
    options = ("--epochs", "1", "--master-host", "0.0.0.0", "--token", "s3cret")
    ranks = torchrun_trainers(tmp_path, directory, *options, machines=2)
    assert all(lines[-1] == {"done": True} for lines in ranks)
    ((address, master_addr),) = {
        (line["address"], line["master_addr"])
        for lines in ranks
        for line in lines
        if "address" in line
    }
    assert address.rsplit(":", 1)[0] == master_addr  # not 0.0.0.0, where it listens
    check_shares([delivered(lines, "train", 0) for lines in ranks], expected)


def test_one_rank_needs_no_store(
    tmp_path: Path, data: tuple[Path, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # WORLD_SIZE=1: nobody to tell, so the store (here: a port nothing listens on) is not used.
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    directory, expected = data
    with dataset(directory, tmp_path / "shm", master="torchrun") as ds:
        assert (ds.rank, ds.world_size) == (0, 1)
        rows = [i for batch in shmloader.DataLoader(ds, batch_size=64) for i in ids_of(batch)]
        assert ds.master_address is not None and ds.master_address.startswith("127.0.0.1:")
    assert sorted(rows) == expected


@pytest.mark.parametrize(
    ("env", "kwargs", "message"),
    [
        ({"RANK": "0"}, {}, "missing: WORLD_SIZE, MASTER_ADDR, MASTER_PORT"),
        (TORCHRUN_ENV, {"rank": 1}, "rank=1 contradicts the launcher's RANK=0"),
        (TORCHRUN_ENV, {"world_size": 4}, "world_size=4 contradicts the launcher's WORLD_SIZE=2"),
        ({**TORCHRUN_ENV, "LOCAL_WORLD_SIZE": "1"}, {}, "run on several machines"),
        ({**TORCHRUN_ENV, "WORLD_SIZE": "two"}, {}, "not a number"),
    ],
)
def test_launcher_variables_are_checked(env: dict, kwargs: dict, message: str) -> None:
    args = {"rank": None, "world_size": None, "master_host": None, **kwargs}
    with pytest.raises(shmloader.ConfigError, match=message):
        rendezvous_from_env(**args, environ=env)


def test_where_rank_0_listens_and_how_the_others_reach_it() -> None:
    one_machine = rendezvous_from_env(
        rank=None, world_size=None, master_host=None, environ=TORCHRUN_ENV
    )
    assert (one_machine.bind_host, one_machine.advertise_host) == ("127.0.0.1", "127.0.0.1")
    assert (one_machine.rank, one_machine.world_size) == (0, 2)
    several = {**TORCHRUN_ENV, "LOCAL_WORLD_SIZE": "1"}
    anywhere = rendezvous_from_env(rank=0, world_size=2, master_host="0.0.0.0", environ=several)
    # Every interface: the others reach rank 0's machine where they reach the launcher's store.
    assert (anywhere.bind_host, anywhere.advertise_host) == ("0.0.0.0", "node0")
    assert anywhere.key.startswith("shmloader/dataset-")
    given = rendezvous_from_env(rank=0, world_size=2, master_host="10.0.0.5", environ=several)
    assert given.advertise_host == "10.0.0.5"
    assert given.key != anywhere.key  # the next dataset of this process: its own master


def test_master_host_names_an_interface(tmp_path: Path, data: tuple[Path, list[int]]) -> None:
    with pytest.raises(shmloader.ConfigError, match="master_host must name an interface"):
        dataset(data[0], tmp_path / "shm", master_host="")


def test_master_host_is_for_an_embedded_master(tmp_path: Path, data: tuple[Path, list[int]]):
    with pytest.raises(shmloader.ConfigError, match="master_host= is where the embedded master"):
        dataset(data[0], tmp_path / "shm", master="127.0.0.1:1", master_host="0.0.0.0")


def test_an_embedded_master_beyond_loopback_without_a_token_is_warned_of(
    tmp_path: Path, data: tuple[Path, list[int]], caplog: pytest.LogCaptureFixture
) -> None:
    with dataset(data[0], tmp_path / "shm", master_host="0.0.0.0") as ds:
        ds.start()
        assert ds.master_address is not None and ds.master_address.startswith("0.0.0.0:")
        # Another trainer reaches it there (elastic mode needs no more).
        client = shmloader.MasterClient(ds.master_address)
        try:
            assert client.progress().total_records == len(data[1])
        finally:
            client.close()
    assert "listens on 0.0.0.0:" in caplog.text and "without a token" in caplog.text


def test_the_address_rank_0_publishes_is_taken_once_it_answers() -> None:
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=5))
    env = {**TORCHRUN_ENV, "RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port)}
    rank1 = rendezvous_from_env(rank=None, world_size=None, master_host=None, environ=env)
    rank0 = rendezvous_from_env(rank=None, world_size=None, master_host=None, environ=env)
    rank0 = dataclasses.replace(rank0, rank=0, key=rank1.key)  # the same dataset's key
    with pytest.raises(shmloader.MasterError, match="rank 0 did not publish") as caught:
        rank1.lookup(timeout=0.3)
    assert rank1.key in str(caught.value)
    # An address left by a master of an earlier round: nothing listens there any more.
    with socket.socket() as gone:
        gone.bind(("127.0.0.1", 0))
        stale = gone.getsockname()[1]
    store.set(rank1.key, f"oldnonce 127.0.0.1:{stale}")
    with pytest.raises(shmloader.MasterError, match=f"127.0.0.1:{stale}, did not answer"):
        rank1.lookup(timeout=0.5)
    with socket.create_server(("127.0.0.1", 0)) as master:  # rank 0's master, listening
        port = master.getsockname()[1]
        assert rank0.publish(port) == f"127.0.0.1:{port}"
        assert rank1.lookup(timeout=5) == f"127.0.0.1:{port}"
    assert rank1.nonce == rank0.nonce != "oldnonce"
    # Rank 0's close waits for rank 1's, then takes the key away.
    assert rank0.wait_for_ranks(timeout=0.3) == [1]
    rank1.mark_closed()
    assert rank0.wait_for_ranks(timeout=5) == []
    assert not store.check([rank1.key])


@pytest.mark.parametrize(
    ("leaving", "waits"),
    [(SystemExit(0), True), (RuntimeError("the loop failed"), False), (KeyboardInterrupt(), False)],
    ids=["exit-0", "error", "ctrl-c"],
)
def test_rank_0_waits_for_the_others_only_when_its_loop_ended(
    leaving: BaseException,
    waits: bool,
    tmp_path: Path,
    data: tuple[Path, list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch.distributed import TCPStore

    # Waiting in vain takes close_seconds; where rank 0 should wait, rank 1 marks its close
    # after mark_after.
    close_seconds, mark_after = 30.0, 1.0
    monkeypatch.setattr("shmloader.dataset.runtime.launcher.CLOSE_SECONDS", close_seconds)
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=5))
    env = {**TORCHRUN_ENV, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    directory, _ = data
    # The dataset's __exit__ sees the exception first, then pytest.raises.
    with (
        pytest.raises(type(leaving)),
        dataset(directory, tmp_path / "shm", master="torchrun") as ds,
    ):
        ds.start()  # rank 0: its master starts and its address is published
        assert ds.options.rendezvous is not None
        key = ds.options.rendezvous.key
        other = rendezvous_from_env(
            rank=None, world_size=None, master_host=None, environ={**env, "RANK": "1"}
        )
        rank1 = dataclasses.replace(other, key=key)
        assert rank1.lookup(timeout=5) == ds.master_address
        marker = threading.Timer(mark_after, rank1.mark_closed)
        if waits:
            marker.start()
        left = time.monotonic()
        raise leaving
    took = time.monotonic() - left
    if waits:  # until rank 1 marked its close, then the key is gone
        marker.join()
        assert mark_after <= took < close_seconds
        assert not store.check([key])
    else:  # without waiting for rank 1, who never marks: the job is going down
        assert took < close_seconds / 2


def test_ipv6_addresses_are_published_in_brackets() -> None:
    env = {**TORCHRUN_ENV, "WORLD_SIZE": "1"}  # nobody to tell: no store needed
    only = rendezvous_from_env(rank=None, world_size=None, master_host="::1", environ=env)
    assert only.publish(7070) == "[::1]:7070"


def test_an_unreachable_launcher_store_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shmloader.dataset.runtime.launcher.CONNECT_SECONDS", 0.5)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    env = {**TORCHRUN_ENV, "RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    rank1 = rendezvous_from_env(rank=None, world_size=None, master_host=None, environ=env)
    with pytest.raises(shmloader.MasterError, match=f"launcher's store at 127.0.0.1:{port}"):
        rank1.lookup(timeout=1)
