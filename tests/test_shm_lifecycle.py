"""Who removes a store's directory: close, exit, SIGTERM; and what survives a SIGKILL.

SIGTERM with its default disposition: our handler removes the stores, then the process dies
by it. With the application's own handler (installed before or after the store): that handler
alone decides, the store stays usable, and the exit path removes it."""

from __future__ import annotations

import functools
import gc
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from shmloader.shm import SegmentStore, lifecycle, reap_stale

OWNER_SCRIPT = """
import os, signal, sys, threading, time
import pyarrow as pa
from shmloader.shm import SegmentStore, lifecycle

base, mode = sys.argv[1], sys.argv[2]
flag = []
def on_sigterm(signum, frame):  # the application's handler
    if mode == "os-exit":
        os._exit(7)
    if mode == "sys-exit":
        sys.exit(3)
    flag.append(signum)
if mode in ("os-exit", "sys-exit", "flag-before"):
    signal.signal(signal.SIGTERM, on_sigterm)
if mode == "failing-removal":  # an owner whose removal fails: its path is a file
    class Owner: pass
    blocker, other = os.path.join(base, "not-a-dir"), Owner()
    open(blocker, "w").close()
    lifecycle.register(other, blocker)
store = SegmentStore.create("1MiB", base_dir=base)
if mode == "flag-after":
    signal.signal(signal.SIGTERM, on_sigterm)
if mode == "flag-chaining":  # as Lightning's: set a flag, then call the handler it replaced
    ours = signal.getsignal(signal.SIGTERM)
    def chaining(signum, frame):
        on_sigterm(signum, frame)
        ours(signum, frame)
    signal.signal(signal.SIGTERM, chaining)
if mode == "slow-hook":  # a hook that never returns, waking up as real ones do
    def slow_hook():
        print("hook", flush=True)
        # Not one endless wait: importing pyarrow starts a thread that takes signals, and
        # a second SIGTERM the kernel hands to it cannot interrupt a wait of the main thread,
        # where Python runs handlers (the likely cause of a hang of this test seen once in
        # CI). The dataset's own hooks wait with timeouts.
        while True:
            time.sleep(0.05)
    lifecycle.on_sigterm(slow_hook)
batch = pa.record_batch({"x": pa.array([1, 2, 3])})
store.write(batch)
print(store.path, flush=True)
if mode == "exit":
    sys.exit(0)
if mode == "interrupt":
    raise KeyboardInterrupt
if mode.startswith("flag"):
    while not flag:
        time.sleep(0.02)
    store.write(batch)  # the store is still ours to use
    print(len(store.segments()), flush=True)
    sys.exit(0)  # no close(): interpreter exit removes it
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
    left = sorted(os.listdir(dead_path))  # lock, the peak in use, one segment: left behind
    assert left[:2] == [".lock", ".peak"] and len(left) == 3, left
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


@pytest.mark.parametrize("mode", ["flag-before", "flag-after", "flag-chaining"])
def test_the_applications_sigterm_handler_keeps_the_store_until_exit(
    tmp_path: Path, mode: str
) -> None:
    with owner_process(tmp_path, mode) as (proc, path):
        proc.terminate()
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "2"  # it wrote on after SIGTERM
        assert proc.wait(timeout=60) == 0
    assert not os.path.exists(path)
    assert os.listdir(tmp_path) == []


def test_sigterm_handler_that_exits_leaves_cleanup_to_the_exit_path(tmp_path: Path) -> None:
    with owner_process(tmp_path, "sys-exit") as (proc, path):
        proc.terminate()
        assert proc.wait(timeout=60) == 3  # the handler installed before the store ran
    assert not os.path.exists(path)
    assert os.listdir(tmp_path) == []  # SystemExit: atexit removed it


def test_sigterm_handler_that_os_exits_leaves_the_store_to_the_reaper(tmp_path: Path) -> None:
    with owner_process(tmp_path, "os-exit") as (proc, dead_path):
        proc.terminate()
        assert proc.wait(timeout=60) == 7  # the handler installed before the store ran
    assert os.path.isdir(dead_path)  # no exit path ran: as after a SIGKILL
    with SegmentStore.create("1MiB", base_dir=tmp_path) as store:
        assert os.listdir(tmp_path) == [os.path.basename(store.path)]


def test_a_second_sigterm_skips_the_hooks_left(tmp_path: Path) -> None:
    with owner_process(tmp_path, "slow-hook") as (proc, path):
        assert proc.stdout is not None
        proc.terminate()
        assert proc.stdout.readline().strip() == "hook"  # blocked in it, for good
        proc.terminate()
        assert proc.wait(timeout=60) == -signal.SIGTERM
    assert not os.path.exists(path)
    assert os.listdir(tmp_path) == []


def test_a_removal_that_fails_on_sigterm_still_removes_the_rest_and_dies(tmp_path: Path) -> None:
    # It raised out of the handler: the store after it stayed, the process lived on (the
    # error raised into its main thread), and every later SIGTERM was ignored.
    with owner_process(tmp_path, "failing-removal") as (proc, path):
        proc.terminate()
        assert proc.wait(timeout=60) == -signal.SIGTERM
    assert not os.path.exists(path)
    assert os.listdir(tmp_path) == ["not-a-dir"]


@pytest.mark.parametrize("mode", ["exit", "interrupt"])
def test_normal_exit_and_ctrl_c_remove_the_store(tmp_path: Path, mode: str) -> None:
    with owner_process(tmp_path, mode) as (proc, path):
        code = proc.wait(timeout=60)
    assert (code == 0) == (mode == "exit")
    assert not os.path.exists(path)
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


def _mark(directory: Path) -> None:
    directory.mkdir(exist_ok=True)


def _sleep_when_started(started: Any) -> None:
    started.set()  # a SIGTERM before the child's after-fork step would be lost (Python's)
    time.sleep(120)


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="needs fork")
def test_sigterm_of_a_forked_child_only_kills_it(tmp_path: Path) -> None:
    # torch terminates its DataLoader workers: they inherited our handler, hooks and store.
    hooked = tmp_path / "hooked"
    key = lifecycle.on_sigterm(functools.partial(_mark, hooked))
    try:
        with SegmentStore.create("1MiB", base_dir=tmp_path) as store:
            store.write(pa.record_batch({"x": pa.array([1])}))
            fork = mp.get_context("fork")
            started = fork.Event()
            child = fork.Process(target=_sleep_when_started, args=(started,))
            child.start()
            assert started.wait(timeout=60)
            os.kill(child.pid, signal.SIGTERM)
            child.join(timeout=60)
            assert child.exitcode == -signal.SIGTERM
            assert not hooked.exists()  # the parent's hooks are not the child's
            assert len(store.segments()) == 1
    finally:
        lifecycle.forget_sigterm(key)


def test_reap_keeps_foreign_names(tmp_path: Path) -> None:
    (tmp_path / "shmloader-not-ours").mkdir()
    (tmp_path / "other").mkdir()
    report = reap_stale(tmp_path)
    assert [(os.path.basename(e.path), e.action) for e in report.entries] == [
        ("shmloader-not-ours", "left")
    ]
    assert sorted(os.listdir(tmp_path)) == ["other", "shmloader-not-ours"]
