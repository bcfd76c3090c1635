"""TFRecord-framed record files plus a user decode function, as a source.

Counts come from each file's sidecar index (built on demand by
:class:`shmloader.formats.tfrecord.RecordFile`), so ``plan()`` never decodes a record. A read
pulls the range's payloads with one indexed seek, decodes them (one call per record with
``decode``; with ``decode_batch`` one call per block of the file read, about 2 MiB of records,
as a writer takes them: ``streamed.py``) and converts the result with
:mod:`shmloader.sources.columns`.

The schema is fixed once per source: given with ``schema=``, or inferred from a sample of the
records (the first ones and runs spread over the whole plan: ``_inferred.py``). The sample is
the same in every process, so readers that each infer it agree; reading
:attr:`RecordFileSource.schema` in the parent before the source is pickled saves them its
reads.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from .._fs import expand_paths
from .._keywords import suggest_keywords
from ..errors import ConfigError, CorruptRecordError, OnError
from ..formats.index import INDEX_SUFFIX
from ..formats.tfrecord import Bad, RecordFile, Run
from ._decoding import (
    At,
    Locations,
    decode_columns_to_batch,
    decode_to_batch,
    record_failure,
)
from ._inferred import Candidate, InferringSource
from .base import (
    ReadResult,
    Shard,
    check_callable,
    check_held,
    check_on_error,
    check_schema,
)
from .columns import BatchBuilder, infer_schema, infer_schema_from_columns
from .skipped import SkippedRecord
from .streamed import Chunk, StreamedColumns

# Payloads are bytes, or memoryviews with ``views=True``.
Decode = Callable[[Any], Mapping[str, Any]]
DecodeBatch = Callable[[list[Any]], Mapping[str, Any]]

RAW_SCHEMA = pa.schema([pa.field("record", pa.binary())])
_OPEN_FILES = 16  # RecordFiles (with their loaded offsets) kept per process


class RecordFileSource(InferringSource):
    """Record files (TFRecord framing, optionally gzip/zlib), each record decoded in the
    readers by a function of yours.

    Args:
        paths: A glob, a path or a list of them, local or URIs that ``pyarrow.fs`` reads.
            Sidecar ``*.shmidx`` files a glob matches are left out.
        decode: ``decode(payload) -> mapping`` of column values, once per record. With
            neither function, batches have one ``record: binary`` column of raw payloads.
            Defined anywhere: docs/sources.md, "Where functions may live".
        decode_batch: ``decode_batch(payloads) -> mapping`` of batched arrays (or lists),
            once per block of about 2 MiB of records: faster for numeric data.
        on_error: ``"raise"``: a bad record (corrupt framing, a decode that raises or does
            not fit the schema) raises an error naming file, record and byte offset.
            ``"skip"``: it is left out and reported as a :class:`SkippedRecord`; damaged
            framing met while indexing is stepped over too (docs/formats.md, "Damaged
            framing").
        schema: ``pyarrow.Schema`` of the decoded columns (``None``: inferred from a sample
            of the records).
        compression: ``"auto"`` (told from the file's first bytes), ``None``, ``"gzip"`` or
            ``"zlib"``.
        index_dir: Folder for offset indexes that cannot be written beside the data (else
            ``$SHMLOADER_INDEX_DIR``, else ``~/.cache/shmloader/index``).
        views: Hand the functions ``memoryview`` slices of the blocks read instead of a
            ``bytes`` copy of each payload: one copy less, worth it for large records (12 KB
            images: see docs/performance.md), not for small ones. The functions must then
            take any bytes-like object, and copy what they keep after returning.
        filesystem: A ``pyarrow.fs.FileSystem`` to read the paths through (an object store
            with its own endpoint and credentials); it travels to the readers.
    """

    _LOCAL = ("_files", "_builder")

    @suggest_keywords()
    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        decode: Decode | None = None,
        decode_batch: DecodeBatch | None = None,
        on_error: OnError = "raise",
        schema: pa.Schema | None = None,
        compression: str | None = "auto",
        index_dir: str | None = None,
        views: bool = False,
        filesystem: pafs.FileSystem | None = None,
    ) -> None:
        super().__init__()
        paths = self._given(paths, filesystem)
        if decode is not None and decode_batch is not None:
            raise ConfigError("give decode or decode_batch, not both")
        check_callable("decode", decode)
        check_callable("decode_batch", decode_batch)
        check_schema(schema)
        if schema is not None and decode is None and decode_batch is None:
            raise ConfigError("schema= needs decode or decode_batch (raw records are binary)")
        # A glob like ``data/*`` also matches the sidecar indexes written next to the data.
        self.paths = [p for p in expand_paths(paths) if not p.endswith(INDEX_SUFFIX)]
        if not self.paths:
            raise ConfigError(f"{paths}: only index files ({INDEX_SUFFIX}) match, no data")
        self.decode = decode
        self.decode_batch = decode_batch
        self.on_error = check_on_error(on_error)
        self.compression = compression
        self.index_dir = index_dir
        if views and decode is None and decode_batch is None:
            raise ConfigError("views=True needs decode or decode_batch (raw records are bytes)")
        self.views = bool(views)
        if schema is None and decode is None and decode_batch is None:
            schema = RAW_SCHEMA
        if schema is None:
            # Decoders that know their output (ExampleDecoder, ExampleBatchDecoder) say so: no
            # guess from one record, which would get variable-length features wrong.
            declared = getattr(decode if decode is not None else decode_batch, "schema", None)
            schema = declared if isinstance(declared, pa.Schema) else None
        self._given_schema = schema
        if schema is not None:
            BatchBuilder(schema)  # unsupported column types fail here, not in a reader
        self._init_local()

    def _init_local(self) -> None:
        self._files: OrderedDict[str, RecordFile] = OrderedDict()
        self._builder: BatchBuilder | None = None

    def __repr__(self) -> str:
        return f"RecordFileSource({len(self.paths)} files, on_error={self.on_error!r})"

    def _make_plan(self) -> list[Shard]:
        return [Shard(p, self._file(p).num_records) for p in self.paths]

    def _file(self, path: str) -> RecordFile:
        self.check_known(path)
        rf = self._files.pop(path, None)
        if rf is None:
            # Skipping steps over damaged framing too: the index keeps the records after it.
            rf = RecordFile(
                path,
                compression=self.compression,
                index_dir=self.index_dir,
                resync=self.on_error == "skip",
            )
        self._files[path] = rf
        while len(self._files) > _OPEN_FILES:
            self._files.popitem(last=False)
        return rf

    def _read(self, shard: Shard, start: int, stop: int) -> ReadResult:
        path = shard.path
        skipped: list[SkippedRecord] = []
        check_held(path, start, stop, self._file(path).num_records)
        runs = self._file(path).read_runs(
            start, stop, on_error=self.on_error, views=self.views, mapped=True
        )
        builder = self.builder()
        if self.decode_batch is not None or self.decode is not None:
            # Decoded a block at a time, as a writer takes them (streamed.py).
            chunks = self._decode_runs(path, runs, builder, skipped)
            return ReadResult(StreamedColumns(builder, stop - start, chunks, skipped))
        payloads: list[Any] = []  # raw records, stored as they are
        for run in runs:
            if isinstance(run, Bad):
                record_failure(path, At(run.record, run.offset), run.error, self.on_error, skipped)
            else:
                payloads.extend(run.payloads)
        batch = builder.from_columns({"record": payloads}, len(payloads))
        skipped.sort(key=lambda s: s.index)
        return ReadResult(batch, tuple(skipped))

    def _decode_runs(
        self,
        path: str,
        runs: Iterable[Run | Bad],
        builder: BatchBuilder,
        skipped: list[SkippedRecord],
    ) -> Iterator[Chunk]:
        """One chunk per run of good records (a block of the file, at most): one
        ``decode_batch`` call, or one ``decode`` call per record."""
        for run in runs:
            if isinstance(run, Bad):
                record_failure(path, At(run.record, run.offset), run.error, self.on_error, skipped)
                continue
            first = run.first
            where = Locations(list(range(first, first + len(run.payloads))), run.offsets)
            if self.decode_batch is not None:
                yield decode_columns_to_batch(
                    builder,
                    path,
                    run.payloads,
                    where,
                    decode_batch=self.decode_batch,
                    on_error=self.on_error,
                    skipped=skipped,
                )
            else:
                yield decode_to_batch(
                    builder,
                    path,
                    run.payloads,
                    where,
                    parse=None,
                    decode=self.decode,
                    on_error=self.on_error,
                    skipped=skipped,
                    fixed=True,
                )

    def _candidates(self, path: str, start: int, stop: int) -> Iterator[Candidate]:
        for idx, off, payload in self._file(path).read_range(start, stop, on_error="skip"):
            if self.views and isinstance(payload, bytes):
                yield path, At(idx, off), memoryview(payload)  # as decode gets it
            else:
                yield path, At(idx, off), payload

    def _schema_of(self, path: str, payload: bytes | memoryview | CorruptRecordError) -> pa.Schema:
        if isinstance(payload, CorruptRecordError):
            raise payload
        if self.decode is not None:
            return infer_schema(self.decode(payload))
        assert self.decode_batch is not None
        return infer_schema_from_columns(self.decode_batch([payload]), 1)
