"""Arrow IPC files and streams, and Hugging Face ``save_to_disk`` folders, as a source.

* IPC **file** format (``.arrow`` / Feather v2, starts with ``ARROW1``): the footer lists the
  record batches, so ``plan()`` counts rows from batch metadata only (``count_rows``) and a
  read opens just the batches that overlap the range.
* IPC **stream** format (no footer): counting needs one pass over the stream; a read walks
  the batches up to the range's end. Local files are memory-mapped, so walking a batch does
  not copy its data; on object stores each pass reads the stream from the start.
* A Hugging Face ``datasets`` folder written by ``Dataset.save_to_disk``: ``state.json``
  lists ``_data_files`` (IPC streams) in order; they become the shards in that order.

Batch row counts of each file are found once per process and cached in the source.
``columns=`` and ``tensors=`` work as in :class:`~shmloader.sources.parquet.ParquetSource`.

A variable-length list of numbers whose rows all have one length L, in every file, is read as
a tensor of row shape ``(L,)``, as if ``tensors=`` named it: Hugging Face ``datasets`` writes
a column of fixed-size embeddings as ``list<float>``, and a batch should give it as one
tensor, not a list of them. ``plan()`` decides it once (``_tabular.UniformLists``), from the
offsets of the batches: those a stream's count walks anyway, and an IPC file's batches read
for the list columns alone (memory-mapped locally; on an object store, one read of those
columns). The result travels with the pickled source, so readers do not look again, and every
task gives the column one form. ``tensors=`` wins over it; a source made
:meth:`~shmloader.sources.base.BaseSource.with_varying_lists` (what
``SharedTaskDataset(ragged=...)`` asks for) keeps such columns lists.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from .._fs import _GLOB_CHARS, expand_paths, open_stream, resolve
from .._keywords import suggest_keywords
from ..errors import ConfigError, DataError
from ._tabular import (
    SchemaCheck,
    UniformLists,
    check_columns,
    check_options,
    finish,
    open_input,
    row_spans,
)
from .base import BaseSource, ReadResult, Shard, check_held
from .hf import HFDataset, hf_dataset_files, is_hf_dataset, refuse_other_hf

_FILE_MAGIC = b"ARROW1"
HF_STATE = "state.json"


class ArrowSource(BaseSource):
    """Arrow IPC files or streams, Hugging Face ``save_to_disk`` folders, or a
    ``datasets.Dataset``: its own Arrow files where they hold it as it is, else one file
    written for it once into ``cache_dir``.

    Args:
        paths: A glob, a path, a folder or a list of them, or a ``datasets.Dataset``.
        columns: Columns to read (``None``: all).
        tensors: Shapes of list columns to read as tensors, ``{"x": (2, 3)}``. A list
            column whose rows all have one length is a tensor without it.
        cache_dir: Where a ``datasets.Dataset`` that is not its files as they are is
            written (else ``$SHMLOADER_DATASETS_DIR``, else ``~/.cache/shmloader/datasets``).
        filesystem: A ``pyarrow.fs.FileSystem`` to read the paths through.
    """

    # Row shapes of the list columns found to hold one length in every row (tensor_shapes):
    # None until a plan looks.
    _fixed_lists: dict[str, tuple[int, ...]] | None = None

    @suggest_keywords()
    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | HFDataset,
        *,
        columns: Sequence[str] | None = None,
        tensors: Mapping[str, Sequence[int]] | None = None,
        cache_dir: str | None = None,
        filesystem: pafs.FileSystem | None = None,
    ) -> None:
        super().__init__()
        refuse_other_hf(paths)
        if is_hf_dataset(paths):
            self.paths = hf_dataset_files(paths, cache_dir)  # in the dataset's order
            if columns is None:
                columns = list(paths.column_names)
        else:
            self.paths = expand_arrow_paths(self._given(paths, filesystem))  # type: ignore[arg-type]
        self.columns, self.tensors = check_options(columns, tensors)
        # An IPC file's rows per record batch, and the (batches, bytes) they were counted at.
        self._file_rows: dict[str, tuple[tuple[int, int], tuple[int, ...]]] = {}

    def __repr__(self) -> str:
        return f"ArrowSource({len(self.paths)} files, columns={self.columns})"

    def _make_plan(self) -> list[Shard]:
        """One shard per file, counted; every schema checked (``SchemaCheck``); and, unless
        :attr:`lists_vary`, the list columns whose rows all have one length found
        (``UniformLists``): from the batches an IPC stream's count walks anyway, and from
        an IPC file's batches read for those columns alone (mapped locally, so no copy; on
        an object store, a read of those columns once per plan)."""
        shards = []
        check = SchemaCheck(self.columns, self.tensors)
        uniform = None if self.lists_vary else UniformLists(self.columns, self.tensors)
        for path in self.paths:
            with open_input(path) as f:
                if _is_ipc_file(path, f):
                    reader = _open_file(path, f)
                    shards.append(Shard(path, _count_rows(reader)))
                    check(path, reader.schema, shards[-1].num_records)
                    if uniform is not None and uniform.undecided:
                        _see_file_lists(path, f, reader.schema, uniform)
                else:
                    reader = _open_stream(path, f)
                    schema = reader.schema
                    seen = uniform if uniform is not None and uniform.in_file(schema) else None
                    rows = 0
                    for batch in _batches(path, reader):
                        rows += batch.num_rows
                        if seen is not None:
                            seen.see(batch)
                    shards.append(Shard(path, rows))
                    check(path, schema, rows)
        self._fixed_lists = {} if uniform is None else uniform.shapes()
        return shards

    def forget_decided_types(self) -> None:
        self._fixed_lists = None

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Row shape of every column read as a tensor: the ones ``tensors=`` names, and the
        list columns the plan found to hold one length in every row (unless
        :attr:`lists_vary`). Found with the plan, which travels to readers with the source;
        a source not planned yet plans here, so every process reads a column one way."""
        if self._fixed_lists is None:
            if self.lists_vary:
                self._fixed_lists = {}
            else:
                self._plan = list(self._make_plan())
        assert self._fixed_lists is not None  # set by _make_plan
        return {**self._fixed_lists, **self.tensors}

    def _read(self, shard: Shard, start: int, stop: int) -> ReadResult:
        path = shard.path
        self.check_known(path)
        with open_input(path) as f:
            if _is_ipc_file(path, f):
                reader = _open_file(path, f)
                schema = reader.schema
                check_columns(path, schema, self.columns)
                counts = self._file_counts(path, f, reader)
                check_held(path, start, stop, sum(counts))
                wanted, offset = row_spans(counts, start, stop)
                batches = [_get_batch(path, reader, i) for i in wanted]
            else:
                reader = _open_stream(path, f)
                schema = reader.schema
                check_columns(path, schema, self.columns)
                batches, offset = _stream_range(path, reader, start, stop)
        table = pa.Table.from_batches(batches, schema=schema)
        if self.columns is not None:
            table = table.select(self.columns)
        return ReadResult(finish(path, table, offset, start, stop, self.tensor_shapes()))

    def _file_counts(
        self, path: str, f: Any, reader: pa.ipc.RecordBatchFileReader
    ) -> tuple[int, ...]:
        """Rows per record batch of an IPC file, counted again when the file is not the one
        counted (another number of batches, or another size): a file rewritten shorter with
        as many batches was sliced by the old sizes, which handed out other records' rows
        for a range the file no longer holds, and no error."""
        key = (reader.num_record_batches, f.size())
        cached = self._file_rows.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        counts = tuple(_get_batch(path, reader, i).num_rows for i in range(key[0]))
        self._file_rows[path] = (key, counts)
        return counts


