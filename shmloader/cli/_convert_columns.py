"""Table columns to per-row Example feature values, and the spec that reads them back.

``shmloader convert`` turns each input row into one tf.train.Example. A column's type fixes
its list kind once (integers, booleans and times -> int64; floats and decimals -> float32;
strings and binaries -> bytes; lists, nested or fixed-size, of those -> the flattened list);
the values per row are cut from the column's flattened numpy buffer, not converted one
Python object at a time. While rows pass, each column records how many values its rows held
and whether any was null, so that at the end it can say which spec decodes what was written.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ConfigError
from ..sources._tensor_types import is_any_list

_SUPPORTED = (
    "integers, booleans, floats, decimals, dates/times, strings, binaries, or lists of those"
)


def _kind_of_leaf(t: pa.DataType) -> str | None:
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return "int64"
    if pa.types.is_temporal(t):
        return "int64"
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "float32"
    if (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
    ):
        return "bytes"
    if pa.types.is_dictionary(t):
        return _kind_of_leaf(t.value_type)
    return None


def _fixed_dims(t: pa.DataType) -> tuple[int, ...] | None:
    """Shape every row has by type alone (fixed-size lists), or None for variable lists."""
    dims: list[int] = []
    while is_any_list(t):
        if not pa.types.is_fixed_size_list(t):
            return None
        dims.append(t.list_size)
        t = t.value_type
    return tuple(dims)


def _leaf_type(t: pa.DataType) -> pa.DataType:
    while is_any_list(t):
        t = t.value_type
    return t


class ColumnStats:
    """What one output feature held across all rows: kind, value counts, nulls, shape."""

    def __init__(self, name: str, kind: str, dims: tuple[int, ...] | None, source: str) -> None:
        self.name = name
        self.kind = kind
        self.dims = dims  # from the type (fixed-size lists, numpy shape); None: variable
        self.source = source  # "<path>: <type>", to explain a later conflict
        self.min_count: int | None = None
        self.max_count = 0
        self.nulls = 0

    def update(self, counts: np.ndarray, nulls: int) -> None:
        self.nulls += nulls
        if counts.size:
            low, high = int(counts.min()), int(counts.max())
            self.min_count = low if self.min_count is None else min(self.min_count, low)
            self.max_count = max(self.max_count, high)

    def merge(self, other: ColumnStats) -> None:
        """Fold in a later batch's stats; its column must convert to the same kind."""
        if self.kind != other.kind:
            raise ConfigError(
                f"column {self.name!r} changes type between inputs: {self.source} gives "
                f"{self.kind} values, {other.source} gives {other.kind} values"
            )
        if self.dims != other.dims:
            self.dims = None  # inputs disagree on the shape: only the flat length is known
        self.nulls += other.nulls
        if other.min_count is not None:
            self.update(np.array([other.min_count, other.max_count]), 0)

    def spec_line(self) -> str:
        """The line of the printed spec: fixed when every row held the same number."""
        name, kind = json.dumps(self.name), json.dumps(self.kind)
        varlen = f"{name}: VarLenFeature({kind}),"
        if self.min_count is None:
            return f"{varlen}  # no row has a value"
        if self.min_count != self.max_count:
            unsupported = "; lists of bytes are not decoded yet" if self.kind == "bytes" else ""
            return f"{varlen}  # {self.min_count} to {self.max_count} values per row{unsupported}"
        fits = self.dims is not None and int(np.prod(self.dims)) == self.min_count
        shape = self.dims if fits and self.dims is not None else (self.min_count,)
        fixed = f"FixedLenFeature({shape!r}, {kind}"
        if self.nulls and self.kind == "bytes":  # no lists of bytes: a default fills the gaps
            return f'{name}: {fixed}, default=b""),  # {self.nulls} rows without it get b""'
        if self.nulls:
            return f"{varlen}  # {self.nulls} rows without it; or {fixed}, default=...)"
        return f"{name}: {fixed}),"


def arrow_columns(batch: pa.RecordBatch, path: str) -> list[tuple[ColumnStats, list[Any]]]:
    """Each column of ``batch`` as (stats for this batch, one value per row; None = null)."""
    names = batch.schema.names
    if len(set(names)) != len(names):
        dupes = sorted({n for n in names if names.count(n) > 1})
        raise ConfigError(f"{path}: duplicate column names {dupes}; features need unique names")
    return [_arrow_column(name, batch.column(i), path) for i, name in enumerate(names)]


