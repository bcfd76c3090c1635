"""``tf.train.Example`` payloads to columns (and back) without TensorFlow.

A spec maps feature names to :class:`FixedLenFeature` / :class:`VarLenFeature`, as in
``tf.io.parse_example``. :class:`ExampleDecoder` decodes one payload (it is the ``decode=``
of a record source and is pickled into reader processes); :class:`ExampleBatchDecoder`
decodes a list of payloads into batched columns, which is where the speed is: payloads are
parsed by the protobuf C runtime into a wire-compatible "raw" view whose numeric lists are
bytes, and all records' bytes of a column become one numpy array at once.

Errors are :class:`~shmloader.errors.DecodeError` naming the feature, what the spec expects
and what the payload holds; the batch decoder also sets ``index`` to the payload's position
in the list. The caller, which knows the file, adds path and offset.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import pyarrow as pa
from google.protobuf.message import DecodeError as ProtoDecodeError

from .._proto import example_pb2 as pb
from ..errors import ConfigError, DecodeError
from . import _example_wire as wire
from .example_spec import Column, Feature, FixedLenFeature, VarLenFeature, compile_spec

__all__ = [
    "ExampleBatchDecoder",
    "ExampleDecoder",
    "FixedLenFeature",
    "VarLenFeature",
    "decode_example",
    "encode_example",
]

Payload = bytes | bytearray | memoryview
_ONEOF = {"int64": "int64_list", "float32": "float_list", "bytes": "bytes_list"}
_KIND_OF = {v: k for k, v in _ONEOF.items()}
_NUMPY = {"int64": np.int64, "float32": np.float32}


def _expected(col: Column) -> str:
    if col.shape is None:
        return f"a variable-length {col.kind} list"
    if col.shape == ():
        return f"one {col.kind} value (shape ())"
    return f"{col.size} {col.kind} values (shape {col.shape})"


def _error(col: Column, found: str, index: int | None) -> DecodeError:
    return DecodeError(
        f"feature {col.name!r}: expected {_expected(col)}, found {found}", index=index
    )


def _parse(payload: Payload, index: int | None, unpacked: str | None = None) -> Any:
    """The raw view's feature map, repacked when feature ``unpacked`` is not all packed."""
    try:
        # The C runtime parses any buffer (tfrecord readers hand out memoryviews).
        data = payload if unpacked is None else wire.repacked(cast(bytes, payload))
        return pb.RawExample.FromString(cast(bytes, data)).features.feature
    except ProtoDecodeError as exc:
        # The full parse also checks bytes the raw view takes as they are: say why it ran.
        why = "" if unpacked is None else f" (parsed in full: {unpacked!r} is not plain packed)"
        raise DecodeError(
            f"payload of {len(payload)} bytes is not a tf.train.Example{why}: {exc}", index=index
        ) from exc


def _check_strict(fmap: Any, names: frozenset[str], index: int | None) -> None:
    unknown = sorted(set(fmap.keys()) - names)
    if unknown:
        raise DecodeError(
            f"features {unknown} are not in the spec (strict=True); the spec has {sorted(names)}",
            index=index,
        )


def _raw_values(col: Column, feat: Any, kind: str, index: int | None) -> Any:
    """Values of a present feature of the right kind: list of bytes or 1-D array."""
    if kind == "bytes":
        return list(feat.bytes_list.value)
    try:
        return wire.values_of(getattr(feat, _ONEOF[kind]), kind)
    except wire.MalformedList as exc:
        raise DecodeError(f"feature {col.name!r}: {exc}", index=index) from exc
    except wire.NotPacked:
        raise wire.NotPacked(col.name) from None  # the caller reparses, naming the feature


def _shaped(col: Column, values: Any) -> Any:
    assert col.shape is not None
    if col.kind == "bytes":
        if col.shape == ():
            return values[0]
        return values if len(col.shape) == 1 else _nest(values, col.shape)
    array = values.reshape(col.shape)
    return array[()] if col.shape == () else array


