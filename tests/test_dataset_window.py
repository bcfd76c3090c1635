"""A sorted batch over the segments of the batch before it is gathered through the SlotTable,
without grouping its rows (dataset/slot_table.py): the same batch as through the groups, and any
other batch still goes through them, errors included."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import shmloader.dataset.gather.gatherer as worker
from shmloader.dataset.accounting.plane import slot_name
from shmloader.dataset.core.indices import encode_indices
from shmloader.dataset.gather.gather import gather, segment_views
from shmloader.dataset.gather.gatherer import Gatherer
from shmloader.shm.store import SegmentStore

SIZES = [50, 20, 50, 30]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SegmentStore]:
    with SegmentStore.create("64MiB", base_dir=str(tmp_path)) as made:
        handle = made.handle()
        start = 0
        for slot, n in enumerate(SIZES):
            ids = np.arange(start, start + n, dtype=np.int64)
            image = (ids[:, None, None] + np.arange(6).reshape(2, 3)).astype(np.uint8)
            batch = pa.record_batch(
                {"image": pa.FixedShapeTensorArray.from_numpy_ndarray(image), "id": ids}
            )
            handle.rename(handle.write(batch).name, slot_name(slot))
            start += n
        yield made


@pytest.fixture
def grouped_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many batches went through the groups."""
    calls: list[int] = []
    real = worker.group_rows

    def counted(indices: Any) -> Any:
        calls.append(len(indices))
        return real(indices)

    monkeypatch.setattr(worker, "group_rows", counted)
    return calls


def _indices(slots: list[int]) -> np.ndarray:
    return np.concatenate([encode_indices(s, np.arange(SIZES[s])) for s in slots])


def _want(store: SegmentStore, idx: np.ndarray) -> dict[str, np.ndarray]:
    plain = store.handle()
    batch = gather(lambda s: segment_views(plain.open(slot_name(s))), idx, ["image", "id"])
    return {name: batch[name].numpy() for name in ("image", "id")}  # type: ignore[attr-defined]


def _same(got: dict[str, Any], want: dict[str, np.ndarray]) -> bool:
    return all(np.array_equal(got[name].numpy(), want[name]) for name in want)


def test_sorted_batches_over_the_same_segments_skip_the_groups(
    store: SegmentStore, grouped_calls: list[int]
) -> None:
    g = Gatherer(store.handle(), ["image", "id"])
    rng = np.random.default_rng(3)
    idx = _indices([0, 1, 2])
    first = np.sort(rng.choice(idx, 40, replace=False))
    assert _same(g.gather(first), _want(store, first))
    assert grouped_calls == [40]  # the first batch over these segments: groups, and the table
    for size in (1, 7, 40, len(idx)):
        batch = np.sort(rng.choice(idx, size, replace=False))
        got = g.gather(batch)
        assert list(got) == ["image", "id"]
        assert _same(got, _want(store, batch))
    one_segment = encode_indices(1, np.array([0, 5, 19]))  # a subset of the table's segments
    assert g.gather(one_segment)["id"].tolist() == [50, 55, 69]
    assert grouped_calls == [40]
    g.close()


def test_other_batches_still_go_through_the_groups(
    store: SegmentStore, grouped_calls: list[int]
) -> None:
    g = Gatherer(store.handle(), ["image", "id"])
    g.gather(_indices([0, 1]))  # the table holds segments 0 and 1
    calls = len(grouped_calls)
    beyond = _indices([1, 3])  # segment 3 is not in it
    assert _same(g.gather(beyond), _want(store, beyond))
    unsorted = _indices([0, 1])[::-1].copy()  # grouped by slot, each group as given
    want = [*range(49, -1, -1), *range(69, 49, -1)]
    assert g.gather(unsorted)["id"].tolist() == want
    assert len(grouped_calls) == calls + 2
    with pytest.raises(IndexError, match="row 20 of segment slot 1 is out of range"):
        g.gather(encode_indices(1, np.array([3, 20])))  # inside the table's slots, not its rows
    with pytest.raises(IndexError, match="out of range"):
        g.gather(encode_indices(2, np.array([50])))  # a slot past the table's, rows too far
    g.close()


def test_a_slot_between_the_tables_goes_through_the_groups(
    store: SegmentStore, grouped_calls: list[int]
) -> None:
    g = Gatherer(store.handle(), ["image", "id"])
    g.gather(_indices([0, 2]))  # the table spans slots 0-2 and holds 0 and 2, not 1
    calls = len(grouped_calls)
    between = encode_indices(1, np.array([0, 5, 19]))
    assert g.gather(between)["id"].tolist() == [50, 55, 69]
    assert len(grouped_calls) == calls + 1
    g.close()


def test_a_subset_of_the_columns_goes_through_the_groups(
    store: SegmentStore, grouped_calls: list[int]
) -> None:
    g = Gatherer(store.handle(), ["id"])
    idx = _indices([0, 1])
    for _ in range(3):
        assert g.gather(idx)["id"].tolist() == list(range(70))
    assert len(grouped_calls) == 3  # no table: the segments hold a column not asked for
    g.close()
