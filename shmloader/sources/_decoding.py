"""Decoded records -> one batch, with every failure located: what all record sources share.

:class:`~shmloader.sources.records.RecordFileSource` and the indexed sources (CSV, JSON Lines,
WebDataset) read a range as a list of items (payloads, lines, samples) plus where each item
sits in its file (:class:`At`). Everything after that is the same for all of them, so it lives
here once, and a failure reads the same whichever source hit it:

* a record whose parse or decode raises becomes a :class:`DecodeError` (or the
  :class:`DataError` it raised) naming file, record and byte offset, or a
  :class:`SkippedRecord` under ``on_error="skip"`` (:func:`record_failure`);
* conversion by :class:`BatchBuilder` reports positions in the list it was given;
  :func:`locate` turns those back into file, record and offset;
* the schema, when not given, is inferred from a sample of the records (_inferred.py);
* within :func:`watching_records`, each record's index is reported before its decode, for a
  reader to publish: a decode that kills the process (a crash in native code, ``os._exit``)
  raises nothing that could name the record (reader/position.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import pyarrow as pa

from ..errors import DataError, DecodeError, OnError
from .columns import BatchBuilder, FixedColumns
from .skipped import SkippedRecord

# Told each record's index (in its file) before the record is decoded; None: not watched, and
# records decode at full speed (one ``map`` over them).
_watch: Callable[[int], None] | None = None


@contextlib.contextmanager
def watching_records(watch: Callable[[int], None]) -> Iterator[None]:
    """Within the block, :func:`decode_to_batch` calls ``watch(index)`` before it decodes each
    record, ``index`` its place in its file. A reader publishes it where its pool finds it
    should the decode kill the process (reader/position.py); a call per record costs more
    than a plain ``map``, so a reader watches only tasks that failed before."""
    global _watch
    previous, _watch = _watch, watch
    try:
        yield
    finally:
        _watch = previous


@dataclass(frozen=True, slots=True)
class At:
    """Where a record is: its index in the file, its byte offset, and extra words (a key)."""

    index: int
    offset: int
    note: str = ""


class Locations(Sequence[At]):
    """Record indexes and offsets kept in two plain lists, an :class:`At` made only on access.

    For the vectorised paths, where building an object per record would cost more than the
    decode itself; the objects are needed only to name a record that failed.
    """

    __slots__ = ("indexes", "offsets")

    def __init__(self, indexes: list[int], offsets: list[int]) -> None:
        self.indexes = indexes
        self.offsets = offsets

    def __len__(self) -> int:
        return len(self.indexes)

    @overload
    def __getitem__(self, pos: int) -> At: ...

    @overload
    def __getitem__(self, pos: slice) -> Locations: ...

    def __getitem__(self, pos: int | slice) -> At | Locations:
        if isinstance(pos, slice):
            return Locations(self.indexes[pos], self.offsets[pos])
        return At(self.indexes[pos], self.offsets[pos])


def record_failure(
    path: str, at: At, exc: Exception, on_error: OnError, skipped: list[SkippedRecord]
) -> None:
    """A record failed to parse or decode: raise an error naming it, or add it to ``skipped``.

    A :class:`DataError` of ours (a schema mismatch, a corrupt frame) already says what is
    wrong and keeps its class; anything else is the user's code failing, kept as the cause.
    """
    cause: BaseException | None = exc
    if isinstance(exc, DataError):
        # Ours already says what is wrong: the error raised restates it naming the record,
        # and keeps what caused it.
        cls, reason, cause, fix = type(exc), exc.reason, exc.__cause__, exc.fix
    else:
        cls, reason, fix = DecodeError, f"decode failed: {type(exc).__name__}: {exc}", None
    if on_error == "raise":
        raise cls(reason + at.note, path=path, index=at.index, offset=at.offset, fix=fix) from cause
    skipped.append(SkippedRecord(path, at.index, at.offset, reason + at.note))


def locate(exc: DecodeError, path: str, at: At | None) -> DecodeError:
    """A conversion error as the same class, naming the file and, where known, the record."""
    if at is None:
        return type(exc)(exc.reason, path=path, fix=exc.fix)
    return type(exc)(exc.reason + at.note, path=path, index=at.index, offset=at.offset, fix=exc.fix)


def decode_to_batch(
    builder: BatchBuilder,
    path: str,
    items: Sequence[Any],
    where: Sequence[At],
    *,
    parse: Callable[[str, Any], Any] | None,
    decode: Callable[[Any], Any] | None,
    on_error: OnError,
    skipped: list[SkippedRecord],
    fixed: bool = False,
) -> pa.RecordBatch | FixedColumns:
    """Items through ``parse(path, item)`` then ``decode`` (either may be None), one call each
    per record, then one conversion of all that succeeded; failures raise (named) or go to
    ``skipped``. ``fixed``: when every record decoded and every column is fixed-width
    numeric, return :class:`FixedColumns` (tensors as their rows: a reader stacks them
    straight into shared memory, one copy of each value less than building the batch).

    Under ``"raise"`` the records before the first failing one are still converted, so that a
    record that decodes but does not fit the schema is reported if it comes first.
    """
    raising = on_error == "raise"
    failures: list[tuple[int, Exception]] = []
    decoded: list[Any] | None = None
    watch = _watch
    if parse is None and decode is not None:
        # The common case at C speed; if any record fails, the items are decoded again one
        # by one to tell which (decode functions are expected to be pure).
        try:
            if watch is None:
                decoded = list(map(decode, items))
            else:
                decoded = [
                    _watched(watch, at, decode, item) for item, at in zip(items, where, strict=True)
                ]
        except Exception:
            decoded = None
    kept: Sequence[int]  # positions in ``items`` of the records that decoded
    if decoded is not None and fixed:
        columns = builder.fixed_records(decoded)
        if columns is not None:
            return columns
    if decoded is not None:
        records, kept = decoded, range(len(items))
    else:
        records, kept = _decode_each(path, items, where, parse, decode, raising, failures, watch)
    if raising:
        try:
            batch = builder.from_records(records)
        except DecodeError as exc:
            found = exc.index
            at = where[kept[found]] if found is not None and 0 <= found < len(kept) else None
            # The located error says all the inner one did, with the right record: keep only
            # what caused that (said once, cause first).
            raise locate(exc, path, at) from exc.__cause__
    else:
        batch, bad = builder.from_records_skipping(records)
        for pos, err in bad.items():
            at = where[kept[pos]]
            skipped.append(SkippedRecord(path, at.index, at.offset, err.reason + at.note))
    for pos, error in failures:
        record_failure(path, where[pos], error, on_error, skipped)
    return batch


def _watched(watch: Callable[[int], None], at: At, decode: Callable[[Any], Any], item: Any) -> Any:
    """``decode(item)``, the record's index reported to ``watch`` first."""
    watch(at.index)
    return decode(item)


