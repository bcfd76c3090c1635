"""Grouping a batch's sample indices by segment (``dataset/gather.py``), against plain Python."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
import torch

from shmloader.dataset.core.indices import encode_indices, group_rows, split_indices
from shmloader.dataset.gather.gather import _dense_view
from shmloader.errors import ConfigError, DataError


def _reference(idx: np.ndarray) -> list[tuple[int, list[int], int, int, int]]:
    """(slot, rows, start, stop, max row) per segment, segments in order of first slot value,
    rows in index-list order within each: a stable sort by slot, as the gather promises."""
    slots, rows = split_indices(idx)
    order = sorted(range(len(idx)), key=lambda i: int(slots[i]))
    out: list[tuple[int, list[int], int, int, int]] = []
    for pos, i in enumerate(order):
        slot, row = int(slots[i]), int(rows[i])
        if out and out[-1][0] == slot:
            out[-1][1].append(row)
        else:
            out.append((slot, [row], pos, pos, 0))
    return [(s, r, a, a + len(r), max(r)) for s, r, a, _, _ in out]


@pytest.mark.parametrize("spread", [1, 8, 3000])  # one segment, a window, slots far apart
@pytest.mark.parametrize("sort", [True, False])
def test_groups_match_a_stable_sort_by_segment(spread: int, sort: bool) -> None:
    rng = np.random.default_rng(spread + sort)
    for _ in range(20):
        n = int(rng.integers(1, 300))
        slots = rng.integers(5, 5 + spread, n)
        idx = np.concatenate([encode_indices(int(s), rng.integers(0, 5000, 1)) for s in slots])
        if sort:
            idx = np.sort(idx)
        groups, rows = group_rows(idx)
        got = [(g.slot, g.rows.tolist(), g.start, g.stop, g.max_row) for g in groups]
        assert got == _reference(idx)
        assert rows.tolist() == [r for g in got for r in g[1]]  # all groups' rows, in order


def test_an_empty_batch_is_refused() -> None:
    with pytest.raises(ConfigError, match="empty batch"):
        group_rows(np.empty(0, dtype=np.int64))


@pytest.mark.parametrize("tensor", [False, True])
def test_fixed_shape_columns_are_viewed_without_copy_even_when_sliced(tensor: bool) -> None:
    # A sliced column starts at an offset into its values: the view must start there too.
    values = pa.array(np.arange(40, dtype=np.float32))
    column: pa.Array = pa.FixedSizeListArray.from_arrays(values, 4)
    if tensor:
        column = pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(pa.float32(), [2, 2]), column)
    sliced = column.slice(3, 5)
    view = _dense_view(sliced)
    assert view is not None
    want = np.arange(12, 32, dtype=np.float32).reshape((5, 2, 2) if tensor else (5, 4))
    np.testing.assert_array_equal(view, want)
    assert view.base is not None  # a view of the Arrow buffer, not a copy


def test_the_first_gather_imports_neither_pyarrow_compute_nor_pandas() -> None:
    # Each cost the first batch: pyarrow.compute about 0.1 s (FixedSizeListArray.flatten
    # imported it), pandas about 0.2 s (pyarrow's to_numpy and pa.array look for it; the test
    # extra installs it). The batch is built without pa.array, which would import pandas.
    pytest.importorskip("pandas")
    code = (
        "import sys, pyarrow as pa\n"
        "from shmloader.dataset.gather.gather import segment_views\n"
        "values = pa.Array.from_buffers(pa.float32(), 12, [None, pa.py_buffer(bytes(48))])\n"
        "x = pa.FixedSizeListArray.from_arrays(values, 3)\n"
        "segment_views(pa.RecordBatch.from_arrays([x], names=['x']))\n"
        "print(sorted(m for m in ('pandas', 'pyarrow.compute') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _gather_two_segments(columns: dict[str, list]) -> dict[str, object]:
    """Rows 0-2 of one segment and 0-1 of another, each segment made of ``columns``' values
    split 3 + 2 (the first three in segment 1, the last two in segment 2)."""
    from shmloader.dataset.gather.gather import gather, segment_views

    table = pa.table(columns)
    segs = {
        1: segment_views(table.slice(0, 3).to_batches()[0]),
        2: segment_views(table.slice(3).to_batches()[0]),
    }
    indices = np.concatenate([encode_indices(1, np.arange(3)), encode_indices(2, np.arange(2))])
    return gather(segs.__getitem__, indices, list(columns))


def test_a_columns_form_follows_its_type_not_its_data() -> None:
    tensor3 = pa.fixed_shape_tensor(pa.bool_(), [3])
    bools = pa.array([[True, False, True]] * 5, pa.list_(pa.bool_(), 3))
    out = _gather_two_segments(
        {
            "flag": pa.array([True, False, True, True, False]),
            "mask": bools,
            "mask_tensor": pa.ExtensionArray.from_storage(tensor3, bools),
            "grid": pa.array(
                [[[i, i]] * 3 for i in range(5)], pa.list_(pa.list_(pa.float32(), 2), 3)
            ),
            "tokens": pa.array([[1], None, [2, 3], [], [4]], pa.list_(pa.int64())),
            "words": pa.array([["a"], ["b", "c"], [], None, ["d"]], pa.list_(pa.string())),
            "nested": pa.array(
                [[[1]], [[2, 3]], [], [[4], []], [[5]]], pa.list_(pa.list_(pa.int64()))
            ),
            "name": pa.array(["a", None, "c", "d", "e"]),
        }
    )
    flag, mask, mask_tensor, grid = out["flag"], out["mask"], out["mask_tensor"], out["grid"]
    assert isinstance(flag, torch.Tensor) and flag.dtype == torch.bool
    assert flag.tolist() == [True, False, True, True, False]
    for m in (mask, mask_tensor):
        assert isinstance(m, torch.Tensor) and m.dtype == torch.bool and m.shape == (5, 3)
        assert m.tolist() == [[True, False, True]] * 5
    assert isinstance(grid, torch.Tensor) and grid.shape == (5, 3, 2)
    assert grid[:, 0, 0].tolist() == [0, 1, 2, 3, 4]
    tokens = out["tokens"]
    assert isinstance(tokens, list) and tokens[1] is None
    assert [t.tolist() for t in tokens if t is not None] == [[1], [2, 3], [], [4]]
    assert out["words"] == [["a"], ["b", "c"], [], None, ["d"]]
    assert out["nested"] == [[[1]], [[2, 3]], [], [[4], []], [[5]]]
    assert out["name"] == ["a", None, "c", "d", "e"]


@pytest.mark.parametrize(
    "column",
    [
        pa.array([1.0, 2.0, 3.0, None, 5.0]),
        pa.array([True, False, True, None, False]),
        pa.array([[1, 2], [3, 4], [5, 6], [7, None], [9, 10]], pa.list_(pa.int64(), 2)),
        pa.array([[1], [2], [3], [4, None], [5]], pa.list_(pa.int64())),
    ],
    ids=["number", "bool", "fixed-size-list", "list-of-numbers"],
)
def test_a_null_where_a_tensor_stands_is_refused(column: pa.Array) -> None:
    # Segment 1 has no null, segment 2 has one: that batch was a tensor or a list by the data.
    with pytest.raises(DataError, match="column 'x' holds a null"):
        _gather_two_segments({"x": column})
