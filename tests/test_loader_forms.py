"""Exactly once wherever users put the loader: the forms a torch user writes first.

- ``torch.utils.data.DataLoader(ds, batch_size=B)`` with no sampler (torch's own
  ``SequentialSampler``, or ``RandomSampler`` with ``shuffle=True``): the positions it hands
  ``__getitems__`` take the next rows of the dataset's order (dataset/natural.py); without
  workers that is exact through ``break``, ``state_dict()`` and a SIGKILL + resume. With workers
  it cannot be, and the training process gets a ``ConfigError`` naming the fix, raised by torch
  itself from the first batch, never a worker's traceback.
- ``shmloader.DataLoader(transform=fn)``: a batch counts as delivered once ``fn`` returned, so
  rows of a batch whose transform raised come again, in the next pass and after a resume.
- A plain DataLoader whose deliveries cannot be reported says so once, with the fix.

Real reader processes, real files, the multiset of delivered ids.
"""

from __future__ import annotations

import inspect
import itertools
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch.utils.data
from _dataset_helpers import dataset, ids_of, saved_killed_resumed, shm_entries, write_dataset

import shmloader

SIZES = [230, 170]  # 400 records, tasks of 100: batches of 32 cross task and block boundaries
BATCH = 32


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    directory = tmp_path_factory.mktemp("data")
    return directory, write_dataset(directory, SIZES)


def natural(ds: Any, *, shuffle: bool = False, **options: Any) -> torch.utils.data.DataLoader:
    """The loader as a torch user writes it: no sampler, no collate_fn."""
    return torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=shuffle, **options)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("stop", [1, 5, 11])
