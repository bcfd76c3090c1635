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


@pytest.fixture(autouse=True, scope="session")
def _no_shm_leaks() -> Iterator[None]:
    before = _ours()
    yield
    leaked = sorted(n for n in _ours() - before if _left_by_this_run(n))
    assert not leaked, f"tests left entries in {SHM_DIR}: {leaked}"