def _nest(flat: list[bytes], shape: tuple[int, ...]) -> list[Any]:
    if len(shape) == 1:
        return list(flat)
    step = len(flat) // shape[0] if shape[0] else 0
    return [_nest(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


def _empty(col: Column) -> Any:
    return [] if col.kind == "bytes" else np.empty(0, dtype=_NUMPY[col.kind])


def _column_value(col: Column, feat: Any, index: int | None = None) -> Any:
    """One feature of one record, checked against its column (the exact, general path)."""
    if feat is None:
        if col.shape is None:
            return _empty(col)
        if col.default is None:
            raise _error(col, "no such feature (and the spec gives no default)", index)
        default = col.default
        return _shaped(col, list(default) if col.kind == "bytes" else np.array(default))
    oneof = feat.WhichOneof("kind")
    if oneof is None:
        values = _empty(col)  # A Feature with no list set is an empty list of any kind.
    elif oneof != _ONEOF[col.kind]:
        found_kind = _KIND_OF[oneof]
        found = len(_raw_values(col, feat, found_kind, index))
        article = "an" if found_kind == "int64" else "a"
        raise _error(col, f"{article} {found_kind} list of {found} values", index)
    else:
        values = _raw_values(col, feat, col.kind, index)
    if col.shape is None:
        return values
    if len(values) != col.size:
        raise _error(col, f"{len(values)} {col.kind} values", index)
    return _shaped(col, values)


def decode_example(
    payload: Payload, spec: Mapping[str, Feature], *, strict: bool = False
) -> dict[str, object]:
    """Decode one payload; see :class:`ExampleDecoder` (build one to decode many)."""
    return ExampleDecoder(spec, strict=strict)(payload)


class _DecoderBase:
    def __init__(self, spec: Mapping[str, Feature], *, strict: bool = False) -> None:
        self.columns = compile_spec(spec)
        self.spec: dict[str, Feature] = dict(spec)
        self.strict = bool(strict)
        self._names = frozenset(c.name for c in self.columns)

    @property
    def schema(self) -> pa.Schema:
        """The Arrow schema of the decoded columns, for ``RecordFileSource(schema=...)``.

        Sources infer a schema from the first record, which cannot know that a
        variable-length feature varies; this one says so (``list<...>``). Fixed numeric
        features with a shape are tensor columns (``fixed_shape_tensor``), scalars primitive
        columns, bytes ``binary`` (a fixed bytes feature with a shape: ``list<binary>``).
        """
        return pa.schema([pa.field(c.name, _arrow_type(c), nullable=False) for c in self.columns])

    def __reduce__(self) -> tuple[Any, ...]:
        # Sent to spawned readers: the spec travels, the compiled plan is rebuilt there.
        return (_rebuild, (type(self), self.spec, self.strict))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r}, strict={self.strict})"


def _arrow_type(col: Column) -> pa.DataType:
    value = {"int64": pa.int64(), "float32": pa.float32(), "bytes": pa.binary()}[col.kind]
    if col.shape is None:
        return pa.list_(value)
    if col.shape == ():
        return value
    if col.kind == "bytes":
        return pa.list_(value)
    return pa.fixed_shape_tensor(value, col.shape)


def _rebuild(cls: type[_DecoderBase], spec: dict[str, Feature], strict: bool) -> _DecoderBase:
    return cls(spec, strict=strict)


class ExampleDecoder(_DecoderBase):
    """``payload -> {name: value}`` by a spec.

    Fixed numeric features give numpy arrays of the spec's shape (a numpy scalar for
    ``shape=()``), fixed bytes features ``bytes`` (a list, nested for 2-D, when the shape has
    values), variable-length ones a 1-D array or a list of bytes. Features absent from the spec
    are ignored unless ``strict=True``.
    """

    def __call__(self, payload: Payload) -> dict[str, object]:
        fmap = _parse(payload, None)
        if self.strict:
            _check_strict(fmap, self._names, None)
        try:
            return self._decode(fmap)
        except wire.NotPacked as exc:  # values written unpacked: rare, so parsing twice is fine
            return self._decode(_parse(payload, None, unpacked=exc.args[0]))

    def _decode(self, fmap: Any) -> dict[str, object]:
        return {c.name: _column_value(c, fmap.get(c.name)) for c in self.columns}


class ExampleBatchDecoder(_DecoderBase):
    """``[payload, ...] -> {name: column}`` for a whole batch at once.

    Fixed numeric features give one array of shape ``(n, *shape)``; fixed bytes features a
    list of n values as :class:`ExampleDecoder` gives them; variable-length features a list of
    n arrays (or of n lists of bytes).
    """

    def __call__(self, payloads: Sequence[Payload]) -> dict[str, object]:
        fmaps = [_parse(p, i) for i, p in enumerate(payloads)]
        if self.strict:
            for i, fmap in enumerate(fmaps):
                _check_strict(fmap, self._names, i)
        return {c.name: _decode_column(c, fmaps, payloads) for c in self.columns}


def _general_value(col: Column, fmaps: list[Any], payloads: Sequence[Payload], i: int) -> Any:
    """Record ``i``'s value by the exact, general path, reparsing it repacked if need be.

    The repacked map replaces the record's raw one, so later columns find plain packed runs.
    """
    try:
        return _column_value(col, fmaps[i].get(col.name), i)
    except wire.NotPacked:
        fmaps[i] = _parse(payloads[i], i, unpacked=col.name)
    return _column_value(col, fmaps[i].get(col.name), i)


def _decode_column(col: Column, fmaps: list[Any], payloads: Sequence[Payload]) -> object:
    if col.kind == "bytes":
        return [_general_value(col, fmaps, payloads, i) for i in range(len(fmaps))]
    # Records in plain packed form are joined and decoded in one go; the rest (absent,
    # unpacked, wrong kind or length) take the exact path, which also raises the errors.
    nbytes = 4 * col.size if col.kind == "float32" and col.shape is not None else None
    runs, rows, rest = wire.gather_packed(fmaps, col.name, _ONEOF[col.kind], nbytes)
    other = {i: _general_value(col, fmaps, payloads, i) for i in rest}
    values, counts = _decode_runs(col, runs, rows)
    if col.shape is None:
        return _split_varlen(values, counts, rows, other, len(fmaps))
    bad = np.flatnonzero(counts != col.size)
    if bad.size:
        row = rows[int(bad[0])]
        raise _error(col, f"{int(counts[bad[0]])} {col.kind} values", row)
    shape = (len(fmaps), *col.shape)
    if not other:
        return values.reshape(shape)  # the common case: no copy beyond the join
    out = np.empty((len(fmaps), col.size), dtype=_NUMPY[col.kind])
    if rows:
        out[rows] = values.reshape(len(rows), col.size)
    for i, value in other.items():
        out[i] = np.reshape(value, -1)
    return out.reshape(shape)


