"""No configuration hangs: a plain ``torch.utils.data.DataLoader`` given ``sampler=ds.sampler()``
under a budget of one or two segments used to wait for ever (torch's BatchSampler keeps the
rows of its next batch, whose segments fill the budget, while the task they need has no room).
Now it finishes, or raises ShmSpaceError saying which setting to change, as shmloader.DataLoader
does."""

from __future__ import annotations

import struct
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _dataset_helpers import data_loader, shm_entries, write_dataset

import shmloader


def _padded(payload: bytes) -> dict[str, Any]:
    record_id, _ = struct.unpack("<qB", payload)
    return {"id": record_id, "pad": np.zeros(1000, np.uint8)}  # ~100 KB segments of 100 rows


@pytest.mark.long
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["torch", "shmloader"])
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("budget", ["150KiB", "250KiB"])
def test_a_tight_budget_finishes_or_says_what_to_raise(
    tmp_path: Path, kind: str, num_workers: int, budget: str
) -> None:
    expected = write_dataset(tmp_path / "data", [1500])
    (tmp_path / "shm").mkdir()
    src = shmloader.RecordFileSource(str(tmp_path / "data" / "*.tfrecord"), decode=_padded)
    got: list[int] = []
    with shmloader.SharedTaskDataset(
        src,
        num_readers=2,
        records_per_task=100,
        epochs=1,
        shm_budget=budget,
        shm_dir=str(tmp_path / "shm"),
    ) as ds:
        try:
            for batch in data_loader(ds, kind, 64, num_workers):
                got += batch["id"].tolist()
        except shmloader.ShmSpaceError as exc:
            assert "raise shm_budget" in str(exc)
            assert max(Counter(got).values(), default=1) == 1
        else:
            assert sorted(got) == expected
    assert shm_entries(tmp_path / "shm") == []


@pytest.mark.long
@pytest.mark.timeout(120)
def test_one_segment_of_room_under_torch_s_batch_sampler_is_a_named_error(tmp_path: Path) -> None:
    write_dataset(tmp_path / "data", [1500])
    (tmp_path / "shm").mkdir()
    src = shmloader.RecordFileSource(str(tmp_path / "data" / "*.tfrecord"), decode=_padded)
    with shmloader.SharedTaskDataset(
        src,
        num_readers=2,
        records_per_task=100,
        epochs=1,
        shm_budget="150KiB",
        shm_dir=str(tmp_path / "shm"),
    ) as ds:
        with pytest.raises(shmloader.ShmSpaceError, match="torch's BatchSampler") as info:
            for _batch in data_loader(ds, "torch", 64, 2):
                pass
        assert "batch_sampler=ds.batch_sampler(batch_size)" in str(info.value)
