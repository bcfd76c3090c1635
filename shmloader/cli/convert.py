"""``shmloader convert INPUT... --output-dir DIR``: tables to TFRecord shards of tf.train.Example,
or a folder of files (images, ...) to WebDataset tar shards (``sources/file_shards.py``).

One Example per input row, written in shards of ``--records-per-file`` records named
``<prefix>-00000-of-000NN.tfrecord`` (each with its sidecar index, so training plans them
without a scan). Inputs are read batch by batch (Parquet by row batches, CSV and JSON Lines by
blocks), so a dataset larger than memory converts; ``.npz`` archives are loaded whole, as numpy
does. At the end the command prints the ``FixedLenFeature`` / ``VarLenFeature`` spec that
decodes what it wrote, to paste into the training script.

The shard count is only known once the last row is read (CSV and JSON Lines have no row
count up front), so shards are written under ``.partial`` names and renamed at the end; a
failed run removes its partial files and leaves no half-named dataset behind.
"""

from __future__ import annotations

import argparse
import re
import sys
import zipfile
from collections.abc import Generator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from tqdm import tqdm

from .._fs import claim_output_folder, expand_paths, open_random, open_stream, resolve
from ..errors import ConfigError, DataError
from ..formats.example import encode_example
from ..formats.tfrecord import RecordFile, RecordWriter
from ..sources.file_shards import write_file_shards
from ._convert_columns import ColumnStats, arrow_columns, numpy_columns
from ._convert_types import (
    USER_TYPES,
    ColumnTypes,
    Widen,
    check_fixed_used,
    has_untyped_column,
    is_late_type_error,
    split_column_type_args,
    user_types,
    widen_for,
)

FORMATS = ("parquet", "csv", "jsonl", "npz")
FILES = "files"  # --format files: one sample per file, into tar shards (sources/file_shards.py)
_EXTENSIONS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".npz": "npz",
}
# Text inputs may be compressed as a whole; pyarrow picks the codec from the extension.
_STREAM_SUFFIXES = (".gz", ".bz2", ".zst", ".lz4")
_BATCH_ROWS = 8192
_PARTIAL = ".partial"

Columns = list[tuple[ColumnStats, list[Any]]]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "convert",
        help=(
            "convert Parquet/CSV/JSON Lines/npz rows into TFRecord shards of tf.train.Example, "
            "or a folder of files (images, ...) into WebDataset tar shards"
        ),
        description=(
            "Write one tf.train.Example per input row into TFRecord shards (with their sidecar "
            "indexes) and print the feature spec that decodes them. Scalars become 1-element "
            "lists, fixed-size arrays and lists are flattened, strings and binaries become "
            "bytes. A folder of files of no table format (or --format files) becomes "
            "WebDataset tar shards instead, one sample per file named by its path under the "
            "folder (cat/001.jpg: key cat/001, field jpg), in an order that puts files of "
            "every subfolder in every shard. Exit status: 0 done, 1 an input that cannot be "
            "read or decoded, 2 bad arguments (a missing input among them) or a column an "
            "Example cannot hold."
        ),
    )
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="files, URIs or quoted globs")
    parser.add_argument("--output-dir", required=True, metavar="DIR", help="where shards go")
    parser.add_argument(
        "--records-per-file",
        type=int,
        default=None,
        metavar="N",
        help=("records per output shard (default: 100000 rows; files: about 256 MiB of them)"),
    )
    parser.add_argument(
        "--format",
        choices=(*FORMATS, FILES),
        default=None,
        help=(
            "input format (default: from each file's extension; a folder of files of no table "
            "format: files)"
        ),
    )
    parser.add_argument("--prefix", default="part", help="shard name prefix (default: part)")
    parser.add_argument(
        "--column-type",
        action="append",
        default=[],
        metavar="NAME=TYPE",
        help=(
            f"read CSV/JSON Lines column NAME as TYPE ({', '.join(USER_TYPES)}) instead of "
            "inferring it; repeatable (default: inferred, widened when later rows need it)"
        ),
    )
    parser.add_argument(
        "--compression",
        choices=("gzip", "zlib"),
        default=None,
        help="compress the shards as TensorFlow's TFRecordOptions do (default: none)",
    )
    parser.set_defaults(func=run)


