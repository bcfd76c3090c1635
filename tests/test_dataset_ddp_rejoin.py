"""A DDP job restarted against a standalone master that is in the middle of an epoch: with each
rank's state loaded it delivers the rest exactly once, in equal shares; without, every rank
whose queue is partly consumed refuses to start (it would deliver unequal batches: measured
17/18/17 steps with three ranks, and an all_reduce that waited until its timeout)."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _dataset_helpers import dataset, ids_of, source, write_dataset

import shmloader
from shmloader.errors import ConfigError

WORLD = 2
STEPS = 3  # batches of 64 the first job takes: each rank completes its first task (<= 100)


def ranks(directory: Path, shm: Path, address: str) -> list[Any]:
    return [
        dataset(directory, shm / f"rank{r}", master=address, rank=r, world_size=WORLD, seed=3)
        for r in range(WORLD)
    ]


def test_a_restarted_job_must_load_the_ranks_states(tmp_path: Path) -> None:
    directory = tmp_path / "data"
    expected = write_dataset(directory, [700, 455])  # 1155: 578 per rank, one of padding
    with shmloader.Master(
        source(directory),
        records_per_task=100,
        epochs=1,
        seed=3,
        world_size=WORLD,
        lease_timeout=2.0,
        consumer_timeout=10.0,
    ) as master:
        # The first job: both ranks take STEPS batches, save their states and stop.
        first, states = [], []
        for ds in ranks(directory, tmp_path / "first", master.address):
            with ds:
                dl = shmloader.DataLoader(ds, batch_size=64)
                first.append([i for b in itertools.islice(dl, STEPS) for i in ids_of(b)])
                states.append(dl.state_dict())
        # A new job without the states: each rank names the epoch and the records left.
        for ds in ranks(directory, tmp_path / "bare", master.address):
            with ds, pytest.raises(ConfigError) as refused:
                len(shmloader.DataLoader(ds, batch_size=64))
            message = str(refused.value)
            assert "epoch 0 is partly consumed" in message, message
            assert "rank 0: " in message and "rank 1: " in message, message
            assert "load each rank's state_dict()" in message.lower(), message
        # With them, the ranks deliver the rest in equal batches, every record once.
        loaders = []
        for ds, state in zip(
            ranks(directory, tmp_path / "second", master.address), states, strict=True
        ):
            loaders.append(shmloader.DataLoader(ds, batch_size=64))
            loaders[-1].load_state_dict(state)
        try:
            batches = [[ids_of(b) for b in dl] for dl in loaders]
        finally:
            for dl in loaders:
                dl.dataset.close()
        assert len(batches[0]) == len(batches[1])
        second = [[i for b in rank for i in b] for rank in batches]
        assert master.progress().finished
    share = math.ceil(len(expected) / WORLD)
    got = [a + b for a, b in zip(first, second, strict=True)]
    assert [len(g) for g in got] == [share] * WORLD
    seen = Counter(got[0] + got[1])
    assert set(seen) == set(expected)
    assert sum(seen.values()) - len(seen) == WORLD * share - len(expected)
