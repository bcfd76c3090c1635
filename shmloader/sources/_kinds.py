"""Per-column converters behind :mod:`shmloader.sources.columns`.

Each column type has one :class:`Kind` that knows how to (a) convert a whole list of values
in one vectorised step when they are already exactly right (the common case, checked with a
cheap loop over attributes), (b) normalise one value at a time otherwise, so that a bad value
is reported with its column and record position, and (c) convert a batched numpy array from a
``decode_batch`` function without looking at records one by one.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import ConfigError, DecodeError, SchemaMismatchError
from ._numpy_arrow import binary_array, from_numpy, numpy_dtype
from .row_arrays import RowArrays

_INT32_MAX = 2**31 - 1
_NUMERIC_KINDS = "biuf"
# Python numbers carry a kind but no width: an int may fill any integer or float column
# (if it fits, checked on conversion), a float any float column, a bool any numeric one.
_PYTHON_TARGETS = {"b": "biuf", "i": "iuf", "u": "iuf", "f": "f"}


def describe(value: Any) -> str:
    """A short description of a value for error messages ("float64 array of shape (3,)")."""
    if value is None:
        return "None"
    if isinstance(value, np.ndarray):
        return f"{value.dtype} array of shape {value.shape}"
    if isinstance(value, np.generic):
        return f"numpy {value.dtype} scalar"
    if isinstance(value, (bool, int, float)):
        return f"Python {type(value).__name__} {value!r}"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__} of {len(value)} values"
    if type(value).__module__.split(".")[0] == "torch" and hasattr(value, "numpy"):
        # Readers store numpy and Python values only (they do not import torch); say how.
        shape = tuple(getattr(value, "shape", ()))
        return (
            f"torch.Tensor ({getattr(value, 'dtype', '?')}, shape {shape}; decode functions "
            "return numpy arrays: use tensor.numpy())"
        )
    return type(value).__name__


def at(err: DecodeError, position: int) -> DecodeError:
    """The same error with ``index`` set to the record's position in the list given."""
    out = type(err)(err.reason, path=err.path, offset=err.offset, index=position, fix=err.fix)
    out.__cause__ = err.__cause__
    return out


def _mismatch(
    name: str, expected: str, value: Any, why: str = "", *, fix: str | None = None
) -> SchemaMismatchError:
    tail = f" ({why})" if why else ""
    return SchemaMismatchError(
        f"column {name!r}: expected {expected}, found {describe(value)}{tail}", fix=fix
    )


def _cast(name: str, expected: str, value: Any, dst: np.dtype) -> Any:
    """Check that ``value`` (array or scalar) may become ``dst``; return it as numpy.

    numpy values follow numpy's "safe" rule; Python numbers and lists may change width within
    their kind (they carry no width), but must fit.
    """
    from_python = not isinstance(value, (np.ndarray, np.generic))
    raw: Any = value  # a Python int as it is; anything else as numpy, converted once
    if from_python and type(value) is int and not isinstance(value, bool):
        src = np.dtype(np.int64)  # its kind; the fit is checked below
    else:
        try:
            raw = np.asarray(value)
        except (ValueError, TypeError) as exc:
            raise DecodeError(f"column {name!r}: cannot store {describe(value)}: {exc}") from exc
        src = raw.dtype
    if src.kind not in _NUMERIC_KINDS:
        raise SchemaMismatchError(
            f"column {name!r}: cannot store {describe(value)} of dtype {src} (only bool, "
            "integer and float values are stored)"
        )
    if src != dst:
        ok = dst.kind in _PYTHON_TARGETS[src.kind] if from_python else np.can_cast(src, dst, "safe")
        if not ok:
            raise _mismatch(name, expected, value, f"{src} cannot be cast to {dst} safely")
        if from_python and dst.kind in "iu" and not _fits(raw, dst):
            raise _mismatch(name, expected, value, f"does not fit {dst}")
    try:
        return np.asarray(raw, dtype=dst)
    except OverflowError as exc:
        raise _mismatch(name, expected, value, f"does not fit {dst}") from exc


