"""The master and its clients in separate processes, killed with SIGKILL at bad moments."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shmloader.errors import LeaseError, MasterError
from shmloader.formats.tfrecord import write_records
from shmloader.master.client import MasterClient
from shmloader.master.server import Master
from shmloader.sources.base import Shard

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}

VICTIM = textwrap.dedent(
    """
    import json, sys, time
    from shmloader.master.client import MasterClient
    client = MasterClient(sys.argv[1])
    client.register("victim")
    client.start_heartbeat("victim", interval=0.1)
    leases = client.lease("victim", 3).leases
    print(json.dumps([[x.task_id, x.seq] for x in leases]), flush=True)
    time.sleep(600)
    """
)


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        cwd=ROOT,
    )


def _first_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        _, err = proc.communicate(timeout=10)
        raise AssertionError(f"process exited ({proc.returncode}) without output: {err}")
    return line


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def test_killed_client_leases_are_handed_out_again(procs: list[subprocess.Popen[str]]) -> None:
    plan = [Shard("a", 20), Shard("b", 12)]
    # The victim's leases come back by their deadline. No timeout under the master's 2-s stall
    # floor (server.stall_threshold): a pause of this process (master and survivor) of 1-2 s
    # would expire the survivor's lease too, and "expired" would be 4.
    with Master(plan, records_per_task=4, lease_timeout=2, consumer_timeout=30) as m:
        victim = _spawn("-c", VICTIM, m.address)
        procs.append(victim)
        held = {tuple(x) for x in json.loads(_first_line(victim))}
        assert len(held) == 3
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)

        done: dict[int, int] = {}  # task id -> attempt that completed it
        with MasterClient(m.address, timeout=5, retry_for=5) as c:
            c.register("survivor")
            c.start_heartbeat("survivor", interval=0.2)
            give_up = time.monotonic() + 30
            while True:
                reply = c.lease("survivor", 1)
                if reply.finished:
                    break
                for x in reply.leases:
                    assert x.task_id not in done, f"task {x.task_id} handed out twice"
                    if (x.task_id, x.seq) in held:
                        assert x.attempt == 2  # the victim's death counted as one attempt
                    done[x.task_id] = x.attempt
                    c.complete(x.lease_id)
                if not reply.leases:
                    assert time.monotonic() < give_up, "the victim's leases never came back"
                    time.sleep(0.05)
            progress = c.progress()
    assert sorted(done) == list(range(8))
    assert {t for t, _ in held} <= set(done)
    assert progress.finished and progress.counters["expired"] == 3
    assert progress.epochs[0].done_records == 32


def test_master_killed_mid_epoch_restarts_on_its_journal(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for name, n in (("a", 9), ("b", 7)):
        write_records(str(data / f"{name}.tfrecord"), [os.urandom(20) for _ in range(n)])
    args = [
        "-m", "shmloader", "master", str(data / "*.tfrecord"), "--records-per-task", "2",
        "--journal", str(tmp_path / "journal"), "--lease-timeout", "3",
        "--consumer-timeout", "10", "--seed", "3",
    ]  # fmt: skip
    first = _spawn(*args, "--port", "0")
    procs.append(first)
    line = _first_line(first)
    assert line.startswith("shmloader master listening on 127.0.0.1:")
    address = line.split()[-1]
    num_tasks = 5 + 4

    completed: list[int] = []
    with MasterClient(address, timeout=5, retry_for=30) as c:
        assert c.register("trainer").num_tasks == num_tasks
        for _ in range(3):
            (x,) = c.lease("trainer", 1).leases
            c.complete(x.lease_id)
            completed.append(x.task_id)
        held = c.lease("trainer", 2).leases
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        # Back on the same port; the client's calls wait for it (UNAVAILABLE is retried).
        second = _spawn(*args, "--port", address.rsplit(":", 1)[1])
        procs.append(second)
        for x in held:
            c.complete(x.lease_id)
            completed.append(x.task_id)
        while True:
            reply = c.lease("trainer", 2)
            for x in reply.leases:
                try:
                    c.complete(x.lease_id)
                except LeaseError as exc:
                    raise AssertionError(f"lease of task {x.task_id}: {exc}") from exc
                completed.append(x.task_id)
            if reply.finished:
                break
        progress = c.progress()
    assert sorted(completed) == list(range(num_tasks))  # each once
    assert progress.finished and progress.counters["completed"] == num_tasks
    assert progress.epochs[0].done_records == 16
    second.send_signal(signal.SIGTERM)
    out, err = second.communicate(timeout=20)
    assert second.returncode == 0, err
    assert "stopped: 1 of 1 epoch(s) finished" in out


def test_a_client_refuses_to_work_in_a_forked_child() -> None:
    with Master([Shard("a", 3)], records_per_task=1) as m, MasterClient(m.address) as c:
        c.register("parent")
        pid = os.fork()
        if pid == 0:  # the child: only our check runs, no gRPC call is attempted
            try:
                c.progress()
            except MasterError as exc:
                os._exit(0 if "create a MasterClient in each process" in str(exc) else 2)
            os._exit(1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert c.progress().num_tasks == 3  # the parent's channel is unharmed