def _stream_range(
    path: str, reader: pa.ipc.RecordBatchStreamReader, start: int, stop: int
) -> tuple[list[pa.RecordBatch], int]:
    """The stream's batches that overlap rows [start, stop) and the first one's first row."""
    batches: list[pa.RecordBatch] = []
    offset = row = 0
    if start == stop:
        return batches, start
    for batch in _batches(path, reader):
        end = row + batch.num_rows
        if end > start and batch.num_rows:
            if not batches:
                offset = row
            batches.append(batch)
        row = end
        if row >= stop:
            return batches, offset
    # The stream ended first: it holds ``row`` records now (what finish() sees is only the
    # part of the range it still has, which overstates what is left when that is nothing).
    check_held(path, start, stop, row)
    return batches, offset


def _see_file_lists(path: str, f: Any, schema: pa.Schema, uniform: UniformLists) -> None:
    """Show ``uniform`` the rows of an IPC file's list columns in question, batch by batch,
    reading those columns alone (``included_fields``); stops once none is."""
    names = uniform.in_file(schema)
    if not names:
        return
    options = pa.ipc.IpcReadOptions(included_fields=[schema.get_field_index(n) for n in names])
    try:
        reader = pa.ipc.open_file(f, options=options)
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"not a readable Arrow IPC file: {exc}", path=path) from exc
    for i in range(reader.num_record_batches):
        if not uniform.undecided:
            return
        uniform.see(_get_batch(path, reader, i))


