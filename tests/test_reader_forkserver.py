"""The readers' fork server (shmloader/reader/forkserver.py): readers are its forks, it reports
to the trainer how each exited, and nothing outlives the trainer or the server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
from _dataset_helpers import REPO_ROOT, dataset, ids_of, subprocess_env, wait_gone, write_dataset

import shmloader
from shmloader.reader.forkserver import KILLED, ForkServer
from shmloader.reader.messages import STOP
from shmloader.reader.pool import ReaderLauncher, reader_environment


def test_readers_are_forks_of_one_server_that_tells_how_each_exited() -> None:
    launcher = ReaderLauncher()
    try:
        first, second = launcher.launch(), launcher.launch()
        server = launcher.server_pid
        assert server is not None
        assert psutil.Process(server).ppid() == os.getpid()
        for reader in (first, second):
            assert psutil.Process(reader.process.pid).ppid() == server
            assert reader.process.poll() is None
        os.kill(first.process.pid, signal.SIGKILL)
        assert first.process.wait(30.0) == -signal.SIGKILL
        second.conn.send(STOP)  # not configured yet: it exits at once, quietly
        assert second.process.wait(30.0) == 0
        third = launcher.launch()  # the same server forks the next one
        assert launcher.server_pid == server
        third.process.kill()
        assert third.process.wait(30.0) == -signal.SIGKILL
    finally:
        launcher.close()
    assert wait_gone([server]) == []


def test_a_server_that_stops_answering_is_killed_not_waited_for() -> None:
    # Stopped (SIGSTOP), the server is alive but never answers the fork request: the
    # reader's pid is then -1 after the wait, the server is killed, and a launcher starts
    # another for the next reader.
    server = ForkServer(reader_environment(os.environ), answer_seconds=1.0)
    os.kill(server.popen.pid, signal.SIGSTOP)
    try:
        reader, conn = server.fork()
        conn.close()
        assert reader.pid == -1
        assert reader.poll() == KILLED and not server.alive
        assert server.popen.returncode == -signal.SIGKILL
    finally:
        server.close(30.0)
    assert wait_gone([server.popen.pid]) == []


def test_a_reader_still_running_when_its_server_is_closed_goes_with_it() -> None:
    launcher = ReaderLauncher()
    reader = launcher.launch()
    pid, server = reader.process.pid, launcher.server_pid
    launcher.close()
    assert wait_gone([pid, server]) == []
    assert reader.process.poll() is not None


_TRAINER = """
import sys, time
sys.path.insert(0, sys.argv[1])
from shmloader.reader.forkserver import KILLED, ForkServer
from shmloader.reader.pool import ReaderLauncher, reader_environment
launcher = ReaderLauncher()
readers = [launcher.launch(), launcher.launch()]
print(launcher.server_pid, *[r.process.pid for r in readers], flush=True)
time.sleep(120)
"""


def test_a_trainer_killed_takes_its_server_and_readers_along() -> None:
    trainer = subprocess.Popen(
        [sys.executable, "-c", _TRAINER, str(REPO_ROOT)],
        stdout=subprocess.PIPE,
        env=subprocess_env(),
        text=True,
    )
    try:
        assert trainer.stdout is not None
        pids = [int(p) for p in trainer.stdout.readline().split()]
        assert len(pids) == 3
        assert all(psutil.pid_exists(p) for p in pids)
    finally:
        trainer.kill()
        trainer.wait()
    assert wait_gone(pids) == []


@pytest.mark.timeout(120)
def test_a_server_killed_mid_epoch_is_started_again_and_nothing_is_lost(tmp_path: Path) -> None:
    """Its readers die with it (the parent-death signal); the pool sees them die, and the
    readers it starts in their place come from a new server. Every record comes once."""
    directory = tmp_path / "data"
    expected = write_dataset(directory, [500, 300])
    with dataset(directory, tmp_path / "shm", epochs=2, slow=True) as ds:
        dl = shmloader.DataLoader(ds, batch_size=50)
        got: list[int] = []
        server = None
        for batch in dl:
            got += ids_of(batch)
            if server is None:
                server = ds.runtime.pool.server_pid
                readers = ds.runtime.pool.pids()
                assert server is not None
                os.kill(server, signal.SIGKILL)
                assert wait_gone([server, *readers]) == []
        assert Counter(got) == Counter(expected)
        assert sorted(i for batch in dl for i in ids_of(batch)) == expected
        pool = ds.runtime.pool
        assert pool.server_pid not in (None, server)
        assert all(r.restarts >= 1 for r in ds.stats().readers)
        roles = {p.role for p in ds.stats().processes}
        assert "reader server" in roles


def test_the_server_holds_one_thread_of_python_when_it_forks() -> None:
    """A fork copies only the thread that forks: a lock another thread held stays held in
    the child for ever. The server runs Python in one thread (pyarrow's allocator may keep a
    background thread of its own, which jemalloc makes fork-safe)."""
    launcher = ReaderLauncher()
    try:
        reader = launcher.launch()
        assert reader.process.pid > 0  # the server answered: it is in its loop
        server = launcher.server_pid
        assert server is not None
        names = [
            Path(f"/proc/{server}/task/{task}/comm").read_text().strip()
            for task in os.listdir(f"/proc/{server}/task")
        ]
        assert [n for n in names if n != "jemalloc_bg_thd"] == [names[0]], names
    finally:
        launcher.close()


def test_no_reader_or_server_is_left_once_the_dataset_closes(tmp_path: Path) -> None:
    directory = tmp_path / "data"
    expected = write_dataset(directory, [200])
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    with dataset(directory, tmp_path / "shm", epochs=1) as ds:
        assert sorted(i for b in shmloader.DataLoader(ds, batch_size=50) for i in ids_of(b)) == (
            expected
        )
        ours = {c.pid for c in psutil.Process().children(recursive=True)} - before
        assert len(ours) >= 3  # the server and two readers (DataLoader workers: none)
    deadline = time.monotonic() + 30
    while ours & {c.pid for c in psutil.Process().children(recursive=True)}:
        assert time.monotonic() < deadline, "a reader or the server outlived the dataset"
        time.sleep(0.02)


def test_the_server_exits_when_told_though_a_forked_child_holds_its_channel() -> None:
    """A DataLoader worker forked from the trainer inherits the trainer's end of the channel:
    the server must not wait for that end to close (it would be killed after the timeout)."""
    launcher = ReaderLauncher()
    reader = launcher.launch()
    assert reader.process.pid > 0
    holder = os.fork()  # as a DataLoader worker would be
    if holder == 0:
        time.sleep(60)
        os._exit(0)
    try:
        reader.conn.send(STOP)
        assert reader.process.wait(30.0) == 0
        assert launcher.close(timeout=30.0) == 0  # exited when told, not killed
    finally:
        os.kill(holder, signal.SIGKILL)
        os.waitpid(holder, 0)
