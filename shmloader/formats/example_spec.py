"""Feature specs for ``tf.train.Example`` payloads, checked once before any record is read.

The classes mirror TensorFlow's ``tf.io.FixedLenFeature`` / ``tf.io.VarLenFeature`` so a spec
written for ``tf.io.parse_example`` carries over. They only hold what the user wrote;
:func:`compile_spec` validates it with the feature's name in every message and turns it into
:class:`Column` plans the decoders use without further checks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError

KINDS = ("int64", "float32", "bytes")
_ALIASES = {"int64": "int64", "float32": "float32", "bytes": "bytes", "string": "bytes"}
_ACCEPTED = "'int64', 'float32', 'bytes' or 'string' (or the numpy dtypes int64, float32, bytes_)"


@dataclass(frozen=True)
class FixedLenFeature:
    """A feature with exactly ``prod(shape)`` values in every record (``shape=()``: one).

    ``default`` is used where a record lacks the feature; without one that is an error.
    """

    shape: tuple[int, ...] | int
    dtype: Any
    default: Any = None


@dataclass(frozen=True)
class VarLenFeature:
    """A feature with any number of values (none where the record lacks it)."""

    dtype: Any


Feature = FixedLenFeature | VarLenFeature


@dataclass(frozen=True)
class Column:
    """A validated spec entry. ``shape`` None means variable length."""

    name: str
    kind: str
    shape: tuple[int, ...] | None
    size: int
    default: np.ndarray | list[bytes] | None

    @property
    def fixed(self) -> bool:
        return self.shape is not None


def normalize_dtype(dtype: Any, name: str) -> str:
    """The kind of list ("int64", "float32", "bytes") a dtype is stored as."""
    if isinstance(dtype, str) and dtype.lower() in _ALIASES:
        return _ALIASES[dtype.lower()]
    if dtype in (bytes, str):
        return "bytes"
    try:
        npd = np.dtype(dtype)
    except TypeError as exc:
        raise ConfigError(
            f"feature {name!r}: dtype {dtype!r} is not supported; use {_ACCEPTED}"
        ) from exc
    if npd == np.int64:
        return "int64"
    if npd == np.float32:
        return "float32"
    if npd.kind in "SU":
        return "bytes"
    raise ConfigError(
        f"feature {name!r}: dtype {npd} is not supported (Example lists hold only int64, "
        f"float32 and bytes); use {_ACCEPTED} and cast after decoding"
    )


def _normalize_shape(shape: Any, name: str) -> tuple[int, ...]:
    def is_dim(d: Any) -> bool:
        return isinstance(d, (int, np.integer)) and not isinstance(d, bool)

    if is_dim(shape):
        dims: tuple[int, ...] = (int(shape),)
    elif isinstance(shape, (tuple, list)) and all(is_dim(d) for d in shape):
        dims = tuple(int(d) for d in shape)
    else:
        raise ConfigError(
            f"feature {name!r}: shape must be an int or a tuple of ints, got {shape!r}"
        )
    if any(d < 0 for d in dims):
        raise ConfigError(f"feature {name!r}: shape {dims} has a negative dimension")
    return dims


def _flatten(value: Any) -> list[Any]:
    # Not np.ravel: numpy's bytes dtype drops trailing NUL bytes.
    if isinstance(value, (list, tuple)):
        return [item for part in value for item in _flatten(part)]
    if isinstance(value, np.ndarray):
        return _flatten(value.tolist())
    return [value]


def _normalize_default(
    default: Any, kind: str, shape: tuple[int, ...], name: str
) -> np.ndarray | list[bytes]:
    size = math.prod(shape)
    if kind == "bytes":
        items = _flatten(default)
        if not all(isinstance(v, (bytes, str)) for v in items):
            raise ConfigError(f"feature {name!r}: a bytes default must hold bytes or str")
        values = [v.encode() if isinstance(v, str) else bytes(v) for v in items]
        if len(values) == 1 and size != 1:
            values = values * size
        if len(values) != size:
            raise ConfigError(
                f"feature {name!r}: default has {len(values)} values, shape {shape} needs {size}"
            )
        return values
    try:
        array = np.asarray(default, dtype=np.float32 if kind == "float32" else np.int64)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"feature {name!r}: default {default!r} is not {kind}: {exc}") from exc
    if array.size == 1:
        array = np.full(shape, array.reshape(()), dtype=array.dtype)
    if array.size != size:
        raise ConfigError(
            f"feature {name!r}: default has {array.size} values, shape {shape} needs {size}"
        )
    array = array.reshape(shape)
    array.flags.writeable = False
    return array


def compile_column(name: str, feature: Any) -> Column:
    if not isinstance(name, str):
        raise ConfigError(f"feature names must be str, got {name!r}")
    if isinstance(feature, VarLenFeature):
        kind = normalize_dtype(feature.dtype, name)
        return Column(name, kind, None, 0, None)
    if isinstance(feature, FixedLenFeature):
        kind = normalize_dtype(feature.dtype, name)
        shape = _normalize_shape(feature.shape, name)
        default = (
            None
            if feature.default is None
            else _normalize_default(feature.default, kind, shape, name)
        )
        return Column(name, kind, shape, math.prod(shape), default)
    raise ConfigError(
        f"feature {name!r}: expected FixedLenFeature or VarLenFeature, got {type(feature).__name__}"
    )


def compile_spec(spec: Mapping[str, Feature]) -> tuple[Column, ...]:
    if not isinstance(spec, Mapping):
        raise ConfigError(f"a feature spec is a mapping name -> feature, got {type(spec).__name__}")
    if not spec:
        raise ConfigError("the feature spec is empty: name at least one feature to decode")
    return tuple(compile_column(name, feature) for name, feature in spec.items())
