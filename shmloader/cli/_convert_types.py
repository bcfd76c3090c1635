"""Column types for CSV and JSON Lines inputs that fit the whole file, not only its first block.

pyarrow's streaming readers fix each column's type from the first block (1 MB) and fail when a
later value does not fit: integers there and ``1.5`` later, numbers there and ``abc`` later (CSV),
an empty column there (CSV) or a key that first appears later (JSON Lines). A file like that is
still one well-typed table, so ``shmloader convert`` does not give up: on such a failure it reads
the file once more in chunks with whole-chunk inference (``read_csv`` / ``read_json``, which
promote types across their blocks), joins the chunk types and the first block's into the
narrowest type that holds every value, and starts the conversion over with those types pinned
(``ConvertOptions.column_types`` / ``ParseOptions.explicit_schema``). Only a failing file costs
the extra pass; files that convert without one are read exactly as before.

The join never loses what a user would want kept: an integer column whose later values are
integers beyond int64 (ids, hashes) is not rounded into floats on the user's behalf; that is an
error asking for ``--column-type NAME=string`` (or ``=float64`` to accept the rounding).
JSON Lines cannot mix kinds (a number here and a string there) at all in pyarrow, so such a
column is an error naming its line. Types the user pinned with ``--column-type`` are never
changed; a value that does not fit them is an error naming the column.
"""

from __future__ import annotations

import io
import re
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json

from .._fs import open_stream
from ..errors import ConfigError, DataError

# What --column-type accepts: the types a CSV cell or JSON value reads as without loss of meaning.
USER_TYPES: dict[str, pa.DataType] = {
    "int64": pa.int64(),
    "float64": pa.float64(),
    "string": pa.string(),
}
_CHUNK = 8 << 20  # bytes per discovery chunk; each is parsed whole, so memory stays bounded
_INT64_LIMIT = 2.0**63
# The streaming readers' messages for a value that does not fit the type fixed earlier.
_CSV_LATE = re.compile(r"In CSV column #(\d+): CSV conversion error to (.+?): invalid value")
_JSON_LATE = re.compile(
    r"Failed to convert JSON to |JSON parse error: Column\(.*\) changed from "
    r"|JSON parse error: unexpected field"
)
_JSON_KIND_CHANGE = re.compile(r"Column\(/?(.*?)\) changed from (\w+) to (\w+) in row (\d+)")


def split_column_type_args(specs: Sequence[str]) -> dict[str, str]:
    """``--column-type NAME=TYPE`` arguments as {name: type name}."""
    types: dict[str, str] = {}
    for spec in specs:
        name, sep, kind = spec.rpartition("=")
        if not sep or not name:
            raise ConfigError(f"--column-type {spec!r}: use NAME=TYPE")
        if types.get(name, kind) != kind:
            raise ConfigError(f"--column-type gives column {name!r} two types")
        types[name] = kind
    return types


def user_types(column_types: Mapping[str, str]) -> dict[str, pa.DataType]:
    """Type names the user pinned as arrow types; an unknown name is a ConfigError."""
    for name, kind in column_types.items():
        if kind not in USER_TYPES:
            raise ConfigError(
                f"--column-type {name}={kind}: TYPE must be one of {', '.join(USER_TYPES)}"
            )
    return {name: USER_TYPES[kind] for name, kind in column_types.items()}


class Widen(Exception):
    """A file needs wider column types than its first block gave; convert starts over."""

    def __init__(self, path: str, types: dict[str, pa.DataType], was: dict[str, str]) -> None:
        super().__init__(f"{path}: widen {sorted(types)}")
        self.path = path
        self.types = types
        self.was = was  # name -> what the first block gave it, in words

    def notes(self) -> list[str]:
        return [
            f"{self.path}: column {name!r} {self.was[name]} in the file's first block, but "
            f"later rows need {t}; read it as {t} throughout"
            for name, t in self.types.items()
        ]


@dataclass
class ColumnTypes:
    """Column types pinned for CSV/JSON Lines reads: the user's (fixed) and learned widenings."""

    fixed: dict[str, pa.DataType] = field(default_factory=dict)
    learned: dict[str, pa.DataType] = field(default_factory=dict)

    @property
    def pinned(self) -> dict[str, pa.DataType]:
        return {**self.learned, **self.fixed}

    def csv_options(self) -> pa_csv.ConvertOptions | None:
        return pa_csv.ConvertOptions(column_types=self.pinned) if self.pinned else None

    def json_options(self) -> pa_json.ParseOptions | None:
        pinned = self.pinned
        return pa_json.ParseOptions(explicit_schema=pa.schema(pinned)) if pinned else None

    def open(self, stream: pa.NativeFile, fmt: str) -> pa.RecordBatchReader:
        """The streaming reader, with the pinned types (none: exactly pyarrow's defaults)."""
        if fmt == "csv":
            return pa_csv.open_csv(stream, convert_options=self.csv_options())
        return pa_json.open_json(stream, parse_options=self.json_options())


