"""What the CSV, JSON Lines and WebDataset sources share.

Each keeps a sidecar offset index per file (kind ``csv`` / ``jsonl`` / ``wds``), so ``plan()``
counts records without parsing them and a read is one seek and one read of the range's bytes.
After parsing, records (dicts) go through the optional user ``decode`` and become one batch
through :class:`~shmloader.sources.columns.BatchBuilder`, with every failure named by file,
record index and byte offset, or skipped and reported under ``on_error="skip"``.

The output schema is fixed once per source: given with ``schema=``, or inferred from a sample
of the records that is the same in every process (_inferred.py), so readers that each infer
it agree.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from .._fs import expand_paths
from ..errors import ConfigError, OnError
from ..formats.index import INDEX_SUFFIX, cached_offsets
from ._decoding import At, decode_to_batch, record_failure
from ._inferred import Candidate, InferringSource
from .base import (
    ReadResult,
    Shard,
    check_callable,
    check_held,
    check_on_error,
    check_range,
    check_schema,
)
from .columns import BatchBuilder, infer_schema
from .skipped import SkippedRecord

Decode = Callable[[dict[str, Any]], Mapping[str, Any]]
Parse = Callable[[Any], Any]

_CACHED_FILES = 16  # offset arrays kept per process


class IndexedSource(InferringSource):
    """Files with a sidecar offset index, parsed into dicts, decoded into one batch."""

    kind: str = ""  # the index kind, set by subclasses

    _LOCAL = ("_offsets", "_builder")

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        decode: Decode | None,
        on_error: OnError,
        schema: pa.Schema | None,
        index_dir: str | None,
        filesystem: pafs.FileSystem | None = None,
    ) -> None:
        super().__init__()
        paths = self._given(paths, filesystem)
        check_callable("decode", decode)
        check_schema(schema)
        if schema is not None:
            BatchBuilder(schema)  # unsupported column types fail here, not in a reader
        # A glob like ``data/*`` also matches the sidecar indexes written next to the data.
        self.paths = [p for p in expand_paths(paths) if not p.endswith(INDEX_SUFFIX)]
        if not self.paths:
            raise ConfigError(f"{paths}: only index files ({INDEX_SUFFIX}) match, no data")
        self.decode = decode
        self.on_error = check_on_error(on_error)
        self.index_dir = index_dir
        self._given_schema = schema
        self._init_local()

    def _init_local(self) -> None:
        self._offsets: OrderedDict[str, np.ndarray] = OrderedDict()
        self._builder: BatchBuilder | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.paths)} files, on_error={self.on_error!r})"

    # -- offsets and plan ---------------------------------------------------------------
    def _build_offsets(self, path: str) -> np.ndarray:
        raise NotImplementedError

    def offsets(self, path: str) -> np.ndarray:
        """The ``n + 1`` record offsets of one of this source's files (cached on disk and in
        this process)."""
        self.check_known(path)
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

    def read_result(self, shard: Shard, start: int, stop: int) -> ReadResult:
        check_range(shard, start, stop)
        # A file that shrank since planning has a rebuilt, shorter index in a new process.
        check_held(shard.path, start, stop, len(self.offsets(shard.path)) - 1)
        return self._read(shard, start, stop)

    def where(self, path: str, start: int, stop: int) -> list[At]:
        offs = self.offsets(path)[start:stop].tolist()
        return [At(start + i, off) for i, off in enumerate(offs)]

    # -- schema ---------------------------------------------------------------------------
    def raws(self, path: str, start: int, stop: int) -> tuple[list[Any], list[At]]:
        """Records ``[start, stop)`` before :meth:`_parse` (a bad one may be an exception)."""
        raise NotImplementedError

    def _candidates(self, path: str, start: int, stop: int) -> Iterator[Candidate]:
        raws, where = self.raws(path, start, stop)
        for raw, at in zip(raws, where, strict=True):
            yield path, at, raw

    def _parse(self, path: str, raw: Any) -> Any:
        """A raw record -> the dict given to ``decode`` (raise DecodeError if it is bad)."""
        if isinstance(raw, Exception):
            raise raw
        return raw

    def _schema_of(self, path: str, raw: Any) -> pa.Schema:
        record = self._parse(path, raw)
        return infer_schema(self.decode(record) if self.decode is not None else record)

    # -- records -> batch -------------------------------------------------------------------
    def to_batch(
        self, path: str, raws: Sequence[Any], where: Sequence[At], skipped: list[SkippedRecord]
    ) -> pa.RecordBatch:
        """Parse, decode and convert records; failures raise (named) or go to ``skipped``."""
        return decode_to_batch(
            self.builder(),
            path,
            raws,
            where,
            parse=self._parse,
            decode=self.decode,
            on_error=self.on_error,
            skipped=skipped,
        )

    def failed(self, path: str, at: At, exc: Exception, skipped: list[SkippedRecord]) -> None:
        """A record failed to parse or decode: raise a DataError naming it, or skip it."""
        record_failure(path, at, exc, self.on_error, skipped)
