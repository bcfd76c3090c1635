"""Every record reaches the training loop once per epoch, in a reproducible order, with real
reader processes and real DataLoader workers (both our DataLoader and torch's)."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch.utils.data
from _dataset_helpers import dataset, ids_of, source, write_dataset

import shmloader
from shmloader.shm.names import start_token

SIZES = [1000, 517, 730]  # tasks of 100: 10 + 6 + 8, two of them short
BATCH = 64


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    directory = tmp_path_factory.mktemp("data")
    return directory, write_dataset(directory, SIZES)


def make_loader(ds: Any, kind: str, **kwargs: Any) -> Any:
    if kind == "shmloader":
        return shmloader.DataLoader(ds, batch_size=BATCH, **kwargs)
    return torch.utils.data.DataLoader(
        ds, batch_size=BATCH, sampler=ds.sampler(), collate_fn=ds.collate, **kwargs
    )


def one_pass(dl: Any) -> list[int]:
    return [i for batch in dl for i in ids_of(batch)]


def assert_once(got: list[int], expected: list[int]) -> None:
    twice = sorted(i for i, n in Counter(got).items() if n > 1)
    missing = sorted(set(expected) - set(got))
    assert not twice and not missing, f"delivered twice: {twice[:20]}, lost: {missing[:20]}"
    assert len(got) == len(expected)


@pytest.mark.parametrize("num_workers", [0, 1, 2])
@pytest.mark.parametrize("kind", ["shmloader", "torch"])
def test_every_record_once_per_epoch(
    tmp_path: Path, data: tuple[Path, list[int]], kind: str, num_workers: int
) -> None:
    directory, expected = data
    # epochs=None: the master never runs out; each full pass of the loader is the next epoch.
    with dataset(directory, tmp_path, epochs=None) as ds:
        dl = make_loader(ds, kind, num_workers=num_workers)
        for _ in range(2):
            assert len(ds) == len(expected)
            assert_once(one_pass(dl), expected)
        stats = ds.stats()
        assert stats.records_consumed == 2 * len(expected)
        assert stats.duplicate_tasks == 0 and stats.records_skipped == 0
        assert len(stats.readers) == 2
        assert all(start_token(r.pid) is not None for r in stats.readers)
        assert sum(r.records for r in stats.readers) >= 2 * len(expected)


def test_a_pass_left_early_is_finished_by_the_next(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    directory, expected = data
    with dataset(directory, tmp_path, epochs=2) as ds:
        dl = make_loader(ds, "torch", num_workers=2)
        first: list[int] = []
        for i, batch in enumerate(dl):
            first += ids_of(batch)
            if i == 4:
                break  # prefetched batches of the two workers are never seen by the loop
        rest = one_pass(dl)
        # torch's DataLoader completes on gather: rows gathered for the abandoned iterator
        # but never seen are lost to the loop, never duplicated.
        assert not set(first) & set(rest)
        assert len(set(first) | set(rest)) == len(first) + len(rest) <= len(expected)
        assert_once(one_pass(dl), expected)  # epoch 1 is whole again


def test_shmloader_loader_redelivers_what_the_loop_never_saw(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    directory, expected = data
    with dataset(directory, tmp_path, epochs=2) as ds:
        dl = make_loader(ds, "shmloader", num_workers=2)
        first: list[int] = []
        for i, batch in enumerate(dl):
            first += ids_of(batch)
            if i == 4:
                break
        rest = one_pass(dl)
        assert_once(first + rest, expected)
        assert_once(one_pass(dl), expected)


@pytest.mark.parametrize("drop_last", [False, True])
def test_a_break_in_an_epochs_last_batches_is_finished_alone_by_the_next_pass(
    tmp_path: Path, data: tuple[Path, list[int]], drop_last: bool
) -> None:
    """Two workers prefetch 4 batches: a break 3 batches before the end leaves the sampler's
    pass finished, with rows gathered that the loop never received. The next pass is just
    those (the rest of the epoch), and the one after a whole epoch: the rest used to come
    first in a pass that then ran through the whole next epoch."""
    directory, expected = data
    with dataset(directory, tmp_path, epochs=None) as ds:
        dl = make_loader(ds, "shmloader", num_workers=2, drop_last=drop_last)
        stop = len(expected) // BATCH - 3
        first: list[int] = []
        for i, batch in enumerate(dl):
            first += ids_of(batch)
            if i + 1 == stop:
                break
        left = len(expected) - len(first)  # the rest of the epoch: this pass's length
        assert len(dl) == (left // BATCH if drop_last else -(-left // BATCH))
        rest = one_pass(dl)
        kept = len(expected) - len(expected) % BATCH if drop_last else len(expected)
        assert len(first) + len(rest) == kept
        assert_once(first + rest, (first + rest) if drop_last else expected)
        assert dl.state_dict()["epoch"] == 1
        assert len(dl) == (len(expected) // BATCH if drop_last else -(-len(expected) // BATCH))
        whole = one_pass(dl)
        assert len(whole) == kept and len(set(whole)) == kept


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", ["shmloader", "batch_sampler"])
def test_drop_last_drops_the_short_batch_for_its_epoch(
    tmp_path: Path, data: tuple[Path, list[int]], kind: str, num_workers: int
) -> None:
    directory, expected = data
    full = len(expected) // BATCH  # 2247 rows: 35 batches, 7 rows dropped per epoch
    with dataset(directory, tmp_path, epochs=None) as ds:
        if kind == "shmloader":
            dl: Any = shmloader.DataLoader(
                ds, batch_size=BATCH, drop_last=True, num_workers=num_workers
            )
        else:  # a plain DataLoader, reported through the dataset's batch sampler
            dl = torch.utils.data.DataLoader(
                ds,
                batch_sampler=ds.batch_sampler(BATCH, drop_last=True),
                collate_fn=ds.collate,
                num_workers=num_workers,
            )
        for epoch in range(3):
            assert len(dl) == full
            got = one_pass(dl)
            # Dropped rows do not come back in the next pass (they did: 36 batches, repeats).
            assert len(got) == full * BATCH == len(set(got))
            assert set(got) <= set(expected)
            if kind == "shmloader":
                assert dl.state_dict()["epoch"] == epoch + 1
        if kind == "shmloader":
            assert ds.stats().records_consumed == 3 * len(expected)


def test_torchs_own_drop_last_leaves_rows_for_the_next_pass_and_says_so(
    tmp_path: Path, data: tuple[Path, list[int]], caplog: pytest.LogCaptureFixture
) -> None:
    directory, expected = data
    with dataset(directory, tmp_path, epochs=None) as ds:
        dl = torch.utils.data.DataLoader(
            ds, batch_size=BATCH, sampler=ds.sampler(), collate_fn=ds.collate, drop_last=True
        )
        first = one_pass(dl)
        with caplog.at_level(logging.WARNING, logger="shmloader.dataset"):
            second = one_pass(dl)
    dropped = set(expected) - set(first)
    assert len(dropped) == len(expected) % BATCH
    assert dropped <= set(second[:BATCH])  # owed to epoch 0: first in the next pass
    assert "ds.batch_sampler(batch_size, drop_last=True)" in caplog.text


def run_ids(directory: Path, shm_dir: Path, *, seed: int, num_workers: int) -> list[list[int]]:
    with dataset(directory, shm_dir, epochs=2, seed=seed, shuffle_window=4) as ds:
        dl = make_loader(ds, "shmloader", num_workers=num_workers)
        return [one_pass(dl) for _ in range(2)]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_same_seed_same_order(
    tmp_path: Path, data: tuple[Path, list[int]], num_workers: int
) -> None:
    directory, expected = data
    a = run_ids(directory, tmp_path / "a", seed=11, num_workers=num_workers)
    b = run_ids(directory, tmp_path / "b", seed=11, num_workers=num_workers)
    assert a == b
    assert a[0] != a[1]  # each epoch has its own order
    assert sorted(a[0]) == sorted(a[1]) == expected
    c = run_ids(directory, tmp_path / "c", seed=12, num_workers=num_workers)
    assert c[0] != a[0] and sorted(c[0]) == expected


def test_no_shuffle_keeps_file_order(tmp_path: Path, data: tuple[Path, list[int]]) -> None:
    directory, expected = data
    with dataset(directory, tmp_path, epochs=1, shuffle=False) as ds:
        assert one_pass(make_loader(ds, "shmloader", num_workers=2)) == expected


def test_an_order_that_the_budget_made_depend_on_timing_is_warned_about(
    tmp_path: Path, data: tuple[Path, list[int]], caplog: pytest.LogCaptureFixture
) -> None:
    """Room for three segments, blocks of up to 8 tasks: the sampler must go on with part of
    a block (rows still once each), and then a rerun with the same seed may see other
    batches. That used to pass in silence; a warning says so, once. An ample budget says
    nothing."""
    from shmloader.shm import ipc_file_size

    directory, expected = data
    src = source(directory)
    one = ipc_file_size(src.read(src.plan()[0], 0, 100))
    sampler_log = "shmloader.dataset.order.sampler"
    with caplog.at_level(logging.WARNING, logger=sampler_log):
        with dataset(directory, tmp_path / "small", shm_budget=3 * one) as ds:
            assert_once(one_pass(make_loader(ds, "shmloader")), expected)
        # Once, however often it happens. (Starved with nothing ready, the sampler may also
        # hand out a short batch, and say that in a warning of its own: timing decides.)
        said = [r.getMessage() for r in caplog.records if r.name == sampler_log]
        assert len([m for m in said if "depends on timing" in m]) == 1, said
        caplog.clear()
        with dataset(directory, tmp_path / "ample") as ds:
            assert_once(one_pass(make_loader(ds, "shmloader")), expected)
        assert not [r for r in caplog.records if r.name == sampler_log]


@pytest.mark.parametrize(("ours_first", "workers"), [(0, 0), (10, 0), (10, 2), (0, 2)])
def test_a_plain_loader_after_ours_consumes_what_it_gathers(
    tmp_path: Path, data: tuple[Path, list[int]], ours_first: int, workers: int
) -> None:
    """Loaders used one after the other continue each other's epochs, whichever they are. Once
    a shmloader.DataLoader existed, rows a plain DataLoader then gathered counted as consumed
    only when "delivered", which a plain loader never says: its tasks never completed, their
    segments stayed, and the next pass delivered those rows again as the rest of the epoch."""
    directory, expected = data
    with dataset(directory, tmp_path, epochs=1) as ds:
        ours = make_loader(ds, "shmloader", num_workers=workers)
        it = iter(ours)
        got = [i for _ in range(ours_first) for i in ids_of(next(it))]
        del it
        got += one_pass(make_loader(ds, "torch", num_workers=workers))
        assert_once(got, expected)
        assert one_pass(ours) == []  # epochs=1: the one epoch is done
        assert ds.stats().records_consumed == len(expected)