def test_the_natural_loader_gives_each_record_once_through_break(
    tmp_path: Path, data: tuple[Path, list[int]], stop: int
) -> None:
    directory, expected = data
    with dataset(directory, tmp_path, epochs=1) as ds:
        dl = natural(ds)
        assert len(dl) == -(-len(expected) // BATCH)  # torch's own count, from len(ds)
        got: list[int] = []
        for step, batch in enumerate(dl):
            assert type(batch) is not list and set(batch) == {"id", "x"}
            got += ids_of(batch)
            if step + 1 == stop:
                break
        assert len(got) == stop * BATCH
        assert len(dl) == -(-(len(expected) - len(got)) // BATCH)  # what is left
        got += [i for batch in dl for i in ids_of(batch)]  # the rest of the epoch
        assert Counter(got) == Counter(expected)
        assert list(dl) == []  # epochs=1: over
    assert shm_entries(tmp_path) == []


@pytest.mark.timeout(180)
def test_the_natural_loader_gives_each_epoch_once_per_pass(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    directory, expected = data
    with dataset(directory, tmp_path, epochs=3) as ds:
        dl = natural(ds)
        for _ in range(3):
            assert len(dl) == -(-len(expected) // BATCH)
            assert Counter(i for batch in dl for i in ids_of(batch)) == Counter(expected)
        assert len(dl) == 0


@pytest.mark.timeout(180)
def test_a_break_before_the_natural_loaders_short_last_batch_puts_it_in_the_next_pass(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    """Left after 12 of 13 batches, the pass leaves 16 rows, which torch cannot tell from a
    short last batch it dropped (drop_last=True): they come first in the next pass, with the
    next epoch, each once."""
    directory, expected = data
    with dataset(directory, tmp_path, epochs=2) as ds:
        dl = natural(ds)
        first: list[int] = []
        for step, batch in enumerate(dl):
            first += ids_of(batch)
            if step + 1 == 12:
                break
        assert len(dl) == (len(expected) + 16) // BATCH
        second = [i for batch in dl for i in ids_of(batch)]
    assert Counter(first + second[:16]) == Counter(expected)
    assert Counter(second[16:]) == Counter(expected)


@pytest.mark.timeout(180)
def test_the_natural_loader_follows_the_datasets_order(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    """The order is the dataset's (its seed), the same as shmloader.DataLoader's, whatever the
    readers' timing."""
    directory, _ = data

    def order(kind: str, where: Path) -> list[int]:
        with dataset(directory, where, epochs=1) as ds:
            dl: Any = shmloader.DataLoader(ds, batch_size=BATCH) if kind else natural(ds)
            return [i for batch in dl for i in ids_of(batch)]

    ours = order("shmloader", tmp_path / "a")
    assert ours != sorted(ours)  # the dataset shuffles (seed 7)
    assert order("", tmp_path / "b") == ours


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "sampler", ["shuffle", "random", "distributed"], ids=["shuffle=True", "random", "ddp"]
)
def test_a_sampler_of_torchs_is_refused_with_the_fix(
    tmp_path: Path, data: tuple[Path, list[int]], sampler: str
) -> None:
    """torch's shuffle=True (a RandomSampler, which reads len(ds) again at the end of its pass
    and would ask for rows the pass does not have), or another sampler of torch's, gives
    positions out of sequence: refused at the first batch, nothing consumed."""
    directory, expected = data
    with dataset(directory, tmp_path, epochs=1) as ds:
        if sampler == "shuffle":
            dl = natural(ds, shuffle=True)
        else:
            chosen: Any = (
                torch.utils.data.RandomSampler(ds)
                if sampler == "random"
                else torch.utils.data.DistributedSampler(ds, num_replicas=2, rank=0)
            )
            dl = natural(ds, sampler=chosen)
        with pytest.raises(shmloader.ConfigError, match=r"gives the order itself.*Leave shuffle="):
            next(iter(dl))
        got = [i for b in shmloader.DataLoader(ds, batch_size=BATCH) for i in ids_of(b)]
        assert sorted(got) == expected


@pytest.mark.timeout(180)
def test_the_natural_loader_with_drop_last_puts_the_short_tail_in_the_next_pass(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    """torch drops a pass's short last batch without asking for it: those rows stay owed to
    their epoch and come first in the next pass, with the next epoch (400 = 12 * 32 + 16: the
    second pass has 16 + 400 = 13 * 32 rows), never a pass of their own that torch would drop
    again."""
    directory, expected = data
    with dataset(directory, tmp_path, epochs=3) as ds:
        dl = natural(ds, drop_last=True)
        passes = [[i for batch in dl for i in ids_of(batch)] for _ in range(3)]
    tail = len(expected) % BATCH  # 16
    assert [len(p) for p in passes] == [len(expected) - tail, len(expected) + tail, 384]
    seen = Counter(i for p in passes for i in p)
    assert set(seen) == set(expected) and max(seen.values()) == 3
    assert sum(1 for n in seen.values() if n == 2) == tail  # the last epoch's, dropped for good
    assert Counter(passes[0] + passes[1][:tail]) == Counter(expected)  # epoch 0, whole


@pytest.mark.timeout(180)
@pytest.mark.parametrize("pin_memory", [False, True])
def test_the_natural_loader_with_workers_is_refused_in_the_training_process(
    tmp_path: Path, data: tuple[Path, list[int]], pin_memory: bool
) -> None:
    directory, _ = data
    with dataset(directory, tmp_path, epochs=1) as ds:
        dl = natural(ds, num_workers=2, pin_memory=pin_memory)
        with pytest.raises(shmloader.ConfigError) as caught:
            next(iter(dl))
        message = str(caught.value)
        assert message.startswith("a torch DataLoader with workers and its own sampler")
        assert f"shmloader.DataLoader(ds, batch_size={BATCH}, num_workers=...)" in message
        assert "the same arguments less shuffle= and sampler=, which it does not take" in message
        assert "Traceback" not in message and "worker process" not in message
        # Nothing was consumed: shmloader.DataLoader over the same dataset gets every record.
        got = [i for b in shmloader.DataLoader(ds, batch_size=BATCH) for i in ids_of(b)]
        assert sorted(got) == data[1]
    assert shm_entries(tmp_path) == []


@pytest.mark.timeout(240)
@pytest.mark.parametrize("step", [3, 9])
def test_the_natural_loader_saved_then_killed_resumes_exactly(
    tmp_path: Path, data: tuple[Path, list[int]], step: int
) -> None:
    directory, expected = data
    common: dict[str, Any] = {
        "data": str(directory),
        "shm_dir": str(tmp_path / "shm"),
        "kind": "natural",
        "batch_size": BATCH,
        "dataset": {"epochs": 1},
    }
    first, second = saved_killed_resumed(tmp_path, common, step)
    assert Counter(first.ids(0) + second.ids(0)) == Counter(expected)
    assert shm_entries(tmp_path / "shm") == []


class Flaky:
    """A per-batch transform that raises on its ``fail_at``-th call, as a real one might on a
    bad batch (a NaN check, a device out of memory)."""

    def __init__(self, fail_at: int) -> None:
        self.fail_at = fail_at
        self.calls = 0

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        if self.calls == self.fail_at:
            raise ValueError("this batch cannot be used")
        return batch


@pytest.mark.timeout(180)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_raising_transform_loses_nothing_in_the_next_pass(
    tmp_path: Path, data: tuple[Path, list[int]], workers: int
) -> None:
    directory, expected = data
    with dataset(directory, tmp_path, epochs=1) as ds:
        dl = shmloader.DataLoader(ds, batch_size=BATCH, num_workers=workers, transform=Flaky(4))
        got: list[int] = []
        with pytest.raises(ValueError, match="cannot be used"):
            for batch in dl:
                got += ids_of(batch)
        assert len(got) == 3 * BATCH
        got += [i for batch in dl for i in ids_of(batch)]  # the next pass: the rest, with it
    assert Counter(got) == Counter(expected)
    assert shm_entries(tmp_path) == []


@pytest.mark.long
@pytest.mark.timeout(180)
def test_a_raising_transform_caught_saved_and_resumed_loses_nothing(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    directory, expected = data
    got: list[int] = []
    with dataset(directory, tmp_path / "first", epochs=1) as ds:
        dl = shmloader.DataLoader(ds, batch_size=BATCH, num_workers=2, transform=Flaky(6))
        try:
            for batch in dl:
                got += ids_of(batch)
        except ValueError:
            state = dl.state_dict()  # what a loop that catches the error saves
    assert len(got) == 5 * BATCH
    with dataset(directory, tmp_path / "second", epochs=1) as ds:
        dl = shmloader.DataLoader(ds, batch_size=BATCH, num_workers=2)
        dl.load_state_dict(state)
        got += [i for batch in dl for i in ids_of(batch)]
    assert Counter(got) == Counter(expected)


@pytest.mark.timeout(120)
@pytest.mark.skipif(
    "in_order" not in inspect.signature(torch.utils.data.DataLoader).parameters,
    reason="this torch's DataLoader has no in_order",
)
def test_deliveries_that_cannot_be_reported_are_said_once_with_the_fix(
    tmp_path: Path, data: tuple[Path, list[int]], caplog: pytest.LogCaptureFixture
) -> None:
    """A DataLoader given in_order=False hands batches over as workers finish them: torch's
    requests then report nothing, so the rows count as gathered, and the user is told so."""
    directory, expected = data
    with (
        caplog.at_level(logging.WARNING, logger="shmloader"),
        dataset(directory, tmp_path, epochs=2) as ds,
    ):
        dl = torch.utils.data.DataLoader(
            ds, batch_sampler=ds.batch_sampler(BATCH), num_workers=2, in_order=False
        )
        for _ in range(2):
            assert sorted(i for batch in dl for i in ids_of(batch)) == expected
    warned = [r.getMessage() for r in caplog.records if "cannot tell" in r.getMessage()]
    assert len(warned) == 1
    assert "in_order=False" in warned[0]
    assert f"shmloader.DataLoader(ds, batch_size={BATCH}, ...)" in warned[0]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("workers", [0, 2])
def test_islice_and_zip_with_the_loader_last_lose_nothing(
    tmp_path: Path, data: tuple[Path, list[int]], workers: int
) -> None:
    directory, expected = data
    with dataset(directory, tmp_path, epochs=1) as ds:
        dl = shmloader.DataLoader(ds, batch_size=BATCH, num_workers=workers)
        got = [i for batch in itertools.islice(dl, 4) for i in ids_of(batch)]
        got += [i for _, batch in zip(range(3), dl, strict=False) for i in ids_of(batch)]
        assert len(got) == 7 * BATCH
        got += [i for batch in dl for i in ids_of(batch)]
    assert Counter(got) == Counter(expected)
