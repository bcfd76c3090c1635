"""flock()s that a fork() in another thread must not leave held (shmloader/_flock.py)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from shmloader import _flock

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")


def _fork_child(seconds: float, check: str | None = None) -> int:
    """A child that sleeps (exit code 0), or first checks that descriptor ``check`` (a
    number) points at /dev/null (exit code 3 if not). Returns once the child runs."""
    ready, tell = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        if check is not None and os.readlink(f"/proc/self/fd/{check}") != os.devnull:
            code = 3
        os.write(tell, b"x")
        time.sleep(seconds)
        os._exit(code)
    os.close(tell)
    os.read(ready, 1)  # after fork()'s handlers ran in the child
    os.close(ready)
    return pid


def _reap(pid: int) -> int:
    os.kill(pid, signal.SIGKILL)
    return os.waitpid(pid, 0)[1]


def test_a_fork_while_a_thread_holds_the_lock_does_not_keep_it(tmp_path: Path) -> None:
    path = str(tmp_path / "lock")
    Path(path).touch()
    holding, let_go = threading.Event(), threading.Event()

    def holder() -> None:
        with _flock.exclusive(path):
            holding.set()
            let_go.wait(10)

    children: list[int] = []
    t = threading.Thread(target=holder)
    t.start()
    assert holding.wait(5)
    # Forks from another thread while the lock is held (as a DataLoader starts its workers
    # while the trainer's maintenance thread releases a segment); the fork waits.
    forker = threading.Thread(target=lambda: children.append(_fork_child(30)))
    forker.start()
    time.sleep(0.2)
    let_go.set()
    t.join(5)
    forker.join(5)
    try:
        assert len(children) == 1
        got = threading.Event()

        def taker() -> None:
            with _flock.exclusive(path):
                got.set()

        threading.Thread(target=taker, daemon=True).start()
        # Without the guard the child holds the lock for its 30 s.
        assert got.wait(5), "the forked child kept the lock"
    finally:
        for pid in children:
            _reap(pid)


def test_a_held_lock_stays_the_parents_after_fork(tmp_path: Path) -> None:
    path = str(tmp_path / "journal.lock")
    fd = _flock.hold(path)
    assert fd is not None
    assert _flock.hold(path) is None  # held: a second holder is refused, not kept waiting
    pid = _fork_child(0.3, check=str(fd))
    _flock.release(fd)
    again = _flock.hold(path)  # the child still lives, and holds nothing
    try:
        assert again is not None
    finally:
        if again is not None:
            _flock.release(again)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child's copy was not /dev/null"


def test_exclusive_needs_the_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError), _flock.exclusive(str(tmp_path / "missing")):
        pass
