"""JSON Lines files as a source: one JSON object per line, one shard per file.

``plan()`` counts records from a line-offset index (kind ``jsonl``, see
:mod:`shmloader.sources._lines`) built by one numpy pass over the file. Blank lines (only
spaces, tabs, ``\\r``) are skipped in both count and read, as JSON Lines readers commonly do;
they are not records and not errors.

A read seeks to the range's first line and reads the range's bytes once. Without ``decode``
they are parsed by ``pyarrow.json`` against the source's fixed schema (about ten times faster
than ``json.loads`` plus conversion); numeric lists become tensor columns. If that fast path
fails for any reason (a bad line, bytes that are not UTF-8, a missing key, a null, a list of
another length, a value of another type), the range is parsed again line by line with
``json.loads`` and :class:`~shmloader.sources.columns.BatchBuilder`, which is the reference
behaviour: it names the bad line (file, record index, byte offset) or skips it under
``on_error="skip"``. With ``decode`` every line takes that path: ``json.loads`` ->
``decode(dict)`` -> batch.

The schema is fixed once per source (``schema=``, else inferred from a sample of the records,
the first ones and runs spread over all of them: ``_inferred.py``, and the rules of
:mod:`shmloader.sources.columns`): a number that is a float in any record sampled makes its
column float64, a list of numbers whose length differs among them a variable-length list,
one of one length a tensor. Pass
``schema=`` (with ``pa.list_(...)`` for lists whose length varies) when the sample is not
typical; the error at a record that misfits names the exact one.
Columns hold no nulls: a ``null`` or a missing key is a bad record; fill defaults in ``decode``.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.json as pj

from .._keywords import suggest_keywords
from ..errors import ConfigError, DecodeError, OnError
from ._indexed import At, Decode, IndexedSource
from ._lines import read_span, scan_lines
from ._tabular import check_options, to_batch
from .base import ReadResult, Shard
from .columns import as_tensor_column
from .skipped import SkippedRecord

_BLANK = b" \t\r"


class JSONLSource(IndexedSource):
    """JSON Lines files, indexed by line on first use.

    Args:
        paths: A glob, a path or a list of them.
        columns: Keys to read, the others ignored (``None``: every key of the schema is
            required, and an extra key is an error).
        decode: ``decode(obj) -> mapping``: a parsed (and projected) object into the stored
            columns.
        on_error: ``"raise"``, or ``"skip"``: bad lines are left out, reported as skipped.
        schema: Schema of the stored columns (``None``: inferred from a sample); without
            ``decode``, its names act as ``columns``.
        index_dir: Folder for line indexes that cannot be written beside the data.
        filesystem: A ``pyarrow.fs.FileSystem`` to read the paths through.
    """

    kind = "jsonl"

    @suggest_keywords()
    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        columns: Sequence[str] | None = None,
        decode: Decode | None = None,
        on_error: OnError = "raise",
        schema: pa.Schema | None = None,
        index_dir: str | None = None,
        filesystem: pafs.FileSystem | None = None,
    ) -> None:
        super().__init__(
            paths,
            decode=decode,
            on_error=on_error,
            schema=schema,
            index_dir=index_dir,
            filesystem=filesystem,
        )
        self.columns = check_options(columns, None)[0]
        if schema is not None and decode is None:
            if self.columns is not None and self.columns != schema.names:
                raise ConfigError(
                    f"columns={self.columns} and schema names {schema.names} differ; without "
                    "decode the schema is what is stored, so give one or make them equal"
                )
            self.columns = list(schema.names)

    def _build_offsets(self, path: str) -> Any:
        return scan_lines(path, blank=_BLANK)

    def raws(self, path: str, start: int, stop: int) -> tuple[list[Any], list[At]]:
        return self._split(path, start, stop, self._span(path, start, stop))

    def _span(self, path: str, start: int, stop: int) -> bytes:
        offs = self.offsets(path)
        return read_span(path, int(offs[start]), int(offs[stop]))

    def _split(self, path: str, start: int, stop: int, span: bytes) -> tuple[list[Any], list[At]]:
        offs = self.offsets(path)
        bounds = (offs[start : stop + 1] - offs[start]).tolist()
        lines = [span[a:b] for a, b in itertools.pairwise(bounds)]
        return lines, self.where(path, start, stop)

    def _parse(self, path: str, raw: Any) -> Any:
        try:
            obj = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise DecodeError(f"invalid JSON: {exc}") from exc
        if not isinstance(obj, dict):
            raise DecodeError(f"expected a JSON object per line, found a {type(obj).__name__}")
        if self.columns is None:
            return obj
        missing = [c for c in self.columns if c not in obj]
        if missing:
            raise DecodeError(
                f"no key(s) {', '.join(map(repr, missing))} in this object; it has "
                f"{sorted(obj)[:20]}"
            )
        return {c: obj[c] for c in self.columns}

    def _read(self, shard: Shard, start: int, stop: int) -> ReadResult:
        path = shard.path
        if start == stop:
            self.offsets(path)  # an unknown path is still refused
            return ReadResult(self.builder().empty())
        span = self._span(path, start, stop)
        if self.decode is None:
            batch = self._fast(span, stop - start)
            if batch is not None:
                return ReadResult(batch)
        raws, where = self._split(path, start, stop, span)
        skipped: list[SkippedRecord] = []
        batch = self.to_batch(path, raws, where, skipped)
        skipped.sort(key=lambda s: s.index)
        return ReadResult(batch, tuple(skipped))

    def _fast(self, span: bytes, count: int) -> pa.RecordBatch | None:
        """The whole range through pyarrow.json, or None when anything is off.

        None is not an error being dropped: the caller re-parses the same lines with the
        reference path, which either gives the same batch or names (or skips) the bad lines.
        """
        schema = self.schema
        parse_schema = _json_schema(schema)
        if parse_schema is None or not _is_utf8(span):
            return None
        options = pj.ParseOptions(
            explicit_schema=parse_schema,
            unexpected_field_behavior="error" if self.columns is None else "ignore",
        )
        try:
            table = pj.read_json(
                pa.BufferReader(span),
                read_options=pj.ReadOptions(use_threads=False, block_size=len(span) + 1),
                parse_options=options,
            )
        except (pa.ArrowException, OSError):
            return None
        if table.num_rows != count or any(c.null_count for c in table.columns):
            return None
        try:
            for i, field in enumerate(schema):
                if table.schema.field(i).type != field.type:
                    table = table.set_column(i, field.name, _as_tensor(table.column(i), field))
        except DecodeError:
            return None
        batch = to_batch(table)
        return batch if batch.schema.equals(schema) else None


def _json_schema(schema: pa.Schema) -> pa.Schema | None:
    """What pyarrow.json parses into: tensors as nested lists; None if a type has no JSON
    form (binary), which leaves every read on the reference path."""
    fields = []
    for field in schema:
        t = field.type
        if isinstance(t, pa.FixedShapeTensorType):
            nested: pa.DataType = t.value_type
            for _ in t.shape:
                nested = pa.list_(nested)
            t = nested
        elif pa.types.is_fixed_size_list(t):
            t = pa.list_(t.value_type)
        elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
            return None
        fields.append(pa.field(field.name, t))
    return pa.schema(fields)


def _is_utf8(span: bytes) -> bool:
    """Whether the range's bytes are valid UTF-8, as ``json.loads`` requires.

    pyarrow.json copies a string's bytes unchecked, so a line with invalid UTF-8 would reach
    shared memory and fail only when a batch is gathered. Checking the whole span, not just
    the parsed string columns, also covers keys and values that ``columns=`` leaves out,
    which ``json.loads`` refuses too. ASCII (most data) is decided by ``isascii``; other spans
    by Arrow's validator over a zero-copy view, about four times faster than ``decode()``.
    """
    if span.isascii():
        return True
    offsets = pa.py_buffer(np.array([0, len(span)], dtype=np.int64))
    view = pa.Array.from_buffers(pa.large_string(), 1, [None, offsets, pa.py_buffer(span)])
    try:
        view.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def _as_tensor(column: pa.ChunkedArray, field: pa.Field) -> pa.Array:
    t = field.type
    shape = t.shape if isinstance(t, pa.FixedShapeTensorType) else (t.list_size,)
    tensor = as_tensor_column(column, shape, field.name)
    return tensor if isinstance(t, pa.FixedShapeTensorType) else tensor.storage
