"""Spare mappings: released segments' mappings kept for their files' next segments."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from shmloader.dataset.accounting.plane import slot_name
from shmloader.dataset.core.indices import encode_indices
from shmloader.dataset.gather.gatherer import SWEEP_SECONDS, Gatherer
from shmloader.shm.region import PAGE, Placed, Region
from shmloader.shm.spare_maps import SpareMappings
from shmloader.shm.store import SegmentStore

pytestmark = pytest.mark.skipif(Region.create(PAGE) is None, reason="no gather region here")


def _map(region: Region, path: Path, data: bytes) -> Placed:
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        placed = region.map_file(fd, len(data))
    finally:
        os.close(fd)
    assert placed is not None and placed.inode == path.stat().st_ino
    return placed


def test_a_spare_mapping_shows_the_file_written_again(tmp_path: Path) -> None:
    region = Region.create(64 * PAGE)
    assert region is not None
    maps = SpareMappings(region, max_count=8, max_bytes=64 * PAGE)
    path = tmp_path / "f"
    placed = _map(region, path, b"a" * (3 * PAGE))
    maps.keep(placed)
    with open(path, "r+b") as f:  # what a writer does with a spare: cut, then write
        f.truncate(2 * PAGE)
        f.write(b"b" * (2 * PAGE))
    again = maps.take(path.stat().st_ino, 2 * PAGE)
    assert again is not None and len(maps) == 0
    adopted = region.adopt(again, 2 * PAGE)
    assert adopted.offset == placed.offset and bytes(adopted.buffer) == b"b" * (2 * PAGE)
    with pytest.raises(ValueError, match="do not fit"):
        region.adopt(again, 4 * PAGE)
    region.close()


def test_files_gone_too_small_or_beyond_the_caps_are_unmapped(tmp_path: Path) -> None:
    region = Region.create(64 * PAGE)
    assert region is not None
    maps = SpareMappings(region, max_count=2, max_bytes=64 * PAGE)
    placed = [_map(region, tmp_path / f"f{i}", bytes([i]) * PAGE) for i in range(4)]
    for p in placed[:3]:
        maps.keep(p)
    assert len(maps) == 2 and maps.nbytes == 2 * PAGE  # the oldest went first
    assert maps.take(placed[0].inode, PAGE) is None
    assert maps.take(placed[1].inode, 2 * PAGE) is None  # too small: unmapped, not handed out
    assert len(maps) == 1
    maps.keep(placed[3])
    assert maps.sweep([placed[3].inode]) == 1  # f2's file is gone from the listing
    assert len(maps) == 1 and maps.take(placed[3].inode, PAGE) is not None
    # Every unmapped placement gave its part of the region back.
    free = sum(length for _, length in region.free_extents)
    assert free == 64 * PAGE - PAGE  # only f3's page is still mapped (taken, the caller's)
    by_bytes = SpareMappings(region, max_count=8, max_bytes=PAGE)
    by_bytes.keep(_map(region, tmp_path / "g0", b"x" * PAGE))
    by_bytes.keep(_map(region, tmp_path / "g1", b"y" * PAGE))
    assert len(by_bytes) == 1
    by_bytes.clear()
    assert len(by_bytes) == 0
    region.close()


def _write(store: SegmentStore, slot: int, ids: np.ndarray) -> None:
    handle = store.handle()
    values = np.repeat(ids.astype(np.float32)[:, None], 16, axis=1)
    batch = pa.record_batch(
        {"x": pa.FixedShapeTensorArray.from_numpy_ndarray(values), "id": pa.array(ids)}
    )
    info = handle.write(batch)
    assert info is not None
    handle.rename(info.name, slot_name(slot))


def test_the_gatherer_reads_a_rewritten_spare_through_its_spare_mapping(tmp_path: Path) -> None:
    with SegmentStore.create("64MiB", base_dir=str(tmp_path)) as store:
        handle = store.handle()
        g = Gatherer(handle, ["x", "id"])
        _write(store, 0, np.arange(100))
        _write(store, 1, np.arange(100, 200))
        assert g.gather(encode_indices(0, np.arange(100)))["id"].tolist() == list(range(100))
        offset = g.in_region[0].offset
        handle.release(slot_name(0))
        time.sleep(SWEEP_SECONDS)  # the next gather sweeps: segment 0's mapping is kept
        g.gather(encode_indices(1, np.arange(3)))
        maps = g.spare_mappings
        assert maps is not None and len(maps) == 1
        _write(store, 2, np.arange(1000, 1100))  # into segment 0's file, now a spare
        got = g.gather(encode_indices(2, np.arange(100)))
        assert g.in_region[2].offset == offset and len(maps) == 0  # the spare one, taken
        assert got["id"].tolist() == list(range(1000, 1100))  # the new rows, never stale ones
        assert np.array_equal(got["x"].numpy()[:, 3], np.arange(1000, 1100, dtype=np.float32))
        assert g.parses_spared == 1  # same place, same metadata: segment 0's views were used
        # A spare mapping whose file a writer removed (to make room) goes at the next sweep.
        handle.release(slot_name(2))
        time.sleep(SWEEP_SECONDS)
        g.gather(encode_indices(1, np.arange(3)))
        assert len(maps) == 1
        (spare,) = [n for n in os.listdir(handle.path) if n.startswith("spare-")]
        os.unlink(os.path.join(handle.path, spare))
        time.sleep(SWEEP_SECONDS)
        g.gather(encode_indices(1, np.arange(3)))
        assert len(maps) == 0
        g.close()


def test_dataloader_workers_unmap_instead_of_keeping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Mapped pages count in the PSS of whoever maps them: a worker's stays that of the
    # segments it reads.
    import shmloader.dataset.gather.gatherer as worker_module

    monkeypatch.setattr(worker_module, "in_worker", lambda: True)
    with SegmentStore.create("64MiB", base_dir=str(tmp_path)) as store:
        handle = store.handle()
        g = Gatherer(handle, ["x", "id"])
        _write(store, 0, np.arange(10))
        _write(store, 1, np.arange(10, 20))
        g.gather(encode_indices(0, np.arange(10)))
        handle.release(slot_name(0))
        time.sleep(SWEEP_SECONDS)
        g.gather(encode_indices(1, np.arange(10)))
        maps = g.spare_mappings
        assert maps is not None and len(maps) == 0 and 0 not in g.in_region
        g.close()