def _fits(raw: Any, dst: np.dtype) -> bool:
    """Whether Python integers (an int, or numpy's array of a list of them) lie in ``dst``'s
    range. numpy 2 refuses one outside it; numpy 1 wraps it around (300 into uint8 gave 44)
    with only a warning."""
    info = np.iinfo(dst)
    if isinstance(raw, int):
        return bool(info.min <= raw <= info.max)
    if raw.size == 0 or raw.dtype.kind not in "iub":
        return True
    return bool(info.min <= int(raw.min()) and int(raw.max()) <= info.max)


class Kind:
    """How one column type is checked and built. Subclasses set ``arrow_type``."""

    arrow_type: pa.DataType

    def describe(self) -> str:
        return str(self.arrow_type)

    def fast(self, vals: list[Any]) -> pa.Array | None:
        """The whole column in one step, or None when some value needs :meth:`normalize`."""
        return None

    def normalize(self, name: str, value: Any) -> Any:
        raise NotImplementedError

    def build(self, vals: list[Any]) -> pa.Array:
        raise NotImplementedError

    def from_batched(self, name: str, arr: np.ndarray) -> pa.Array:
        raise _mismatch(name, f"per-record {self.describe()} values", arr, "give a list")

    def fixed_width(self, arr: np.ndarray, num_records: int) -> bool:
        """Is ``arr`` this column for ``num_records`` records exactly as Arrow lays it out
        (the same dtype, one fixed-size row per record): nothing to check or convert?"""
        return False

    def fixed_values(self, vals: list[Any]) -> np.ndarray | RowArrays | None:
        """Per-record values (at least one) as a fixed-width column a writer copies into
        place (what :meth:`fixed_width` accepts, or its rows not yet stacked), or None: then
        :meth:`fast` / :meth:`build` make an Arrow array, which also names any bad value.
        Asked only of a column whose :meth:`fixable` says yes."""
        return None

    def fixable(self) -> bool:
        """Can :meth:`fixed_values` give a column at all? Asked once per schema: a schema
        with a column that never can (strings, lists, booleans) skips the attempt, which would
        only go over every record's values once more before :meth:`fast` does."""
        return False


class PrimitiveKind(Kind):
    def __init__(self, arrow_type: pa.DataType) -> None:
        self.arrow_type = arrow_type
        self.dtype = numpy_dtype(arrow_type)

    def describe(self) -> str:
        return f"{self.dtype} scalar"

    def fast(self, vals: list[Any]) -> pa.Array | None:
        arr = self._exact_array(vals)
        return None if arr is None else from_numpy(arr, self.arrow_type)

    def _exact_array(self, vals: list[Any]) -> np.ndarray | None:
        """``vals`` as one numpy array if every value is exactly of this column's dtype."""
        try:
            arr = np.array(vals)
        except (ValueError, TypeError, OverflowError):
            return None
        # np.array promotes mixed inputs; a result of exactly our dtype means every value was
        # castable by the rules above (a promoted-away value would change the dtype).
        return arr if arr.dtype == self.dtype and arr.ndim == 1 else None

    def normalize(self, name: str, value: Any) -> Any:
        if isinstance(value, np.ndarray) and value.ndim != 0:
            raise _mismatch(name, self.describe(), value)
        if not isinstance(value, (np.ndarray, np.generic, bool, int, float)):
            hint = " (columns have no nulls)" if value is None else ""
            raise DecodeError(
                f"column {name!r}: cannot store {describe(value)} as {self.dtype}{hint}"
            )
        return _cast(name, self.describe(), value, self.dtype)

    def build(self, vals: list[Any]) -> pa.Array:
        return from_numpy(np.array(vals, dtype=self.dtype), self.arrow_type)

    def fixable(self) -> bool:
        return self.dtype.kind != "b"  # Arrow packs booleans into bits: not a copy of numpy's

    def fixed_values(self, vals: list[Any]) -> np.ndarray | RowArrays | None:
        return self._exact_array(vals)

    def fixed_width(self, arr: np.ndarray, num_records: int) -> bool:
        # bool is not: Arrow packs it to bits
        return arr.dtype == self.dtype and arr.shape == (num_records,) and arr.dtype.kind != "b"

    def from_batched(self, name: str, arr: np.ndarray) -> pa.Array:
        if arr.ndim != 1:
            raise _mismatch(name, f"one {self.dtype} per record (a 1-D array)", arr)
        return from_numpy(_cast(name, self.describe(), arr, self.dtype), self.arrow_type)


