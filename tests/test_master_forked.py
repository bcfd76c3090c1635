"""A process forked while this one's master or master client was open cannot use gRPC: it
used to hang in its first server or call, for ever and without a word (a dataset started in
an ``os.fork()`` child, a ``fork`` DataLoader worker or a fork pool of a running trainer).
Now it gets a MasterError that says why; a process forked after they closed works as before.
"""

from __future__ import annotations

import ast
import gc
import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from _dataset_helpers import dataset, ids_of, source, write_dataset

import shmloader
from shmloader.master import Master, MasterClient

HANG_SECONDS = 60.0  # a child that has not answered by then hangs (it did before the fix)


def _in_child(fn: Callable[[], object]) -> tuple[str, str]:
    """``fn()`` run in an ``os.fork()`` child: ("ok", its result) or (exception type, message);
    ("hung", "") if the child says nothing for HANG_SECONDS (it is then killed)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            os.close(read)
            try:
                outcome = ("ok", str(fn()))
            except BaseException as exc:
                outcome = (type(exc).__name__, str(exc))
            os.write(write, json.dumps(outcome).encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        if not select.select([read], [], [], HANG_SECONDS)[0]:
            os.kill(pid, signal.SIGKILL)
            return ("hung", "")
        kind, message = json.loads(os.read(read, 1 << 16))
        return (kind, message)
    finally:
        os.close(read)
        os.waitpid(pid, 0)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("forked")
    write_dataset(directory, [30, 30])
    return directory


def test_a_dataset_in_a_child_forked_from_a_running_one_is_refused(
    data: Path, tmp_path: Path
) -> None:
    shm = tmp_path / "shm"

    def start_another() -> int:
        with dataset(data, shm, num_readers=1, records_per_task=10) as child:
            return len([i for b in shmloader.DataLoader(child, batch_size=10) for i in ids_of(b)])

    with dataset(data, shm, num_readers=1, records_per_task=10) as parent:
        parent.start()
        kind, message = _in_child(start_another)
        assert kind == "MasterError", (kind, message)
        assert f"forked from process {os.getpid()}" in message
        assert "spawn" in message
        # The parent is untouched: its epoch comes whole.
        rows = [i for b in shmloader.DataLoader(parent, batch_size=10) for i in ids_of(b)]
        assert sorted(rows) == list(range(60))


def test_a_client_is_refused_while_a_master_serves_and_after_it_stopped(
    data: Path,
) -> None:
    master = Master(source(data), records_per_task=10).start()
    try:
        kind, message = _in_child(lambda: MasterClient(master.address, retry_for=0))
        assert kind == "MasterError", (kind, message)
        with MasterClient(master.address) as client:  # the parent's own gRPC still works
            assert client.progress().num_tasks == 6  # the plan: 60 records in tasks of 10
    finally:
        master.stop()

    def ask() -> int:
        with Master(source(data), records_per_task=10) as m, MasterClient(m.address) as client:
            return len(client.progress().epochs)

    # gRPC's threads outlive the master and the client: a child forked now hung in about one
    # try in twenty beside a CPU hog. It is refused instead, every time.
    kind, message = _in_child(ask)
    assert kind == "MasterError", (kind, message)
    assert "also once they closed" in message and "GRPC_ENABLE_FORK_SUPPORT=1" in message


def test_a_grandchild_is_told_which_child_it_came_through(data: Path) -> None:
    # The message said "forked from process <grandparent>", whose child it is not.
    with Master(source(data), records_per_task=10) as master:

        def in_grandchild() -> tuple[int, str, str]:
            kind, message = _in_child(lambda: MasterClient(master.address, retry_for=0))
            return os.getpid(), kind, message

        kind, result = _in_child(in_grandchild)
    assert kind == "ok", (kind, result)
    child, grandchild_kind, message = ast.literal_eval(result)  # the tuple's str
    assert grandchild_kind == "MasterError", message
    assert f", through process {child}, from process {os.getpid()} after" in message


class _Finalized:
    """In a reference cycle, so only the garbage collector frees it; says where it did."""

    def __init__(self, where: list[int]) -> None:
        self.where = where
        self.cycle = self

    def __del__(self) -> None:
        self.where.append(os.getpid())


def test_a_forked_child_does_not_finalize_the_parents_garbage(data: Path) -> None:
    # A worker's garbage collector ran the destructors of the parent's unreachable gRPC
    # objects, whose locks fork() had copied held: the worker aborted ("Mutex::Fer while
    # waiting on Condition") or hung in the middle of a batch. What a child inherits is
    # left to the parent now; what the child makes itself is still collected.
    master = Master(source(data), records_per_task=10).start()  # the process has used gRPC
    master.stop()
    finalized_in: list[int] = []

    def collect() -> tuple[list[int], int, bool]:
        own: list[int] = []
        _Finalized(own)
        before = gc.get_stats()[-1]["collections"]
        gc.collect()
        # False: the collector did not run at all. CPython's gc.collect() does nothing while a
        # collection is in progress, and a child forked while another thread of the parent
        # (one of gRPC's, finishing) was collecting inherits that state for good.
        ran = gc.get_stats()[-1]["collections"] > before
        return finalized_in, len(own), ran

    gc.disable()  # keep the garbage until the fork, as a collector that has not run yet does
    try:
        _Finalized(finalized_in)
        for _ in range(5):  # a fork that caught a collection in progress is tried again
            kind, result = _in_child(collect)
            assert kind == "ok", (kind, result)
            in_child, own_collected, ran = ast.literal_eval(result)
            assert in_child == [], "the child ran the destructor of an object the parent made"
            if ran:
                break
    finally:
        gc.enable()
    assert ran, "no child's collector ran in 5 forks"
    assert own_collected == 1, "the child's own garbage was not collected"
    gc.collect()
    assert finalized_in == [os.getpid()]  # the parent's garbage is the parent's to free


_FORK_FIRST = """
import json, os, sys
from shmloader.formats.tfrecord import write_records
from shmloader.master import Master, MasterClient
from shmloader.sources.records import RecordFileSource

path = os.path.join(sys.argv[1], "a.tfrecord")
write_records(path, [b"x"] * 30)

def ask():
    with Master(RecordFileSource(path), records_per_task=10) as m, MasterClient(m.address) as c:
        return c.progress().num_tasks

read, write = os.pipe()
pid = os.fork()  # before this process used gRPC: the child may
if pid == 0:
    os.close(read)
    try:
        outcome = ["ok", ask()]
    except BaseException as exc:
        outcome = [type(exc).__name__, str(exc)]
    os.write(write, json.dumps(outcome).encode())
    os._exit(0)
os.close(write)
child = json.loads(os.read(read, 1 << 16))
os.waitpid(pid, 0)
print(json.dumps({"child": child, "parent": ask()}))
"""


def test_a_child_forked_before_any_master_or_client_uses_grpc(tmp_path: Path) -> None:
    # In a fresh interpreter: this test process has used gRPC already.
    out = subprocess.run(
        [sys.executable, "-c", _FORK_FIRST, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"child": ["ok", 3], "parent": 3}
