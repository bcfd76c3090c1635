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
from typing import Any, NamedTuple, cast

import numpy as np
import pyarrow as pa
import torch

from ...errors import ConfigError, DataError
from ...shm.region import Region
from ...sources._numpy_arrow import from_numpy
from ...sources._tensor_types import first_null_row, is_number_list, tensor_form
from ...sources.columns import column_to_numpy
from ..core.batch import Batch
from ..core.indices import SegmentRows, group_rows
from ..core.ragged_form import LISTS, RaggedForm
from .ragged import ragged_columns


@dataclass(frozen=True)
class ColumnView:
    """One column of one segment, ready to gather from.

    ``dense`` is a zero-copy numpy view of shape ``(rows, *shape)`` for fixed-shape numeric
    columns; other columns (strings, bytes, variable-length lists, booleans) keep ``arrow``.
    """

    dense: np.ndarray | None
    arrow: pa.Array | None
    # Where ``dense`` lies in a gather region (shm/region.py): row ``r`` is row ``first + r``
    # of the region's view with rows starting at byte ``residue``. None outside a region.
    residue: int | None = None
    first: int = 0


def _dense_view(array: pa.Array) -> np.ndarray | None:
    """Zero-copy numpy view ``(rows, *shape)`` of a numeric tensor column, or None: for other
    columns, booleans (bit-packed in Arrow: no zero-copy view) and columns with nulls."""
    form = tensor_form(array.type)
    if form is None or pa.types.is_boolean(form[0]) or first_null_row(array) is not None:
        return None
    return column_to_numpy(array)


class SegmentViews(dict[str, ColumnView]):
    """The views of one segment's columns, with what a batch checks once per segment.

    ``layout`` names every dense column's dtype, row shape and place in the region: segments
    of equal layout gather alike, so a batch compares layouts instead of checking each column.
    """

    def __init__(self, views: dict[str, ColumnView], num_rows: int) -> None:
        super().__init__(views)
        self.num_rows = num_rows
        self.layout = tuple(
            (name, v.dense.dtype, v.dense.shape[1:], v.residue)
            for name, v in views.items()
            if v.dense is not None
        )
        # Where each dense column's rows start in the region, in ``layout`` order: a batch
        # stacks these (one row per segment) instead of reading them column by column.
        self.firsts = tuple(views[name].first for name, *_ in self.layout)


def segment_views(batch: pa.RecordBatch, region: Region | None = None) -> SegmentViews:
    """Views of every column of a segment's batch; made once per segment and cached.

    ``region``: the batch is mapped into it, so dense columns also get their place there.
    """
    views: dict[str, ColumnView] = {}
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        dense = _dense_view(column)
        if dense is None:
            _refuse_nulls(column, name)
            views[name] = ColumnView(dense=None, arrow=column)
            continue
        residue, first = None, 0
        row_bytes = dense.strides[0] if dense.ndim else 0
        if region is not None and row_bytes > 0 and dense.flags.c_contiguous:
            first, residue = divmod(dense.ctypes.data - region.base, row_bytes)
        views[name] = ColumnView(dense=dense, arrow=None, residue=residue, first=first)
    return SegmentViews(views, batch.num_rows)


def in_worker() -> bool:
    """Whether this process is a DataLoader worker."""
    return torch.utils.data.get_worker_info() is not None


_TORCH_DTYPES: dict[np.dtype, torch.dtype] = {}
_ALIGN = 64  # byte alignment of each column inside a batch's storage (a cache line)


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    tdtype = _TORCH_DTYPES.get(dtype)
    if tdtype is None:
        tdtype = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
        _TORCH_DTYPES[dtype] = tdtype
    return tdtype


def alloc_outputs(
    specs: list[tuple[tuple[int, ...], np.dtype]],
) -> list[tuple[torch.Tensor, np.ndarray]]:
    """Output tensors (and numpy views of them) for the dense columns of one batch.

    In a DataLoader worker all columns share one storage of torch shared memory, as
    ``default_collate`` would allocate, but one block per batch instead of one per column:
    torch sends each shared storage to the main process as a file descriptor through a fresh
    connection to the worker (``multiprocessing.resource_sharer``), about a millisecond each,
    and tensors of one storage travel as one. In the training process nothing is sent, and a
    plain tensor per column costs half as much to make as views into one storage.
    """
    if not in_worker():
        # numpy allocates, torch wraps: half the cost of torch.empty and .numpy().
        arrays = [np.empty(shape, dtype) for shape, dtype in specs]
        return [(torch.from_numpy(array), array) for array in arrays]
    offsets, nbytes = block_layout(specs)
    storage = torch.UntypedStorage._new_shared(max(nbytes, 1))
    out = []
    for (shape, dtype), offset in zip(specs, offsets, strict=True):
        tensor = torch.empty(0, dtype=_torch_dtype(dtype)).set_(
            storage, offset // dtype.itemsize, shape, _contiguous_strides(shape)
        )
        out.append((tensor, tensor.numpy()))
    return out


