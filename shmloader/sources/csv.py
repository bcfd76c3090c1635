"""CSV files as a source: one shard per file, a line-offset index for counts and seeks.

``plan()`` counts records from a line-offset index (kind ``csv``, or ``csv-noheader`` when the
first line is data) built by one numpy pass (see :mod:`shmloader.sources._lines`). Empty lines
are skipped in count and read, as ``pyarrow.csv`` does. With ``header=True`` the first
non-empty line names the columns and is not a record; without it columns are ``f0, f1, ...``.

Column types are the same in every task: taken from ``schema=``, else inferred once by
``pyarrow.csv`` from the first ~1 MiB of records of the first non-empty file, then pinned with
``ConvertOptions(column_types=...)``. Inferred dates and timestamps are kept as strings (the
storage has no temporal types). Only an empty field is null, and columns hold no nulls: an
empty numeric field is a bad record (``decode`` sees ``None`` and may fill a default).

**Limitation**: a quoted field that contains a line break spans two lines, which a line index
cannot represent. Building the index detects it (a line with an odd number of ``"``) and raises
a :class:`~shmloader.errors.DataError` naming the file and line; convert such files with
``shmloader convert`` instead. A line that holds an odd number of ``"`` inside an unquoted
field is refused the same way.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.fs as pafs

from .._keywords import suggest_keywords
from ..errors import ConfigError, DataError, DecodeError, OnError
from ._indexed import At, Decode, IndexedSource
from ._lines import read_span, scan_lines
from ._tabular import check_options, to_batch
from .base import ReadResult, Shard
from .skipped import SkippedRecord

_QUOTE = ord('"')
_INFER_BYTES = 1 << 20
_PINNABLE = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean)
_TEXT = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary)


class CSVSource(IndexedSource):
    """CSV files, indexed by line on first use; column types inferred once and pinned.

    Args:
        paths: A glob, a path or a list of them.
        columns: Columns to read (the others are not converted).
        decode: ``decode(row) -> mapping``: a parsed row (a dict of typed values, ``None``
            for an empty field) into the stored columns.
        on_error: ``"raise"``, or ``"skip"``: bad rows are left out, reported as skipped.
        schema: Schema of the stored columns; without ``decode``, its names pick the
            columns and its types are the conversion types.
        index_dir: Folder for line indexes that cannot be written beside the data.
        delimiter: The field separator.
        header: Whether the first non-empty line names the columns (``False``: ``f0``,
            ``f1``, ...).
        filesystem: A ``pyarrow.fs.FileSystem`` to read the paths through.
    """

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
        delimiter: str = ",",
        header: bool = True,
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
        if not isinstance(delimiter, str) or len(delimiter) != 1 or delimiter in '\n\r"':
            raise ConfigError(
                f"delimiter must be one character other than a quote or line "
                f"break, got {delimiter!r}"
            )
        self.delimiter = delimiter
        self.header = bool(header)
        self.kind = "csv" if self.header else "csv-noheader"
        self.columns = check_options(columns, None)[0]
        self._types: dict[str, pa.DataType] | None = None
        if schema is not None and decode is None:
            if self.columns is not None and self.columns != schema.names:
                raise ConfigError(
                    f"columns={self.columns} and schema names {schema.names} differ; without "
                    "decode the schema is what is stored, so give one or make them equal"
                )
            self.columns = list(schema.names)
            bad = [
                f"{f.name}: {f.type}"
                for f in schema
                if not any(c(f.type) for c in _PINNABLE + _TEXT)
            ]
            if bad:
                raise ConfigError(f"CSV fields convert only to numbers, bool or text: {bad}")
            self._types = {f.name: f.type for f in schema}
        self._names: dict[str, list[str]] = {}

    def _init_local(self) -> None:
        super()._init_local()
        self._names = {}

    def __getstate__(self) -> dict[str, object]:
        state = super().__getstate__()
        state.pop("_names", None)
        return state

    # -- index and header ------------------------------------------------------------------
    def _build_offsets(self, path: str) -> Any:
        def odd_quotes(offset: int, line: int) -> Exception:
            return DataError(
                "a line with an odd number of '\"': a quoted field holds a line break, which "
                "CSVSource cannot index (it reads by line); convert the file with `shmloader "
                "convert` and read the result with RecordFileSource",
                path=path,
                offset=offset,
                index=(line - 1 if self.header else line) if line or not self.header else None,
            )

        starts = scan_lines(path, blank=b"\r", quote=_QUOTE, odd_quotes=odd_quotes)
        return starts[1:] if self.header and len(starts) > 1 else starts

    def _make_plan(self) -> list[Shard]:
        shards = super()._make_plan()
        if self.header:
            # A file with no record is never read, so its header is checked here: a file
            # whose lines end with a lone '\r' is all header line to the index (names()).
            for shard in shards:
                if not shard.num_records:
                    self.names(shard.path)
        return shards

    def names(self, path: str) -> list[str]:
        """Column names of one file: its header, else ``f0, f1, ...`` as many as the first
        file's first record has."""
        if path not in self._names:
            self._names[path] = self._read_names(path)
        return self._names[path]

    def _read_names(self, path: str) -> list[str]:
        if not self.header:
            first = self._first_file()
            if first is None:
                return []
            offs = self.offsets(first)
            line = read_span(first, int(offs[0]), int(offs[1]))
            try:
                return [f"f{i}" for i in range(self._parse_raw(line, None, None).num_columns)]
            except (pa.ArrowException, OSError) as exc:
                raise DecodeError(
                    f"cannot count the columns of the first record: {exc}",
                    path=first,
                    index=0,
                    offset=int(offs[0]),
                ) from exc
        end = int(self.offsets(path)[0])  # the header and blank lines come before record 0
        head = read_span(path, 0, end)
        if not head.endswith((b"\n", b"\r")):
            head += b"\n"  # a file of just a header line; pyarrow.csv wants its line end
        try:
            table = self._parse_raw(head, None, None, header=True)
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"cannot parse the header line: {exc}", path=path) from exc
        if table.num_rows:
            # pyarrow.csv also ends a row at a lone '\r' (old Mac line ends), the line index
            # only at '\n': those rows would be taken for the header and never read.
            raise DataError(
                f"the header line holds {table.num_rows} more row(s) for pyarrow.csv"
                f"{_LONE_CR if _has_lone_cr(head) else ''}",
                path=path,
            )
        names = table.column_names
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise DataError(f"the header repeats column name(s) {dupes}", path=path)
        return names

    def _first_file(self) -> str | None:
        return next((s.path for s in self.plan() if s.num_records), None)

    # -- types and schema ------------------------------------------------------------------
    def _wanted(self, path: str) -> list[str]:
        """Columns read from ``path``: the projection, else the first file's columns."""
        if self.columns is not None:
            wanted = self.columns
        else:
            first = self._first_file()
            wanted = self.names(first) if first is not None else []
        missing = [c for c in wanted if c not in self.names(path)]
        if missing:
            raise DataError(f"no column(s) {missing}; the file has {self.names(path)}", path=path)
        return wanted

    def types(self) -> dict[str, pa.DataType]:
        """Conversion type of every column read (inferred once, then pinned)."""
        if self._types is None:
            self._types = self._infer_types()
        return self._types

    def _infer_types(self) -> dict[str, pa.DataType]:
        first = self._first_file()
        if first is None:
            return {c: pa.string() for c in self.columns or []}
        offs = self.offsets(first)
        stop = max(1, int(np.searchsorted(offs, offs[0] + _INFER_BYTES, side="right")) - 1)
        stop = min(stop, len(offs) - 1)
        data = read_span(first, int(offs[0]), int(offs[stop]))
        table = None
        while table is None:
            try:
                table = self._parse_raw(data, self.names(first), None)
            except (pa.ArrowException, OSError) as exc:
                if stop == 1:
                    raise DataError(
                        f"cannot infer column types, the first record does not parse: {exc}; "
                        "pass schema=",
                        path=first,
                        index=0,
                        offset=int(offs[0]),
                    ) from exc
                stop //= 2
                data = data[: int(offs[stop] - offs[0])]
        return {f.name: _pin(f.type) for f in table.schema}

    def _infer_schema(self) -> pa.Schema:
        if self.decode is not None:
            return super()._infer_schema()
        first = self._first_file()
        names = (
            self.columns
            if self.columns is not None
            else (self.names(first) if first is not None else [])
        )
        if not names:
            raise ConfigError("cannot infer a schema: the files hold no records; pass schema=")
        types = self.types()
        return pa.schema([pa.field(n, types[n]) for n in names])

    # -- parsing ---------------------------------------------------------------------------
    def _parse_raw(
        self,
        data: bytes,
        names: list[str] | None,
        types: dict[str, pa.DataType] | None,
        include: list[str] | None = None,
        *,
        header: bool = False,
    ) -> pa.Table:
        """Whole lines as a table: named ``names`` (else from a header line, else f0, f1..),
        converted to ``types`` (else inferred by pyarrow)."""
        if not data.strip():
            return pa.table({n: pa.array([], type=pa.string()) for n in names or []})
        return pcsv.read_csv(
            pa.BufferReader(data),
            read_options=pcsv.ReadOptions(
                column_names=names,
                autogenerate_column_names=names is None and not header,
                use_threads=False,
                block_size=max(len(data) + 1, 1 << 16),
            ),
            parse_options=pcsv.ParseOptions(delimiter=self.delimiter),
            convert_options=pcsv.ConvertOptions(
                column_types=types,
                include_columns=include,
                null_values=[""],
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )

    def _rows(
        self, path: str, start: int, stop: int
    ) -> tuple[pa.Table, list[At], list[tuple[At, Exception]]]:
        """Records ``[start, stop)`` parsed: the good rows, where they are, and the bad ones.

        One pyarrow call for the whole range; only when it fails is the range halved until
        the bad lines are isolated (a few calls per bad line, not one per line).
        """
        offs = self.offsets(path)
        base = int(offs[start])
        data = read_span(path, base, int(offs[stop]))
        rel = (offs[start : stop + 1] - base).tolist()
        where = self.where(path, start, stop)
        wanted = self._wanted(path)
        names = self.names(path)
        all_types = self.types()
        types = {c: all_types[c] for c in wanted}
        tables: list[pa.Table] = []
        good: list[At] = []
        bad: list[tuple[At, Exception]] = []

        def parse(lo: int, hi: int) -> None:
            try:
                table = self._parse_raw(data[rel[lo] : rel[hi]], names, types, wanted)
                if table.num_rows != hi - lo:
                    hint = _LONE_CR if _has_lone_cr(data[rel[lo] : rel[hi]]) else ""
                    raise DecodeError(f"{hi - lo} line(s) parsed into {table.num_rows} rows{hint}")
            except (pa.ArrowException, OSError, DecodeError) as exc:
                if hi - lo == 1:
                    reason = exc.reason if isinstance(exc, DecodeError) else str(exc)
                    err = DecodeError(f"bad CSV row: {reason}")
                    err.__cause__ = exc
                    bad.append((where[lo], err))
                    return
                mid = (lo + hi) // 2
                parse(lo, mid)
                parse(mid, hi)
                return
            tables.append(table)
            good.extend(where[lo:hi])

        if stop > start:
            parse(0, stop - start)
        schema = pa.schema([pa.field(c, types[c]) for c in wanted])
        table = pa.concat_tables(tables) if tables else schema.empty_table()
        return table, good, bad

    def raws(self, path: str, start: int, stop: int) -> tuple[list[Any], list[At]]:
        table, good, bad = self._rows(path, start, stop)
        items: list[tuple[At, Any]] = list(zip(good, table.to_pylist(), strict=True)) + bad
        items.sort(key=lambda item: item[0].index)
        return [raw for _, raw in items], [at for at, _ in items]

    def _read(self, shard: Shard, start: int, stop: int) -> ReadResult:
        path = shard.path
        skipped: list[SkippedRecord] = []
        if self.decode is not None:
            raws, where = self.raws(path, start, stop)
            batch = self.to_batch(path, raws, where, skipped)
        else:
            table, good, bad = self._rows(path, start, stop)
            table, good, null_bad = _drop_nulls(table, good)
            for at, exc in sorted(bad + null_bad, key=lambda item: item[0].index):
                self.failed(path, at, exc, skipped)
            batch = to_batch(table.cast(self.schema)) if table.num_rows else self.builder().empty()
        skipped.sort(key=lambda s: s.index)
        return ReadResult(batch, tuple(skipped))


def _drop_nulls(
    table: pa.Table, good: list[At]
) -> tuple[pa.Table, list[At], list[tuple[At, Exception]]]:
    """Rows with an empty (null) field are bad records: columns hold no nulls."""
    if not any(c.null_count for c in table.columns):
        return table, good, []
    mask = np.zeros(table.num_rows, dtype=bool)
    first_null: dict[int, str] = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        if column.null_count:
            nulls = pc.is_null(column).to_numpy(zero_copy_only=False)
            for row in np.flatnonzero(nulls & ~mask).tolist():
                first_null[row] = name
            mask |= nulls
    bad: list[tuple[At, Exception]] = [
        (
            good[row],
            DecodeError(
                f"column {name!r} is empty; columns hold no nulls (fill a "
                "default in decode, or clean the data)"
            ),
        )
        for row, name in sorted(first_null.items())
    ]
    keep = np.flatnonzero(~mask)
    return table.take(keep), [good[i] for i in keep.tolist()], bad


_LONE_CR = (
    "; it holds a '\\r' not followed by '\\n', which ends a row for pyarrow.csv but not a "
    "line for CSVSource's index: convert the line ends to '\\n' (or '\\r\\n')"
)


def _has_lone_cr(data: bytes) -> bool:
    return data.count(b"\r") > data.count(b"\r\n")


def _pin(t: pa.DataType) -> pa.DataType:
    """An inferred type as stored: numbers and bool as they are, everything else as text."""
    return t if any(check(t) for check in _PINNABLE) else pa.string()
