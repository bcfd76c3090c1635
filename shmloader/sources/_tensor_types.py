"""Which Arrow columns become tensors in a batch, and where such a column holds a null.

A batch column's form must follow from its type alone, never from the data: otherwise one
task's segment (no null in it) gathers as a tensor and the next one's (a null) as a list, and
a batch drawing from both cannot be built. So numeric and boolean columns, and fixed-size lists
and fixed-shape tensors of them, always become tensors, which have no null: a source that reads
Arrow data (Parquet, Arrow IPC) refuses a null in them, as in the values of a variable-length
numeric list (each row of one becomes a 1-D tensor). A null *row* of a variable-length list, a
string or a binary column is kept: those become Python lists, where it is ``None``.

Kept free of torch: readers check their batches with it, and the gather shapes its output.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ._numpy_arrow import numpy_dtype, to_numpy


def is_number(typ: pa.DataType) -> bool:
    """Integer, floating point or boolean: what a tensor can hold."""
    return pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_boolean(typ)


def tensor_form(typ: pa.DataType) -> tuple[pa.DataType, tuple[int, ...]] | None:
    """``(value type, row shape)`` of a column that becomes one tensor, else None.

    Scalars have shape ``()``; fixed-size lists (also nested) and fixed-shape tensors the
    shape of a row."""
    if isinstance(typ, pa.FixedShapeTensorType):
        inner = tensor_form(typ.value_type)
        return None if inner is None else (inner[0], (*typ.shape, *inner[1]))
    if pa.types.is_fixed_size_list(typ):
        inner = tensor_form(typ.value_type)
        return None if inner is None else (inner[0], (typ.list_size, *inner[1]))
    return (typ, ()) if is_number(typ) else None


def innermost_values(array: pa.Array) -> pa.Array:
    """The scalar values of a tensor column's rows, fixed-size lists unwrapped at any depth,
    as ``flatten()`` gives them for an array without nulls. ``flatten`` imports
    ``pyarrow.compute`` on first use: about 0.1 s of a trainer's time to its first batch."""
    if isinstance(array, pa.ExtensionArray):
        return innermost_values(array.storage)
    if pa.types.is_fixed_size_list(array.type):
        size = array.type.list_size
        return innermost_values(array.values.slice(array.offset * size, len(array) * size))
    return array


def is_any_list(typ: pa.DataType) -> bool:
    """A list of any kind: variable-length (also large) or fixed-size."""
    return bool(
        pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ)
    )


def is_number_list(typ: pa.DataType) -> bool:
    """A variable-length list of numbers: each row becomes a 1-D tensor."""
    return (pa.types.is_list(typ) or pa.types.is_large_list(typ)) and is_number(typ.value_type)


def first_null_row(array: pa.Array) -> int | None:
    """The first row of ``array`` that a tensor cannot hold (a null in it, at any depth), for
    columns that become tensors or lists of 1-D tensors; None if there is none or the column
    becomes something else."""
    typ = array.type
    if tensor_form(typ) is not None:
        return _first_null(array)
    if is_number_list(typ):
        offsets = to_numpy(array.offsets)
        values = array.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        value = _first_null(values)
        if value is None:
            return None
        return int(np.searchsorted(offsets, int(offsets[0]) + value, side="right")) - 1
    return None


def _first_null(array: pa.Array) -> int | None:
    """The first of ``array``'s entries that is null or holds a null in its fixed-size values."""
    if isinstance(array, pa.ExtensionArray):
        return _first_null(array.storage)
    found = [_null_position(array)]
    if pa.types.is_fixed_size_list(array.type):
        size = array.type.list_size
        inner = _first_null(array.values.slice(array.offset * size, len(array) * size))
        found.append(None if inner is None else inner // size)
    rows = [p for p in found if p is not None]
    return min(rows) if rows else None


def _null_position(array: pa.Array) -> int | None:
    if not array.null_count:
        return None
    validity = array.buffers()[0]
    assert validity is not None  # a null count needs a validity bitmap
    bits = np.unpackbits(np.frombuffer(validity, np.uint8), bitorder="little")
    valid = bits[array.offset : array.offset + len(array)]
    return int(np.flatnonzero(valid == 0)[0])


NULLS = "nulls"  # a column of Arrow type null (e.g. only nulls in a Parquet file): None rows
# The words of every column gathered by ``to_pylist``, followed by " of <its Arrow type>".
PYTHON_VALUES = "list of Python values"


# How gather_form starts the form of a variable-length numeric list column.
NUMBER_LISTS = "list of 1-D"


def gather_form(typ: pa.DataType) -> tuple[bool, str]:
    """``(tensor, words)``: whether a column of type ``typ`` becomes one tensor in a batch,
    and what it becomes, in words (docs/dataset.md, "Batches"). Types with the same words
    gather alike (``string`` and ``large_string``, a dictionary of strings and strings); a
    batch cannot draw rows from segments whose forms for a column differ, and a batch drawn
    from one of them alone would silently differ from the next: readers send these forms
    with every segment, and the trainer compares them (dataset/column_forms.py). A column of type
    null agrees with any form that is not a tensor (``forms_agree``)."""
    form = tensor_form(typ)
    if form is not None:
        value, shape = form
        name = _dtype_name(value)
        return True, f"{name} tensor of row shape {shape}" if shape else f"{name} scalar"
    if pa.types.is_null(typ):
        return False, NULLS
    if pa.types.is_dictionary(typ) and tensor_form(typ.value_type) is None:
        return gather_form(typ.value_type)  # gathered as its values' Python objects
    if is_number_list(typ):
        return False, f"{NUMBER_LISTS} {_dtype_name(typ.value_type)} tensors"
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return False, "list of str"
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        return False, "list of bytes"
    return False, f"{PYTHON_VALUES} of {str(typ).replace('large_', '')}"


def schema_forms(schema: pa.Schema) -> tuple[tuple[str, bool, str], ...]:
    """``(name, *gather_form)`` of every column of ``schema``, in its order."""
    return tuple((field.name, *gather_form(field.type)) for field in schema)


def forms_agree(a: tuple[bool, str], b: tuple[bool, str]) -> bool:
    """Whether columns of these forms can share a batch: equal tensor forms (one dtype, one
    row shape: the batch's one tensor), or two forms that are not tensors, which a batch
    holds as a Python list with an item per row whatever each segment's Arrow type.

    Only tensor columns are held to one form. Lists differed harmlessly before the check
    existed, and the plan check of the Parquet and Arrow sources (``_tabular.SchemaCheck``)
    lets such files share a source: ``timestamp[ms]`` and ``timestamp[us]``, ``date32`` and
    ``date64``, decimals of two precisions, ``string`` and ``binary``, ``list<float>`` and
    ``list<double>``, or a column of nulls beside any of them. Refusing them failed the loop
    mid-epoch, at the first task of the second file, on data that gathered before."""
    if a[0] or b[0]:
        return a == b
    return True


def _dtype_name(typ: pa.DataType) -> str:
    """numpy's name of a number type (``float64``, not Arrow's ``double``): what a user wrote."""
    return numpy_dtype(typ).name