def block_layout(specs: list[tuple[tuple[int, ...], np.dtype]]) -> tuple[list[int], int]:
    """Where each column of a batch starts when all lie in one block (each on a cache line),
    and the block's size."""
    offsets, nbytes = [], 0
    for shape, dtype in specs:
        offsets.append(nbytes)
        nbytes += -(-math.prod(shape) * dtype.itemsize // _ALIGN) * _ALIGN
    return offsets, nbytes


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def gather(
    views_of: Callable[[int], dict[str, ColumnView]],
    indices: Sequence[int] | np.ndarray,
    columns: Sequence[str],
    region: Region | None = None,
    grouped: tuple[list[SegmentRows], np.ndarray] | None = None,
    alloc: Callable[[list[tuple[tuple[int, ...], np.dtype]]], Sequence[Any]] | None = None,
    of_batch: BatchSegments | None = None,
    ragged: RaggedForm = LISTS,
) -> dict[str, object]:
    """Gather ``indices`` into one batch: column name -> tensor (or list, see below).

    Rows are grouped by segment (stable order), so the batch holds the same samples as the index
    list, grouped by segment. Dense columns become one tensor of shape ``(n, *shape)``; boolean
    columns a bool tensor; string and bytes columns a list of ``str`` / ``bytes``; variable-length
    numeric lists as ``ragged`` says (ragged.py: a list of 1-D tensors by default).

    With ``region`` (the segments' views were made in it), a dense column whose segments all
    line up in the region is copied with one ``take`` for the whole batch; otherwise one per
    segment. ``grouped``: what :func:`group_rows` gives for ``indices``, if known already.
    ``alloc(specs)``: ``(value, numpy array)`` per dense column, the array to fill and the
    value that stands for the column in the batch; tensors by default (``alloc_outputs``).
    ``of_batch``: :func:`batch_segments` of the groups' slots, if known already (the batches
    of one shuffle window read the same segments).
    """
    groups, rows = grouped if grouped is not None else group_rows(indices)
    n = len(rows)
    known = of_batch if of_batch is not None else batch_segments(views_of, [g.slot for g in groups])
    segments, alike = known.views, known.alike
    first = segments[0]
    dense = [name for name in columns if first[name].dense is not None]
    protos = [_dense(first, name) for name in dense]
    outputs = (alloc or alloc_outputs)([((n, *p.shape[1:]), p.dtype) for p in protos])
    _check_rows(groups, segments)  # once per segment, not once per column
    if known.firsts is not None and region is not None and in_region(first, dense):
        _take_from_region(region, first, known.firsts, groups, rows, outputs)
    else:
        for name, proto, (_tensor, target) in zip(dense, protos, outputs, strict=True):
            for group, views in zip(groups, segments, strict=True):
                array = _dense(views, name) if alike else _checked(views, name, proto)
                # Bounds and types are checked above, so the takes can use mode="clip": with
                # the default "raise", numpy copies through a temporary buffer given out=.
                array.take(group.rows, axis=0, out=target[group.start : group.stop], mode="clip")
    out = Batch()
    results = iter(outputs)
    for name in columns:
        if first[name].dense is not None:
            out[name] = next(results)[0]
        else:
            out.update(_gather_arrow(segments, groups, name, ragged))
    return out


def _dense(views: dict[str, ColumnView], name: str) -> np.ndarray:
    array = views[name].dense
    assert array is not None  # callers ask only for dense columns
    return array


def in_region(first: dict[str, ColumnView], dense: Sequence[str]) -> bool:
    """Whether the batch's dense columns are all placed in the region, in the segment's own
    column order (the order of ``first.layout``)."""
    layout = getattr(first, "layout", ())
    return (
        bool(dense)
        and len(layout) == len(dense)
        and all(
            entry[0] == name and entry[3] is not None
            for entry, name in zip(layout, dense, strict=True)
        )
    )


class BatchSegments(NamedTuple):
    """The segments a batch reads, with what batches over the same segments share."""

    views: list[dict[str, ColumnView]]
    alike: bool  # all of one layout (``SegmentViews.layout``)
    # Where each dense column's rows start in the region, per segment: (columns, segments).
    # None unless alike.
    firsts: np.ndarray | None


def batch_segments(
    views_of: Callable[[int], dict[str, ColumnView]], slots: Sequence[int]
) -> BatchSegments:
    """The views of ``slots`` and what a batch derives from them once, not per column: one
    layout check for all, and the region starts as one array (a caller may keep the result
    for the next batch over the same slots)."""
    views = [views_of(slot) for slot in slots]
    layout = getattr(views[0], "layout", None)
    alike = layout is not None and all(getattr(v, "layout", None) == layout for v in views)
    firsts = None
    if alike:
        rows = [cast(SegmentViews, v).firsts for v in views]
        firsts = np.ascontiguousarray(np.array(rows, dtype=np.int64).reshape(len(views), -1).T)
    return BatchSegments(views, alike, firsts)


def _take_from_region(
    region: Region,
    first: dict[str, ColumnView],
    firsts: np.ndarray,
    groups: list[SegmentRows],
    rows: np.ndarray,
    outputs: Sequence[Any],
) -> None:
    """All segments line up in the region: one take per column for the whole batch.

    Row ``r`` of group ``g`` lies at region row ``firsts[c, g] + r`` of column ``c``; the
    positions of every column are made at once, as a (columns, rows) array.
    """
    assert isinstance(first, SegmentViews)
    if len(groups) == 1:
        positions = firsts + rows  # (columns, 1) + (rows,)
    else:
        positions = np.repeat(firsts, [g.stop - g.start for g in groups], axis=1)
        positions += rows
    take_positions(region, first.layout, positions, outputs)


def take_positions(
    region: Region, layout: tuple[Any, ...], positions: np.ndarray, outputs: Sequence[Any]
) -> None:
    """Copy the region rows ``positions[c]`` of each column ``c`` of ``layout``
    (``SegmentViews.layout``) into ``outputs[c]``'s array: one ``take`` per column."""
    for (_name, dtype, row_shape, residue), where, (_value, target) in zip(
        layout, positions, outputs, strict=True
    ):
        assert residue is not None  # see in_region
        view = region.rows(dtype, row_shape, residue)
        view.take(where, axis=0, out=target, mode="clip")


def _check_rows(groups: list[SegmentRows], segments: list[dict[str, ColumnView]]) -> None:
    """Every group's rows exist in its segment (all its columns have its row count)."""
    for group, views in zip(groups, segments, strict=True):
        if group.max_row >= views.num_rows:  # type: ignore[attr-defined]
            raise IndexError(
                f"row {group.max_row} of segment slot {group.slot} is out of range: "
                f"it has {views.num_rows} rows"  # type: ignore[attr-defined]
            )


def _checked(views: dict[str, ColumnView], name: str, proto: np.ndarray) -> np.ndarray:
    """The segment's dense array, if it matches the batch's first segment (its rows are
    checked by :func:`_check_rows`)."""
    array = views[name].dense
    if array is None or array.dtype != proto.dtype or array.shape[1:] != proto.shape[1:]:
        raise ConfigError(f"column {name!r} changes type or shape between segments")
    return array


def _gather_arrow(
    segments: list[dict[str, ColumnView]],
    groups: list[SegmentRows],
    name: str,
    ragged: RaggedForm,
) -> dict[str, object]:
    """The batch's entries for a column that is not a dense tensor: its name, and for a
    variable-length list in a ``ragged`` form, the second column that form adds."""
    parts = []
    for views, group in zip(segments, groups, strict=True):
        array = views[name].arrow
        if array is None:
            raise ConfigError(f"column {name!r} changes type between segments")
        parts.append(array.take(from_numpy(group.rows.astype(np.int64, copy=False), pa.int64())))
    typ = parts[0].type
    if tensor_form(typ) is not None:  # booleans, copied out of their bits (nulls: segment_views)
        return {name: torch.from_numpy(np.concatenate([column_to_numpy(p) for p in parts]))}
    if is_number_list(typ):
        extra = ragged.extra_column(name)
        if extra is not None and extra in segments[0]:
            raise ConfigError(
                f"ragged={ragged.form!r} adds a column {extra!r} for the lengths of "
                f"{name!r}, and the data has a column of that name: rename it in decode, or "
                "leave it out with columns="
            )
        return dict(ragged_columns(name, parts, ragged))
    return {name: [v for part in parts for v in part.to_pylist()]}


def _refuse_nulls(column: pa.Array, name: str) -> None:
    """Sources that read Arrow data refuse these nulls, naming file and row; a segment written
    some other way must not turn a tensor column into a list either."""
    if first_null_row(column) is not None:
        raise DataError(
            f"column {name!r} holds a null, and its rows become tensors, which have none"
        )
