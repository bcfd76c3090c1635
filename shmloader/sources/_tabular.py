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
from ._tensor_types import first_null_row, is_any_list, tensor_form
from .base import check_held
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
    and tensors asked for exist, every file has the same columns, and every file gives a
    column the same form in a batch (``_tensor_types``): a tensor of one dtype and row shape,
    or a Python list. A batch mixing rows of two files would otherwise fail mid-epoch, once
    both files' tasks were in hand. Types that differ but gather alike agree (``string`` and
    ``large_string``; ``list<float>`` and ``list<list<float>>`` declared as one tensor)."""

    def __init__(self, columns: list[str] | None, tensors: Mapping[str, tuple[int, ...]]):
        self.columns = columns
        self.tensors = tensors
        self.first: tuple[str, pa.Schema] | None = None
        # Each column's form in a batch, with the type and file that gave it.
        self.forms: dict[str, tuple[tuple[Any, ...], pa.DataType, str]] = {}
        self.only_nulls: dict[str, str] = {}  # column -> a file where it is of type null

    def __call__(self, path: str, schema: pa.Schema, rows: int) -> None:
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
        other, known = self.first
        if set(schema.names) != set(known.names):
            raise ConfigError(
                f"{path} has the columns {', '.join(schema.names)} where {other} has "
                f"{', '.join(known.names)}; pick common ones with columns="
            )
        for field in schema:
            self._agree(field.name, field.type, path, rows)

    def _agree(self, name: str, typ: pa.DataType, path: str, rows: int) -> None:
        if pa.types.is_null(typ):  # an empty file's column, or one of nulls only
            if rows:
                self.only_nulls.setdefault(name, path)
        else:
            form = self._form(name, typ)
            known = self.forms.setdefault(name, (form, typ, path))
            if known[0] != form:
                raise ConfigError(
                    f"column {name!r} is {typ} in {path} but {known[1]} in {known[2]}, and a "
                    "batch cannot hold both: every file must give a column one type (cast "
                    "when writing the files, or leave the column out with columns=)"
                )
        if name in self.only_nulls and name in self.forms and self.forms[name][0][0] == "tensor":
            raise ConfigError(
                f"column {name!r} holds only nulls in {self.only_nulls[name]}, where "
                f"{self.forms[name][2]} gives it {self.forms[name][1]}, which becomes a tensor: "
                "tensors have no null (fill them when writing, or leave the column out with "
                "columns=)"
            )

    def _form(self, name: str, typ: pa.DataType) -> tuple[Any, ...]:
        if name in self.tensors:  # re-typed when read: its innermost values decide
            inner = typ.storage_type if isinstance(typ, pa.BaseExtensionType) else typ
            while is_any_list(inner):
                inner = inner.value_type
            return ("tensor", inner, self.tensors[name])
        form = tensor_form(typ)
        return ("tensor", *form) if form is not None else ("list",)


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
    check_held(path, start, stop, start + table.num_rows)
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
