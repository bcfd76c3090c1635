"""Views of parsed segments reused for the next file at the same place (dataset/view_cache.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from shmloader.dataset.accounting.plane import slot_name
from shmloader.dataset.core.indices import encode_indices
from shmloader.dataset.gather.gather import segment_views
from shmloader.dataset.gather.gatherer import SWEEP_SECONDS, Gatherer
from shmloader.dataset.gather.view_cache import ParsedViews
from shmloader.shm.region import PAGE, Placed, Region
from shmloader.shm.store import SegmentStore, read_segment

pytestmark = pytest.mark.skipif(Region.create(PAGE) is None, reason="no gather region here")


def _file(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _batch(ids: list[int], names: list[str] | None = None) -> pa.RecordBatch:
    columns = {"id": pa.array(ids, pa.int64())}
    if names is not None:
        columns["name"] = pa.array(names)
    return pa.record_batch(columns)


def _place(region: Region, path: Path, data: bytes, at: Placed | None = None) -> Placed:
    """``data`` written to ``path`` and mapped (into ``at``'s place, as an adopted mapping)."""
    with open(path, "r+b" if path.exists() else "wb") as f:
        f.truncate(len(data))
        f.write(data)
    if at is not None:
        return region.adopt(at, len(data))
    fd = os.open(path, os.O_RDONLY)
    try:
        placed = region.map_file(fd, len(data))
    finally:
        os.close(fd)
    assert placed is not None
    return placed


def test_same_metadata_at_the_same_place_reuses_the_views(tmp_path: Path) -> None:
    region = Region.create(64 * PAGE)
    assert region is not None
    parsed = ParsedViews(max_count=4)
    path = tmp_path / "seg"
    placed = _place(region, path, _file(_batch([1, 2, 3], ["a", "b", "c"])))
    batch = read_segment(placed.buffer)
    views = segment_views(batch, region)
    parsed.remember(placed, batch, views)
    # New values, same lengths: only data bytes differ, so the views read the new file.
    again = _place(region, path, _file(_batch([7, 8, 9], ["x", "y", "z"])), at=placed)
    found = parsed.find(again)
    assert found is views and parsed.hits == 1
    dense = found["id"].dense
    arrow = found["name"].arrow
    assert dense is not None and dense.tolist() == [7, 8, 9]
    assert arrow is not None and arrow.to_pylist() == ["x", "y", "z"]
    # String offsets are data too: other lengths, same total, are read right.
    moved = _place(region, path, _file(_batch([7, 8, 9], ["x", "yy", ""])), at=placed)
    assert parsed.find(moved) is views and arrow.to_pylist() == ["x", "yy", ""]
    # One more character: the values buffer's length in the metadata differs (the file's
    # size does not, padded to 8 bytes), so a parse is needed.
    grown = _place(region, path, _file(_batch([7, 8, 9], ["x", "y", "zw"])), at=placed)
    assert grown.buffer.size == again.buffer.size
    assert parsed.find(grown) is None
    longer = _place(region, path, _file(_batch([1, 2, 3, 4], ["a", "b", "c", "d"])), at=placed)
    assert parsed.find(longer) is None and parsed.hits == 2
    # Elsewhere in the region: never the views of another place.
    other = _place(region, tmp_path / "other", _file(_batch([7, 8, 9], ["x", "y", "z"])))
    assert other.offset != placed.offset and parsed.find(other) is None
    del views, found, dense, arrow, batch
    parsed.clear()
    region.close()


def test_the_oldest_place_is_forgotten_beyond_the_cap(tmp_path: Path) -> None:
    region = Region.create(64 * PAGE)
    assert region is not None
    parsed = ParsedViews(max_count=2)
    data = _file(_batch([1, 2]))
    placed = [_place(region, tmp_path / f"f{i}", data) for i in range(3)]
    for p in placed:
        batch = read_segment(p.buffer)
        parsed.remember(p, batch, segment_views(batch, region))
    assert len(parsed) == 2
    assert parsed.find(placed[0]) is None and parsed.find(placed[2]) is not None
    parsed.clear()
    region.close()


def _write(store: SegmentStore, slot: int, ids: np.ndarray) -> None:
    handle = store.handle()
    info = handle.write(pa.record_batch({"id": pa.array(ids, pa.int64())}))
    assert info is not None
    handle.rename(info.name, slot_name(slot))


def test_the_gatherer_parses_a_segment_of_another_length_anew(tmp_path: Path) -> None:
    with SegmentStore.create("64MiB", base_dir=str(tmp_path)) as store:
        handle = store.handle()
        g = Gatherer(handle, ["id"])
        _write(store, 0, np.arange(100))
        _write(store, 1, np.arange(100, 200))
        g.gather(encode_indices(0, np.arange(100)))
        handle.release(slot_name(0))
        time.sleep(SWEEP_SECONDS)  # the next gather sweeps: segment 0's mapping is kept
        g.gather(encode_indices(1, np.arange(3)))
        _write(store, 2, np.arange(1000, 1090))  # fewer rows, into segment 0's file
        got = g.gather(encode_indices(2, np.arange(90)))
        assert got["id"].tolist() == list(range(1000, 1090))
        assert g.parses_spared == 0
        with pytest.raises(IndexError, match="out of range"):  # its own length, not 100
            g.gather(encode_indices(2, np.array([95])))
        g.close()
