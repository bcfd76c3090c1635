"""DDP: ranks that share one standalone master get equal shares (the same number of batches per
epoch, so collectives never hang) and together cover every record."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
from _dataset_helpers import Trainer, dataset, ids_of, source, write_dataset

import shmloader

SIZES = [700, 455]  # 1155 records: odd, so two ranks need one record of padding
WORLD = 2
EPOCHS = 2


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    directory = tmp_path_factory.mktemp("data")
    return directory, write_dataset(directory, SIZES)


@pytest.mark.parametrize(
    ("policy", "cache"),
    # cache=True: a rank's next share is mostly other tasks (and cut elsewhere): what its
    # cache holds serves some of it, and the shares stay equal and whole.
    [("pad", False), ("drop", False), ("pad", True)],
)
def test_ranks_get_equal_batches_and_cover_every_record(
    tmp_path: Path,
    data: tuple[Path, list[int]],
    policy: str,
    cache: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    directory, expected = data
    with shmloader.Master(
        source(directory),
        records_per_task=100,
        epochs=EPOCHS,
        seed=3,
        world_size=WORLD,
        ddp_policy=policy,
        lease_timeout=2.0,
        consumer_timeout=10.0,
    ) as master:
        ranks = [
            dataset(
                directory,
                tmp_path / f"rank{r}",
                master=master.address,
                rank=r,
                world_size=WORLD,
                ddp_policy=policy,
                epochs=EPOCHS,
                seed=3,
                cache=cache,
            )
            for r in range(WORLD)
        ]
        try:
            loaders = [shmloader.DataLoader(ds, batch_size=64, num_workers=1) for ds in ranks]
            for epoch in range(EPOCHS):
                lengths = [len(dl) for dl in loaders]
                per_rank = [[ids_of(b) for b in dl] for dl in loaders]
                batches = [len(p) for p in per_rank]
                assert batches[0] == batches[1] == lengths[0] == lengths[1], epoch
                got = [[i for b in p for i in b] for p in per_rank]
                share = (math.ceil if policy == "pad" else math.floor)(len(expected) / WORLD)
                assert [len(g) for g in got] == [share] * WORLD
                everything = Counter(got[0] + got[1])
                if policy == "pad":
                    assert set(everything) == set(expected)  # the union covers every record
                    assert sum(n - 1 for n in everything.values()) == WORLD * share - len(expected)
                else:
                    assert set(everything) <= set(expected)
                    assert max(everything.values()) == 1
                    assert len(everything) == WORLD * share
        finally:
            for ds in ranks:
                ds.close()
        assert master.progress().finished
    # cache=True is told, once per rank, that a rank's cache serves a part of its next share.
    told = [r for r in caplog.records if "cache=True with 2 DDP ranks" in r.getMessage()]
    assert len(told) == (WORLD if cache else 0)


def test_each_rank_in_its_own_process(tmp_path: Path, data: tuple[Path, list[int]]) -> None:
    directory, expected = data
    with shmloader.Master(
        source(directory),
        records_per_task=100,
        epochs=EPOCHS,
        seed=4,
        world_size=WORLD,
        lease_timeout=2.0,
        consumer_timeout=10.0,
    ) as master:
        trainers = [
            Trainer(
                tmp_path,
                f"rank{r}",
                data=str(directory),
                shm_dir=str(tmp_path / f"shm{r}"),
                dataset={
                    "master": master.address,
                    "rank": r,
                    "world_size": WORLD,
                    "epochs": EPOCHS,
                    "seed": 4,
                },
                loader={"num_workers": 1},
                passes=EPOCHS,
            )
            for r in range(WORLD)
        ]
        for t in trainers:
            assert t.finish() == 0, t.output()
        assert master.progress().finished
    share = math.ceil(len(expected) / WORLD)
    for p in range(EPOCHS):
        batches = [sum(1 for line in t.lines() if line.get("pass") == p) for t in trainers]
        assert batches[0] == batches[1] == math.ceil(share / 64)
        ids = [t.ids(p) for t in trainers]
        assert [len(i) for i in ids] == [share, share]
        assert set(ids[0]) | set(ids[1]) == set(expected)