def _count_rows(reader: pa.ipc.RecordBatchFileReader) -> int:
    """Rows of an IPC file, from its batches' metadata (``count_rows``, in recent pyarrow);
    with an older pyarrow, from its batches, read for it (cheap where the file is mapped)."""
    count = getattr(reader, "count_rows", None)
    if count is not None:
        return int(count())
    return sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))


def _is_ipc_file(path: str, f: Any) -> bool:
    try:
        head = f.read(len(_FILE_MAGIC))
        f.seek(0)
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"cannot read: {exc}", path=path) from exc
    return bool(head == _FILE_MAGIC)


def _open_file(path: str, f: Any) -> pa.ipc.RecordBatchFileReader:
    try:
        return pa.ipc.open_file(f)
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"not a readable Arrow IPC file: {exc}", path=path) from exc


def _open_stream(path: str, f: Any) -> pa.ipc.RecordBatchStreamReader:
    try:
        return pa.ipc.open_stream(f)
    except (OSError, pa.ArrowException) as exc:
        raise DataError(
            f"neither an Arrow IPC file nor a readable IPC stream: {exc}", path=path
        ) from exc


def _get_batch(path: str, reader: pa.ipc.RecordBatchFileReader, i: int) -> pa.RecordBatch:
    try:
        return reader.get_batch(i)
    except (OSError, ValueError, pa.ArrowException) as exc:  # ValueError: no batch i
        raise DataError(f"cannot read record batch {i}: {exc}", path=path) from exc


def _batches(path: str, reader: pa.ipc.RecordBatchStreamReader) -> Iterator[pa.RecordBatch]:
    """The stream's batches; a damaged stream raises DataError naming the file and batch."""
    i = 0
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            return
        except (OSError, pa.ArrowException) as exc:
            raise DataError(
                f"cannot read record batch {i} of the stream: {exc}", path=path
            ) from exc
        yield batch
        i += 1


def expand_arrow_paths(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
) -> list[str]:
    """Like :func:`shmloader._fs.expand_paths`, but a ``save_to_disk`` folder stands for its
    data files (in ``state.json`` order). Groups (a folder's files, or one file) are sorted
    by their first path, so the plan does not depend on the order arguments were given in."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    groups: list[list[str]] = []
    plain: list[str] = []
    for item in items:
        p = os.fspath(item)
        if not any(c in p for c in _GLOB_CHARS) and _is_dir(p):
            groups.append(hf_data_files(p))
        else:
            plain.append(p)
    if plain:
        groups.extend([f] for f in expand_paths(plain))
    groups.sort(key=lambda g: g[0])
    return list(dict.fromkeys(p for group in groups for p in group))


def _is_dir(path: str) -> bool:
    fs, inner = resolve(path)
    return bool(fs.get_file_info(inner).type == pafs.FileType.Directory)


def hf_data_files(folder: str) -> list[str]:
    """The data files of a Hugging Face ``save_to_disk`` folder, from its ``state.json``."""
    base = folder.rstrip("/")
    fs, inner = resolve(base)
    if fs.get_file_info(f"{inner}/dataset_dict.json").type == pafs.FileType.File:
        raise ConfigError(
            f"{folder} holds a DatasetDict (several splits); give one split's folder, "
            f"e.g. {base}/train"
        )
    state_path = f"{base}/{HF_STATE}"
    if fs.get_file_info(f"{inner}/{HF_STATE}").type != pafs.FileType.File:
        raise ConfigError(
            f"{folder} is a directory without {HF_STATE} (not a save_to_disk folder); "
            f"give files, a list or a glob like {base}/*.arrow"
        )
    try:
        with open_stream(state_path) as f:
            state = json.loads(f.read())
        names = [entry["filename"] for entry in state["_data_files"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise DataError(f"not a datasets state file ({exc!r})", path=state_path) from exc
    if not names:
        raise ConfigError(f"{state_path} lists no data files")
    files = []
    for name in names:
        if "/" in name or name in ("", ".", ".."):
            raise DataError(f"data file name {name!r} points outside the folder", path=state_path)
        # Local paths absolute and normalised, as expand_paths gives them (one file, one name).
        local = isinstance(fs, pafs.LocalFileSystem)
        path = f"{inner}/{name}" if local else f"{base}/{name}"
        if fs.get_file_info(f"{inner}/{name}").type != pafs.FileType.File:
            raise DataError(f"lists {name}, which does not exist", path=state_path)
        files.append(path)
    return files