def _decode_each(
    path: str,
    items: Sequence[Any],
    where: Sequence[At],
    parse: Callable[[str, Any], Any] | None,
    decode: Callable[[Any], Any] | None,
    raising: bool,
    failures: list[tuple[int, Exception]],
    watch: Callable[[int], None] | None,
) -> tuple[list[Any], list[int]]:
    """Records that decode, their positions in ``items``; failures appended to ``failures``;
    each record's index reported to ``watch`` (if any) before it is parsed."""
    records: list[Any] = []
    kept: list[int] = []
    for pos, item in enumerate(items):
        if watch is not None:
            watch(where[pos].index)
        try:
            if parse is not None:
                item = parse(path, item)
            if decode is not None:
                item = decode(item)
        except Exception as exc:
            failures.append((pos, exc))
            if raising:
                break
            continue
        records.append(item)
        kept.append(pos)
    return records, kept


def decode_columns_to_batch(
    builder: BatchBuilder,
    path: str,
    payloads: list[bytes],
    where: Sequence[At],
    *,
    decode_batch: Callable[[list[bytes]], Any],
    on_error: OnError,
    skipped: list[SkippedRecord],
) -> pa.RecordBatch | FixedColumns:
    """One ``decode_batch`` call and one conversion for all ``payloads`` (no per-record work);
    fixed-width numeric columns are returned as they are, unconverted (``FixedColumns``).

    Only when that fails are the records retried one by one, which isolates the bad ones
    (``"skip"``) or names the first (``"raise"``).
    """
    if not payloads:
        return builder.empty()
    try:
        columns = decode_batch(payloads)
        fixed = builder.fixed_columns(columns, len(payloads))
        return fixed if fixed is not None else builder.from_columns(columns, len(payloads))
    except Exception as exc:
        whole = exc
    batches = []
    for pos, payload in enumerate(payloads):
        try:
            batches.append(builder.from_columns(decode_batch([payload]), 1))
        except Exception as exc:
            record_failure(path, where[pos], exc, on_error, skipped)
    if on_error == "raise":
        first, last = where[0], where[-1]
        raise DecodeError(
            f"decode_batch failed on records [{first.index}, {last.index}] but on none of them "
            f"alone: {type(whole).__name__}: {whole}",
            path=path,
            index=first.index,
            offset=first.offset,
        ) from whole
    return pa.concat_batches(batches) if batches else builder.empty()
