"""``len(dl)`` is the number of batches the next pass delivers: after a ``break``, after a
resume, after the last epoch; and a loader whose dataset was closed says so. Real readers,
real DataLoader workers, an embedded master."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _dataset_helpers import data_loader, dataset, ids_of, source, write_dataset

import shmloader
from shmloader.errors import StoreClosedError

SIZES = [700, 650, 500, 800, 350]  # 3000 records: tasks of 100
BATCH = 64


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    directory = tmp_path_factory.mktemp("data")
    return directory, write_dataset(directory, SIZES)


def loader(ds: Any, kind: str, num_workers: int, drop_last: bool = False) -> Any:
    return data_loader(ds, kind, BATCH, num_workers, drop_last=drop_last)


def first_batches(dl: Any, n: int) -> list[int]:
    """The ids of the first ``n`` batches of a pass, which is then left (``break``)."""
    got: list[int] = []
    for i, batch in enumerate(dl):
        got += ids_of(batch)
        if i + 1 == n:
            break
    return got


def whole_pass(dl: Any) -> tuple[int, list[int]]:
    """(len(dl) before the pass, the ids it delivered), checking the pass had that many."""
    length = len(dl)
    batches = [ids_of(batch) for batch in dl]
    assert len(batches) == length, f"len(dl) said {length}, the pass gave {len(batches)}"
    return length, [i for b in batches for i in b]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", ["shmloader", "batch_sampler", "torch"])
def test_len_after_a_break_is_what_the_next_pass_delivers(
    tmp_path: Path, data: tuple[Path, list[int]], kind: str, num_workers: int
) -> None:
    """It was the whole epoch's 47 batches: 42 came after a break at 5, 2 after a break at
    45 (or 2 with two workers, which had taken the rest: it depended on num_workers)."""
    directory, expected = data
    with dataset(directory, tmp_path, epochs=None) as ds:
        dl = loader(ds, kind, num_workers)
        for stop in (5, 45):
            first = first_batches(dl, stop)
            rows = len(ds)
            length, rest = whole_pass(dl)
            if kind == "torch":  # ours deliver the rest of an epoch alone (see chunks)
                assert rows == len(rest)
            # Under sampler=ds.sampler() with workers, prefetched batches are lost.
            if kind != "torch" or num_workers == 0:
                assert length == -(-(len(expected) - len(first)) // BATCH)
                assert sorted(first + rest) == expected
        assert whole_pass(dl)[0] == -(-len(expected) // BATCH)  # a whole epoch again


def test_ddp_ranks_that_stop_at_the_same_step_get_the_same_len(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    """Two ranks of 1500 rows each (24 batches) break after 3 batches: each next pass is 21
    batches, and len(dl) says so on both (a collective per step would not hang)."""
    directory, expected = data
    with shmloader.Master(
        source(directory), records_per_task=100, world_size=2, epochs=None, seed=7
    ) as master:
        ranks = [
            dataset(directory, tmp_path / f"r{r}", master=master.address, rank=r, world_size=2)
            for r in range(2)
        ]
        try:
            loaders = [shmloader.DataLoader(ds, batch_size=BATCH, num_workers=1) for ds in ranks]
            first = [first_batches(dl, 3) for dl in loaders]
            lengths = [len(dl) for dl in loaders]
            rest = [whole_pass(dl)[1] for dl in loaders]
            assert lengths == [-(-(1500 - 3 * BATCH) // BATCH)] * 2
            assert sorted(i for part in first + rest for i in part) == expected
            assert [len(dl) for dl in loaders] == [-(-1500 // BATCH)] * 2
        finally:
            for ds in ranks:
                ds.close()


@pytest.mark.parametrize(
    ("stop", "num_workers", "kind", "drop_last", "merged"),
    [
        (1, 2, "shmloader", False, False),
        (37, 2, "shmloader", False, False),
        (46, 0, "shmloader", False, False),
        (10, 0, "shmloader", True, False),
        (10, 0, "batch_sampler", False, False),
        (10, 2, "torch", False, False),
        (44, 0, "shmloader", False, True),  # another world: the master leaves them out
    ],
)
def test_len_after_a_resume_is_what_is_left_of_the_epoch(
    tmp_path: Path,
    data: tuple[Path, list[int]],
    stop: int,
    num_workers: int,
    kind: str,
    drop_last: bool,
    merged: bool,
) -> None:
    """The tasks the state consumed are still in the master's schedule (the readers skip
    them): len(dl) was 47 however much was consumed (the loop then got 46, 37, 1, ...)."""
    directory, expected = data
    with dataset(directory, tmp_path, epochs=None) as ds:
        dl = shmloader.DataLoader(ds, batch_size=BATCH, num_workers=num_workers)
        first = first_batches(dl, stop)
        state = dl.state_dict()
    if merged:
        state = shmloader.merge_states([state])
    with dataset(directory, tmp_path, epochs=None) as ds:
        shmloader.DataLoader(ds, batch_size=BATCH).load_state_dict(state)
        dl = loader(ds, kind, num_workers, drop_last)
        left = len(expected) - len(first)
        assert len(ds) == left
        length, rest = whole_pass(dl)
        assert length == (left // BATCH if drop_last else -(-left // BATCH))
        if not drop_last:
            assert sorted(first + rest) == expected
        whole = len(expected) // BATCH if drop_last else -(-len(expected) // BATCH)
        assert whole_pass(dl)[0] == whole


@pytest.mark.parametrize("resume", [False, True])
def test_records_the_source_skipped_are_not_counted_as_rows_left(
    tmp_path: Path, resume: bool
) -> None:
    """Rows are not records: tasks 0 and 1 (in plan order) each lost a record to
    ``on_error="skip"``, and the 200 rows delivered took 202 records, so 2797 rows are left
    (2800 counting the rows delivered as records). Task 25, not read when len() is asked,
    lost one too: len() counts its 100 records until it is admitted (an upper bound)."""
    directory = tmp_path / "data"
    expected = write_dataset(directory, SIZES, poison={5, 150, 2500})
    options: dict[str, Any] = {"epochs": None, "shuffle": False, "on_error": "skip"}
    with dataset(directory, tmp_path / "shm", **options) as ds:
        dl = shmloader.DataLoader(ds, batch_size=10, num_workers=2)
        first = first_batches(dl, 20)
        if resume:
            state = dl.state_dict()
            ds.close()
            ds = dataset(directory, tmp_path / "shm", **options)
            dl = shmloader.DataLoader(ds, batch_size=10, num_workers=2)
            dl.load_state_dict(state)
        with ds:
            rows = len(ds)
            rest = [i for batch in dl for i in ids_of(batch)]
    assert sorted(first + rest) == sorted(set(expected) - {5, 150, 2500})
    assert len(rest) == 2797
    assert len(rest) <= rows <= len(rest) + 1


@pytest.mark.parametrize("merged", [False, True])
def test_a_state_saved_after_the_last_epoch_resumes_with_empty_passes(
    tmp_path: Path, data: tuple[Path, list[int]], merged: bool
) -> None:
    """It was accepted, then the first len() or batch raised ConfigError ("first_epoch 2 is
    past the last epoch") from the embedded master's start."""
    directory, expected = data
    with dataset(directory, tmp_path, epochs=2) as ds:
        dl = shmloader.DataLoader(ds, batch_size=BATCH, num_workers=1)
        for _ in range(2):
            assert sorted(whole_pass(dl)[1]) == expected
        state = dl.state_dict()
    assert state["epoch"] == 2
    if merged:
        state = shmloader.merge_states([state])
    for _ in range(2):  # and the state saved after resuming resumes the same way
        with dataset(directory, tmp_path, epochs=2) as ds:
            dl = shmloader.DataLoader(ds, batch_size=BATCH, num_workers=1)
            dl.load_state_dict(state)
            assert len(dl) == 0 and len(ds) == 0
            assert list(dl) == [] and list(dl) == []
            state = dl.state_dict()
            assert state["epoch"] >= 2  # each pass after the last is one more (empty) epoch
            assert not state["completed_seqs"] and not state["consumed"]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_next_batch_after_closing_the_dataset_says_it_was_closed(
    tmp_path: Path, data: tuple[Path, list[int]], num_workers: int
) -> None:
    """With workers it raised FileNotFoundError "batch ring ... is gone (its worker
    exited?)": a batch prefetched into a ring that went with the store."""
    directory, _ = data
    with dataset(directory, tmp_path, epochs=None) as ds:
        dl = shmloader.DataLoader(ds, batch_size=BATCH, num_workers=num_workers)
        it = iter(dl)
        for _ in range(5):
            next(it)
        ds.close()
        with pytest.raises(StoreClosedError, match="no longer exists: its owner closed it"):
            next(it)
        del it


@pytest.mark.parametrize("how", ["fresh", "positions", "merged", "rank"])
def test_len_before_the_first_batch_starts_nothing(
    tmp_path: Path, data: tuple[Path, list[int]], how: str
) -> None:
    """``len(ds)`` and ``len(dl)`` before the first iteration are worked out from the plan: no
    master, no reader configured; and they are what the first pass then delivers, also after
    a state is loaded (by positions, or merged record ranges) and for a DDP rank's share."""
    directory, expected = data
    options: dict[str, Any] = {"epochs": 2}
    if how == "rank":
        options.update(rank=1, world_size=2)
    state = None
    if how in ("positions", "merged"):
        with dataset(directory, tmp_path / "before", epochs=2) as ds:
            dl = shmloader.DataLoader(ds, batch_size=BATCH)
            first_batches(dl, 7)
            state = dl.state_dict()
        if how == "merged":
            state = shmloader.merge_states([state])
    with dataset(directory, tmp_path / "shm", **options) as ds:
        dl = shmloader.DataLoader(ds, batch_size=BATCH)
        if state is not None:
            dl.load_state_dict(state)
        rows, batches = len(ds), len(dl)
        assert not ds.started  # nothing started
        length, got = whole_pass(dl)
        assert (rows, batches) == (len(got), length)
        if how == "fresh":
            assert sorted(got) == expected
        elif how != "rank":
            assert len(got) == len(expected) - 7 * BATCH


@pytest.mark.parametrize("kind", ["shmloader", "batch_sampler"])
def test_a_loop_that_stops_after_the_last_batch_gets_the_next_epoch_whole(data, tmp_path, kind):
    """A loop that stops once it had len(dl) batches (as Lightning's does) never runs the pass
    to its end; nothing of that epoch is left, so the next pass is the next epoch, whole."""
    directory, expected = data
    with dataset(directory, tmp_path / "shm", epochs=3) as ds:
        dl = loader(ds, kind, 0)
        for _ in range(2):
            n = len(dl)
            assert n == 47
            got = first_batches(dl, n)  # the pass is left after its last batch
            assert sorted(got) == expected
        length, got = whole_pass(dl)
        assert length == 47 and sorted(got) == expected
        assert len(dl) == 0


def test_length_epoch_counts_the_whole_epoch_whatever_was_delivered(data, tmp_path):
    directory, expected = data
    with dataset(directory, tmp_path / "shm", epochs=2) as ds:
        rest = shmloader.DataLoader(ds, batch_size=BATCH)
        epoch = shmloader.DataLoader(ds, batch_size=BATCH, length="epoch")
        assert len(rest) == len(epoch) == 47  # before the start: from the plan
        got = first_batches(rest, 10)
        assert len(rest) == 37 and len(epoch) == 47
        _, more = whole_pass(rest)
        assert sorted(got + more) == expected
        assert len(epoch) == 47  # the next epoch
        assert len(shmloader.DataLoader(ds, batch_size=BATCH, length="epoch", drop_last=True)) == 46
    with pytest.raises(shmloader.ConfigError, match="length must be one of 'rest', 'epoch'"):
        shmloader.DataLoader(ds, batch_size=BATCH, length="all")  # type: ignore[arg-type]
