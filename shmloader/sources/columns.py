"""Decoded values -> one Arrow RecordBatch: the storage format of every task.

A task's records end up as one RecordBatch in shared memory, and the dataset gathers rows
from it with numpy. So the layout is chosen for that gather:

* a numpy array whose shape is the same in every record becomes a **tensor column**
  (``pa.fixed_shape_tensor(value_type, shape)``): its storage is a FixedSizeList, so all
  records' values sit in one contiguous, null-free buffer that :func:`column_to_numpy` views
  as ``(n, *shape)`` without copying;
* a numpy or Python scalar becomes a primitive column, ``bytes`` -> ``binary``, ``str`` ->
  ``string`` (``large_binary`` / ``large_string`` when one batch holds more than 2 GiB);
* variable-length 1-D arrays become ``list<value_type>`` columns when the schema says so, or
  when their lengths differ among the records inference samples (:func:`merge_inferred`);
  pass ``schema=`` with ``pa.list_(...)`` for columns whose length varies beyond the sample
  (the mismatch error gives the whole schema to pass).

dtype mapping (numpy <-> Arrow): bool <-> bool (Arrow packs bools to bits, so bool tensors are
not zero-copy), int8..int64 / uint8..uint64 / float16 / float32 / float64 <-> the Arrow type of
the same name. Python ``bool``/``int``/``float`` infer ``bool``/``int64``/``float64``.
Nothing else is stored: ``None``, dicts, objects, complex, datetime or string-dtype arrays raise
:class:`DecodeError` naming the column. There are no nulls in columns built here.

Casting is conservative: a numpy value may be cast only where numpy calls it ``safe``
(int32 -> int64, float32 -> float64, int16 -> float32; not float64 -> float32). Python numbers
carry no width, so they fill any column of a compatible kind if the value fits: an ``int`` any
integer or float column (``7`` into uint8; ``300`` into uint8 is an error), a ``float`` any
float column (``1.5`` into float32), a ``bool`` any numeric column. Lists of Python numbers
follow the same rule for tensor and list columns.

Errors raised here name the column; ``index`` on the exception is the record's *position in the
list given* (the caller maps it to a file and a record number).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import ConfigError, DecodeError, SchemaMismatchError
from ._kinds import (
    EMPTY_LIST,
    Kind,
    TensorKind,
    at,
    is_numeric,
    kind_for_type,
    kind_for_value,
    try_build,
)
from ._numpy_arrow import to_numpy
from ._tensor_types import first_null_row, innermost_values, is_any_list, tensor_form
from .row_arrays import RowArrays

__all__ = [
    "BatchBuilder",
    "FixedColumns",
    "as_tensor_column",
    "column_to_numpy",
    "columns_to_batch",
    "infer_schema",
    "infer_schema_from_columns",
    "merge_inferred",
    "records_to_batch",
    "schema_code",
    "tensor_type",
]


def tensor_type(dtype: Any, shape: Sequence[int]) -> pa.FixedShapeTensorType:
    """The tensor column type for numpy ``dtype`` and per-record ``shape``."""
    return pa.fixed_shape_tensor(pa.from_numpy_dtype(np.dtype(dtype)), tuple(shape))


def infer_schema(record: Mapping[str, Any]) -> pa.Schema:
    """Schema of one decoded record (see the module doc for the rules)."""
    if not isinstance(record, Mapping):
        raise DecodeError(
            f"decode must return a mapping of column -> value, got {type(record).__name__}"
        )
    if not record:
        raise DecodeError("decode returned an empty mapping (no columns)")
    return pa.schema([pa.field(_name(k), kind_for_value(_name(k), v)) for k, v in record.items()])


def infer_schema_from_columns(columns: Mapping[str, Any], num_records: int) -> pa.Schema:
    """Schema of a ``decode_batch`` result: arrays with first dim ``num_records`` or lists."""
    if not isinstance(columns, Mapping) or not columns:
        raise DecodeError(
            "decode_batch must return a non-empty mapping of column -> batched values, "
            f"got {type(columns).__name__}"
        )
    fields = []
    for key, value in columns.items():
        name = _name(key)
        _check_rows(name, value, num_records)
        if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
            if value.ndim == 1:
                fields.append(pa.field(name, kind_for_value(name, value[:1].reshape(()))))
            else:
                fields.append(pa.field(name, kind_for_value(name, value[0])))
        else:
            first = value[0] if num_records else None
            fields.append(pa.field(name, kind_for_value(name, first)))
    return pa.schema(fields)


def merge_inferred(schemas: Sequence[pa.Schema], *, lists_vary: bool = False) -> pa.Schema:
    """One schema from those of a sample of records (each inferred alone).

    A 1-D numeric column whose length differs between them, or that is empty in one, is a
    variable-length list (``list<value_type>``), and so is every 1-D numeric column under
    ``lists_vary``; a column of Python numbers that are ints in some and floats in others is
    float64. Anything else takes the first record's type: a later record that does not fit is
    reported as it is read, naming it.
    """
    first = schemas[0]
    fields = []
    for index, field in enumerate(first):
        types = [s.field(index).type for s in schemas if s.names == first.names]
        merged = _merged_type(field.name, types, len(schemas))
        if lists_vary:
            merged = _as_list(merged)
        fields.append(pa.field(field.name, merged))
    return pa.schema(fields)


def _as_list(typ: pa.DataType) -> pa.DataType:
    """A 1-D numeric column type as a variable-length list; any other type as it is."""
    dims = _one_dim(typ)
    if dims is None or dims[0] is None:
        return typ
    return pa.list_(dims[0])


def _one_dim(typ: pa.DataType) -> tuple[pa.DataType | None, int | None] | None:
    """(value type, length) of a 1-D numeric column type: length None for a list, value type
    None for an empty list; None for other types."""
    if typ == EMPTY_LIST:
        return None, None
    if isinstance(typ, pa.FixedShapeTensorType) and len(typ.shape) == 1:
        return typ.value_type, typ.shape[0]
    if pa.types.is_list(typ) and is_numeric(typ.value_type):
        return typ.value_type, None
    return None


def _merged_type(name: str, types: list[pa.DataType], sampled: int) -> pa.DataType:
    if all(t == types[0] for t in types) and types[0] != EMPTY_LIST:
        return types[0]
    numbers = {pa.int64(), pa.float64()}
    if all(t in numbers for t in types):
        return pa.float64()
    dims = [d for d in map(_one_dim, types) if d is not None]
    if len(dims) < len(types):  # not all 1-D numeric: the first record's type stands
        return types[0]
    values = [value for value, _length in dims if value is not None]
    if not values:
        raise DecodeError(
            f"column {name!r} holds an empty list in each of the first {sampled} records, so "
            "the type of its values cannot be inferred: pass schema= with "
            "pa.list_(pa.int64()) (or the value type it holds)"
        )
    value = pa.float64() if set(values) == numbers else values[0]
    lengths = {length for _value, length in dims}
    if len(lengths) == 1 and None not in lengths:  # one length: ints and floats in the rows
        return pa.fixed_shape_tensor(value, (lengths.pop(),))
    return pa.list_(value)


def schema_code(schema: pa.Schema) -> str:
    """``schema`` as the Python that builds it (``pa.schema([("id", pa.int64()), ...])``),
    for an error to say the exact ``schema=`` to give."""
    fields = ", ".join(f"({field.name!r}, {_type_code(field.type)})" for field in schema)
    return f"pa.schema([{fields}])"


def _type_code(typ: pa.DataType) -> str:
    if isinstance(typ, pa.FixedShapeTensorType):
        return f"pa.fixed_shape_tensor({_type_code(typ.value_type)}, {tuple(typ.shape)})"
    if pa.types.is_list(typ):
        return f"pa.list_({_type_code(typ.value_type)})"
    if pa.types.is_large_list(typ):
        return f"pa.large_list({_type_code(typ.value_type)})"
    if pa.types.is_fixed_size_list(typ):
        return f"pa.list_({_type_code(typ.value_type)}, {typ.list_size})"
    factory = _TYPE_FACTORIES.get(typ)
    return f"pa.{factory}()" if factory else f"pa.{typ}()"


# Arrow type -> the name of the pyarrow function that makes it, where the two differ in name
# (str(pa.float32()) is "float") or for every type a column built here may have.
_TYPE_FACTORIES = {
    getattr(pa, name)(): name
    for name in (
        "bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        "float16", "float32", "float64", "string", "large_string", "binary", "large_binary",
    )
}  # fmt: skip


def _list_fix(schema: pa.Schema, name: str, kind: TensorKind) -> str:
    """What to do when column ``name`` of an inferred schema (a 1-D tensor) meets a record of
    another length: the schema with that column a list, to give the source."""
    varying = pa.schema(
        [pa.field(f.name, pa.list_(kind.value_type)) if f.name == name else f for f in schema]
    )
    return (
        f"The schema was inferred from a sample of the records, in each of which column "
        f"{name!r} held {kind.shape[0]} values. If its length varies, give the source "
        f"schema={schema_code(varying)}, or give SharedTaskDataset ragged= (every 1-D column "
        'of numbers is then a variable-length list); to leave such records out, on_error="skip"'
    )


class BatchBuilder:
    """Turns decoded records (or a ``decode_batch`` result) into batches of one fixed schema.

    Compiled once per schema and reused for every range, so the per-call work is only the
    conversion itself. Picklable (it holds the schema and small per-column converters).

    ``inferred``: the schema was inferred from a sample of the records, not given. A record
    whose 1-D column has another length than the sample's then says the exact ``schema=``
    that makes the column a variable-length list (:func:`schema_code`).
    """

    def __init__(self, schema: pa.Schema, *, inferred: bool = False) -> None:
        if len(schema) == 0:
            raise ConfigError("schema has no columns")
        self.schema = schema
        self._kinds: list[tuple[str, Kind]] = [(f.name, kind_for_type(f)) for f in schema]
        if inferred:
            for name, kind in self._kinds:
                if isinstance(kind, TensorKind) and len(kind.shape) == 1:
                    kind.other_shape_fix = _list_fix(schema, name, kind)
        self._names = frozenset(schema.names)
        # Every column fixed-width numeric: only then may fixed_records hand them over.
        self._fixable = all(kind.fixable() for _, kind in self._kinds)

    def from_records(self, records: Sequence[Any]) -> pa.RecordBatch:
        """One batch from per-record mappings; the first bad record raises."""
        try:
            batch, _ = self._from_records(records, collect=False)
        except DecodeError:
            # Columns are checked one after another; report the *first* bad record instead.
            _, bad = self._from_records(records, collect=True)
            if not bad:
                raise
            raise bad[min(bad)] from bad[min(bad)].__cause__
        return batch

    def from_records_skipping(
        self, records: Sequence[Any]
    ) -> tuple[pa.RecordBatch, dict[int, DecodeError]]:
        """Like :meth:`from_records` but leaves bad records out and returns their errors.

        At most two passes: one that finds every bad record, one over the good ones.
        """
        return self._from_records(records, collect=True)

    def _from_records(
        self, records: Sequence[Any], *, collect: bool
    ) -> tuple[pa.RecordBatch, dict[int, DecodeError]]:
        columns = self._columns(records)
        bad: dict[int, DecodeError] = {}
        good = records
        if columns is None:
            bad = self._key_errors(records, collect)
            good = [r for i, r in enumerate(records) if i not in bad]
            columns = [[r[name] for r in good] for name, _ in self._kinds]
        arrays = []
        value_bad: dict[int, DecodeError] = {}
        for (name, kind), vals in zip(self._kinds, columns, strict=True):
            arrays.append(try_build(kind, name, vals, value_bad if collect else None))
        if value_bad:
            # Positions in ``value_bad`` are in ``good``; map back and convert the rest again.
            positions = [i for i in range(len(records)) if i not in bad]
            for pos, err in value_bad.items():
                bad[positions[pos]] = at(err, positions[pos])
            batch, _ = self._from_records(
                [r for i, r in enumerate(records) if i not in bad], collect=False
            )
            return batch, dict(sorted(bad.items()))
        return self._batch(arrays, len(good)), dict(sorted(bad.items()))

    def from_columns(self, columns: Mapping[str, Any], num_records: int) -> pa.RecordBatch:
        """One batch from a ``decode_batch`` result (no per-record loop for numeric arrays)."""
        if not isinstance(columns, Mapping):
            raise DecodeError(
                f"decode_batch must return a mapping of column -> values, "
                f"got {type(columns).__name__}"
            )
        found = {_name(k) for k in columns}
        if found != self._names:
            raise _key_mismatch(self._names, found)
        arrays = []
        for name, kind in self._kinds:
            value = columns[name]
            _check_rows(name, value, num_records)
            if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
                arrays.append(kind.from_batched(name, value))
            else:
                arrays.append(try_build(kind, name, list(value), None))
        return self._batch(arrays, num_records)

    def fixed_records(self, records: Sequence[Any]) -> FixedColumns | None:
        """Per-record mappings (one ``decode`` call each) as :class:`FixedColumns` when every
        column is fixed-width numeric and every value exactly of its type: tensors are kept as
        their rows, for the writer to stack straight into shared memory. None otherwise, and
        :meth:`from_records` converts or names what is wrong."""
        columns = self._columns(records) if records and self._fixable else None
        if columns is None:
            return None
        arrays = []
        for (_name, kind), vals in zip(self._kinds, columns, strict=True):
            fixed = kind.fixed_values(vals)
            if fixed is None:
                return None
            arrays.append(fixed)
        return FixedColumns(self, len(records), tuple(arrays))

    def fixed_columns(self, columns: Any, num_records: int) -> FixedColumns | None:
        """``columns`` (a ``decode_batch`` result) as :class:`FixedColumns` if every column is
        a numpy array of exactly its field's dtype and row shape; None otherwise (then
        :meth:`from_columns` converts or names what is wrong)."""
        if not num_records or not isinstance(columns, Mapping) or len(columns) != len(self._kinds):
            return None
        arrays = []
        for name, kind in self._kinds:
            value = columns.get(name)
            if not (isinstance(value, np.ndarray) and kind.fixed_width(value, num_records)):
                return None
            arrays.append(value)
        return FixedColumns(self, num_records, tuple(arrays))

    def empty(self) -> pa.RecordBatch:
        """A zero-row batch of the schema (what an empty or all-skipped range returns)."""
        return pa.RecordBatch.from_arrays(
            [pa.array([], type=f.type) for f in self.schema], schema=self.schema
        )

    def _batch(self, arrays: list[pa.Array], num_records: int) -> pa.RecordBatch:
        if num_records == 0:
            return self.empty()
        # Types may differ from the schema only by a large_ promotion, so build from names.
        return pa.RecordBatch.from_arrays(arrays, names=[name for name, _ in self._kinds])

    def _columns(self, records: Sequence[Any]) -> list[list[Any]] | None:
        """Values column by column, or None when some record has other keys (slow path).

        Every record a dict with as many keys as the schema and each schema name found in it
        means the key sets are equal; the checks run in C (``map``), not per record in Python.
        """
        if set(map(type, records)) - {dict} or set(map(len, records)) - {len(self._kinds)}:
            return None
        try:
            return [[r[name] for r in records] for name, _ in self._kinds]
        except KeyError:
            return None

    def _key_errors(self, records: Sequence[Any], collect: bool) -> dict[int, DecodeError]:
        bad: dict[int, DecodeError] = {}
        for i, r in enumerate(records):
            err = self._record_key_error(r)
            if err is not None:
                err = at(err, i)
                if not collect:
                    raise err
                bad[i] = err
        return bad

    def _record_key_error(self, record: Any) -> DecodeError | None:
        if not isinstance(record, Mapping):
            return DecodeError(
                f"decode must return a mapping of column -> value, got {type(record).__name__}"
            )
        try:
            found = {_name(k) for k in record}
        except DecodeError as exc:
            return exc
        if found != self._names:
            return _key_mismatch(self._names, found)
        return None


@dataclass(frozen=True, eq=False)
class FixedColumns:
    """A ``decode_batch`` result of fixed-width numeric columns, checked and not yet copied.

    ``arrays`` are in schema order, each of exactly its field's dtype and shape ``(num_rows,
    *row_shape)``, and may be strided: the usual result is views of one joined buffer, a
    label after each image. Arrow has no strides, so :meth:`to_batch` copies each such array
    once; a reader instead writes the arrays straight into its shared-memory segment, which
    is that copy and the write in one (``shm/template.py``).
    """

    builder: BatchBuilder
    num_rows: int
    # A tensor column of per-record decode results may be their list, not yet stacked
    # (RowArrays: stacked straight into the segment, or by numpy.asarray).
    arrays: tuple[np.ndarray | RowArrays, ...]

    @property
    def schema(self) -> pa.Schema:
        return self.builder.schema

    def to_batch(self) -> pa.RecordBatch:
        arrays = [np.asarray(a) for a in self.arrays]
        return self.builder.from_columns(
            dict(zip(self.schema.names, arrays, strict=True)), self.num_rows
        )


def records_to_batch(
    records: Sequence[Mapping[str, Any]], schema: pa.Schema | None = None
) -> pa.RecordBatch:
    """Per-record mappings -> one batch; schema inferred from the first record if not given."""
    if schema is None:
        if not records:
            raise DecodeError("cannot infer a schema from zero records; pass schema=", fix="")
        schema = infer_schema(records[0])
    return BatchBuilder(schema).from_records(records)


def columns_to_batch(
    columns: Mapping[str, Any], num_records: int, schema: pa.Schema | None = None
) -> pa.RecordBatch:
    """A ``decode_batch`` result -> one batch; schema inferred from it if not given."""
    if schema is None:
        schema = infer_schema_from_columns(columns, num_records)
    return BatchBuilder(schema).from_columns(columns, num_records)


def column_to_numpy(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A tensor (or primitive) column as a numpy array of shape ``(n, *shape)``.

    This is what the dataset's gather builds on: for tensor columns, fixed-size-list columns
    (one level per dimension) and primitive columns the result is a read-only *view* of the
    Arrow buffer (zero-copy), so ``column_to_numpy(col)[indices]`` is the one copy of a batch.
    Copies only where Arrow's layout differs from numpy's: bool (bit-packed) values, and a
    ChunkedArray of several chunks (concatenated). Nulls are refused: they have no numpy form.
    Fixed-size lists are unwrapped by slicing, not ``flatten()`` (see ``innermost_values``).
    """
    if isinstance(array, pa.ChunkedArray):
        array = array.chunk(0) if array.num_chunks == 1 else array.combine_chunks()
    form = tensor_form(array.type)
    if form is None:
        raise ConfigError(
            f"column_to_numpy needs a tensor, fixed-size-list or numeric column, got {array.type}"
        )
    row = first_null_row(array)
    if row is not None:
        raise DecodeError(f"column of type {array.type} has nulls (the first in row {row})")
    # A view of the values' buffer; a copy for bool only (bit-packed in Arrow)
    flat = to_numpy(innermost_values(array))
    return flat.reshape((len(array), *form[1]))


