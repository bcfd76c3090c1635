"""What the CSV, JSON Lines and WebDataset sources share.

Each keeps a sidecar offset index per file (kind ``csv`` / ``jsonl`` / ``wds``), so ``plan()``
counts records without parsing them and a read is one seek and one read of the range's bytes.
After parsing, records (dicts) go through the optional user ``decode`` and become one batch
through :class:`~shmloader.sources.columns.BatchBuilder`, with every failure named by file,
record index and byte offset, or skipped and reported under ``on_error="skip"``.

The output schema is fixed once per source: given with ``schema=``, or inferred from the first
record that parses (and decodes) in plan order; that record is the same in every process, so
readers that each infer it agree.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from .._fs import expand_paths
from ..errors import ConfigError, DataError, DecodeError
from ..formats.index import INDEX_SUFFIX, cached_offsets
from .base import BaseSource, Shard, SkippedRecord, check_on_error
from .columns import BatchBuilder, infer_schema

Decode = Callable[[dict[str, Any]], Mapping[str, Any]]
Parse = Callable[[Any], Any]

_CACHED_FILES = 16  # offset arrays kept per process
INFER_ATTEMPTS = 1000  # records that may fail (on_error="skip") while inferring a schema


@dataclass(frozen=True, slots=True)
class At:
    """Where a record is: its index in the file, its byte offset, and extra words (a key)."""

    index: int
    offset: int
    note: str = ""


class IndexedSource(BaseSource):
    """Files with a sidecar offset index, parsed into dicts, decoded into one batch."""

    kind: str = ""  # the index kind, set by subclasses

    _LOCAL = ("_offsets", "_builder", "_known")

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        decode: Decode | None,
        on_error: str,
        schema: pa.Schema | None,
        index_dir: str | None,
    ) -> None:
        super().__init__()
        if decode is not None and not callable(decode):
            raise ConfigError(f"decode must be callable, got {type(decode).__name__}")
        if schema is not None and not isinstance(schema, pa.Schema):
            raise ConfigError(f"schema must be a pyarrow.Schema, got {type(schema).__name__}")
        if schema is not None:
            BatchBuilder(schema)  # unsupported column types fail here, not in a reader
        # A glob like ``data/*`` also matches the sidecar indexes written next to the data.
        self.paths = [p for p in expand_paths(paths) if not p.endswith(INDEX_SUFFIX)]
        if not self.paths:
            raise ConfigError(f"{paths}: only index files ({INDEX_SUFFIX}) match, no data")
        self.decode = decode
        self.on_error = check_on_error(on_error)
        self.index_dir = index_dir
        self._schema = schema
        self._init_local()

    def _init_local(self) -> None:
        self._offsets: OrderedDict[str, np.ndarray] = OrderedDict()
        self._builder: BatchBuilder | None = None
        self._known = frozenset(self.paths)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.paths)} files, on_error={self.on_error!r})"

    # -- offsets and plan ---------------------------------------------------------------
    def _build_offsets(self, path: str) -> np.ndarray:
        raise NotImplementedError

    def offsets(self, path: str) -> np.ndarray:
        """The ``n + 1`` record offsets of one of this source's files (cached on disk and in
        this process)."""
        if path not in self._known:
            raise ConfigError(f"{path} is not one of this source's files")
        found = self._offsets.pop(path, None)
        if found is None:
            found = cached_offsets(
                path, self.kind, lambda: self._build_offsets(path), index_dir=self.index_dir
            )
        self._offsets[path] = found
        while len(self._offsets) > _CACHED_FILES:
            self._offsets.popitem(last=False)
        return found

    def _make_plan(self) -> list[Shard]:
        return [Shard(p, len(self.offsets(p)) - 1) for p in self.paths]

    def where(self, path: str, start: int, stop: int) -> list[At]:
        offs = self.offsets(path)[start:stop].tolist()
        return [At(start + i, off) for i, off in enumerate(offs)]

    # -- schema ---------------------------------------------------------------------------
    @property
    def schema(self) -> pa.Schema:
        """The batches' schema (inferred from the first record that decodes if not given).

        Reading it in the parent before the source is pickled saves each reader the one
        extra small read that inference costs.
        """
        if self._schema is None:
            self._schema = self._infer_schema()
        return self._schema

    def raws(self, path: str, start: int, stop: int) -> tuple[list[Any], list[At]]:
        """Records ``[start, stop)`` before :meth:`_parse` (a bad one may be an exception)."""
        raise NotImplementedError

    def _first_records(self) -> Iterator[tuple[str, At, Any]]:
        """Raw records in plan order, read in growing pieces (most data infers from one)."""
        for shard in self.plan():
            pos, piece = 0, 16
            while pos < min(shard.num_records, INFER_ATTEMPTS):
                stop = min(shard.num_records, pos + piece)
                raws, where = self.raws(shard.path, pos, stop)
                for raw, at in zip(raws, where, strict=True):
                    yield shard.path, at, raw
                pos, piece = stop, piece * 4

    def _parse(self, path: str, raw: Any) -> Any:
        """A raw record -> the dict given to ``decode`` (raise DecodeError if it is bad)."""
        if isinstance(raw, Exception):
            raise raw
        return raw

    def _infer_schema(self) -> pa.Schema:
        """From the first record that parses and decodes, in plan order. Records that fail
        are passed over even with ``on_error="raise"``: reading their range reports them."""
        failures: list[str] = []
        for path, at, raw in self._first_records():
            try:
                record = self._parse(path, raw)
                if self.decode is not None:
                    record = self.decode(record)
                return infer_schema(record)
            except Exception as exc:
                failures.append(f"{path}, record {at.index}, byte offset {at.offset}: {exc!r}")
            if len(failures) >= INFER_ATTEMPTS:
                break
        if not failures:
            raise ConfigError("cannot infer a schema: the files hold no records; pass schema=")
        raise DecodeError(
            f"cannot infer a schema: the first {len(failures)} records all failed; "
            f"first failure: {failures[0]}; pass schema= or fix the data"
        )

    def builder(self) -> BatchBuilder:
        if self._builder is None:
            self._builder = BatchBuilder(self.schema)
        return self._builder

    # -- records -> batch -------------------------------------------------------------------
    def to_batch(
        self, path: str, raws: Sequence[Any], where: Sequence[At], skipped: list[SkippedRecord]
    ) -> pa.RecordBatch:
        """Parse, decode and convert records; failures raise (named) or go to ``skipped``."""
        decode = self.decode
        raising = self.on_error == "raise"
        records: list[Any] = []
        kept: list[At] = []
        failures: list[tuple[At, Exception]] = []
        for raw, at in zip(raws, where, strict=True):
            try:
                record = self._parse(path, raw)
                if decode is not None:
                    record = decode(record)
            except Exception as exc:
                failures.append((at, exc))
                if raising:
                    break  # converting the records before it may still find an earlier one
                continue
            records.append(record)
            kept.append(at)
        builder = self.builder()
        if raising:
            try:
                batch = builder.from_records(records)
            except DecodeError as exc:
                raise _locate(exc, path, kept) from exc
            for at, error in failures:
                self.failed(path, at, error, skipped)
            return batch
        for at, error in failures:
            self.failed(path, at, error, skipped)
        batch, bad = builder.from_records_skipping(records)
        for pos, err in bad.items():
            at = kept[pos]
            skipped.append(SkippedRecord(path, at.index, at.offset, err.reason + at.note))
        return batch

    def failed(self, path: str, at: At, exc: Exception, skipped: list[SkippedRecord]) -> None:
        """A record failed to parse or decode: raise a DecodeError naming it, or skip it."""
        if isinstance(exc, DataError):
            reason, cls = exc.reason, type(exc)
        else:
            reason, cls = f"decode failed: {type(exc).__name__}: {exc}", DecodeError
        if self.on_error == "raise":
            raise cls(reason + at.note, path=path, index=at.index, offset=at.offset) from exc
        skipped.append(SkippedRecord(path, at.index, at.offset, reason + at.note))


def _locate(exc: DecodeError, path: str, where: Sequence[At]) -> DecodeError:
    """A conversion error (index = position in the converted list) named by file and record."""
    if exc.index is None or not 0 <= exc.index < len(where):
        return type(exc)(exc.reason, path=path)
    at = where[exc.index]
    return type(exc)(exc.reason + at.note, path=path, index=at.index, offset=at.offset)
