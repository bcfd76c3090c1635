"""Resuming a DDP checkpoint with another number of trainers: every rank's state is merged
into one (record ranges, not queue positions), and the new job's schedule for that epoch is
what is left, split anew. Every record of the epoch reaches the loop exactly once."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _dataset_helpers import dataset, ids_of, source, write_dataset

import shmloader
from shmloader.dataset.core.record_ranges import row_records, to_ranges
from shmloader.dataset.resume.checkpoint import merge_states
from shmloader.errors import ConfigError, ShmloaderError
from shmloader.master.tasks import TaskTable, build_schedule
from shmloader.sources.base import Shard

SIZES = [700, 455]
EPOCHS = 2
SEED = 3
BATCH = 50
STEPS = 3  # batches each rank of the first job delivers before it stops


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    directory = tmp_path_factory.mktemp("data")
    return directory, write_dataset(directory, SIZES)


def _master(directory: Path, world_size: int, **kwargs: Any) -> shmloader.Master:
    return shmloader.Master(
        source(directory),
        records_per_task=100,
        epochs=EPOCHS,
        seed=SEED,
        world_size=world_size,
        lease_timeout=2.0,
        consumer_timeout=10.0,
        **kwargs,
    )


@pytest.fixture(scope="module")
def stopped(
    tmp_path_factory: pytest.TempPathFactory, data: tuple[Path, list[int]]
) -> tuple[list[dict[str, Any]], list[int]]:
    """Two ranks on one master deliver STEPS batches each, save their states and close."""
    directory, _ = data
    tmp = tmp_path_factory.mktemp("first")
    with _master(directory, 2) as master:
        ranks = [
            dataset(
                directory,
                tmp / f"rank{r}",
                master=master.address,
                rank=r,
                world_size=2,
                epochs=EPOCHS,
                seed=SEED,
            )
            for r in range(2)
        ]
        try:
            loaders = [shmloader.DataLoader(ds, batch_size=BATCH) for ds in ranks]
            its = [iter(dl) for dl in loaders]
            seen = [i for it in its for _ in range(STEPS) for i in ids_of(next(it))]
            states = [dl.state_dict() for dl in loaders]
        finally:
            for ds in ranks:
                ds.close()
    assert [s["epoch"] for s in states] == [0, 0]
    assert len(seen) == len(set(seen)) == 2 * STEPS * BATCH
    return states, seen


def test_one_trainer_resumes_a_two_rank_checkpoint(
    tmp_path: Path,
    data: tuple[Path, list[int]],
    stopped: tuple[list[dict[str, Any]], list[int]],
) -> None:
    directory, expected = data
    states, seen = stopped
    with dataset(directory, tmp_path / "one", epochs=EPOCHS, seed=SEED) as ds:
        dl = shmloader.DataLoader(ds, batch_size=BATCH)
        dl.load_state_dict(merge_states(states))
        it = iter(dl)
        rest = [i for _ in range(2) for i in ids_of(next(it))]
        again = dl.state_dict()  # what the first job and this one consumed, as ranges
        assert again["resumed"] and again["epoch"] == 0
        assert sum(b - a for rs in again["consumed"].values() for a, b in rs) == len(seen) + 100
        rest += [i for b in it for i in ids_of(b)]
        assert sorted(seen + rest) == expected  # every record of the epoch exactly once
        assert sorted(i for b in dl for i in ids_of(b)) == expected  # the next epoch whole
        assert dl.state_dict()["epoch"] == EPOCHS


def test_three_ranks_resume_a_two_rank_checkpoint(
    tmp_path: Path,
    data: tuple[Path, list[int]],
    stopped: tuple[list[dict[str, Any]], list[int]],
) -> None:
    directory, expected = data
    states, seen = stopped
    merged = merge_states(states)
    with _master(directory, 3, first_epoch=merged["epoch"], resume=merged["consumed"]) as master:
        ranks = [
            dataset(
                directory,
                tmp_path / f"rank{r}",
                master=master.address,
                rank=r,
                world_size=3,
                epochs=EPOCHS,
                seed=SEED,
            )
            for r in range(3)
        ]
        try:
            loaders = [shmloader.DataLoader(ds, batch_size=BATCH) for ds in ranks]
            for dl in loaders:
                dl.load_state_dict(merged)
            left = len(expected) - len(seen)
            for epoch in range(EPOCHS):
                got = [[ids_of(b) for b in dl] for dl in loaders]
                assert len({len(g) for g in got}) == 1, epoch  # equal batches per rank
                flat = [i for g in got for b in g for i in b]
                todo = expected if epoch else sorted(set(expected) - set(seen))
                share = math.ceil(len(todo) / 3)
                assert len(flat) == 3 * share
                assert set(flat) == set(todo)  # pad repeats a few; nothing seen is read again
                assert sum(n - 1 for n in Counter(flat).values()) == 3 * share - len(todo)
                if epoch == 0:
                    assert len(todo) == left
                    # The epoch is done on every rank: a checkpoint now starts the next.
                    merged_again = merge_states([dl.state_dict() for dl in loaders])
                    assert merged_again["epoch"] == 1
        finally:
            for ds in ranks:
                ds.close()
        assert master.progress().finished


def test_merged_state_holds_the_delivered_records(
    stopped: tuple[list[dict[str, Any]], list[int]],
) -> None:
    states, seen = stopped
    merged = merge_states(states)
    # Exactly the delivered rows, as record ranges of their tasks.
    assert sum(b - a for rs in merged["consumed"].values() for a, b in rs) == len(seen)
    assert merged["dataset"]["rank"] is None and merged["merged"]


def test_merge_states_refuses_mismatches(stopped: tuple[list[dict[str, Any]], list[int]]) -> None:
    states, _ = stopped
    with pytest.raises(ConfigError, match="at least one"):
        merge_states([])
    with pytest.raises(ConfigError, match="epoch"):
        merge_states([states[0], {**states[1], "epoch": 1}])
    other = {**states[1], "dataset": {**states[1]["dataset"], "seed": 99}}
    with pytest.raises(ConfigError, match="seed"):
        merge_states([states[0], other])
    with pytest.raises(ConfigError, match="format"):
        merge_states([states[0], {"format": 99}])
    old = {k: v for k, v in states[1].items() if k != "consumed"}
    with pytest.raises(ConfigError, match="consumed"):
        merge_states([states[0], old])


def test_rows_map_to_records_around_skipped_ones() -> None:
    records = row_records(10, 20, (12, 13, 17), 7)
    assert records.tolist() == [10, 11, 14, 15, 16, 18, 19]
    assert to_ranges(records[[0, 1, 2, 4, 5]]) == [(10, 12), (14, 15), (16, 17), (18, 19)]
    with pytest.raises(ShmloaderError, match="cannot tell"):
        row_records(10, 20, (12,), 7)


def test_one_rank_state_alone_is_refused_by_another_world(
    tmp_path: Path,
    data: tuple[Path, list[int]],
    stopped: tuple[list[dict[str, Any]], list[int]],
) -> None:
    directory, _ = data
    states, _ = stopped
    ds = dataset(directory, tmp_path / "one", epochs=EPOCHS, seed=SEED)
    with ds, pytest.raises(ConfigError, match="merge_states"):
        shmloader.DataLoader(ds, batch_size=BATCH).load_state_dict(states[0])


def test_a_resumed_jobs_rank_state_names_merge_states_for_the_same_world(
    tmp_path: Path,
    data: tuple[Path, list[int]],
    stopped: tuple[list[dict[str, Any]], list[int]],
) -> None:
    # A job resumed from a merged state saves per-rank states whose positions are in its
    # shortened schedule ("resumed"). Loading one into the same rank of the same world was
    # refused with "to resume with another number of trainers", though the number is the same.
    directory, _ = data
    states, _ = stopped
    resumed = {**states[1], "resumed": True}
    address = "127.0.0.1:1"  # never reached: the state is refused before the dataset starts
    ds = dataset(directory, tmp_path / "r1", master=address, rank=1, world_size=2, seed=SEED)
    with ds, pytest.raises(ConfigError, match="resumed epoch 0 from merged") as refused:
        shmloader.DataLoader(ds, batch_size=BATCH).load_state_dict(resumed)
    assert "another number of trainers" not in str(refused.value)


def _units(schedule: Any) -> list[list[tuple[int, int, int]]]:
    return [
        [
            (int(schedule.task[u]), int(schedule.start[u]), int(schedule.stop[u]))
            for u in range(schedule.bounds[q], schedule.bounds[q + 1])
        ]
        for q in range(schedule.num_queues)
    ]


def test_build_schedule_leaves_consumed_records_out() -> None:
    table = TaskTable([Shard("a", 25), Shard("b", 10)], 10)  # tasks: a0 a10 a20 b0
    consumed = {0: [(2, 4), (6, 10)], 2: [(20, 25)], 3: [(0, 3)]}
    one = build_schedule(table, 0, seed=0, shuffle=False, world_size=None, consumed=consumed)
    assert _units(one) == [[(0, 0, 2), (0, 4, 6), (1, 10, 20), (3, 3, 10)]]
    two = build_schedule(table, 0, seed=0, shuffle=False, world_size=2, consumed=consumed)
    # 21 records left: 11 each, the second rank padded with the stream's first record.
    assert _units(two) == [
        [(0, 0, 2), (0, 4, 6), (1, 10, 17)],
        [(1, 17, 20), (3, 3, 10), (0, 0, 1)],
    ]
    drop = build_schedule(
        table, 0, seed=0, shuffle=False, world_size=2, policy="drop", consumed=consumed
    )
    assert drop.dropped == ((3, 9, 10),)
    everything = {t: [(int(table.start[t]), int(table.stop[t]))] for t in range(len(table))}
    empty = build_schedule(table, 0, seed=0, shuffle=False, world_size=2, consumed=everything)
    assert len(empty) == 0 and np.array_equal(empty.bounds, [0, 0, 0])
    with pytest.raises(ConfigError, match="outside task 1"):
        build_schedule(table, 0, seed=0, shuffle=False, world_size=None, consumed={1: [(0, 5)]})
    with pytest.raises(ConfigError, match="task 9"):
        build_schedule(table, 0, seed=0, shuffle=False, world_size=None, consumed={9: [(0, 1)]})


def test_dispatcher_config_resume_survives_json() -> None:
    import json

    from shmloader.master.config import JobConfig

    config = JobConfig(records_per_task=10, resume={3: [(5, 8), (0, 2), (2, 4)]})
    assert config.resume == {3: [(0, 4), (5, 8)]}
    again = JobConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config
