"""Checkpoints across processes: a run stops mid-epoch and saves ``state_dict()``; a fresh
process with a new dataset and loader loads it before iterating, delivers exactly the rest of
that epoch, then the next epochs whole."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from _dataset_helpers import Trainer, dataset, ids_of, write_dataset

import shmloader

SIZES = [700, 455]
EPOCHS = 3


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    directory = tmp_path_factory.mktemp("data")
    return directory, write_dataset(directory, SIZES)


@pytest.mark.parametrize("resumed_master", [True, False])
def test_a_standalone_master_and_its_trainer_resume_from_one_plain_state(
    tmp_path: Path, data: tuple[Path, list[int]], resumed_master: bool
) -> None:
    """The state goes to the master (``--resume``, here ``Master(resume=...)``) and to the
    trainer: the master leaves the consumed records out of its schedule, and positions in the
    old schedule named other tasks, whose rows were lost. Without a resumed master, the
    trainer's own state alone still delivers exactly the rest."""
    directory, expected = data
    options = {"epochs": 1, "records_per_task": 100}
    with dataset(directory, tmp_path / "shm", **options) as ds:
        loader = shmloader.DataLoader(ds, batch_size=30, num_workers=2)
        before = []
        for i, batch in enumerate(loader):
            before += batch["id"].tolist()
            if i == 4:
                break
        state = json.loads(json.dumps(loader.state_dict()))
        source = ds.options.source
    resume = {int(t): [tuple(r) for r in rs] for t, rs in state["consumed"].items()}
    with (
        shmloader.Master(
            source,
            records_per_task=100,
            epochs=1,
            seed=7,
            first_epoch=state["epoch"] if resumed_master else 0,
            resume=resume if resumed_master else None,
        ) as master,
        dataset(directory, tmp_path / "shm", **{**options, "master": master.address}) as ds,
    ):
        loader = shmloader.DataLoader(ds, batch_size=30)
        loader.load_state_dict(state)
        rest = [i for batch in loader for i in batch["id"].tolist()]
    assert Counter(before + rest) == Counter(expected)


@pytest.mark.parametrize(
    ("stop_at", "num_workers"),
    [
        ((0, 7), 2),  # mid-epoch 0, with batches prefetched by workers but never delivered
        ((1, 3), 0),  # mid-epoch 1, after a whole epoch
    ],
)
def test_resume_in_a_fresh_process_delivers_exactly_the_rest(
    tmp_path: Path, data: tuple[Path, list[int]], stop_at: tuple[int, int], num_workers: int
) -> None:
    directory, expected = data
    stop_pass = stop_at[0]
    state = tmp_path / "state.json"
    common = {
        "data": str(directory),
        "shm_dir": str(tmp_path / "shm"),
        "dataset": {"epochs": EPOCHS, "shuffle_window": 3},
        "loader": {"num_workers": num_workers},
        "batch_size": 50,
    }
    first = Trainer(
        tmp_path, "first", **common, passes=EPOCHS, stop_at=list(stop_at), save_state=str(state)
    )
    assert first.finish() == 0, first.output()
    assert first.wait_for("stopped")["stopped"] == "close"
    saved = json.loads(state.read_text())
    assert saved["epoch"] == stop_pass
    for p in range(stop_pass):
        assert sorted(first.ids(p)) == expected
    before = first.ids(stop_pass)
    assert len(before) == stop_at[1] * 50

    second = Trainer(tmp_path, "second", **common, passes=EPOCHS - stop_pass, load_state=str(state))
    assert second.finish() == 0, second.output()
    second.wait_for("done")
    rest = second.ids(0)
    assert not set(before) & set(rest)
    assert Counter(before + rest) == Counter(expected)
    for p in range(1, EPOCHS - stop_pass):  # the following epochs, whole
        assert sorted(second.ids(p)) == expected


