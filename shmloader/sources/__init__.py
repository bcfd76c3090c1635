"""Data sources: what the master plans from and what readers read.

Every source speaks the protocol in :mod:`shmloader.sources.base`; see docs/sources.md.

Names are imported on first use: a reader process unpickles one source, and importing every
source's module (the CSV source pulls in ``pyarrow.compute``) cost each reader, and the
training process, about 0.1 s before its first batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:  # the names for type checkers (``as``: re-exported)
    from .arrow import ArrowSource as ArrowSource
    from .base import BaseSource as BaseSource
    from .base import ReadResult as ReadResult
    from .base import Shard as Shard
    from .base import Source as Source
    from .columns import BatchBuilder as BatchBuilder
    from .columns import FixedColumns as FixedColumns
    from .columns import as_tensor_column as as_tensor_column
    from .columns import column_to_numpy as column_to_numpy
    from .columns import columns_to_batch as columns_to_batch
    from .columns import infer_schema as infer_schema
    from .columns import records_to_batch as records_to_batch
    from .columns import tensor_type as tensor_type
    from .csv import CSVSource as CSVSource
    from .factory import source_for_paths as source_for_paths
    from .files import FileSource as FileSource
    from .jsonl import JSONLSource as JSONLSource
    from .parquet import ParquetSource as ParquetSource
    from .records import RecordFileSource as RecordFileSource
    from .skipped import SkippedRecord as SkippedRecord
    from .streamed import StreamedColumns as StreamedColumns
    from .webdataset import WebDatasetSource as WebDatasetSource

# public name -> submodule that defines it
_EXPORTS: dict[str, str] = {
    "ArrowSource": ".arrow",
    "BaseSource": ".base",
    "ReadResult": ".base",
    "Shard": ".base",
    "Source": ".base",
    "BatchBuilder": ".columns",
    "FixedColumns": ".columns",
    "as_tensor_column": ".columns",
    "column_to_numpy": ".columns",
    "columns_to_batch": ".columns",
    "infer_schema": ".columns",
    "records_to_batch": ".columns",
    "tensor_type": ".columns",
    "CSVSource": ".csv",
    "source_for_paths": ".factory",
    "FileSource": ".files",
    "JSONLSource": ".jsonl",
    "ParquetSource": ".parquet",
    "RecordFileSource": ".records",
    "SkippedRecord": ".skipped",
    "StreamedColumns": ".streamed",
    "WebDatasetSource": ".webdataset",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
