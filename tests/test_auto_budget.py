"""``shm_budget="auto"``, the default: 1 GiB where the shared-memory filesystem has room, else
three quarters of what it has free, split among the machine's ranks (``$LOCAL_WORLD_SIZE``).

A real filesystem's free space decides; ``LOCAL_WORLD_SIZE`` (what torchrun sets) scales the
share down to the sizes a container's small ``/dev/shm`` would give.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _dataset_helpers import dataset, ids_of, shm_entries, write_dataset

import shmloader
from shmloader.shm import space
from shmloader.shm.budget import reserve
from shmloader.shm.space import AUTO_CEILING, AUTO_FLOOR, AUTO_SHARE, budget_bytes

MiB = 1 << 20


def _ranks_for(base: Path, share: int) -> str:
    """The ``LOCAL_WORLD_SIZE`` under which "auto" gives each rank about ``share`` bytes."""
    return str(max(1, int(space(str(base)).free * AUTO_SHARE) // share))


def test_auto_takes_a_gib_where_there_is_room_else_a_share_of_what_is_free(
    tmp_path: Path,
) -> None:
    alone = budget_bytes("auto", str(tmp_path), {})
    free = space(str(tmp_path)).free
    if free * AUTO_SHARE > 2 * AUTO_CEILING:  # free space moves a little meanwhile
        assert alone == AUTO_CEILING
    else:
        assert abs(alone - free * AUTO_SHARE) < 64 * MiB
    # A rank of many on one machine takes its part of the share.
    each = budget_bytes("auto", str(tmp_path), {"LOCAL_WORLD_SIZE": _ranks_for(tmp_path, 64 * MiB)})
    assert 60 * MiB < each <= 68 * MiB
    # Sizes given are taken as they are, whatever is free.
    assert budget_bytes("3GiB", str(tmp_path), {"LOCAL_WORLD_SIZE": "8"}) == 3 << 30
    assert budget_bytes(12345, None, {}) == 12345
    # A LOCAL_WORLD_SIZE that is no number counts as one rank.
    assert abs(budget_bytes("auto", str(tmp_path), {"LOCAL_WORLD_SIZE": "x"}) - alone) < 64 * MiB


def test_auto_with_too_little_free_says_how_to_make_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_dataset(tmp_path / "data", [50])
    ranks = _ranks_for(tmp_path, AUTO_FLOOR // 4)
    with pytest.raises(shmloader.ShmSpaceError) as info:
        budget_bytes("auto", str(tmp_path), {"LOCAL_WORLD_SIZE": ranks})
    message = str(info.value)
    assert message.startswith(f"{tmp_path} has ")  # the cause first: how much is free
    assert f"for each of the {ranks} ranks of this machine" in message
    assert "docker run --shm-size=" in message and "mount -o remount,size=" in message
    # The dataset says the same as it is made, before anything starts.
    monkeypatch.setenv("LOCAL_WORLD_SIZE", ranks)
    with pytest.raises(shmloader.ShmSpaceError, match="too little for shared-memory segments"):
        dataset(tmp_path / "data", tmp_path / "shm", shm_budget="auto")
    assert shm_entries(tmp_path / "shm") == []


def test_a_dataset_sized_to_a_small_filesystem_delivers_every_record_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = write_dataset(tmp_path / "data", [700, 600])
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", _ranks_for(shm, 12 * MiB))
    with dataset(tmp_path / "data", shm, shm_budget="auto") as ds:
        assert 10 * MiB < ds.options.shm_budget <= 14 * MiB
        got = [i for batch in shmloader.DataLoader(ds, batch_size=64) for i in ids_of(batch)]
        stats = ds.stats()
        assert stats.shm_budget == ds.options.shm_budget and stats.shm_peak <= ds.options.shm_budget
    assert sorted(got) == sorted(expected)
    assert shm_entries(shm) == []


def test_a_task_larger_than_the_filesystem_allows_names_the_filesystem(tmp_path: Path) -> None:
    # Raising shm_budget alone would not do: the fix is a larger filesystem.
    (tmp_path / "store").mkdir()
    too_large = space(str(tmp_path)).free
    with pytest.raises(shmloader.ShmSpaceError) as info:
        reserve(str(tmp_path / "store"), too_large, 8 * MiB)
    message = str(info.value)
    assert message.startswith("a segment of ") and "cannot fit in shm_budget" in message
    assert f"{tmp_path} has " in message and "docker run --shm-size=" in message
    assert os.listdir(tmp_path / "store") == []
    # A segment that a larger budget could hold is told only to raise it.
    with pytest.raises(shmloader.ShmSpaceError) as info:
        reserve(str(tmp_path / "store"), 16 * MiB, 8 * MiB)
    assert "docker" not in str(info.value) and "raise shm_budget" in str(info.value)
