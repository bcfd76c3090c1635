"""NumPy arrays to Arrow arrays and back, zero-copy, without pyarrow's look for pandas.

``pa.array`` and ``Array.to_numpy`` ask pyarrow's pandas shim whether an object is a pandas
one, and the first question imports pandas where it is installed: about 0.2 s of CPU, paid
by every reader on its first task and by the trainer on its first batch (both on the way to
the first batch). For numbers and bytes, the conversions here build or read the buffers
themselves (``Array.from_buffers``, ``np.frombuffer``), which never asks; other types go
through pyarrow as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

__all__ = ["binary_array", "from_numpy", "numpy_dtype", "to_numpy", "values_view"]

_INT32_MAX = 2**31 - 1
_NUMPY_OF: dict[pa.DataType, type[np.generic]] = {
    pa.bool_(): np.bool_,
    pa.int8(): np.int8,
    pa.int16(): np.int16,
    pa.int32(): np.int32,
    pa.int64(): np.int64,
    pa.uint8(): np.uint8,
    pa.uint16(): np.uint16,
    pa.uint32(): np.uint32,
    pa.uint64(): np.uint64,
    pa.float16(): np.float16,
    pa.float32(): np.float32,
    pa.float64(): np.float64,
}


def numpy_dtype(typ: pa.DataType) -> np.dtype:
    """numpy's dtype of an Arrow type, as ``typ.to_pandas_dtype()`` gives it, without it for
    booleans, numbers, timestamps and durations: pyarrow before 18 imports pandas there (0.2 s
    of CPU, and a ModuleNotFoundError without pandas)."""
    known = _NUMPY_OF.get(typ)
    if known is not None:
        return np.dtype(known)
    if pa.types.is_timestamp(typ) and typ.tz is None:
        return np.dtype(f"datetime64[{typ.unit}]")
    if pa.types.is_duration(typ):
        return np.dtype(f"timedelta64[{typ.unit}]")
    return np.dtype(typ.to_pandas_dtype())


def _plain_numeric(typ: pa.DataType) -> bool:
    """Integers and floats: one values buffer laid out as numpy lays out the same dtype."""
    return bool(pa.types.is_integer(typ) or pa.types.is_floating(typ))


def values_view(array: pa.Array) -> np.ndarray | None:
    """The values of a primitive numeric array without nulls as a read-only numpy view of its
    buffer (no copy), or None for any other array (bool is bit-packed; nulls need a mask)."""
    if not _plain_numeric(array.type) or array.null_count:
        return None
    dtype = numpy_dtype(array.type)
    data = array.buffers()[1]
    if data is None:
        return np.empty(0, dtype=dtype)
    view = np.frombuffer(data, dtype=dtype, count=len(array) + array.offset)[array.offset :]
    view.flags.writeable = False  # the buffer may be a shared segment, read by others
    return view


def to_numpy(array: pa.Array) -> np.ndarray:
    """``array.to_numpy(zero_copy_only=False)``: a view for numbers without nulls."""
    view = values_view(array)
    return array.to_numpy(zero_copy_only=False) if view is None else view


def from_numpy(values: np.ndarray, typ: pa.DataType) -> pa.Array:
    """``pa.array(values, type=typ)``: over the same memory for a 1-D array of integers or
    floats already of ``typ``'s dtype (the array keeps ``values`` alive), else through
    pyarrow (which converts, checks for overflow and copies)."""
    if (
        _plain_numeric(typ)
        and values.ndim == 1
        and values.flags.c_contiguous
        and values.dtype == numpy_dtype(typ)
        and values.dtype.isnative
    ):
        return pa.Array.from_buffers(typ, len(values), [None, pa.py_buffer(values)])
    return pa.array(values, type=typ)


def binary_array(values: Sequence[bytes], typ: pa.DataType) -> pa.Array:
    """A binary column of ``values`` (each exactly ``bytes``): one join and one offsets
    array, as ``pa.array`` would build them. ``typ`` binary becomes large_binary when the
    values pass 2 GiB in all, as ``pa.array`` does on a capacity error."""
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, values), dtype=np.int64, count=len(values)), out=offsets[1:])
    kept: np.ndarray = offsets
    if pa.types.is_binary(typ) and offsets[-1] <= _INT32_MAX:
        kept = offsets.astype(np.int32)
    else:
        typ = pa.large_binary()
    data = pa.py_buffer(b"".join(values))
    return pa.Array.from_buffers(typ, len(values), [None, pa.py_buffer(kept), data])
