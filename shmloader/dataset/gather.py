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

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

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


_TORCH_DTYPES: dict[np.dtype, torch.dtype] = {}
_ALIGN = 64  # byte alignment of each column inside a batch's storage (a cache line)


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    tdtype = _TORCH_DTYPES.get(dtype)
    if tdtype is None:
        tdtype = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
        _TORCH_DTYPES[dtype] = tdtype
    return tdtype


def _alloc(specs: list[tuple[tuple[int, ...], np.dtype]]) -> list[tuple[torch.Tensor, np.ndarray]]:
    """Output tensors (and numpy views of them) for the dense columns of one batch.

    All columns share one storage. In a DataLoader worker it is torch shared memory, as
    ``default_collate`` would allocate, but one block per batch instead of one per column:
    torch sends each shared storage to the main process as a file descriptor through a fresh
    connection to the worker (``multiprocessing.resource_sharer``), about a millisecond each,
    and tensors of one storage travel as one.
    """
    offsets, nbytes = [], 0
    for shape, dtype in specs:
        offsets.append(nbytes)
        size = math.prod(shape) * dtype.itemsize
        nbytes += -(-size // _ALIGN) * _ALIGN
    if _in_worker():
        storage = torch.UntypedStorage._new_shared(max(nbytes, 1))
    else:
        storage = torch.UntypedStorage(max(nbytes, 1))
    out = []
    for (shape, dtype), offset in zip(specs, offsets, strict=True):
        tensor = torch.empty(0, dtype=_torch_dtype(dtype)).set_(
            storage, offset // dtype.itemsize, shape, _contiguous_strides(shape)
        )
        out.append((tensor, tensor.numpy()))
    return out


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


class SegmentRows(NamedTuple):
    """The rows of one segment in a batch: ``rows`` go to output positions ``[start, stop)``."""

    slot: int
    rows: np.ndarray
    start: int
    stop: int
    max_row: int


def group_by_segment(indices: Sequence[int] | np.ndarray) -> list[SegmentRows]:
    """Sample indices grouped by segment, each group in index-list order (a stable sort)."""
    slots, rows = split_indices(indices)
    n = len(rows)
    if n == 0:
        raise ConfigError("cannot gather an empty batch")
    lo, hi = int(slots.min()), int(slots.max())
    if lo == hi:
        return [SegmentRows(lo, rows, 0, n, int(rows.max()))]
    key = slots - lo
    if hi - lo < 1 << 16:
        key = key.astype(np.uint16)  # numpy sorts 16-bit keys stably by radix sort: faster
    order = np.argsort(key, kind="stable")
    rows = rows[order]
    counts = np.bincount(key, minlength=hi - lo + 1)
    present = np.flatnonzero(counts)
    stops = np.cumsum(counts[present])
    starts = stops - counts[present]
    maxima = np.maximum.reduceat(rows, starts)
    return [
        SegmentRows(lo + k, rows[a:b], a, b, m)
        for k, a, b, m in zip(
            present.tolist(), starts.tolist(), stops.tolist(), maxima.tolist(), strict=True
        )
    ]


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
    groups = group_by_segment(indices)
    n = groups[-1].stop
    segments = [views_of(g.slot) for g in groups]
    first = segments[0]
    dense = [name for name in columns if first[name].dense is not None]
    protos = [first[name].dense for name in dense]
    outputs = _alloc([((n, *p.shape[1:]), p.dtype) for p in protos if p is not None])
    for group, views in zip(groups, segments, strict=True):
        for name, proto, (_tensor, target) in zip(dense, protos, outputs, strict=True):
            array = views[name].dense
            assert proto is not None
            if array is None or array.dtype != proto.dtype or array.shape[1:] != proto.shape[1:]:
                raise ConfigError(f"column {name!r} changes type or shape between segments")
            if group.max_row >= len(array):
                raise IndexError(
                    f"row {group.max_row} of segment slot {group.slot} is out of range: "
                    f"it has {len(array)} rows"
                )
            # mode="clip" (bounds checked above): with the default "raise", numpy copies
            # through a temporary buffer whenever out= is given, doubling the work.
            np.take(array, group.rows, axis=0, out=target[group.start : group.stop], mode="clip")
    out: dict[str, object] = {}
    results = iter(outputs)
    for name in columns:
        if first[name].dense is not None:
            out[name] = next(results)[0]
        else:
            out[name] = _gather_arrow(segments, groups, name)
    return out


def _gather_arrow(
    segments: list[dict[str, ColumnView]], groups: list[SegmentRows], name: str
) -> object:
    parts = []
    for views, group in zip(segments, groups, strict=True):
        array = views[name].arrow
        if array is None:
            raise ConfigError(f"column {name!r} changes type between segments")
        parts.append(array.take(pa.array(group.rows)))
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
