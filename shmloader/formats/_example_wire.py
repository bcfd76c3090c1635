"""Numeric values of Example features straight from their wire bytes.

Converting a protobuf repeated field to numpy creates one Python object per value, which is
most of the cost of decoding an Example. Parsed as ``RawExample`` (see example.proto) a
packed float or int64 list arrives as bytes: floats are then one ``np.frombuffer`` and int64s
one vectorised varint decode, for a single record or for a whole batch joined together.

A list that is not only packed runs (values written unpacked, legal but written by no
TensorFlow writer) raises :class:`NotPacked`; the caller then parses the whole payload again
through :func:`repacked`, so the result never depends on the encoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from google.protobuf.unknown_fields import UnknownFieldSet

from .._proto import example_pb2 as pb

_FLOAT = np.dtype("<f4")
_MAX_VARINT_BYTES = 10
_FEW_BYTES = 16
_U64 = (1 << 64) - 1


class MalformedList(ValueError):
    """A numeric list whose bytes are not valid protobuf; the caller names the feature."""


class NotPacked(Exception):
    """A numeric list holds values written unpacked: the raw view cannot order them."""


def packed_bytes(plist: pb.PackedList) -> bytes | None:
    """The concatenated packed values, or None when some values are not in packed form.

    Values written unpacked do not fit the ``bytes`` field of the raw view, so protobuf keeps
    them as unknown fields of the list; any unknown field means "parse it repacked".
    (Checking ``ByteSize()`` instead would serialize the list again: O(n) and 4x slower.)
    """
    if len(UnknownFieldSet(plist)):
        return None
    runs = plist.packed
    return runs[0] if len(runs) == 1 else b"".join(runs)


def repacked(payload: bytes) -> bytes:
    """The payload re-encoded with every numeric list as packed runs only, in wire order.

    The raw view keeps a list's packed runs apart from its unpacked values (those become
    unknown fields), so the order between the two is lost there. The full ``Example`` parse
    concatenates them in wire order, as protobuf requires; serializing it again writes each
    list as one packed run, which the raw view reads in the usual way. Unknown fields are
    dropped first: none holds a value, and left in a list they would look unpacked again.
    Raises protobuf's DecodeError when the payload is not a valid Example.
    """
    example = pb.Example.FromString(payload)
    example.DiscardUnknownFields()
    return example.SerializeToString()


def floats_from_bytes(data: bytes | bytearray) -> np.ndarray:
    """float32 values of packed bytes; writable when ``data`` is a bytearray (no copy)."""
    if len(data) % 4:
        raise MalformedList(f"malformed float32 list: {len(data)} bytes is not a multiple of 4")
    values = np.frombuffer(data, dtype=_FLOAT)
    if values.dtype != np.float32 or not values.flags.writeable:  # big-endian host / bytes
        values = values.astype(np.float32)
    return values


def varint_ends(data: bytes) -> np.ndarray:
    """Boolean mask of the bytes that end a varint (high bit clear)."""
    return np.frombuffer(data, dtype=np.uint8) < 0x80


def _few_int64s(data: bytes) -> np.ndarray:
    # A handful of bytes (a label, a few ids): plain Python beats numpy's per-call overhead.
    values: list[int] = []
    value = shift = 0
    for byte in data:
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            value &= _U64
            values.append(value - (1 << 64) if value >> 63 else value)
            value = shift = 0
        else:
            shift += 7
            if shift >= 7 * _MAX_VARINT_BYTES:
                raise MalformedList("malformed int64 list: a varint is longer than 10 bytes")
    if shift:
        raise MalformedList("malformed int64 list: the last varint is cut off")
    return np.array(values, dtype=np.int64)


def int64s_from_bytes(data: bytes, ends: np.ndarray | None = None) -> np.ndarray:
    """Decode a run of packed varints (int64 two's complement, as protobuf writes them)."""
    if len(data) <= _FEW_BYTES:
        return _few_int64s(data)
    raw = np.frombuffer(data, dtype=np.uint8)
    if ends is None:
        ends = raw < 0x80
    if not ends[-1]:
        raise MalformedList("malformed int64 list: the last varint is cut off")
    last_of = np.flatnonzero(ends)
    first_of = np.empty_like(last_of)
    first_of[0] = 0
    first_of[1:] = last_of[:-1] + 1
    if len(last_of) == len(raw):
        # Every value below 128: one byte each (labels, small ids), nothing to assemble.
        return raw.astype(np.int64)
    lengths = last_of - first_of + 1
    if int(lengths.max()) > _MAX_VARINT_BYTES:
        raise MalformedList("malformed int64 list: a varint is longer than 10 bytes")
    # Position of each byte inside its varint -> its 7-bit group's shift.
    group = np.repeat(np.arange(len(last_of)), lengths)
    shift = (np.arange(len(raw)) - first_of[group]).astype(np.uint64) * np.uint64(7)
    parts = (raw & 0x7F).astype(np.uint64) << shift
    return np.bitwise_or.reduceat(parts, first_of).view(np.int64)


def values_of(plist: pb.PackedList, kind: str) -> np.ndarray:
    """All values of one numeric list as a fresh (writable) 1-D array.

    Raises NotPacked when the list is not only packed runs (see :func:`repacked`).
    """
    data = packed_bytes(plist)
    if data is None:
        raise NotPacked
    if kind == "float32":
        return floats_from_bytes(data)
    return int64s_from_bytes(data)


def gather_packed(
    fmaps: Sequence[Any], name: str, oneof: str, nbytes: int | None
) -> tuple[list[bytes], list[int], list[int]]:
    """Split a batch's records into plain packed runs (and their rows) and the rest.

    A run qualifies when it is the list's only run, has ``nbytes`` bytes (if given) and the
    list holds nothing else; absent, empty, other-kind or unpacked lists are "the rest",
    for the exact path. This loop runs once per record and column, so it is kept lean.
    """
    runs: list[bytes] = []
    rows: list[int] = []
    rest: list[int] = []
    for i, fmap in enumerate(fmaps):
        feat = fmap.get(name)
        if feat is not None:
            plist = getattr(feat, oneof)
            packed = plist.packed
            if len(packed) == 1:
                data = packed[0]  # each indexing copies the bytes out of the message
                if (nbytes is None or len(data) == nbytes) and not len(UnknownFieldSet(plist)):
                    runs.append(data)
                    rows.append(i)
                    continue
        rest.append(i)
    return runs, rows, rest


def counts_per_run(ends: np.ndarray, offsets: Sequence[int] | np.ndarray) -> np.ndarray:
    """How many varints end inside each ``[offsets[i], offsets[i+1])`` byte range."""
    cumulative = np.concatenate(([0], np.cumsum(ends, dtype=np.int64)))
    bounds = np.asarray(offsets, dtype=np.int64)
    return np.diff(cumulative[bounds])