def is_late_type_error(fmt: str, exc: BaseException) -> bool:
    """Whether ``exc`` is a streaming reader refusing a value the first block's type can't hold."""
    pattern = _CSV_LATE if fmt == "csv" else _JSON_LATE
    return isinstance(exc, pa.ArrowInvalid) and pattern.search(str(exc)) is not None


def widen_for(
    path: str, fmt: str, compression: str | None, types: ColumnTypes, exc: pa.ArrowInvalid | None
) -> Widen | DataError | None:
    """What to do about ``exc`` in ``path``: the widening that reads it, or the error to raise.

    Compares the types the streaming reader fixed (first block, pinned types applied) with the
    whole file's, found chunk by chunk; None when they agree. ``exc``: the streaming reader's
    failure, or None when asked because the first block left a column untyped (all empty).
    """
    with open_stream(path, compression) as stream:
        try:
            first = types.open(stream, fmt).schema
        except pa.ArrowInvalid:  # a value in the first block does not fit a --column-type
            first = pa.schema(types.pinned)
    found = _scan(path, fmt, compression)
    widen: dict[str, pa.DataType] = {}
    was: dict[str, str] = {}
    for name, (whole, where) in found.types.items():
        current = first.field(name).type if name in first.names else None
        joined = whole if current is None else _join(current, whole, fmt)
        if joined is not None and joined == current:
            continue
        if name in types.fixed:
            return DataError(
                f"column {name!r} is --column-type {types.fixed[name]} but holds {whole} "
                f"values (in {where}){f': {exc}' if exc else ''}",
                path=path,
            )
        if joined is None:
            return DataError(
                f"column {name!r} holds {current} values in its first block and {whole} "
                f"values in {where}; JSON Lines cannot mix them in one column",
                path=path,
            )
        big = found.too_big.get(name)
        rounds = _is_float(joined) and not _is_float(current)
        if big is not None and rounds and name not in found.fractional:
            return DataError(
                f"column {name!r} holds integers beyond int64 from {big}; they would lose "
                f"exactness as floats: pass --column-type {name}=string to keep their digits "
                f"(bytes), or --column-type {name}=float64 to store them rounded",
                path=path,
            )
        widen[name] = joined
        if current is None:
            was[name] = "does not appear"
        else:
            was[name] = "is empty" if pa.types.is_null(current) else f"is {current}"
    if widen:
        return Widen(path, widen, was)
    return None


def has_untyped_column(schema: pa.Schema) -> bool:
    """Whether a column (or its list values) was all empty in the first block: type null."""
    return any(pa.types.is_null(_leaf(f.type)) for f in schema)


def _leaf(t: pa.DataType) -> pa.DataType:
    while pa.types.is_list(t) or pa.types.is_large_list(t):
        t = t.value_type
    return t


def _is_float(t: pa.DataType | None) -> bool:
    return t is not None and pa.types.is_floating(_leaf(t))


