"""Suite-wide guards: no test may leave shmloader entries in /dev/shm."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

SHM_DIR = "/dev/shm"


def _ours() -> set[str]:
    if not os.path.isdir(SHM_DIR):
        return set()
    return {n for n in os.listdir(SHM_DIR) if n.lower().startswith("shmloader")}


@pytest.fixture(autouse=True, scope="session")
def _no_shm_leaks() -> Iterator[None]:
    before = _ours()
    yield
    leaked = _ours() - before
    assert not leaked, f"tests left entries in {SHM_DIR}: {sorted(leaked)}"
