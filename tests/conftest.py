"""Suite-wide guards: no test may leave shmloader entries in /dev/shm; and shmloader's
bytecode is written once for the processes the tests start."""

from __future__ import annotations

import compileall
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import shmloader
from shmloader.shm.names import is_alive, parse_dataset_name

SHM_DIR = "/dev/shm"


def _write_bytecode() -> None:
    """Where bytecode is not written (``PYTHONDONTWRITEBYTECODE``, as on our CI machines), each
    reader and trainer process the suite starts, thousands of them, compiled shmloader's ~100
    modules from source: 0.09 s of CPU each, a quarter of the CPU time of three dataset
    test files (test_dataset_failures, _reader_deaths, _workers: 53 s of user time, 40 s now).
    Written once here, into the ``__pycache__`` folders Python itself writes where it may."""
    if sys.dont_write_bytecode:
        for folder in (Path(shmloader.__file__).parent, Path(__file__).parent):
            compileall.compile_dir(folder, quiet=1)


_write_bytecode()


def _ours() -> set[str]:
    if not os.path.isdir(SHM_DIR):
        return set()
    return {n for n in os.listdir(SHM_DIR) if n.lower().startswith("shmloader")}


def _left_by_this_run(name: str) -> bool:
    """Ours if this process owns it or its owner is dead (a test's killed trainer). A store
    of another live process belongs to a run beside this one (another checkout's suite)."""
    owner = parse_dataset_name(name)
    if owner is None:
        return True
    pid, token = owner
    return pid == os.getpid() or not is_alive(pid, token)


def _leaked(before: set[str]) -> list[str]:
    return sorted(n for n in _ours() - before if _left_by_this_run(n))


def _xdist_worker() -> bool:
    """Whether this process runs tests for pytest-xdist's controller (``pytest -n 2``)."""
    return "PYTEST_XDIST_WORKER" in os.environ


def _xdist_controller(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "numprocesses", None)) and not _xdist_worker()


@pytest.fixture(autouse=True, scope="session")
def _no_shm_leaks() -> Iterator[None]:
    """In a run of one process, at its end. A worker of ``pytest -n`` cannot tell an entry
    another worker's test is still using from one left behind: the controller checks, once
    every worker is done (``pytest_sessionfinish`` below)."""
    if _xdist_worker():
        yield
        return
    before = _ours()
    yield
    leaked = _leaked(before)
    assert not leaked, f"tests left entries in {SHM_DIR}: {leaked}"


_BEFORE = pytest.StashKey[set[str]]()


def pytest_sessionstart(session: pytest.Session) -> None:
    if _xdist_controller(session.config):
        session.config.stash[_BEFORE] = _ours()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _xdist_controller(session.config):
        return
    leaked = _leaked(session.config.stash.get(_BEFORE, set()))
    if leaked:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"tests left entries in {SHM_DIR}: {leaked}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