@dataclass
class ConvertResult:
    """What a conversion wrote: shard paths with their record counts, and the columns seen."""

    files: list[tuple[str, int]] = field(default_factory=list)
    columns: dict[str, ColumnStats] = field(default_factory=dict)
    # Column types read wider than a CSV/JSON Lines file's first block gave, one line each.
    notes: list[str] = field(default_factory=list)

    @property
    def records(self) -> int:
        return sum(n for _, n in self.files)

    def spec_text(self) -> str:
        lines = [
            "from shmloader.formats.example import FixedLenFeature, VarLenFeature",
            "",
            "spec = {",
            *(f"    {c.spec_line()}" for c in self.columns.values()),
            "}",
        ]
        return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        if args.format == FILES or (args.format is None and _is_folder_of_files(args.inputs)):
            _write_files(args)
        else:
            _convert_rows(args)
    except ConfigError as exc:
        print(f"shmloader convert: {exc}", file=sys.stderr)
        return 2
    except DataError as exc:
        print(f"shmloader convert: {exc}", file=sys.stderr)
        return 1
    return 0


def _convert_rows(args: argparse.Namespace) -> None:
    """``convert`` of tables: TFRecord shards, and the spec that decodes them."""
    result = convert(
        args.inputs,
        args.output_dir,
        records_per_file=_ROWS_PER_FILE if args.records_per_file is None else args.records_per_file,
        fmt=args.format,
        prefix=args.prefix,
        compression=args.compression,
        column_types=split_column_type_args(args.column_type),
    )
    for note in result.notes:
        print(f"shmloader convert: note: {note}", file=sys.stderr)
    where = f" ({args.compression})" if args.compression else ""
    files = len(result.files)
    print(f"wrote {result.records} records to {files} file{'s' if files != 1 else ''}{where}:")
    _list_shards([(path, n, "record") for path, n in result.files])
    print("\nFeature spec that decodes them:\n")
    print(result.spec_text())


def _write_files(args: argparse.Namespace) -> None:
    """``convert`` of a folder of files: tar shards, and how to read them."""
    written = write_file_shards(
        args.inputs, args.output_dir, files_per_shard=args.records_per_file, prefix=args.prefix
    )
    files = sum(shard.files for shard in written)
    print(f"wrote {files} files to {len(written)} tar shard{'s' if len(written) != 1 else ''}:")
    _list_shards([(shard.path, shard.files, "file") for shard in written])
    pattern = f"{args.output_dir.rstrip('/')}/{args.prefix}-*.tar"
    print(
        "\nRead them with:\n\n"
        f'    source = shmloader.WebDatasetSource("{pattern}", decode=decode)\n\n'
        "where decode(sample) gets {'__key__': 'cat/001', 'jpg': b'...'}: the key is the "
        "file's path under the folder without its ending, the field its ending."
    )


def _list_shards(shards: list[tuple[str, int, str]]) -> None:
    """One line per shard (path, count, what it counts), the first and last 3 of more than 8."""
    shown = shards if len(shards) <= 8 else [*shards[:3], *shards[-3:]]
    for i, (path, n, unit) in enumerate(shown):
        if len(shards) > 8 and i == 3:
            print(f"  ... {len(shards) - 6} more")
        print(f"  {path}  ({n} {unit}{'s' if n != 1 else ''})")


def _is_folder_of_files(inputs: Sequence[str]) -> bool:
    """Whether the inputs include a folder and, all of them expanded, no file has a table
    format's ending: files to put in tar shards, not rows to convert."""
    if not any(_is_folder(p) for p in inputs):
        return False
    return not any(_table_format(p) for p in expand_paths(inputs, directories=True))


def _is_folder(path: str) -> bool:
    fs, inner = resolve(path)
    return bool(fs.get_file_info(inner).type == pafs.FileType.Directory)


def _table_format(path: str) -> str | None:
    try:
        return format_of(path)
    except ConfigError:
        return None


_ROWS_PER_FILE = 100_000