def as_tensor_column(
    array: pa.Array | pa.ChunkedArray, shape: Sequence[int], name: str = "?"
) -> pa.Array:
    """Re-type a list / fixed-size-list column (one list level per leading dimension, the
    last level holding the rest) as a tensor column of per-row ``shape``, zero-copy.

    This is how columns read from Parquet or Arrow files written without the tensor type
    become gatherable. Every row must hold exactly ``shape`` values and no nulls; the first
    row that does not raises SchemaMismatchError with ``index`` = that row.
    """
    shape = tuple(int(d) for d in shape)
    if isinstance(array, pa.ChunkedArray):
        array = array.chunk(0) if array.num_chunks == 1 else array.combine_chunks()
    typ = array.type
    if isinstance(typ, pa.FixedShapeTensorType):
        if tuple(typ.shape) != shape:
            raise SchemaMismatchError(
                f"column {name!r}: expected tensors of shape {shape}, found shape {typ.shape}"
            )
        return array
    values: pa.Array = array
    per_row = 1  # elements of the current level per row
    level = 0
    while is_any_list(values.type):
        if level >= len(shape):
            raise SchemaMismatchError(f"column {name!r}: {typ} has more levels than {shape}")
        want = shape[level] if is_any_list(values.type.value_type) else math.prod(shape[level:])
        _check_lengths(name, values, want, per_row, shape)
        per_row *= want
        values = values.flatten()
        level += 1
    if level == 0 or not is_numeric(values.type):
        raise SchemaMismatchError(
            f"column {name!r}: expected a list column of numbers to use as tensors of shape "
            f"{shape}, found {typ}"
        )
    if values.null_count:
        raise SchemaMismatchError(f"column {name!r}: has null values; tensors cannot hold nulls")
    ttype = pa.fixed_shape_tensor(values.type, shape)
    storage = pa.FixedSizeListArray.from_arrays(values, type=ttype.storage_type)
    return pa.ExtensionArray.from_storage(ttype, storage)


