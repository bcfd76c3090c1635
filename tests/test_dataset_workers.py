"""DataLoader settings users combine with the dataset: start methods, persistent workers,
pin_memory (a no-op with a warning on a CPU-only machine, which must not break anything),
prefetch_factor. Each must still deliver every record once per epoch."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch.utils.data
from _dataset_helpers import dataset, ids_of, write_dataset

import shmloader

SIZES = [400, 333]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    directory = tmp_path_factory.mktemp("data")
    return directory, write_dataset(directory, SIZES)


def passes(dl: Any, n: int) -> list[list[int]]:
    return [sorted(i for batch in dl for i in ids_of(batch)) for _ in range(n)]


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_start_methods_with_persistent_workers_and_pinning(
    tmp_path: Path, data: tuple[Path, list[int]], context: str
) -> None:
    directory, expected = data
    with dataset(directory, tmp_path, epochs=None) as ds, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pin_memory without an accelerator warns
        dl = shmloader.DataLoader(
            ds,
            batch_size=50,
            num_workers=2,
            multiprocessing_context=context,
            persistent_workers=True,
            pin_memory=True,
            prefetch_factor=3,
        )
        assert passes(dl, 2) == [expected] * 2


def test_torch_loader_under_spawn(tmp_path: Path, data: tuple[Path, list[int]]) -> None:
    directory, expected = data
    with dataset(directory, tmp_path, epochs=1) as ds:
        dl = torch.utils.data.DataLoader(
            ds,
            batch_size=50,
            sampler=ds.sampler(),
            collate_fn=ds.collate,
            num_workers=2,
            multiprocessing_context="spawn",
            prefetch_factor=1,
        )
        assert passes(dl, 1) == [expected]


def test_pin_memory_in_the_main_process(tmp_path: Path, data: tuple[Path, list[int]]) -> None:
    directory, expected = data
    with dataset(directory, tmp_path, epochs=1) as ds, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dl = shmloader.DataLoader(ds, batch_size=50, num_workers=0, pin_memory=True)
        batches = list(dl)
        assert sorted(i for b in batches for i in ids_of(b)) == expected
        assert all(
            isinstance(b["id"], torch.Tensor) and b["id"].dtype == torch.int64 for b in batches
        )


def test_batches_and_single_samples(tmp_path: Path, data: tuple[Path, list[int]]) -> None:
    directory, expected = data
    with dataset(directory, tmp_path, epochs=1, shuffle=False) as ds:
        dl = shmloader.DataLoader(ds, batch_size=64, drop_last=True)
        assert len(dl) == len(expected) // 64
        sizes = [len(b["id"]) for b in dl]
        assert sizes == [64] * (len(expected) // 64)


def test_a_pass_after_the_last_epoch_is_empty(tmp_path: Path, data: tuple[Path, list[int]]) -> None:
    directory, expected = data
    with dataset(directory, tmp_path, epochs=1) as ds:
        dl = shmloader.DataLoader(ds, batch_size=50, num_workers=1)
        assert passes(dl, 1) == [expected]
        assert len(ds) == 0 and len(dl) == 0
        assert list(dl) == []


def _ledger_files(ds: Any) -> list[str]:
    folder = Path(ds.runtime.store.path) / "ledger"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_our_workers_write_no_ledger_and_everything_is_released(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    # shmloader.DataLoader marks rows gathered as the loop receives them; a plain
    # DataLoader's workers must still report through the ledger (nothing else would: the
    # segments would never be released).
    directory, expected = data
    with dataset(directory, tmp_path / "ours", epochs=2) as ds:
        ours = shmloader.DataLoader(ds, batch_size=50, num_workers=2, persistent_workers=True)
        assert passes(ours, 2) == [expected] * 2
        assert _ledger_files(ds) == []
        ds.runtime.plane.read_ledger_and_send()  # what the maintenance thread does every few ms
        assert ds.stats().shm_in_use == 0  # every segment released
    with dataset(directory, tmp_path / "plain", epochs=1) as ds:
        plain = torch.utils.data.DataLoader(
            ds, batch_size=50, sampler=ds.sampler(), collate_fn=ds.collate, num_workers=1
        )
        assert passes(plain, 1) == [expected]
        assert _ledger_files(ds) != []
        ds.runtime.plane.read_ledger_and_send()
        assert ds.stats().shm_in_use == 0


@pytest.mark.parametrize("workers", [0, 1])
def test_a_plain_loader_needs_no_collate_fn(
    tmp_path: Path, data: tuple[Path, list[int]], workers: int
) -> None:
    """torch's default_collate passes a batch through (batch.py); a collate_fn that takes it
    for a list of samples is told what to change, not given a bare ``KeyError: 0``."""
    directory, expected = data
    with dataset(directory, tmp_path, epochs=2) as ds:
        dl = torch.utils.data.DataLoader(
            ds, batch_size=50, sampler=ds.sampler(), num_workers=workers
        )
        got = [i for batch in dl for i in ids_of(batch)]
        assert sorted(got) == expected
        samples = torch.utils.data.DataLoader(
            ds,
            batch_size=50,
            sampler=ds.sampler(),
            num_workers=workers,
            collate_fn=lambda batch: [batch[i]["id"] for i in range(len(batch))],
        )
        with pytest.raises(TypeError, match=r"already collated.*transform=fn"):
            next(iter(samples))


@pytest.mark.long
def test_a_batch_is_a_dict(tmp_path: Path, data: tuple[Path, list[int]]) -> None:
    directory, _ = data
    with dataset(directory, tmp_path, epochs=1) as ds:
        batch = next(iter(shmloader.DataLoader(ds, batch_size=50)))
        assert isinstance(batch, dict)
        assert dict(batch).keys() == batch.keys()
        with pytest.raises(KeyError):
            batch["no such column"]