def convert(
    inputs: str | Sequence[str],
    output_dir: str,
    *,
    records_per_file: int = _ROWS_PER_FILE,
    fmt: str | None = None,
    prefix: str = "part",
    compression: str | None = None,
    progress: bool | None = None,
    column_types: Mapping[str, str] | None = None,
) -> ConvertResult:
    """Convert ``inputs`` into shards in ``output_dir``; see the module docstring.

    ``progress``: show a tqdm bar (None: only when stderr is a terminal).
    ``column_types``: {column: "int64" | "float64" | "string"} for CSV/JSON Lines columns,
    instead of pyarrow's inference. Other columns whose later rows don't fit the type the
    file's first block gave are widened, and the conversion starts over (see
    ``_convert_types``); ``ConvertResult.notes`` says which.
    """
    if records_per_file < 1:
        raise ConfigError(f"--records-per-file must be at least 1, got {records_per_file}")
    if not re.fullmatch(r"[A-Za-z0-9._-]+", prefix):
        raise ConfigError(f"--prefix {prefix!r}: use letters, digits, '.', '_' or '-'")
    types = ColumnTypes(fixed=user_types(column_types or {}))
    paths = expand_paths(inputs)
    formats = [fmt or format_of(p) for p in paths]
    notes: list[str] = []
    while True:  # ends: each Widen pins a strictly wider type, and types only widen so far
        try:
            result = _convert_once(
                paths, formats, output_dir, records_per_file, prefix, compression, progress, types
            )
        except Widen as widen:
            types.learned.update(widen.types)
            notes.extend(widen.notes())
            continue
        result.notes = notes
        return result


def _convert_once(
    paths: list[str],
    formats: list[str],
    output_dir: str,
    records_per_file: int,
    prefix: str,
    compression: str | None,
    progress: bool | None,
    types: ColumnTypes,
) -> ConvertResult:
    """One pass over every input; a Widen leaves nothing written behind."""
    out = _ShardWriter(output_dir, prefix, records_per_file, compression)
    result = ConvertResult()
    rows_seen = 0
    try:
        with tqdm(
            total=_known_rows(paths, formats),
            unit="rows",
            desc="converting",
            file=sys.stderr,
            disable=None if progress is None else not progress,
        ) as bar:
            for path, kind in zip(paths, formats, strict=True):
                for n, columns in _read_batches(path, kind, types):
                    _track(result.columns, columns, n, rows_seen)
                    names = [stats.name for stats, _ in columns]
                    for values in zip(*(rows for _, rows in columns), strict=True):
                        out.write(
                            encode_example(
                                {k: v for k, v in zip(names, values, strict=True) if v is not None}
                            )
                        )
                    rows_seen += n
                    bar.update(n)
        if rows_seen == 0:
            raise ConfigError(f"the inputs hold no rows ({', '.join(paths)}); nothing written")
        check_fixed_used(
            types.fixed, {n for n, c in result.columns.items() if c.min_count is not None}
        )
        result.files = out.finish()
    except BaseException:
        out.abort()
        raise
    return result


def format_of(path: str) -> str:
    name = path.lower()
    for suffix in _STREAM_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    for ext, kind in _EXTENSIONS.items():
        if name.endswith(ext):
            return kind
    raise ConfigError(
        f"{path}: cannot tell the format from the extension; pass --format {'|'.join(FORMATS)}"
    )


def _known_rows(paths: list[str], formats: list[str]) -> int | None:
    """Total rows for the progress bar when every input says so up front (Parquet footers)."""
    if any(kind != "parquet" for kind in formats):
        return None
    total = 0
    for path in paths:
        with _reading(path, "parquet"), open_random(path) as f:
            total += pq.ParquetFile(f).metadata.num_rows
    return total


def _track(seen: dict[str, ColumnStats], columns: Columns, n: int, rows_before: int) -> None:
    """Merge a batch's column stats; a column absent from some rows counts those as nulls."""
    present = set()
    for stats, _ in columns:
        present.add(stats.name)
        if stats.name in seen:
            seen[stats.name].merge(stats)
        else:
            stats.nulls += rows_before
            seen[stats.name] = stats
    for name, stats in seen.items():
        if name not in present:
            stats.nulls += n


@contextmanager
def _reading(path: str, fmt: str) -> Iterator[None]:
    """Turn pyarrow/numpy/OS errors while reading ``path`` into a DataError naming it."""
    try:
        yield
    except ConfigError:
        raise
    except (pa.ArrowException, OSError, EOFError, ValueError, zipfile.BadZipFile) as exc:
        raise DataError(f"cannot read as {fmt}: {exc}", path=path) from exc