def _arrow_column(name: str, col: pa.Array, path: str) -> tuple[ColumnStats, list[Any]]:
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    kind = _kind_of_leaf(_leaf_type(col.type))
    if kind is None:
        raise ConfigError(
            f"{path}: column {name!r} has type {col.type}, which a tf.train.Example cannot "
            f"hold; supported: {_SUPPORTED}"
        )
    stats = ColumnStats(name, kind, _fixed_dims(col.type), f"{path}: {col.type}")
    row_null = col.is_null().to_numpy(zero_copy_only=False)
    leaf, offsets = _flatten(col)
    if is_any_list(col.type) and leaf.null_count:
        raise ConfigError(
            f"{path}: column {name!r} has null values inside its lists; an Example list "
            "cannot hold them (fill or drop them first)"
        )
    values = _leaf_values(leaf, kind, name, path)
    counts = np.diff(offsets)
    stats.update(counts[~row_null], int(row_null.sum()))
    rows: list[Any] = [
        None if null else values[lo:hi]
        for null, lo, hi in zip(
            row_null.tolist(), offsets[:-1].tolist(), offsets[1:].tolist(), strict=True
        )
    ]
    return stats, rows


def _flatten(col: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Leaf values and per-row offsets into them (null rows and null sublists are empty)."""
    counts = np.ones(len(col), dtype=np.int64)
    if not is_any_list(col.type):
        # Null scalars still occupy a slot in the leaf array; their rows are dropped later.
        return col, np.concatenate(([0], np.cumsum(counts)))
    current = col
    while is_any_list(current.type):
        lengths = pc.fill_null(pc.list_value_length(current), 0).to_numpy(zero_copy_only=False)
        bounds = np.concatenate(([0], np.cumsum(counts)))
        running = np.concatenate(([0], np.cumsum(lengths, dtype=np.int64)))
        counts = running[bounds[1:]] - running[bounds[:-1]]
        current = pc.list_flatten(current)
    return current, np.concatenate(([0], np.cumsum(counts)))


def _leaf_values(leaf: pa.Array, kind: str, name: str, path: str) -> Any:
    """The leaf buffer as something sliceable per row without per-value Python work."""
    if kind == "bytes":
        return leaf.to_pylist()
    try:
        if pa.types.is_temporal(leaf.type):  # their integer storage: seconds, days, ...
            leaf = leaf.cast(pa.int64() if leaf.type.bit_width == 64 else pa.int32())
        # Nulls become 0 here; rows that are null are left out of the Example anyway.
        leaf = leaf.cast(pa.int64() if kind == "int64" else pa.float64()).fill_null(0)
    except pa.ArrowInvalid as exc:
        raise ConfigError(
            f"{path}: column {name!r} ({leaf.type}) does not fit an Example {kind} list: {exc}"
        ) from exc
    dtype = np.int64 if kind == "int64" else np.float32
    return np.asarray(leaf.to_numpy(zero_copy_only=False), dtype=dtype)


def numpy_columns(
    arrays: dict[str, np.ndarray], start: int, stop: int, path: str
) -> list[tuple[ColumnStats, list[Any]]]:
    """Rows ``[start, stop)`` of same-length arrays (an ``.npz``), one feature per array."""
    out = []
    for name, array in arrays.items():
        kind = _numpy_kind(array, name, path)
        stats = ColumnStats(name, kind, tuple(array.shape[1:]), f"{path}: {array.dtype}")
        part = array[start:stop]
        per_row = int(np.prod(array.shape[1:]))
        stats.update(np.full(len(part), per_row, dtype=np.int64), 0)
        rows: Sequence[Any] = part.tolist() if kind == "bytes" else list(part)
        out.append((stats, list(rows)))
    return out


def _numpy_kind(array: np.ndarray, name: str, path: str) -> str:
    if array.dtype.kind in "biu":
        return "int64"
    if array.dtype.kind == "f":
        return "float32"
    if array.dtype.kind in "SU":
        return "bytes"
    raise ConfigError(
        f"{path}: array {name!r} has dtype {array.dtype}, which a tf.train.Example cannot "
        "hold; use integer, float, bytes or str arrays"
    )