def _check_lengths(
    name: str, values: pa.Array, want: int, per_row: int, shape: tuple[int, ...]
) -> None:
    """Every list at this level holds ``want`` items (``per_row`` lists make up one row)."""
    if values.null_count:
        row = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0]) // per_row
        raise SchemaMismatchError(f"column {name!r}: null where a tensor is needed", index=row)
    if pa.types.is_fixed_size_list(values.type):
        if values.type.list_size == want:
            return
        row = 0
        found = values.type.list_size
    else:
        lengths = values.value_lengths().to_numpy(zero_copy_only=False)
        wrong = np.flatnonzero(lengths != want)
        if not len(wrong):
            return
        row, found = int(wrong[0]) // per_row, int(lengths[wrong[0]])
    raise SchemaMismatchError(
        f"column {name!r}: a list of {found} values where tensors of shape {shape} need {want}",
        index=row,
    )


def _name(key: Any) -> str:
    if not isinstance(key, str):
        raise DecodeError(f"column names must be str, got {key!r} ({type(key).__name__})")
    return key


def _check_rows(name: str, value: Any, num_records: int) -> None:
    if isinstance(value, np.ndarray):
        rows = value.shape[0] if value.ndim else None
    elif isinstance(value, (list, tuple)):
        rows = len(value)
    else:
        raise DecodeError(
            f"column {name!r}: decode_batch must give an array with one row per record or a "
            f"list of per-record values, got {type(value).__name__}"
        )
    if rows != num_records:
        raise SchemaMismatchError(
            f"column {name!r}: decode_batch gave {rows} rows for {num_records} records"
        )


def _key_mismatch(expected: frozenset[str], found: set[str]) -> SchemaMismatchError:
    missing = sorted(expected - found)
    extra = sorted(found - expected)
    parts = []
    if missing:
        parts.append(f"missing column(s) {', '.join(map(repr, missing))}")
    if extra:
        parts.append(f"unexpected column(s) {', '.join(map(repr, extra))}")
    return SchemaMismatchError(
        f"{'; '.join(parts)} (expected columns {sorted(expected)}, found {sorted(found)})"
    )
