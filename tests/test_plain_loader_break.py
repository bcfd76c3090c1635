"""``break``, then the next pass, with a plain ``torch.utils.data.DataLoader``.

Without workers the batch the loop got is the last one gathered, so every record comes once
per epoch, as with shmloader.DataLoader. With workers and ``batch_sampler=ds.batch_sampler()``
the dataset learns from torch's requests which batches reached the loop (delivery.py): exact
too. With ``sampler=ds.sampler()`` torch's BatchSampler hides that, torch drops the batches it
had prefetched when the pass is left, and the dataset (which sees gathers, not deliveries)
counted them delivered: the next pass says how many rows its workers had gathered and why
some never reached the loop.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch.utils.data
from _dataset_helpers import data_loader, dataset, ids_of, shm_entries, write_dataset

PREFETCHED = "ended early (a break?) under a plain torch.utils.data.DataLoader"


def _break_then_finish(tmp_path: Path, kind: str, num_workers: int) -> tuple[list[int], Counter]:
    expected = write_dataset(tmp_path / "data", [400, 400])
    with dataset(tmp_path / "data", tmp_path / "shm", epochs=1) as ds:
        dl = data_loader(ds, kind, 32, num_workers)
        got: list[int] = []
        for step, batch in enumerate(dl):
            got += ids_of(batch)
            if step == 9:
                break
        for batch in dl:  # the rest of the epoch
            got += ids_of(batch)
    assert shm_entries(tmp_path / "shm") == []
    return expected, Counter(got)

    return expected, Counter(got)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["torch", "shmloader"])
def test_without_workers_every_record_comes_once(
    tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="shmloader"):
        expected, got = _break_then_finish(tmp_path, kind, 0)
    assert got == Counter(expected)
    assert PREFETCHED not in caplog.text


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["shmloader", "batch_sampler"])
def test_with_workers_shmloader_dataloader_is_exact(
    tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="shmloader"):
        expected, got = _break_then_finish(tmp_path, kind, 2)
    assert got == Counter(expected)
    assert PREFETCHED not in caplog.text


@pytest.mark.timeout(120)
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("prefetch_factor", [1, 3])
def test_a_plain_dataloader_given_the_batch_sampler_is_exact_through_breaks(
    tmp_path: Path, persistent: bool, prefetch_factor: int
) -> None:
    """Breaks at several steps, over two epochs, with persistent workers or not and another
    prefetch depth: each epoch delivers every record once."""

    expected = write_dataset(tmp_path / "data", [300, 300])
    with dataset(tmp_path / "data", tmp_path / "shm", epochs=2) as ds:
        dl = torch.utils.data.DataLoader(
            ds,
            batch_sampler=ds.batch_sampler(32),
            collate_fn=ds.collate,
            num_workers=2,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent,
        )
        for epoch in range(2):
            got: list[int] = []
            for stop in (3, 1, 7):
                for step, batch in enumerate(dl):
                    got += ids_of(batch)
                    if step == stop:
                        break
            for batch in dl:  # the rest of the epoch
                got += ids_of(batch)
            assert Counter(got) == Counter(expected), f"epoch {epoch}"
    assert shm_entries(tmp_path / "shm") == []


@pytest.mark.timeout(120)
def test_with_workers_a_plain_dataloader_says_what_its_prefetch_cost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="shmloader"):
        expected, got = _break_then_finish(tmp_path, "torch", 2)
    assert max(got.values()) == 1 and set(got) <= set(expected)  # never twice
    lost = len(expected) - len(got)
    assert 0 < lost <= 2 * 2 * 32  # torch's default prefetch: 2 batches per worker
    (said,) = [r.getMessage() for r in caplog.records if PREFETCHED in r.getMessage()]
    named = int(said.split("sampler=ds.sampler(): ")[1].split(" of the ")[0])
    assert named == lost  # the rows lost, exactly (torch's BatchSampler drew the batches)
    gathered = int(said.split(" of the ")[1].split(" rows")[0])
    assert gathered >= 10 * 32 + lost  # the ten batches received, and the ones dropped
    assert "batch_sampler=ds.batch_sampler(batch_size) instead" in said


def _plain(ds: Any) -> Any:
    return torch.utils.data.DataLoader(
        ds, batch_sampler=ds.batch_sampler(32), collate_fn=ds.collate, num_workers=2
    )


@pytest.mark.timeout(120)
def test_a_state_saved_after_a_break_names_exactly_what_the_loop_received(tmp_path: Path) -> None:
    """Under a plain DataLoader with workers: the rows of the batches torch had prefetched are
    not in the state, so a trainer resumed from it delivers them."""
    expected = write_dataset(tmp_path / "data", [300, 300])
    got: list[int] = []
    with dataset(tmp_path / "data", tmp_path / "shm", epochs=1) as ds:
        for step, batch in enumerate(_plain(ds)):
            got += ids_of(batch)
            if step == 4:
                break
        state = ds.state_dict()
    with dataset(tmp_path / "data", tmp_path / "shm2", epochs=1) as again:
        again.load_state_dict(state)
        for batch in _plain(again):
            got += ids_of(batch)
    assert Counter(got) == Counter(expected)
