"""``break``, then the next pass, with a plain ``torch.utils.data.DataLoader``.

Without workers the batch the loop got is the last one gathered, so every record comes once
per epoch, as with shmloader.DataLoader. With workers, torch drops the batches it had
prefetched when the pass is left, and the dataset (which sees gathers, not deliveries) counted
them delivered: that loss used to be silent; the next pass now says how many rows its workers
had gathered and why some never reached the loop.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import pytest
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
def test_with_workers_shmloader_dataloader_is_exact(tmp_path: Path) -> None:
    expected, got = _break_then_finish(tmp_path, "shmloader", 2)
    assert got == Counter(expected)


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
    gathered = int(said.split("of the ")[1].split(" rows")[0])
    assert gathered >= 10 * 32 + lost  # the ten batches received, and the ones dropped
    assert "shmloader.DataLoader knows which batches reach the loop" in said
