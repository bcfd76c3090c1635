"""Suite-wide guards: no test may leave shmloader entries in /dev/shm."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from shmloader.shm.names import is_alive, parse_dataset_name

SHM_DIR = "/dev/shm"


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
