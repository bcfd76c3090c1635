"""A resumed epoch, and one continued after a ``break``, go on in the uninterrupted order:
batch for batch the rest is what a run that never stopped delivers (with a seed and a budget
that holds whole blocks). Tasks of 20 rows, window 4 and batches of 20: blocks of 1, 2, 4, 4,
... tasks end at rows 20, 60, 140, 220, ..., so checkpoints after 1 and 3 batches fall on a
block boundary, after 5 and 9 inside a block whose tasks are partly consumed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _dataset_helpers import dataset, ids_of, write_dataset

import shmloader

SIZES = [300, 200, 160]  # 33 tasks of 20
OPTIONS: dict[str, Any] = {"records_per_task": 20, "shuffle_window": 4, "epochs": 2, "seed": 11}
Batches = list[list[int]]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    directory = tmp_path_factory.mktemp("data")
    return directory, write_dataset(directory, SIZES)


def _whole(directory: Path, shm: Path, batch_size: int, num_workers: int) -> list[Batches]:
    with dataset(directory, shm, **OPTIONS) as ds:
        dl = shmloader.DataLoader(ds, batch_size=batch_size, num_workers=num_workers)
        return [[ids_of(b) for b in dl] for _ in range(2)]


@pytest.fixture(scope="module")
def uninterrupted(
    data: tuple[Path, list[int]], tmp_path_factory: pytest.TempPathFactory
) -> dict[int, list[Batches]]:
    """The epochs of a run that never stops, by batch size (and the same with workers)."""
    directory, expected = data
    runs = {}
    for batch_size in (20, 32):
        runs[batch_size] = _whole(directory, tmp_path_factory.mktemp("whole"), batch_size, 0)
        for epoch in runs[batch_size]:
            assert sorted(i for batch in epoch for i in batch) == expected
    assert _whole(directory, tmp_path_factory.mktemp("whole"), 20, 2) == runs[20]
    return runs


def _first(dl: Any, stop: int) -> list[list[int]]:
    """The ids of the loop's first ``stop`` batches, then ``break``."""
    before = []
    for batch in dl:
        before.append(ids_of(batch))
        if len(before) == stop:
            break
    return before


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize(("batch_size", "stop"), [(20, 1), (20, 3), (20, 5), (20, 9), (32, 3)])
def test_a_resumed_epoch_delivers_the_uninterrupted_rest(
    tmp_path: Path,
    data: tuple[Path, list[int]],
    uninterrupted: dict[int, list[Batches]],
    num_workers: int,
    batch_size: int,
    stop: int,
) -> None:
    directory, _ = data
    whole = uninterrupted[batch_size]
    with dataset(directory, tmp_path / "a", **OPTIONS) as ds:
        dl = shmloader.DataLoader(ds, batch_size=batch_size, num_workers=num_workers)
        before = _first(dl, stop)
        state = dl.state_dict()
    assert before == whole[0][:stop]
    with dataset(directory, tmp_path / "b", **OPTIONS) as ds:
        dl = shmloader.DataLoader(ds, batch_size=batch_size, num_workers=num_workers)
        dl.load_state_dict(state)
        rest = [[ids_of(b) for b in dl] for _ in range(2)]
    assert rest[0] == whole[0][stop:]
    assert rest[1] == whole[1]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize(("batch_size", "stop"), [(20, 3), (20, 5), (32, 3)])
def test_a_pass_continued_after_break_delivers_the_uninterrupted_rest(
    tmp_path: Path,
    data: tuple[Path, list[int]],
    uninterrupted: dict[int, list[Batches]],
    num_workers: int,
    batch_size: int,
    stop: int,
) -> None:
    directory, _ = data
    whole = uninterrupted[batch_size]
    with dataset(directory, tmp_path / "shm", **OPTIONS) as ds:
        dl = shmloader.DataLoader(ds, batch_size=batch_size, num_workers=num_workers)
        before = _first(dl, stop)
        rest = [ids_of(b) for b in dl]
        following = [ids_of(b) for b in dl]
    assert before + rest == whole[0]
    assert following == whole[1]


def _inside_a_block(state: dict[str, Any]) -> bool:
    """Whether the state has tasks of a block partly consumed and one after them consumed
    whole (so a resumed run does not read it), with rows of two tasks left."""
    partly = [int(seq) for seq in state["partial_seqs"]]
    return len(partly) >= 2 and max(state["completed_seqs"], default=-1) > min(partly)


def test_records_the_source_skipped_leave_the_resumed_order_as_it_was(tmp_path: Path) -> None:
    """A block's permutation is over its tasks' records, the skipped ones too: a resumed run
    does not read the tasks consumed before (it cannot know how many records they skipped),
    and still lays their block out as the uninterrupted run did. The checkpoint is the first
    with a task of the partly consumed block consumed whole (small batches: the
    rest of that block spans several, and a batch's rows are sorted)."""
    directory = tmp_path / "data"
    expected = [i for i in write_dataset(directory, SIZES, poison=range(3, 660, 9)) if i % 9 != 3]
    options = {**OPTIONS, "on_error": "skip"}
    with dataset(directory, tmp_path / "w", **options) as ds:
        dl = shmloader.DataLoader(ds, batch_size=2)
        whole = [[ids_of(b) for b in dl] for _ in range(2)]
    assert sorted(i for batch in whole[0] for i in batch) == expected
    with dataset(directory, tmp_path / "a", **options) as ds:
        dl = shmloader.DataLoader(ds, batch_size=2)
        stop = 0
        for _ in dl:
            stop += 1
            state = dl.state_dict()
            if _inside_a_block(state):
                break
    assert _inside_a_block(state)
    with dataset(directory, tmp_path / "b", **options) as ds:
        dl = shmloader.DataLoader(ds, batch_size=2)
        dl.load_state_dict(state)
        rest = [[ids_of(b) for b in dl] for _ in range(2)]
    assert rest == [whole[0][stop:], whole[1]]
