"""What the Parquet and Arrow sources share: opening files, projecting columns, turning the
pieces of a range into one batch, re-typing declared list columns as tensors, and finding the
list columns whose rows all have one length (:class:`UniformLists`)."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from .._fs import open_random, resolve
from ..errors import ConfigError, DataError, DecodeError
from ._numpy_arrow import to_numpy
from ._tensor_types import first_null_row, is_any_list, is_number_list, tensor_form
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


class UniformLists:
    """Which variable-length lists of numbers hold one length L > 0 in every row of every
    file, seen file by file at plan time: such a column is a tensor of row shape ``(L,)``,
    as if ``tensors={name: (L,)}`` were given (a Hugging Face ``List(Value("float32"))``
    column of embeddings is written as ``list<float>``, whatever its rows hold).

    Every file is looked at before the first batch is read, so every task gives the column
    one form (``_tensor_types``). A column stays a list if any file gives it another type
    (another value type, or not a list of numbers: both gather alike as lists, never as one
    tensor), holds a null row or value, a row of another length or an empty row, or if no
    file holds a row of it. Columns named in ``tensors=`` are the user's and not looked at.
    """

    def __init__(self, columns: Sequence[str] | None, declared: Mapping[str, tuple[int, ...]]):
        self.columns = columns
        self.declared = declared
        # Column -> (value type, the length every row seen so far has, or None before a row).
        self.open: dict[str, tuple[pa.DataType, int | None]] | None = None

    def in_file(self, schema: pa.Schema) -> list[str]:
        """The columns still in question that a file of this schema holds as lists of the
        same numbers: the ones to look at in its batches. The first file's schema names the
        candidates; a later one that gives a candidate another type drops it."""
        names = self.columns if self.columns is not None else schema.names
        types = {name: schema.field(name).type for name in names if name in schema.names}
        if self.open is None:
            self.open = {
                name: (typ.value_type, None)
                for name, typ in types.items()
                if name not in self.declared and is_number_list(typ)
            }
        for name, (value_type, _) in list(self.open.items()):
            typ = types.get(name)
            if typ is None or not is_number_list(typ) or typ.value_type != value_type:
                del self.open[name]
        return list(self.open)

    def see(self, batch: pa.RecordBatch) -> None:
        """Take the lengths of a batch's rows of the columns still in question."""
        if not self.open or not batch.num_rows:
            return
        for name, (value_type, length) in list(self.open.items()):
            found = _one_length(batch.column(name))
            if found is None or (length is not None and found != length):
                del self.open[name]
            else:
                self.open[name] = (value_type, found)

    @property
    def undecided(self) -> bool:
        """Whether a column is still in question (before the first file, every one may be)."""
        return self.open is None or bool(self.open)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Row shape of each column whose every row, in every file, held one length."""
        return {name: (length,) for name, (_, length) in (self.open or {}).items() if length}


def _one_length(array: pa.Array) -> int | None:
    """The length every row of a list array (one row at least) has, from its offsets; None
    where rows differ, one is empty, or a row or a value is null (a null row stays ``None``
    in a list; a null value is refused when read, as it is in any list of numbers)."""
    if array.null_count or first_null_row(array) is not None:
        return None
    lengths = np.diff(to_numpy(array.offsets))
    shortest, longest = int(lengths.min()), int(lengths.max())
    return shortest if shortest == longest and shortest > 0 else None


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
            raise type(exc)(exc.reason, path=path, index=index, fix=exc.fix) from exc
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