def _read_batches(path: str, fmt: str, types: ColumnTypes) -> Iterator[tuple[int, Columns]]:
    if fmt == "npz":
        yield from _npz_batches(path)
        return
    batches = _arrow_batches(path, fmt, types)
    typed = fmt not in ("csv", "jsonl")  # whether every column has a type (text: checked once)
    try:
        while True:
            with _reading(path, fmt):
                try:
                    batch = next(batches, None)
                except pa.ArrowInvalid as exc:
                    if not (fmt in ("csv", "jsonl") and is_late_type_error(fmt, exc)):
                        raise
                    # pyarrow fixed a column's type from the first block and a later value
                    # does not fit it: find the types the whole file needs (Widen starts over).
                    found = widen_for(path, fmt, _stream_compression(path), types, exc)
                    raise found or DataError(f"cannot read as {fmt}: {exc}", path=path) from exc
            if batch is None:
                return
            if not typed:
                typed = True
                if has_untyped_column(batch.schema):  # all empty in the first block
                    with _reading(path, fmt):
                        found = widen_for(path, fmt, _stream_compression(path), types, None)
                    if found is not None:
                        raise found
            if batch.num_rows:
                yield batch.num_rows, arrow_columns(batch, path)
    finally:
        batches.close()  # its input stream, now rather than when the garbage collector runs


def _arrow_batches(
    path: str, fmt: str, types: ColumnTypes
) -> Generator[pa.RecordBatch, None, None]:
    if fmt == "parquet":
        with open_random(path) as f:
            yield from pq.ParquetFile(f).iter_batches(batch_size=_BATCH_ROWS)
        return
    with open_stream(path, _stream_compression(path)) as stream:
        yield from types.open(stream, fmt)


def _stream_compression(path: str) -> str | None:
    return "detect" if path.lower().endswith(_STREAM_SUFFIXES) else None


def _npz_batches(path: str) -> Iterator[tuple[int, Columns]]:
    with _reading(path, "npz"), open_random(path) as f, np.load(f, allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    if not arrays:
        raise ConfigError(f"{path}: the archive holds no arrays")
    lengths = {name: (a.shape[0] if a.ndim else None) for name, a in arrays.items()}
    if None in lengths.values() or len(set(lengths.values())) != 1:
        raise ConfigError(
            f"{path}: every array must share its first dimension (one row each); "
            f"got leading sizes {lengths}"
        )
    n = next(iter(lengths.values()))
    assert n is not None
    for start in range(0, n, _BATCH_ROWS):
        stop = min(start + _BATCH_ROWS, n)
        yield stop - start, numpy_columns(arrays, start, stop, path)


class _ShardWriter:
    """Fills shards of ``per_file`` records under partial names; ``finish`` names them."""

    def __init__(self, output_dir: str, prefix: str, per_file: int, compression: str | None):
        self.fs, self.dir = claim_output_folder(
            output_dir, prefix, ".tfrecord", "remove them or pick another --prefix or --output-dir"
        )
        self.output_dir = output_dir.rstrip("/")
        self.prefix = prefix
        self.per_file = per_file
        self.compression = compression
        self.paths: list[str] = []  # every shard written so far (partial or final name)
        self.counts: list[int] = []
        self._writer: RecordWriter | None = None

    def _path(self, name: str) -> str:
        return f"{self.output_dir}/{name}"

    def write(self, payload: bytes) -> None:
        if self._writer is None or self._writer.count >= self.per_file:
            self._close_current()
            path = self._path(f"{self.prefix}-{len(self.paths):05d}.tfrecord{_PARTIAL}")
            # No index yet: an index is tied to the file's path, which changes in finish().
            self._writer = RecordWriter(path, compression=self.compression, index=False)
            self.paths.append(path)
            self.counts.append(0)
        self._writer.write(payload)

    def _close_current(self) -> None:
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.close()
            self.counts[-1] = writer.count

    def finish(self) -> list[tuple[str, int]]:
        """Rename the partial shards to their final names and index them."""
        self._close_current()
        total = len(self.paths)
        for i, count in enumerate(self.counts):
            final = self._path(f"{self.prefix}-{i:05d}-of-{total:05d}.tfrecord")
            self.fs.move(resolve(self.paths[i])[1], resolve(final)[1])
            self.paths[i] = final  # from here on abort() removes the renamed file
            found = RecordFile(final, compression=self.compression).num_records
            if found != count:
                raise DataError(f"wrote {count} records but reading back finds {found}", path=final)
        done = list(zip(self.paths, self.counts, strict=True))
        self.paths, self.counts = [], []
        return done

    def abort(self) -> None:
        """Remove every shard this run wrote: a failed conversion leaves nothing behind."""
        try:
            if self._writer is not None:
                self._writer.close()
        finally:
            self._writer = None
            for path in self.paths:
                self.fs.delete_file(resolve(path)[1])
            self.paths, self.counts = [], []
