"""What the Parquet and Arrow sources share: opening files, projecting columns, turning the
pieces of a range into one batch, and re-typing declared list columns as tensors."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from .._fs import open_random, resolve
from ..errors import ConfigError, DataError, DecodeError
from ._tensor_types import first_null_row
from .columns import as_tensor_column


def open_input(path: str) -> Any:
    """A local file memory-mapped (reads are views of the page cache, not copies); a remote
    one opened for random access through pyarrow.fs."""
    fs, inner = resolve(path)
    if isinstance(fs, pafs.LocalFileSystem):
        try:
            return pa.memory_map(inner, "r")
        except (OSError, pa.ArrowException) as exc:
            raise DataError(f"cannot open for reading: {exc}", path=path) from exc
    return open_random(path)


def check_columns(path: str, schema: pa.Schema, columns: Sequence[str] | None) -> None:
    """Unknown column names are a ConfigError naming the file and what it has."""
    if columns is None:
        return
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise ConfigError(
            f"{path}: no column(s) {', '.join(map(repr, missing))}; "
            f"available columns: {', '.join(schema.names)}"
        )


class SchemaCheck:
    """What ``plan()`` checks of each file's schema (metadata only, no data read): the columns
    and tensors asked for exist, and every file gives each column the same type. A batch mixing
    rows of two files would otherwise fail mid-epoch, once both files' tasks were in hand."""

    def __init__(self, columns: list[str] | None, tensors: Mapping[str, tuple[int, ...]]):
        self.columns = columns
        self.tensors = tensors
        self.first: tuple[str, pa.Schema] | None = None
        self.types: dict[str, tuple[pa.DataType, str]] = {}  # each column's type, and where

    def __call__(self, path: str, schema: pa.Schema) -> None:
        check_columns(path, schema, self.columns)
        if self.columns is not None:
            schema = pa.schema([schema.field(c) for c in self.columns])
        for name in self.tensors:
            if name not in schema.names:
                raise ConfigError(
                    f"{path}: tensors names column {name!r}, which it does not have; "
                    f"available columns: {', '.join(schema.names)}"
                )
        if self.first is None:
            self.first = (path, schema)
            self.types = {f.name: (f.type, path) for f in schema}
            return
        other, known = self.first
        if set(schema.names) != set(known.names):
            raise ConfigError(
                f"{path} has the columns {', '.join(schema.names)} where {other} has "
                f"{', '.join(known.names)}; pick common ones with columns="
            )
        for field in schema:
            was, where = self.types[field.name]
            # Type null: a column of an empty file (or of nulls only), whatever it holds elsewhere.
            if pa.types.is_null(was):
                self.types[field.name] = (field.type, path)
            elif field.type != was and not pa.types.is_null(field.type):
                raise ConfigError(
                    f"column {field.name!r} is {field.type} in {path} but {was} in {where}: "
                    "every file must give a column one type (cast when writing the files, or "
                    "leave the column out with columns=)"
                )


def check_options(
    columns: Sequence[str] | None, tensors: Mapping[str, Sequence[int]] | None
) -> tuple[list[str] | None, dict[str, tuple[int, ...]]]:
    """Normalise the ``columns=`` / ``tensors=`` arguments shared by the tabular sources."""
    if isinstance(columns, str):
        raise ConfigError(f"columns must be a list of names, got the string {columns!r}")
    cols = list(columns) if columns is not None else None
    if cols is not None and len(set(cols)) != len(cols):
        raise ConfigError(f"columns has duplicates: {cols}")
    shapes: dict[str, tuple[int, ...]] = {}
    for name, shape in (tensors or {}).items():
        dims = tuple(int(d) for d in shape)
        if not dims or min(dims) <= 0:
            raise ConfigError(f"tensors[{name!r}]: shape {shape!r} needs positive dimensions")
        if cols is not None and name not in cols:
            raise ConfigError(f"tensors names {name!r}, which is not in columns={cols}")
        shapes[name] = dims
    return cols, shapes


def row_spans(counts: Sequence[int], start: int, stop: int) -> tuple[list[int], int]:
    """Which pieces (row groups, record batches) of these sizes overlap rows [start, stop),
    and the first row of the first of them."""
    ends = list(itertools.accumulate(counts))
    if start == stop:
        return [], start
    first = bisect.bisect_right(ends, start)
    pieces: list[int] = []
    i = first
    while i < len(counts) and (not pieces or ends[i - 1] < stop):
        if counts[i]:
            pieces.append(i)
        i += 1
    return pieces, (ends[first - 1] if first else 0)


def finish(
    path: str,
    table: pa.Table,
    offset: int,
    start: int,
    stop: int,
    tensors: Mapping[str, tuple[int, ...]],
) -> pa.RecordBatch:
    """Rows ``[start, stop)`` of a table whose first row is ``offset``, as one batch with the
    declared tensor columns re-typed; errors name the file and the row."""
    table = table.slice(start - offset, stop - start)
    for name, shape in tensors.items():
        i = table.schema.get_field_index(name)
        if i < 0:
            raise ConfigError(f"{path}: tensors names column {name!r}, which it does not have")
        try:
            column = as_tensor_column(table.column(i), shape, name)
        except DecodeError as exc:
            index = None if exc.index is None else start + exc.index
            raise type(exc)(exc.reason, path=path, index=index) from exc
        table = table.set_column(i, name, column)
    batch = to_batch(table)
    refuse_nulls(path, batch, start)
    return batch


def refuse_nulls(path: str, batch: pa.RecordBatch, start: int) -> None:
    """A null where a tensor will stand is bad input, named by file, row and column: the
    column cannot gather as a tensor in one task and as a list in the next
    (``_tensor_types``)."""
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        row = first_null_row(column)
        if row is not None:
            raise DataError(
                f"column {name!r} holds a null, and its rows become tensors, which have none: "
                "fill the nulls when writing the file, or leave the column out with columns=",
                path=path,
                index=start + row,
            )


def to_batch(table: pa.Table) -> pa.RecordBatch:
    """One RecordBatch of the whole table (copies only columns split over several chunks)."""
    batches = table.combine_chunks().to_batches()
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)