_OTHER_SHAPE = "other shape; for a column whose length varies pass schema= with pa.list_(...)"


class TensorKind(Kind):
    """Fixed-shape arrays; ``arrow_type`` is a fixed_shape_tensor or a fixed_size_list.

    ``other_shape_fix``: what a record of another shape is told to do (the error's ``fix``);
    None: the default, which suggests a list type and ``on_error="skip"``.
    """

    other_shape_fix: str | None = None

    def __init__(self, arrow_type: pa.DataType, value_type: pa.DataType, shape: tuple[int, ...]):
        if math.prod(shape) == 0:
            raise ConfigError(f"tensor shape {shape} has no elements")
        self.arrow_type = arrow_type
        self.value_type = value_type
        self.shape = shape
        self.size = math.prod(shape)
        self.dtype = numpy_dtype(value_type)
        storage = arrow_type.storage_type if isinstance(arrow_type, pa.BaseExtensionType) else None
        self.storage_type = storage if storage is not None else arrow_type

    def describe(self) -> str:
        return f"{self.dtype} array of shape {self.shape}"

    def fast(self, vals: list[Any]) -> pa.Array | None:
        return self.build(vals) if self._all_exact(vals) else None

    def fixable(self) -> bool:
        return self.dtype.kind != "b"

    def fixed_values(self, vals: list[Any]) -> np.ndarray | RowArrays | None:
        if not self._all_exact(vals):
            return None
        if not self.shape:  # one value per record (shape ()): the values, as one array
            return np.array(vals, dtype=self.dtype)
        return RowArrays(vals, self.dtype, self.shape)

    def _all_exact(self, vals: list[Any]) -> bool:
        """Every value an ndarray of exactly this column's dtype and row shape."""
        nd, dt, shape = np.ndarray, self.dtype, self.shape
        # A plain loop: all() over a generator is slower. ``is`` first: numpy hands out one
        # dtype object per built-in type, so ``!=`` (a rich comparison) runs only otherwise.
        for v in vals:
            if type(v) is not nd or (v.dtype is not dt and v.dtype != dt) or v.shape != shape:
                return False
        return True

    def normalize(self, name: str, value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            try:
                shape: tuple[int, ...] | None = np.shape(value)
            except ValueError:  # ragged
                shape = None
            if shape != self.shape:  # before the cast: [] is float64 to numpy, say the length
                raise self._other_shape(name, value)
            value = _cast(name, self.describe(), value, self.dtype)
        if not isinstance(value, np.ndarray):
            raise DecodeError(
                f"column {name!r}: expected {self.describe()}, found {describe(value)}"
            )
        if value.shape != self.shape:
            raise self._other_shape(name, value)
        return _cast(name, self.describe(), value, self.dtype)

    def _other_shape(self, name: str, value: Any) -> SchemaMismatchError:
        if self.other_shape_fix is None:
            return _mismatch(name, self.describe(), value, _OTHER_SHAPE)
        return _mismatch(name, self.describe(), value, "other shape", fix=self.other_shape_fix)

    def build(self, vals: list[Any]) -> pa.Array:
        if not vals:
            return self._wrap(np.empty(0, self.dtype))
        if not self.shape:  # numpy joins no zero-dimensional arrays: one value per record
            return self._wrap(np.array(vals, dtype=self.dtype))
        return self._wrap(np.concatenate(vals, axis=0).reshape(-1))

    def fixed_width(self, arr: np.ndarray, num_records: int) -> bool:
        return (
            arr.dtype == self.dtype
            and arr.shape == (num_records, *self.shape)
            and arr.dtype.kind != "b"
        )

    def from_batched(self, name: str, arr: np.ndarray) -> pa.Array:
        if arr.shape[1:] != self.shape:
            raise _mismatch(name, f"a batch of {self.describe()}", arr, "other shape")
        flat = np.ascontiguousarray(_cast(name, self.describe(), arr, self.dtype)).reshape(-1)
        return self._wrap(flat)

    def _wrap(self, flat: np.ndarray) -> pa.Array:
        values = from_numpy(flat, self.value_type)
        storage = pa.FixedSizeListArray.from_arrays(values, type=self.storage_type)
        if isinstance(self.arrow_type, pa.BaseExtensionType):
            return pa.ExtensionArray.from_storage(self.arrow_type, storage)
        return storage


class ListKind(Kind):
    """Variable-length 1-D arrays: offsets + one values buffer."""

    def __init__(self, arrow_type: pa.DataType) -> None:
        self.arrow_type = arrow_type
        self.value_type = arrow_type.value_type
        self.dtype = numpy_dtype(self.value_type)

    def describe(self) -> str:
        return f"1-D {self.dtype} array"

    def fast(self, vals: list[Any]) -> pa.Array | None:
        nd, dt = np.ndarray, self.dtype
        for v in vals:
            if type(v) is not nd or v.dtype != dt or v.ndim != 1:
                return None
        return self.build(vals)

    def normalize(self, name: str, value: Any) -> Any:
        if not isinstance(value, (np.ndarray, list, tuple)):
            raise DecodeError(
                f"column {name!r}: expected {self.describe()}, found {describe(value)}"
            )
        if not isinstance(value, np.ndarray) and not len(value):
            return np.empty(0, self.dtype)  # an empty list has no dtype (numpy says float64)
        arr = _cast(name, self.describe(), value, self.dtype)
        if arr.ndim != 1:
            raise _mismatch(name, self.describe(), value)
        return arr

    def build(self, vals: list[Any]) -> pa.Array:
        offsets = np.zeros(len(vals) + 1, dtype=np.int64)
        np.cumsum([len(v) for v in vals], out=offsets[1:])
        values = np.concatenate(vals) if vals else np.empty(0, self.dtype)
        return self._wrap(offsets, values)

    def from_batched(self, name: str, arr: np.ndarray) -> pa.Array:
        if arr.ndim != 2:
            raise _mismatch(name, f"a batch of {self.describe()}s (2-D) or a list", arr)
        flat = np.ascontiguousarray(_cast(name, self.describe(), arr, self.dtype)).reshape(-1)
        return self._wrap(np.arange(arr.shape[0] + 1, dtype=np.int64) * arr.shape[1], flat)

    def _wrap(self, offsets: np.ndarray, values: np.ndarray) -> pa.Array:
        typ = self.arrow_type
        if pa.types.is_list(typ) and offsets[-1] > _INT32_MAX:
            typ = pa.large_list(typ.value_field)
        if pa.types.is_list(typ):
            offsets32 = from_numpy(offsets.astype(np.int32), pa.int32())
            return pa.ListArray.from_arrays(offsets32, values, type=typ)
        return pa.LargeListArray.from_arrays(from_numpy(offsets, pa.int64()), values, type=typ)


class BytesKind(Kind):
    """binary / string (and their large_ variants, used when a batch exceeds 2 GiB)."""

    def __init__(self, arrow_type: pa.DataType) -> None:
        self.arrow_type = arrow_type
        is_str = pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)
        self.py_type: type = str if is_str else bytes
        self.large = pa.large_string() if is_str else pa.large_binary()

    def describe(self) -> str:
        return self.py_type.__name__

    def fast(self, vals: list[Any]) -> pa.Array | None:
        t = self.py_type
        for v in vals:
            if type(v) is not t:
                return None
        try:
            return self.build(vals)
        except UnicodeEncodeError:
            # A str with a lone surrogate (json.loads accepts "\ud800") has no UTF-8 form;
            # normalize() finds which record, so the error names it (or skips only it).
            return None

    def normalize(self, name: str, value: Any) -> Any:
        if self.py_type is str:
            if isinstance(value, str):
                try:
                    value.encode("utf-8")  # paid only where fast() declined the column
                except UnicodeEncodeError as exc:
                    raise DecodeError(
                        f"column {name!r}: a str that has no UTF-8 form, which string "
                        f"columns store ({exc})"
                    ) from exc
                return str(value)
            if isinstance(value, (bytes, bytearray, memoryview)):
                raise _mismatch(name, "str", value, "decode it, or declare a binary column")
        elif isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        elif isinstance(value, str):
            raise _mismatch(name, "bytes", value, "encode it, or declare a string column")
        raise DecodeError(f"column {name!r}: expected {self.describe()}, found {describe(value)}")

    def build(self, vals: list[Any]) -> pa.Array:
        if self.py_type is bytes:  # binary or large_binary
            return binary_array(vals, self.arrow_type)
        try:
            arr = pa.array(vals, type=self.arrow_type)
        except pa.ArrowCapacityError:
            return pa.array(vals, type=self.large)
        if isinstance(arr, pa.ChunkedArray):  # over 2 GiB: pyarrow splits instead of failing
            return pa.array(vals, type=self.large)
        return arr


