"""Readers start with the dataset (from the main thread) and wait for their configuration until
its first use: whatever the script does in between, as building its model, overlaps their
start-up. They are the readers that then read (adopted, not started again), and a dataset
closed or dropped before its first use leaves none running."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from _dataset_helpers import dataset, ids_of, wait_gone, write_dataset

import shmloader
from shmloader.reader.pool import ReaderLauncher, ReaderProcess, launch_reader, reader_environment


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    directory = tmp_path_factory.mktemp("data")
    return directory, write_dataset(directory, [300, 150])


def _children() -> set[int]:
    """This process's descendants (readers are children of their fork server). Not told
    apart by command line: a process just started may not have exec'd yet, and shows ours."""
    return {child.pid for child in psutil.Process().children(recursive=True)}


def _new_readers(before: set[int], count: int = 2) -> tuple[psutil.Process, list[psutil.Process]]:
    """The fork server this process started since ``before`` was taken (a child of ours) and
    its ``count`` readers, once it has forked them all (it answers fork requests as it gets to
    them: the dataset does not wait for the pids)."""
    deadline = time.monotonic() + 30.0  # a bound: it forks within a second or so
    while True:
        servers = [child for child in psutil.Process().children() if child.pid not in before]
        readers = servers[0].children() if len(servers) == 1 else []
        if len(readers) == count:
            return servers[0], readers
        assert time.monotonic() < deadline, f"no fork server with {count} readers: {servers}"
        time.sleep(0.01)


def _exited(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _read_all(ds: shmloader.SharedTaskDataset) -> list[int]:
    return sorted(i for b in shmloader.DataLoader(ds, batch_size=50) for i in ids_of(b))


def test_readers_started_with_the_dataset_are_the_ones_that_read(
    data: tuple[Path, list[int]], tmp_path: Path
) -> None:
    directory, expected = data
    before = _children()
    with dataset(directory, tmp_path / "shm", num_readers=2) as ds:
        # Forks of their server, started with them.
        fork_server, forked = _new_readers(before)
        server, started = fork_server.pid, {p.pid for p in forked}
        assert len(started) == 2
        assert not ds.started  # not used yet: no master, no pool thread
        assert _read_all(ds) == expected
        readers = ds.stats().readers
        assert {r.pid for r in readers} == started
        assert [r.restarts for r in readers] == [0, 0]
    assert wait_gone([*started, server]) == []


def test_a_dataset_closed_before_its_first_use_stops_its_readers(
    data: tuple[Path, list[int]], tmp_path: Path
) -> None:
    directory, _ = data
    before = _children()
    ds = dataset(directory, tmp_path / "shm")
    _, processes = _new_readers(before)
    assert len(processes) == 2
    ds.close()
    # Not configured, they hold nothing: close() does not wait for them to finish importing.
    assert [_exited(p) for p in processes] == [True, True]
    assert wait_gone(_children() - before) == []  # their fork server too: nothing kept
    assert os.listdir(tmp_path / "shm") == []


def test_a_dataset_dropped_unused_stops_its_readers(
    data: tuple[Path, list[int]], tmp_path: Path
) -> None:
    directory, _ = data
    before = _children()
    ds = dataset(directory, tmp_path / "shm")
    pids = [p.pid for p in _new_readers(before)[1]]
    del ds
    gc.collect()
    assert wait_gone(pids) == []


def test_made_in_another_thread_its_readers_start_on_first_use(
    data: tuple[Path, list[int]], tmp_path: Path
) -> None:
    """A reader dies with the thread that started it (the parent-death signal): one started
    from a thread that ended would die before its first task."""
    directory, expected = data
    made: list[shmloader.SharedTaskDataset] = []
    before = _children()
    maker = threading.Thread(target=lambda: made.append(dataset(directory, tmp_path / "shm")))
    maker.start()
    maker.join()
    with made[0] as ds:
        assert _children() == before  # no reader launched, nor their fork server
        assert _read_all(ds) == expected
        assert [r.restarts for r in ds.stats().readers] == [0, 0]


def test_a_reader_killed_before_the_first_use_is_replaced(
    data: tuple[Path, list[int]], tmp_path: Path
) -> None:
    directory, expected = data
    before = _children()
    with dataset(directory, tmp_path / "shm") as ds:
        victim = _new_readers(before)[1][0]
        os.kill(victim.pid, signal.SIGKILL)
        assert wait_gone([victim.pid], 30.0) == []
        assert _read_all(ds) == expected
        readers = ds.stats().readers
        assert victim.pid not in {r.pid for r in readers}
        assert sum(r.restarts for r in readers) == 1


@pytest.fixture(params=["forked", "fresh"])
def launch(request: pytest.FixtureRequest) -> Iterator[Callable[[], ReaderProcess]]:
    """Start a reader as a dataset does (forked by its fork server), or as a fresh
    interpreter (where there is no fork)."""
    if request.param == "fresh":
        yield launch_reader
        return
    launcher = ReaderLauncher()
    yield launcher.launch
    launcher.close()


def test_a_reader_whose_trainer_closes_its_pipe_exits_quietly(
    capfd: pytest.CaptureFixture[str], launch: Callable[[], ReaderProcess]
) -> None:
    proc = launch()
    proc.conn.close()
    assert proc.process.wait(30.0) == 0
    assert capfd.readouterr().err == ""


def test_readers_run_with_one_blas_thread_unless_the_user_chose(
    launch: Callable[[], ReaderProcess],
) -> None:
    """numpy's OpenBLAS threads spin at import: CPU a reader needs for its first task."""
    assert reader_environment({"PATH": "/bin"}) == {"PATH": "/bin", "OPENBLAS_NUM_THREADS": "1"}
    assert reader_environment({"OPENBLAS_NUM_THREADS": "4"}) == {"OPENBLAS_NUM_THREADS": "4"}
    proc = launch()
    try:
        # Until the child has exec'd, /proc shows the environment it was forked with (ours).
        deadline = time.monotonic() + 30.0
        while b"shmloader.reader" not in _cmdline(proc.process.pid):
            assert time.monotonic() < deadline, "the reader never started"
            time.sleep(0.01)
        with open(f"/proc/{proc.process.pid}/environ", "rb") as f:
            environ = dict(entry.split(b"=", 1) for entry in f.read().split(b"\0") if b"=" in entry)
    finally:
        proc.conn.close()
        proc.process.wait(30.0)
    chosen = os.environ.get("OPENBLAS_NUM_THREADS") or "1"
    assert environ[b"OPENBLAS_NUM_THREADS"] == chosen.encode()


def _cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


def test_readers_import_the_trainers_shmloader_whatever_folder_they_run_in(
    data: tuple[Path, list[int]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``shmloader/`` in the working folder (a checkout, another version) is not what the
    readers import: ``python -m`` put the working folder first on a reader's sys.path, so it
    imported that one while the trainer ran its own."""
    directory, ids = data
    work = tmp_path / "work"
    (work / "shmloader").mkdir(parents=True)
    (work / "shmloader" / "__init__.py").write_text(
        'raise ImportError("the shmloader of the working folder was imported")\n'
    )
    monkeypatch.chdir(work)
    with dataset(directory, tmp_path / "shm") as ds:
        assert _read_all(ds) == sorted(ids)