def _join(a: pa.DataType, b: pa.DataType, fmt: str) -> pa.DataType | None:
    """Narrowest type holding values of both (None: JSON Lines kinds that cannot mix)."""
    try:
        schema = pa.unify_schemas(
            [pa.schema([("x", a)]), pa.schema([("x", b)])], promote_options="permissive"
        )
        return schema.field("x").type
    except (pa.ArrowTypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    if fmt == "csv":
        return pa.string()  # every CSV cell reads as its text
    if all(pa.types.is_string(t) or pa.types.is_temporal(t) for t in (a, b)):
        return pa.string()  # JSON strings that parsed as times in one part of the file
    return None


@dataclass
class _Found:
    """Whole-file column types, with where each first changed, and what integers overflowed."""

    types: dict[str, tuple[pa.DataType, str]] = field(default_factory=dict)
    fractional: set[str] = field(default_factory=set)  # float columns with a non-integer value
    too_big: dict[str, str] = field(default_factory=dict)  # float columns: first |v| >= 2**63


def _scan(path: str, fmt: str, compression: str | None) -> _Found:
    found = _Found()
    names: list[str] | None = None
    for start, chunk in _chunks(path, compression):
        header = (names is None) if fmt == "csv" else None
        table = _read_chunk(path, fmt, chunk, start, names)
        if fmt == "csv" and names is None:
            names = table.schema.names
        for name, column in zip(table.schema.names, table.columns, strict=True):
            _fold(path, fmt, found, name, column, _Lines(chunk, start, header))
    return found


def _read_chunk(path: str, fmt: str, chunk: bytes, start: int, names: list[str] | None) -> pa.Table:
    if fmt == "csv":
        options = pa_csv.ReadOptions(column_names=names) if names else None
        return pa_csv.read_csv(io.BytesIO(chunk), read_options=options)
    try:  # one block per chunk, so a row number in pyarrow's message counts from the chunk
        options = pa_json.ReadOptions(block_size=max(len(chunk), 1 << 20))
        return pa_json.read_json(io.BytesIO(chunk), read_options=options)
    except pa.ArrowInvalid as exc:
        change = _JSON_KIND_CHANGE.search(str(exc))
        if change is None:
            raise
        name, old, new, row = change.groups()
        line = _Lines(chunk, start, None).line(int(row))
        raise DataError(
            f"column {name!r} holds {old} values and then a {new} at line {line}; JSON Lines "
            f"cannot mix them in one column",
            path=path,
        ) from exc


def _fold(
    path: str, fmt: str, found: _Found, name: str, column: pa.ChunkedArray, lines: _Lines
) -> None:
    """Join one chunk's column into the file's, noting non-integer and beyond-int64 floats."""
    if name not in found.types:
        found.types[name] = (column.type, f"lines {lines.span()}")
    else:
        before, _ = found.types[name]
        joined = _join(before, column.type, fmt)
        if joined is None:
            raise DataError(
                f"column {name!r} holds {before} values and then {column.type} values in lines "
                f"{lines.span()}; JSON Lines cannot mix them in one column",
                path=path,
            )
        if joined != before:
            found.types[name] = (joined, f"lines {lines.span()}")
    leaf = column
    while pa.types.is_list(leaf.type) or pa.types.is_large_list(leaf.type):
        leaf = pc.list_flatten(leaf)
    if not pa.types.is_floating(leaf.type) or len(leaf) == 0:
        return
    finite = pc.fill_null(pc.is_finite(leaf), True)
    whole = pc.fill_null(pc.equal(leaf, pc.floor(leaf)), True)
    if not pc.all(pc.and_(finite, whole)).as_py():
        found.fractional.add(name)
    if name in found.too_big:
        return
    big = pc.index(pc.fill_null(pc.greater_equal(pc.abs(leaf), _INT64_LIMIT), False), True)
    index = big.as_py()
    if index < 0:
        return
    value = f"{leaf[index].as_py():g}"
    if leaf is column:  # a row per value: the exact line
        found.too_big[name] = f"line {lines.line(index)} ({value})"
    else:
        found.too_big[name] = f"lines {lines.span()} ({value})"


class _Lines:
    """Maps a row of a chunk to its line in the file (empty lines hold no row)."""

    def __init__(self, chunk: bytes, start: int, header: bool | None) -> None:
        self.chunk, self.start = chunk, start
        self.header = header  # CSV: whether the chunk starts with the header; None: JSON

    def line(self, row: int) -> int:
        skip = row + (1 if self.header else 0)
        for number, text in enumerate(self.chunk.split(b"\n"), self.start):
            if text.strip():
                if skip == 0:
                    return number
                skip -= 1
        return self.start

    def span(self) -> str:
        first = self.start + (1 if self.header else 0)
        last = self.start + max(self.chunk.count(b"\n") - 1, 0)
        return f"{first}-{last}"


def _chunks(path: str, compression: str | None) -> Iterator[tuple[int, bytes]]:
    """The file in pieces of whole lines, each with its first line's number (from 1).

    The readers run with ``newlines_in_values`` off, so a newline always ends a row.
    """
    with open_stream(path, compression) as stream:
        carry, line = b"", 1
        while piece := stream.read(_CHUNK):
            data = carry + piece
            cut = data.rfind(b"\n") + 1
            if cut:
                yield line, data[:cut]
                line += data.count(b"\n", 0, cut)
            carry = data[cut:]
        if carry.strip():
            yield line, carry


def check_fixed_used(fixed: Mapping[str, pa.DataType], seen: Collection[str]) -> None:
    """A --column-type naming no column with a value is most likely a typo: say so."""
    unused = sorted(n for n in fixed if n not in seen)
    if unused:
        raise ConfigError(
            f"--column-type names {unused}, which no CSV or JSON Lines row has a value for"
        )