def try_build(kind: Kind, name: str, vals: list[Any], bad: dict[int, DecodeError] | None) -> Any:
    """Convert one column; a bad value raises (``bad is None``) or is recorded in ``bad``.

    Returns None when values were recorded as bad: the caller converts again without them.
    """
    arr = kind.fast(vals)
    if arr is not None:
        return arr
    normalized = []
    found = False
    for i, v in enumerate(vals):
        try:
            normalized.append(kind.normalize(name, v))
        except DecodeError as exc:
            if bad is None:
                raise at(exc, i) from exc.__cause__
            bad.setdefault(i, at(exc, i))
            found = True
    return None if found else kind.build(normalized)


def kind_for_type(field: pa.Field) -> Kind:
    """The converter for a schema field; unsupported types are a ConfigError."""
    t = field.type
    if isinstance(t, pa.FixedShapeTensorType) and is_numeric(t.value_type):
        return TensorKind(t, t.value_type, tuple(t.shape))
    if pa.types.is_fixed_size_list(t) and is_numeric(t.value_type):
        return TensorKind(t, t.value_type, (t.list_size,))
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and is_numeric(t.value_type):
        return ListKind(t)
    if is_numeric(t):
        return PrimitiveKind(t)
    if any(check(t) for check in _BYTES_TYPES):
        return BytesKind(t)
    raise ConfigError(
        f"column {field.name!r}: type {t} is not supported (use bool/int/uint/float, "
        "fixed_shape_tensor or fixed_size_list of those, list of those, binary or string)"
    )


