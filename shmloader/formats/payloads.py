"""Payloads of one length as the rows of one 2-D array, without joining them when possible.

A ``decode_batch`` over fixed-size records (an image and a label, a feature vector) wants its
payloads as one ``(n, length)`` uint8 array to slice columns out of; the usual way,
``numpy.frombuffer(b"".join(payloads))``, copies every byte once more. A record file read by
blocks already holds the payloads in one buffer, evenly spaced when they are all one length
(each frame is its payload plus 16 bytes), so the reader can hand that array out as a strided
view of the block, which is free: :class:`Payloads` carries it, :func:`payload_rows` returns
it, or joins when there is none (payloads from anywhere else, or of mixed lengths). The
reader's write into shared memory copies the columns sliced from the view straight out of
the block, so each byte is copied once less (docs/sources.md, "Fixed-size records").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

__all__ = ["Payloads", "payload_rows"]


class Payloads(list[Any]):
    """A list of payloads that also holds them as the rows of one 2-D uint8 array.

    ``rows`` is a read-only view of the buffer the payloads were read into, ``(len(self),
    length)`` with the rows ``stride`` bytes apart, or None when the payloads differ in
    length. It stays a plain list for every other use (indexing, ``len``, ``b"".join``).
    """

    __slots__ = ("rows",)

    def __init__(self, payloads: Iterable[Any], rows: np.ndarray | None) -> None:
        super().__init__(payloads)
        self.rows = rows

    def __reduce__(self) -> tuple[Any, ...]:
        # By value, for every pickle protocol (0 and 1 refuse a class with __slots__).
        return Payloads, (list(self), self.rows)


def _forgetting_rows(name: str) -> Any:
    """``list.<name>``, which first drops ``rows``: once the list changes in place (sorted,
    cut, added to), the view no longer matches it, and :func:`payload_rows` must join."""
    change = getattr(list, name)

    def method(self: Payloads, *args: Any, **kwargs: Any) -> Any:
        self.rows = None
        return change(self, *args, **kwargs)

    method.__name__ = method.__qualname__ = name
    return method


for _name in (
    "__setitem__",
    "__delitem__",
    "__iadd__",
    "__imul__",
    "append",
    "extend",
    "insert",
    "pop",
    "remove",
    "clear",
    "sort",
    "reverse",
):
    setattr(Payloads, _name, _forgetting_rows(_name))


def strided_rows(buffer: Any, first: int, count: int, length: int, stride: int) -> np.ndarray:
    """``count`` rows of ``length`` bytes of ``buffer``, the first at ``first``, ``stride``
    apart: a view, bounds-checked by numpy (a wrong offset raises, it never reads past)."""
    return np.ndarray(
        shape=(count, length), dtype=np.uint8, buffer=buffer, offset=first, strides=(stride, 1)
    )


def _joinable(payload: Any, index: int) -> Any:
    """``payload`` as ``bytes.join`` takes it: a strided memoryview (a column of a 2-D array,
    say) copied in order; a payload that is no buffer at all is named."""
    if isinstance(payload, memoryview) and not payload.c_contiguous:
        return payload.tobytes()
    try:
        memoryview(payload)
    except TypeError:
        raise TypeError(
            f"payload_rows needs bytes-like payloads (bytes, bytearray, memoryview); payload "
            f"{index} is a {type(payload).__name__}"
        ) from None
    return payload


def payload_rows(payloads: Sequence[Any]) -> np.ndarray:
    """The payloads as the rows of one read-only ``(len(payloads), length)`` uint8 array.

    For use in a ``decode_batch`` over records of one size::

        def decode_batch(payloads):
            rows = shmloader.payload_rows(payloads)
            return {"image": rows[:, :12288].reshape(-1, 3, 64, 64),
                    "label": rows[:, 12288:].view("<i8")[:, 0]}

    When a :class:`~shmloader.RecordFileSource` read the payloads as one block of equal-length
    records (the usual case), this is a strided view of that block: no copy. Otherwise
    (payloads of another source, a plain list, a block with a damaged record in it) the
    payloads are joined, one copy. Like the payloads under ``views=True``, a view keeps its
    whole block (about 2 MiB) alive: copy what outlives the call. Payloads of different
    lengths raise ``ValueError`` naming the lengths found; the block is then retried one record
    per call, which keeps them all under ``on_error="skip"``, while ``"raise"`` (the default)
    fails the read with a ``DecodeError`` quoting this one (docs/sources.md).
    """
    if isinstance(payloads, Payloads) and payloads.rows is not None:
        return payloads.rows
    count = len(payloads)
    lengths = set(map(len, payloads))
    if len(lengths) > 1:
        raise ValueError(
            f"payload_rows needs payloads of one length, got {count} of lengths "
            f"{min(lengths)} to {max(lengths)} bytes"
        )
    length = lengths.pop() if lengths else 0
    try:
        joined = b"".join(payloads)
    except TypeError:  # join takes only contiguous buffers: find the payload, say which
        joined = b"".join([_joinable(p, i) for i, p in enumerate(payloads)])
    if len(joined) != count * length:  # len() of a buffer of wider items counts items
        raise ValueError(
            f"payload_rows needs bytes-like payloads of bytes (bytes, bytearray, memoryview "
            f"of format 'B'); {count} payloads of {length} items joined into {len(joined)} bytes"
        )
    return np.frombuffer(joined, dtype=np.uint8).reshape(count, length)
