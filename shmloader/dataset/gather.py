"""Gather rows of shared-memory Arrow batches straight into batch tensors.

This is the hot path of every training step, so it works on whole index arrays: rows are grouped
by segment and each group is copied with one ``numpy.take`` from the zero-copy view of the
segment's column into a slice of the output. Inside a DataLoader worker the output is allocated
in torch's shared memory up front (as ``default_collate`` does), so sending the batch to the
main process copies nothing more: one copy per byte in all.

A sample index is ``slot << ROW_BITS | row``: ``slot`` names the segment (the trainer numbers
segments as they arrive), ``row`` the row in it. Plain ints keep the index lists that cross
processes small and cheap to pickle.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from ..errors import ConfigError

ROW_BITS = 32
ROW_MASK = (1 << ROW_BITS) - 1


def encode_indices(slot: int, rows: np.ndarray) -> np.ndarray:
    """Sample indices of ``rows`` of segment ``slot`` (int64)."""
    return (np.int64(slot) << ROW_BITS) | rows.astype(np.int64, copy=False)


def split_indices(indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(slots, rows) of sample indices, as int64 arrays."""
    idx = np.asarray(indices, dtype=np.int64)
    return idx >> ROW_BITS, idx & ROW_MASK


@dataclass(frozen=True)
class ColumnView:
    """One column of one segment, ready to gather from.

    ``dense`` is a zero-copy numpy view of shape ``(rows, *shape)`` for fixed-shape numeric
    columns; other columns (strings, bytes, variable-length lists, booleans) keep ``arrow``.
    """

    dense: np.ndarray | None
    arrow: pa.Array | None


def _dense_view(array: pa.Array) -> np.ndarray | None:
    """Zero-copy numpy view of a fixed-shape numeric column, or None if it has no such view."""
    if array.null_count:
        return None
    typ = array.type
    if isinstance(typ, pa.FixedShapeTensorType):
        storage = array.storage
        flat = storage.flatten()
        if not _is_plain_numeric(flat.type):
            return None
        values = flat.to_numpy(zero_copy_only=True)
        return values.reshape((len(array), *typ.shape))
    if pa.types.is_fixed_size_list(typ):
        flat = array.flatten()
        if not _is_plain_numeric(flat.type):
            return None
        return flat.to_numpy(zero_copy_only=True).reshape(len(array), typ.list_size)
    if _is_plain_numeric(typ):
        return array.to_numpy(zero_copy_only=True)
    return None


def _is_plain_numeric(typ: pa.DataType) -> bool:
    # Booleans are bit-packed in Arrow, so they have no zero-copy numpy view.
    return (pa.types.is_integer(typ) or pa.types.is_floating(typ)) and not pa.types.is_boolean(typ)


def segment_views(batch: pa.RecordBatch) -> dict[str, ColumnView]:
    """Views of every column of a segment's batch; made once per segment and cached."""
    views: dict[str, ColumnView] = {}
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        dense = _dense_view(column)
        views[name] = ColumnView(dense=dense, arrow=None if dense is not None else column)
    return views


def _in_worker() -> bool:
    return torch.utils.data.get_worker_info() is not None


def _alloc(shape: tuple[int, ...], dtype: np.dtype) -> tuple[torch.Tensor, np.ndarray]:
    """An output tensor and a numpy view of it; in a worker, in torch shared memory."""
    tdtype = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
    numel = int(np.prod(shape, dtype=np.int64))
    if _in_worker():
        storage = torch.empty(0, dtype=tdtype)._typed_storage()._new_shared(numel, device="cpu")
        out = torch.empty(0, dtype=tdtype).new(storage).view(shape)
    else:
        out = torch.empty(shape, dtype=tdtype)
    return out, out.numpy()


def gather(
    views_of: Callable[[int], dict[str, ColumnView]],
    indices: Sequence[int] | np.ndarray,
    columns: Sequence[str],
) -> dict[str, object]:
    """Gather ``indices`` into one batch: column name -> tensor (or list, see below).

    Rows are grouped by segment (stable order), so the batch holds the same samples as the index
    list, grouped by segment. Dense columns become one tensor of shape ``(n, *shape)``; boolean
    columns a bool tensor; string and bytes columns a list of ``str`` / ``bytes``; variable-length
    numeric lists a list of 1-D tensors (their lengths differ, so they cannot be stacked).
    """
    slots, rows = split_indices(indices)
    n = len(rows)
    if n == 0:
        raise ConfigError("cannot gather an empty batch")
    order = np.argsort(slots, kind="stable")
    slots, rows = slots[order], rows[order]
    bounds = np.flatnonzero(np.diff(slots)) + 1
    starts = np.concatenate(([0], bounds))
    stops = np.concatenate((bounds, [n]))
    groups = [
        (int(slots[a]), rows[a:b], int(a), int(b)) for a, b in zip(starts, stops, strict=True)
    ]
    first = views_of(groups[0][0])
    out: dict[str, object] = {}
    for name in columns:
        view = first[name]
        if view.dense is not None:
            tensor, target = _alloc((n, *view.dense.shape[1:]), view.dense.dtype)
            for slot, slot_rows, a, b in groups:
                dense = views_of(slot)[name].dense
                if dense is None or dense.dtype != view.dense.dtype:
                    raise ConfigError(f"column {name!r} changes type between segments")
                np.take(dense, slot_rows, axis=0, out=target[a:b])
            out[name] = tensor
        else:
            out[name] = _gather_arrow(views_of, groups, name)
    return out


def _gather_arrow(
    views_of: Callable[[int], dict[str, ColumnView]],
    groups: list[tuple[int, np.ndarray, int, int]],
    name: str,
) -> object:
    parts = []
    for slot, slot_rows, _a, _b in groups:
        array = views_of(slot)[name].arrow
        if array is None:
            raise ConfigError(f"column {name!r} changes type between segments")
        parts.append(array.take(pa.array(slot_rows)))
    typ = parts[0].type
    if pa.types.is_boolean(typ) and all(p.null_count == 0 for p in parts):
        values = np.concatenate([p.to_numpy(zero_copy_only=False) for p in parts])
        return torch.from_numpy(values)
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        # Copied: a tensor must not keep a released segment's mapping alive.
        return [
            torch.tensor(item.values.to_numpy(zero_copy_only=False))
            for part in parts
            for item in part
        ]
    return [v for part in parts for v in part.to_pylist()]