_BYTES_TYPES = (
    pa.types.is_binary,
    pa.types.is_large_binary,
    pa.types.is_string,
    pa.types.is_large_string,
)


def is_numeric(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t))


# What an empty Python list implies: a variable-length list whose value type the other
# records of the sample tell (columns.merge_inferred).
EMPTY_LIST = pa.list_(pa.null())


def kind_for_value(name: str, value: Any) -> pa.DataType:
    """The column type a first record's value implies (see the columns module doc)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return pa.binary()
    if isinstance(value, str):
        return pa.string()
    if isinstance(value, bool):
        return pa.bool_()
    if isinstance(value, int):
        return pa.int64()
    if isinstance(value, float):
        return pa.float64()
    if isinstance(value, (list, tuple)):
        if not value:
            return EMPTY_LIST  # a list of this column, of a value type other records show
        try:
            value = np.asarray(value)
        except (ValueError, TypeError) as exc:
            raise DecodeError(f"column {name!r}: cannot store this list: {exc}") from exc
    if not isinstance(value, (np.ndarray, np.generic)):
        hint = " (columns have no nulls)" if value is None else ""
        raise DecodeError(f"column {name!r}: cannot store {describe(value)}{hint}")
    if value.dtype.kind not in _NUMERIC_KINDS:
        raise DecodeError(
            f"column {name!r}: cannot store {describe(value)} (dtype {value.dtype}; only bool, "
            "integer and float values are stored; give str/bytes values for text)"
        )
    pa_type = pa.from_numpy_dtype(value.dtype)
    if value.ndim == 0:
        return pa_type
    if value.ndim == 1 and value.size == 0:
        return pa.list_(pa_type)  # an empty 1-D array: of a column whose length varies
    if value.size == 0:
        raise DecodeError(
            f"column {name!r}: the first record has an empty array {value.shape}, so no shape "
            "can be inferred; pass schema= (pa.list_(...) for variable-length columns)"
        )
    return pa.fixed_shape_tensor(pa_type, value.shape)
