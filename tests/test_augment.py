"""Augmentation: ``task_rng()`` in decode (reproducible under the seed, other per epoch) and
``transform=`` on each batch of shmloader.DataLoader. Real readers: which reader reads which
task differs from run to run, and the numbers must not."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _dataset_helpers import shm_entries, write_dataset

import shmloader


def _noisy(payload: bytes) -> dict[str, Any]:
    record_id, _ = struct.unpack("<qB", payload)
    return {"id": record_id, "noise": shmloader.task_rng().random()}


def _noise_by_epoch(tmp_path: Path, seed: int, epochs: int = 2) -> list[dict[int, float]]:
    (tmp_path / "shm").mkdir(exist_ok=True)
    src = shmloader.RecordFileSource(str(tmp_path / "data" / "*.tfrecord"), decode=_noisy)
    out: list[dict[int, float]] = []
    with shmloader.SharedTaskDataset(
        src,
        num_readers=2,
        records_per_task=50,
        seed=seed,
        epochs=epochs,
        shm_dir=str(tmp_path / "shm"),
    ) as ds:
        loader = shmloader.DataLoader(ds, batch_size=40)
        for _ in range(epochs):
            noise: dict[int, float] = {}
            for batch in loader:
                noise.update(zip(batch["id"].tolist(), batch["noise"].tolist(), strict=True))
            out.append(noise)
    assert shm_entries(tmp_path / "shm") == []
    return out


@pytest.mark.timeout(120)
def test_task_rng_is_the_same_per_record_in_every_run_and_other_per_epoch(tmp_path: Path) -> None:
    expected = write_dataset(tmp_path / "data", [230, 170])
    first, again, other = (_noise_by_epoch(tmp_path, s) for s in (7, 7, 8))
    assert all(sorted(epoch) == expected for epoch in first + again + other)
    assert first == again  # same seed: the same numbers for each record, epoch by epoch
    epoch0, epoch1 = first
    assert sum(epoch0[i] != epoch1[i] for i in expected) > 0.99 * len(expected)
    assert sum(first[0][i] != other[0][i] for i in expected) > 0.99 * len(expected)
    assert len(set(epoch0.values())) == len(expected)  # each record its own numbers


def test_outside_a_reader_task_rng_is_seeded_from_zero_at_each_call() -> None:
    assert shmloader.task_rng().random() == shmloader.task_rng().random()
    assert shmloader.task_rng().random() == np.random.default_rng(0).random()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_transform_runs_on_each_batch_the_loop_gets(tmp_path: Path, num_workers: int) -> None:
    expected = write_dataset(tmp_path / "data", [300])
    (tmp_path / "shm").mkdir()
    src = shmloader.RecordFileSource(str(tmp_path / "data" / "*.tfrecord"), decode=_noisy)
    calls: list[int] = []

    def centre(batch: dict[str, Any]) -> dict[str, Any]:
        calls.append(len(batch["id"]))
        return {"id": batch["id"], "centred": batch["noise"] - batch["noise"].mean()}

    with shmloader.SharedTaskDataset(
        src, num_readers=2, records_per_task=50, epochs=1, shm_dir=str(tmp_path / "shm")
    ) as ds:
        loader = shmloader.DataLoader(ds, batch_size=64, num_workers=num_workers, transform=centre)
        got: list[int] = []
        for batch in loader:
            assert set(batch) == {"id", "centred"}
            assert abs(float(batch["centred"].mean())) < 1e-6
            got += batch["id"].tolist()
    assert sorted(got) == expected and sum(calls) == len(expected)
    with pytest.raises(shmloader.ConfigError, match="transform must be a function"):
        shmloader.DataLoader(ds, batch_size=4, transform="normalise")