def test_resumed_order_is_the_uninterrupted_order(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    """With a seed, a resumed epoch (in a new process) continues in the order an uninterrupted
    run would have used, row for row (test_dataset_resume_order.py: batch for batch)."""
    directory, _ = data
    common = {
        "data": str(directory),
        "shm_dir": str(tmp_path / "shm"),
        "dataset": {"epochs": 2, "shuffle_window": 2, "seed": 5},
        "batch_size": 50,
    }
    whole = Trainer(tmp_path, "whole", **common, passes=2)
    state = tmp_path / "state.json"
    part = Trainer(tmp_path, "part", **common, passes=2, stop_at=[0, 4], save_state=str(state))
    assert whole.finish() == 0 and part.finish() == 0
    rest = Trainer(tmp_path, "rest", **common, passes=2, load_state=str(state))
    assert rest.finish() == 0, rest.output()
    assert part.ids(0) == whole.ids(0)[:200]
    assert rest.ids(0) == whole.ids(0)[200:]
    assert rest.ids(1) == whole.ids(1)


def test_state_is_checked_against_the_dataset(tmp_path: Path, data: tuple[Path, list[int]]) -> None:
    directory, _ = data
    with dataset(directory, tmp_path / "a", epochs=1) as ds:
        dl = shmloader.DataLoader(ds, batch_size=50)
        next(iter(dl))
        state = dl.state_dict()
        json.dumps(state)  # plain JSON
        with pytest.raises(shmloader.ConfigError, match="before the first iteration"):
            dl.load_state_dict(state)
    other = dataset(directory, tmp_path / "b", epochs=1, records_per_task=50)
    with other, pytest.raises(shmloader.ConfigError) as info:
        shmloader.DataLoader(other, batch_size=50).load_state_dict(state)
    # The helper's 100 saved, 50 here: the size to give to load it (a state saved with
    # tasks of another size, as those sized from the data or a fixed 4096 of old).
    assert "records_per_task is 100 in the state, 50 here: give records_per_task=100" in str(
        info.value
    )
    same = dataset(directory, tmp_path / "c", epochs=1)
    with same, pytest.raises(shmloader.ConfigError, match="format"):
        shmloader.DataLoader(same, batch_size=50).load_state_dict({"format": 99})


def _first_batches(directory: Path, shm: Path, n: int) -> tuple[list[int], dict]:
    """The rows of a run's first ``n`` batches of 32, and its state after them."""
    with dataset(directory, shm, epochs=2, shuffle_window=4) as ds:
        dl = shmloader.DataLoader(ds, batch_size=32)
        got: list[int] = []
        for i, batch in enumerate(dl):
            got += ids_of(batch)
            if i + 1 == n:
                return got, dl.state_dict()
    raise AssertionError("the epoch ended early")


def test_a_state_saved_right_after_a_resume_still_leaves_out_what_was_consumed(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    """A resumed run that saves before its loop took up the tasks the loaded state had
    consumed part of (at the start of an epoch's loop, say) must save those rows too: they
    were missing, and a second resume delivered them again (with an embedded master: 20 of
    160 rows twice in the reproducer, one task's worth; before done_before, all 160)."""
    directory, expected = data
    before, state = _first_batches(directory, tmp_path / "a", 5)
    assert state["partial_seqs"], state  # the case: tasks consumed in part
    with dataset(directory, tmp_path / "b", epochs=2, shuffle_window=4) as ds:
        dl = shmloader.DataLoader(ds, batch_size=32)
        dl.load_state_dict(state)
        ds.start()
        again = dl.state_dict()  # nothing admitted yet
    assert again["partial_seqs"] == state["partial_seqs"]
    assert again["completed_seqs"] == state["completed_seqs"]
    with dataset(directory, tmp_path / "c", epochs=2, shuffle_window=4) as ds:
        dl = shmloader.DataLoader(ds, batch_size=32)
        dl.load_state_dict(again)
        rest = [r for batch in dl for r in ids_of(batch)]
    assert Counter(before + rest) == Counter(expected)


def test_the_last_state_loaded_is_the_one_that_counts(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    """A state saved after the last epoch, then a mid-epoch one, loaded into one loader: the
    first one's "finished" and its every-record-consumed schedule stayed, and the resumed
    epoch delivered every row (1155) instead of the rest."""
    directory, expected = data
    before, mid = _first_batches(directory, tmp_path / "a", 5)
    with dataset(directory, tmp_path / "b", epochs=2, shuffle_window=4) as ds:
        dl = shmloader.DataLoader(ds, batch_size=32)
        for _ in range(2):
            for _ in dl:
                pass
        end = dl.state_dict()
    with dataset(directory, tmp_path / "c", epochs=2, shuffle_window=4) as ds:
        dl = shmloader.DataLoader(ds, batch_size=32)
        dl.load_state_dict(end)
        dl.load_state_dict(mid)
        rest = [r for batch in dl for r in ids_of(batch)]
        then = [r for batch in dl for r in ids_of(batch)]
    assert Counter(before + rest) == Counter(expected)
    assert Counter(then) == Counter(expected)
