"""Data sources: what the master plans from and what readers read (DESIGN.md, part 'sources').

Every source speaks the protocol in :mod:`shmloader.sources.base`; see docs/sources.md.
"""

from .arrow import ArrowSource
from .base import BaseSource, ReadResult, Shard, SkippedRecord, Source
from .columns import (
    BatchBuilder,
    as_tensor_column,
    column_to_numpy,
    columns_to_batch,
    infer_schema,
    records_to_batch,
    tensor_type,
)
from .csv import CSVSource
from .factory import source_for_paths
from .jsonl import JSONLSource
from .parquet import ParquetSource
from .records import RecordFileSource
from .webdataset import WebDatasetSource

__all__ = [
    "ArrowSource",
    "BaseSource",
    "BatchBuilder",
    "CSVSource",
    "JSONLSource",
    "ParquetSource",
    "ReadResult",
    "RecordFileSource",
    "Shard",
    "SkippedRecord",
    "Source",
    "WebDatasetSource",
    "as_tensor_column",
    "column_to_numpy",
    "columns_to_batch",
    "infer_schema",
    "records_to_batch",
    "source_for_paths",
    "tensor_type",
]
