"""Who removes a store's directory: close, exit, SIGTERM; and what survives a SIGKILL."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pytest

from shmloader.shm import SegmentStore, reap_stale

OWNER_SCRIPT = """
import os, signal, sys, time
import pyarrow as pa
from shmloader.shm import SegmentStore

base, mode = sys.argv[1], sys.argv[2]
if mode == "chain":
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(7))
store = SegmentStore.create("1MiB", base_dir=base)
store.write(pa.record_batch({"x": pa.array([1, 2, 3])}))
print(store.path, flush=True)
if mode == "exit":
    sys.exit(0)
if mode == "interrupt":
    raise KeyboardInterrupt
time.sleep(120)
"""


@contextmanager
def owner_process(base: Path, mode: str = "wait") -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A separate Python process owning a store under ``base``; yields it and the store path."""
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER_SCRIPT, str(base), mode],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        path = proc.stdout.readline().strip()
        assert path.startswith(str(base)), f"owner did not start: {path!r}"
        yield proc, path
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)
        if proc.stdout is not None:
            proc.stdout.close()


def test_sigkilled_owner_is_reaped_by_the_next_store(tmp_path: Path) -> None:
    with owner_process(tmp_path) as (proc, dead_path):
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    assert len(os.listdir(dead_path)) == 2  # lock + one segment, left behind
    with (
        owner_process(tmp_path) as (live, live_path),
        SegmentStore.create("1MiB", base_dir=tmp_path) as store,
    ):
        assert not os.path.exists(dead_path)
        assert os.path.isdir(live_path)  # a live owner's store is kept
        assert sorted(os.listdir(tmp_path)) == sorted(
            os.path.basename(p) for p in (live_path, store.path)
        )
        live.terminate()
        assert live.wait(timeout=60) == -signal.SIGTERM
        assert not os.path.exists(live_path)  # its own SIGTERM handler removed it


def test_sigterm_chains_to_the_previous_handler(tmp_path: Path) -> None:
    with owner_process(tmp_path, "chain") as (proc, path):
        proc.terminate()
        assert proc.wait(timeout=60) == 7  # the handler installed before the store still ran
    assert not os.path.exists(path)


@pytest.mark.parametrize("mode", ["exit", "interrupt"])
def test_normal_exit_and_ctrl_c_remove_the_store(tmp_path: Path, mode: str) -> None:
    with owner_process(tmp_path, mode) as (proc, path):
        code = proc.wait(timeout=60)
    assert (code == 0) == (mode == "exit")
    assert not os.path.exists(path)
    assert os.listdir(tmp_path) == []


def test_sigterm_handler_is_installed_while_open_and_restored(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    first = SegmentStore.create("1MiB", base_dir=tmp_path)
    installed = signal.getsignal(signal.SIGTERM)
    assert installed is not before
    second = SegmentStore.create("1MiB", base_dir=tmp_path)
    assert signal.getsignal(signal.SIGTERM) is installed
    first.close()
    assert signal.getsignal(signal.SIGTERM) is installed  # second still needs it
    second.close()
    assert signal.getsignal(signal.SIGTERM) is before


def test_garbage_collected_owner_removes_its_store(tmp_path: Path) -> None:
    store = SegmentStore.create("1MiB", base_dir=tmp_path)
    path = store.path
    del store
    gc.collect()
    assert not os.path.exists(path)


def _close_inherited(store: SegmentStore) -> None:
    store.write(pa.record_batch({"x": pa.array([1])}))
    store.close()


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="needs fork")
def test_forked_child_never_removes_its_parents_store(tmp_path: Path) -> None:
    with SegmentStore.create("1MiB", base_dir=tmp_path) as store:
        child = mp.get_context("fork").Process(target=_close_inherited, args=(store,))
        child.start()
        child.join(timeout=60)
        assert child.exitcode == 0
        assert os.path.isdir(store.path)
        assert len(store.segments()) == 1


def test_reap_keeps_foreign_names(tmp_path: Path) -> None:
    (tmp_path / "shmloader-not-ours").mkdir()
    (tmp_path / "other").mkdir()
    report = reap_stale(tmp_path)
    assert [(os.path.basename(e.path), e.action) for e in report.entries] == [
        ("shmloader-not-ours", "kept")
    ]
    assert sorted(os.listdir(tmp_path)) == ["other", "shmloader-not-ours"]
