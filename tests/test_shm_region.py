"""The gather region: segment files mapped side by side, one view reaching all of them."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from shmloader.dataset.accounting.plane import slot_name
from shmloader.dataset.core.indices import encode_indices
from shmloader.dataset.gather.gather import gather, segment_views
from shmloader.dataset.gather.gatherer import Gatherer
from shmloader.shm.region import PAGE, Region
from shmloader.shm.store import SegmentStore

pytestmark = pytest.mark.skipif(Region.create(PAGE) is None, reason="no gather region here")


def _file(tmp_path: Path, name: str, data: bytes) -> int:
    path = tmp_path / name
    path.write_bytes(data)
    return os.open(path, os.O_RDONLY)


def test_files_map_side_by_side_and_unmapped_space_is_reused(tmp_path: Path) -> None:
    region = Region.create(16 * PAGE)
    assert region is not None
    placed = []
    for i, size in enumerate([PAGE + 1, 3 * PAGE, 10]):
        fd = _file(tmp_path, f"f{i}", bytes([i + 1]) * size)
        try:
            p = region.map_file(fd, size)
        finally:
            os.close(fd)
        assert p is not None and len(p.buffer) == size
        assert bytes(p.buffer) == bytes([i + 1]) * size
        placed.append(p)
    assert [p.offset for p in placed] == [0, 2 * PAGE, 5 * PAGE]
    view = region.rows(np.dtype(np.uint8), (), 0)
    assert view[2 * PAGE] == 2 and view[5 * PAGE + 9] == 3
    assert not view.flags.writeable
    # No room for 11 pages in one piece; after unmapping the first two files, 5 pages lie
    # before the small file and 10 after it.
    fd = _file(tmp_path, "big", b"\x07" * (10 * PAGE))
    try:
        assert region.map_file(fd, 11 * PAGE) is None
        region.unmap(placed[0])
        region.unmap(placed[1])
        assert region.free_extents == [(0, 5 * PAGE), (6 * PAGE, 10 * PAGE)]
        big = region.map_file(fd, 10 * PAGE)
    finally:
        os.close(fd)
    assert big is not None and big.offset == 6 * PAGE
    assert region.rows(np.dtype(np.uint8), (), 0)[16 * PAGE - 1] == 7
    region.unmap(placed[2])
    assert region.free_extents == [(0, 6 * PAGE)]  # merged with its neighbours again
    region.unmap(big)
    assert region.free_extents == [(0, 16 * PAGE)]
    region.close()


def test_alignment_follows_the_row_size_within_a_limit() -> None:
    region = Region.create(PAGE)
    assert region is not None
    region.fit_rows(3 * PAGE)
    assert region.align == 3 * PAGE
    region.fit_rows(8)
    assert region.align == 3 * PAGE
    region.fit_rows(2**21 + 8)  # the common multiple would be far too coarse: unchanged
    assert region.align == 3 * PAGE
    region.close()


def _segments(store: SegmentStore, sizes: list[int], width: int) -> list[pa.RecordBatch]:
    handle = store.handle()
    batches = []
    start = 0
    for slot, n in enumerate(sizes):
        ids = np.arange(start, start + n, dtype=np.int64)
        values = np.repeat(ids.astype(np.float32)[:, None], width, axis=1)
        batch = pa.record_batch(
            {
                "x": pa.FixedShapeTensorArray.from_numpy_ndarray(values),
                "id": pa.array(ids),
                "name": pa.array([f"r{i}" for i in ids]),
            }
        )
        handle.rename(handle.write(batch).name, slot_name(slot))
        batches.append(batch)
        start += n
    return batches


@pytest.mark.parametrize("width", [64, 3 * 1024 + 1])  # 256-byte rows; rows of odd size
def test_gather_through_the_region_equals_the_per_segment_copy(tmp_path: Path, width: int) -> None:
    with SegmentStore.create("256MiB", base_dir=str(tmp_path)) as store:
        sizes = [100, 37, 100, 5]
        _segments(store, sizes, width)
        in_region = Gatherer(store.handle(), ["x", "id", "name"])
        plain = store.handle()
        rng = np.random.default_rng(1)
        idx = np.concatenate([encode_indices(s, np.arange(n)) for s, n in enumerate(sizes)])
        for order in (np.sort(rng.choice(idx, 90, replace=False)), rng.permutation(idx)[:50]):
            got = in_region.gather(order)
            want = gather(lambda s: segment_views(plain.open(slot_name(s))), order, ["x", "id"])
            assert np.array_equal(got["x"].numpy(), want["x"].numpy())
            assert np.array_equal(got["id"].numpy(), want["id"].numpy())
            assert np.array_equal(got["x"].numpy()[:, 0], got["id"].numpy().astype(np.float32))
            assert got["name"] == [f"r{i}" for i in got["id"].tolist()]
        views = in_region.views(0)
        assert views["x"].residue is not None  # really gathered through the region
        in_region.close()


def test_forked_child_goes_on_with_its_copy_of_the_mappings(tmp_path: Path) -> None:
    with SegmentStore.create("64MiB", base_dir=str(tmp_path)) as store:
        _segments(store, [10, 10], 4)
        g = Gatherer(store.handle(), ["id"])
        idx = np.sort(np.concatenate([encode_indices(s, np.arange(10)) for s in range(2)]))
        assert g.gather(idx[:10])["id"].tolist() == list(range(10))  # maps segment 0 only
        pid = os.fork()
        if pid == 0:  # the child maps segment 1 into its copy; reports by exit status
            ok = False
            try:
                # Unsorted: grouped by segment, each group in the order given.
                want = [*range(9, -1, -1), *range(19, 9, -1)]
                ok = g.gather(idx[::-1])["id"].tolist() == want
            finally:
                os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0
        assert g.gather(idx)["id"].tolist() == list(range(20))  # the parent's, unaffected
        assert len(g.in_region) == 2
        region = g.region
        assert region is not None
        g.close()
        assert len(g.in_region) == 0 and region.closed
