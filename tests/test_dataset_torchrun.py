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

import psutil
import pytest
from _dataset_helpers import (
    REPO_ROOT,
    TESTS_DIR,
    TORCHRUN,
    dataset,
    finish_group,
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


@pytest.mark.long
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


def trained(ranks: list[list[dict]]) -> list[int]:
    """The ids the ranks of ``_torchrun_restart_trainer.py`` trained on, over every round:
    each step as the last round that did it delivered it (a round that died before its state
    counted a step did it again in the next round, which resumed before it)."""
    steps = [line for lines in ranks for line in lines if "step" in line]
    last = {}  # step -> the round that did it last
    for line in sorted(steps, key=lambda line: line["t"]):
        last[line["step"]] = line["round"]
    return [i for line in steps if last[line["step"]] == line["round"] for i in line["ids"]]


def _rounds(ranks: list[list[dict]]) -> list[tuple[int, int]]:
    """(resumed_at, world size) of each round, in the order they began."""
    starts = sorted(
        (line["t"], line["round"], line["resumed_at"], line["world"])
        for lines in ranks
        for line in lines
        if "resumed_at" in line
    )
    seen: dict[str, tuple[int, int]] = {}
    for _, name, at, world in starts:
        seen.setdefault(name, (at, world))
    return list(seen.values())


def _restart_job(
    tmp_path: Path, directory: Path, *options: str, nproc: int = 2, machine: str | None = None
) -> subprocess.Popen[str]:
    """``_torchrun_restart_trainer.py`` under torchrun: every rank takes the whole job's state
    after each step, rank 0 saves it, every rank loads it on start. ``options``: torchrun's
    (before the script), then ``--`` and the trainer's. ``machine``: an agent of an elastic
    job (``--nnodes 1:2``, c10d rendezvous at that ``host:port``) instead of ``--standalone``."""
    split = options.index("--") if "--" in options else len(options)
    launcher, trainer = list(options[:split]), list(options[split + 1 :])
    script = [str(TESTS_DIR / "_torchrun_restart_trainer.py"), str(directory)]
    script += [str(tmp_path / "shm"), str(tmp_path), *trainer]
    if machine is None:
        launcher = ["--standalone", *launcher]
    else:
        launcher = [
            *("--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", machine),
            *("--rdzv-id", tmp_path.name, "--rdzv-conf", "last_call_timeout=1"),
            *("--monitor-interval", "0.5", *launcher),
        ]
    env = subprocess_env()
    if machine is not None:
        # torchrun's agents share their rendezvous store with the workers (torch 2.4 on), and
        # an agent that was rank 0 before a node joined publishes no address for the new
        # round: the joining agent waits for it and fails (pytorch/pytorch#147064). With the
        # sharing off, each round's rank 0 publishes, and its workers serve the store.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return subprocess.Popen(
        [*TORCHRUN, "--nproc_per_node", str(nproc), *launcher, *script],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _lines(tmp_path: Path) -> list[list[dict]]:
    """Every rank file's whole lines (a killed rank may have left half of one)."""
    return [
        [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]
        for path in sorted(tmp_path.glob("rank*.jsonl"))
    ]


def _until_steps(tmp_path: Path, steps: int, procs: list[subprocess.Popen[str]]) -> None:
    """Until the job's steps, counted by its highest step line, reach ``steps``."""
    deadline = time.monotonic() + 180
    while (
        max((line.get("step", -1) for lines in _lines(tmp_path) for line in lines), default=-1)
        < steps
    ):
        for proc in procs:
            assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _pid_of_rank(tmp_path: Path, rank: int) -> int:
    """The pid of the last process that started as ``rank``."""
    text = (tmp_path / f"rank{rank}.jsonl").read_text()
    lines = [json.loads(x) for x in text.splitlines() if x.endswith("}")]
    return [line["pid"] for line in lines if "pid" in line][-1]


def check_epochs(ranks: list[list[dict]], expected: list[int], epochs: int, padded: int) -> None:
    """Every record ``epochs`` times over the rounds, and at most ``padded`` more deliveries
    (DDP padding: each schedule pads to a multiple of its ranks)."""
    seen = Counter(trained(ranks))
    assert set(seen) == set(expected)
    assert min(seen.values()) == epochs, [i for i, n in seen.items() if n < epochs]
    assert sum(seen.values()) - epochs * len(expected) <= padded, seen.most_common(8)


@pytest.mark.long
def test_a_rank_killed_mid_epoch_is_restarted_and_the_epoch_stays_exactly_once(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    directory, expected = data
    proc = _restart_job(tmp_path, directory, "--max-restarts", "1")
    _until_steps(tmp_path, 8, [proc])
    os.kill(_pid_of_rank(tmp_path, 1), signal.SIGKILL)
    out = finish_group(proc, 300)
    assert proc.returncode == 0, out
    ranks = _lines(tmp_path)
    rounds = _rounds(ranks)
    assert len(rounds) == 2 and rounds[1][0] >= 7, rounds  # restarted once, from its state
    for lines in ranks:
        assert "done" in lines[-1], lines[-3:]
    # Each schedule pads to an even count: the first, and the second of what was left.
    check_epochs(ranks, expected, 1, padded=2)
    assert shm_entries(tmp_path / "shm" / "rank0") == shm_entries(tmp_path / "shm" / "rank1") == []


@pytest.mark.long
@pytest.mark.parametrize("saved_by", ["rank 0", "dcp"])
def test_the_whole_jobs_state_resumes_a_job_of_another_size_exactly_once(
    tmp_path: Path, data: tuple[Path, list[int]], saved_by: str
) -> None:
    # Two ranks; rank 1 SIGKILLed mid-epoch, and torchrun (no restarts) ends the job. A new
    # job of three ranks loads the state rank 0 saved (or torch.distributed.checkpoint saved
    # from every rank, shmloader.DCPState) and finishes both epochs.
    directory, expected = data
    options = ("--", "--epochs", "2", *(("--ddp", "--dcp") if saved_by == "dcp" else ()))
    first = _restart_job(tmp_path, directory, *options)
    _until_steps(tmp_path, 8, [first])
    os.kill(_pid_of_rank(tmp_path, 1), signal.SIGKILL)
    out = finish_group(first, 300)
    assert first.returncode != 0, out
    second = _restart_job(tmp_path, directory, *options, nproc=3)
    out = finish_group(second, 300)
    assert second.returncode == 0, out
    ranks = _lines(tmp_path)
    rounds = _rounds(ranks)
    assert [world for _, world in rounds] == [2, 3] and rounds[1][0] >= 7, rounds
    # Padding: 1 in the first job, up to 2 in each epoch of the second.
    check_epochs(ranks, expected, 2, padded=5)
    for r in range(3):
        assert shm_entries(tmp_path / "shm" / f"rank{r}") == []


@pytest.mark.long
def test_an_elastic_job_grows_loses_a_machine_and_stays_exactly_once(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    # torchrun --nnodes 1:2 as on two machines (two agents meeting through a c10d rendezvous
    # on this one): the job starts on one, grows to two when the second joins (a new round:
    # every rank restarts from the state), then loses the second machine (SIGKILL of its
    # agent and rank: the survivor's next all-reduce fails, and a third round goes on alone).
    directory, expected = data
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{s.getsockname()[1]}"
    trainer = ("--", "--epochs", "2", "--ddp", "--step-seconds", "0.1")
    first = _restart_job(
        tmp_path, directory, "--max-restarts", "3", *trainer, nproc=1, machine=endpoint
    )
    second = None
    try:
        _until_steps(tmp_path, 5, [first])
        second = _restart_job(
            tmp_path, directory, "--max-restarts", "3", *trainer, nproc=1, machine=endpoint
        )
        deadline = time.monotonic() + 180
        while not [r for r in _rounds(_lines(tmp_path)) if r[1] == 2]:  # the grown round
            assert first.poll() is None and second.poll() is None
            assert time.monotonic() < deadline
            time.sleep(0.05)
        grown = max(line.get("step", 0) for lines in _lines(tmp_path) for line in lines)
        _until_steps(tmp_path, grown + 5, [first, second])
        # The machine is gone: its agent and its rank (torchrun starts each worker in a
        # session of its own), at once.
        agent = psutil.Process(second.pid)
        for proc in [agent, *agent.children(recursive=True)]:
            proc.kill()
        second.communicate()
        out = finish_group(first, 300)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    assert first.returncode == 0, out
    ranks = _lines(tmp_path)
    worlds = [world for _, world in _rounds(ranks)]
    assert worlds[0] == 1 and 2 in worlds and worlds[-1] == 1, _rounds(ranks)
    # Padding: up to 1 in each schedule at two ranks.
    check_epochs(ranks, expected, 2, padded=len(worlds))


@pytest.mark.long
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
        assert (ds.options.rank, ds.job.world_size) == (0, 1)
        rows = [i for batch in shmloader.DataLoader(ds, batch_size=64) for i in ids_of(batch)]
        assert ds.master_address is not None and ds.master_address.startswith("127.0.0.1:")
    assert sorted(rows) == expected


@pytest.mark.parametrize(
    ("env", "kwargs", "message"),
    [
        ({"RANK": "0"}, {}, "missing: WORLD_SIZE, MASTER_ADDR, MASTER_PORT"),
        (TORCHRUN_ENV, {"rank": 1}, "rank=1 contradicts the launcher's RANK=0"),
        (TORCHRUN_ENV, {"world_size": 4}, "world_size=4 contradicts the launcher's WORLD_SIZE=2"),
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
    # Ranks on several machines and no master_host (a job that grew, say): the same.
    grown = rendezvous_from_env(rank=None, world_size=None, master_host=None, environ=several)
    assert (grown.bind_host, grown.advertise_host) == ("0.0.0.0", "node0")
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


def test_the_whole_jobs_state_meets_every_ranks_and_a_missing_rank_is_named() -> None:
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=5))
    env = {**TORCHRUN_ENV, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port)}
    rank0 = rendezvous_from_env(rank=None, world_size=None, master_host=None, environ=env)
    rank1 = dataclasses.replace(rank0, rank=1)
    rank0.nonce = rank1.nonce = "nonce"  # as publish() and lookup() leave them
    # Rank 0 calls alone (the usual slip: `if rank == 0: save(loader.state_dict())`).
    began = time.monotonic()
    with pytest.raises(shmloader.ConfigError, match=r"ranks \[1\] of 2 did not call it") as caught:
        rank0.share_state(0, '"zero"', timeout=0.5)
    assert time.monotonic() - began < 30  # said, not hung
    assert "rank_state_dict()" in str(caught.value)  # and the way to per-rank states
    # Both call: each gets every rank's, by rank, for this call and the next.
    for call in (1, 2, 3):
        got: list[list[str]] = []
        other = threading.Thread(
            target=lambda c=call, into=got: into.append(rank1.share_state(c, f'"one{c}"'))
        )
        other.start()
        mine = rank0.share_state(call, f'"zero{call}"', timeout=30)
        other.join()
        assert mine == got[0] == [f'"zero{call}"', f'"one{call}"']
    # Each rank removed its key of two calls back: the store does not grow with the steps.
    assert not store.check([f"{rank0.key}/nonce/state/1/0"])
    assert store.check([f"{rank0.key}/nonce/state/3/1"])
    # Rank 1 took part in the last call, and rank 0's master no longer hears from it: it
    # died, said at the first look (not after the timeout), so torchrun restarts the job.
    began = time.monotonic()
    with pytest.raises(shmloader.MasterError, match=r"ranks \[1\] of 2 stopped"):
        rank0.share_state(4, '"zero4"', timeout=60, alive=lambda: {0})
    assert time.monotonic() - began < 30
    # A rank the master never heard from may still be starting: waited for, not declared dead.
    late = dataclasses.replace(rank0, key=rank0.key + "-2", seen_alive=set())
    with pytest.raises(shmloader.ConfigError, match="did not call it"):
        late.share_state(0, '"zero"', timeout=1.5, alive=lambda: {0})


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