def _decode_runs(col: Column, runs: list[bytes], rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """All runs' values as one array, and how many values each run holds."""
    lengths = np.fromiter(map(len, runs), dtype=np.int64, count=len(runs))
    if col.kind == "float32":
        data: bytes | bytearray = bytearray().join(runs)  # one copy, and numpy may write it
        try:
            return wire.floats_from_bytes(data), lengths // 4
        except wire.MalformedList as exc:
            row = rows[int(np.flatnonzero(lengths % 4)[0])]
            raise DecodeError(f"feature {col.name!r}: {exc}", index=row) from exc
    data = b"".join(runs)
    ends = wire.varint_ends(data)
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    # A run must end on a varint's last byte, or its tail would merge into the next run.
    nonempty = np.flatnonzero(lengths)
    try:
        if not ends[offsets[1:][nonempty] - 1].all():
            raise wire.MalformedList("a run ends inside a varint")
        values = wire.int64s_from_bytes(data, ends)
    except wire.MalformedList as exc:
        _raise_for_bad_run(col, runs, rows)
        raise DecodeError(f"feature {col.name!r}: {exc}") from exc
    return values, wire.counts_per_run(ends, offsets)


def _raise_for_bad_run(col: Column, runs: list[bytes], rows: list[int]) -> None:
    """Name the record whose int64 bytes are malformed (decoding them alone fails)."""
    for run, row in zip(runs, rows, strict=True):
        try:
            wire.int64s_from_bytes(run)
        except wire.MalformedList as exc:
            raise DecodeError(f"feature {col.name!r}: {exc}", index=row) from exc


def _split_varlen(
    values: np.ndarray, counts: np.ndarray, rows: list[int], other: dict[int, Any], n: int
) -> list[Any]:
    out: list[Any] = [None] * n
    pieces = np.split(values, np.cumsum(counts)[:-1]) if rows else []
    for row, piece in zip(rows, pieces, strict=True):
        out[row] = piece
    for row, value in other.items():
        out[row] = value
    return out


def encode_example(features: Mapping[str, object]) -> bytes:
    """Serialize ``{name: value}`` as a tf.train.Example (deterministic bytes).

    bytes/str (or lists/arrays of them) become a bytes_list; bools, ints and integer arrays an
    int64_list; floats and float arrays a float_list (as float32, like TensorFlow). Arrays
    of any shape are flattened; an empty Python list becomes a feature with no list set,
    which every dtype reads as empty.
    """
    example = pb.Example()
    fmap = example.features.feature
    for name, value in features.items():
        if not isinstance(name, str):
            raise ConfigError(f"feature names must be str, got {name!r}")
        _fill(fmap[name], name, value)
    return example.SerializeToString(deterministic=True)


def _fill(feature: Any, name: str, value: object) -> None:
    if isinstance(value, (bytes, bytearray, memoryview, str)):
        feature.bytes_list.value.append(_as_bytes(value))
        return
    if isinstance(value, (list, tuple)):
        if not value:
            feature.SetInParent()
            return
        if all(isinstance(v, (bytes, bytearray, memoryview, str)) for v in value):
            feature.bytes_list.value.extend(_as_bytes(v) for v in value)
            return
    try:
        array = np.asarray(value)
    except ValueError as exc:
        raise ConfigError(f"feature {name!r}: cannot encode {type(value).__name__}: {exc}") from exc
    kind = array.dtype.kind
    if kind in "biu":
        if kind == "u" and array.size and int(array.max()) > np.iinfo(np.int64).max:
            raise ConfigError(f"feature {name!r}: value {int(array.max())} exceeds int64")
        feature.int64_list.value.extend(array.astype(np.int64).ravel().tolist())
    elif kind == "f":
        feature.float_list.value.extend(array.astype(np.float32).ravel().tolist())
    elif kind in "SU" or (kind == "O" and _all_bytes(array)):
        feature.bytes_list.value.extend(_as_bytes(v) for v in array.ravel().tolist())
    else:
        raise ConfigError(
            f"feature {name!r}: cannot encode {type(value).__name__} of dtype {array.dtype}; "
            "give ints, floats, bytes or str (or arrays of them)"
        )


def _all_bytes(array: np.ndarray) -> bool:
    return all(isinstance(v, (bytes, bytearray, memoryview, str)) for v in array.ravel().tolist())


def _as_bytes(value: str | bytes | bytearray | memoryview) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)
