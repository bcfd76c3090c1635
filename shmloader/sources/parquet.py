"""Parquet files as a source: one shard per file, reads by row group.

``plan()`` reads only each file's footer (``num_rows``). A read decodes just the row groups
that overlap the range (their row counts are in the footer), only the requested columns, and
slices to the exact rows.

Tensor columns: Parquet has no tensor type. Files written by pyarrow keep the Arrow schema in
their metadata, so ``fixed_shape_tensor`` and ``fixed_size_list`` columns come back as such.
Files from other writers (Spark, DuckDB, pandas without pyarrow metadata, ...) give
``list<...>`` columns: declare those with ``tensors={"name": shape}`` to get tensor columns
(every row must hold exactly that many values; zero-copy re-typing). Undeclared list columns
stay lists: re-typing by looking at the data would give different types to different tasks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from .._fs import expand_paths
from .._keywords import suggest_keywords
from ..errors import DataError
from ._tabular import (
    SchemaCheck,
    check_columns,
    check_options,
    finish,
    open_input,
    row_spans,
)
from .base import BaseSource, ReadResult, Shard, check_held


class ParquetSource(BaseSource):
    """Parquet files: one shard per file, row counts from the footers; a read touches only
    the row groups and columns it needs.

    Args:
        paths: A glob, a path, a directory (the Parquet files under it, as
            ``pyarrow.dataset`` reads one) or a list of them.
        columns: Columns to read (``None``: all).
        tensors: Shapes of list columns to read as tensors, ``{"x": (2, 3)}``, for files
            whose writer stored no Arrow schema.
        filesystem: A ``pyarrow.fs.FileSystem`` to read the paths through.
    """

    @suggest_keywords()
    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        columns: Sequence[str] | None = None,
        tensors: Mapping[str, Sequence[int]] | None = None,
        filesystem: pafs.FileSystem | None = None,
    ) -> None:
        super().__init__()
        self.paths = expand_paths(self._given(paths, filesystem), directories=True)
        self.columns, self.tensors = check_options(columns, tensors)

    def __repr__(self) -> str:
        return f"ParquetSource({len(self.paths)} files, columns={self.columns})"

    def _make_plan(self) -> list[Shard]:
        shards = []
        check = SchemaCheck(self.columns, self.tensors)
        for path in self.paths:
            with open_input(path) as f:
                pf = _parquet_file(path, f)
                check(path, pf.schema_arrow, pf.metadata.num_rows)
                shards.append(Shard(path, pf.metadata.num_rows))
        return shards

    def _read(self, shard: Shard, start: int, stop: int) -> ReadResult:
        path = shard.path
        self.check_known(path)
        with open_input(path) as f:
            pf = _parquet_file(path, f)
            schema = pf.schema_arrow
            check_columns(path, schema, self.columns)
            md = pf.metadata
            check_held(path, start, stop, md.num_rows)
            counts = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
            groups, offset = row_spans(counts, start, stop)
            try:
                if groups:
                    table = pf.read_row_groups(groups, columns=self.columns, use_threads=False)
                else:
                    table = _project(schema, self.columns).empty_table()
            except (OSError, pa.ArrowException) as exc:
                raise DataError(f"cannot read row groups {groups}: {exc}", path=path) from exc
        return ReadResult(finish(path, table, offset, start, stop, self.tensors))


def _parquet_file(path: str, f: Any) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(f)
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"not a readable Parquet file: {exc}", path=path) from exc


def _project(schema: pa.Schema, columns: list[str] | None) -> pa.Schema:
    return schema if columns is None else pa.schema([schema.field(c) for c in columns])
