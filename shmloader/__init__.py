"""shmloader: elastic, zero-copy data loading for PyTorch.

A master splits a dataset into tasks and leases them over gRPC; reader processes decode
records into Arrow buffers in shared memory; :class:`SharedTaskDataset` indexes those buffers
zero-copy so DataLoader workers shuffle and collate without pickling.

Names are imported on first use, so ``import shmloader`` stays cheap for the CLI and for
spawned reader processes that never touch torch; type checkers and IDEs see them all, typed.
The top level holds what users build and catch (sources, the dataset and its loader, errors,
record-file helpers, ``Master`` and ``MasterClient`` for a standalone master, ``merge_states``);
the parts inside (the dispatcher, journal, segment store, samplers) are imported from their
modules.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    # errors
    "ShmloaderError": "shmloader.errors",
    "DataError": "shmloader.errors",
    "CorruptRecordError": "shmloader.errors",
    "TruncatedRecordError": "shmloader.errors",
    "IndexMismatchError": "shmloader.errors",
    "DecodeError": "shmloader.errors",
    "SchemaMismatchError": "shmloader.errors",
    "ConfigError": "shmloader.errors",
    "ShmSpaceError": "shmloader.errors",
    "MasterError": "shmloader.errors",
    "LeaseError": "shmloader.errors",
    "TaskQuarantinedError": "shmloader.errors",
    "StoreClosedError": "shmloader.errors",
    # record files and tf.train.Example
    "write_records": "shmloader.formats.tfrecord",
    "read_records": "shmloader.formats.tfrecord",
    "RecordWriter": "shmloader.formats.tfrecord",
    "RecordFile": "shmloader.formats.tfrecord",
    "payload_rows": "shmloader.formats.payloads",
    "FixedLenFeature": "shmloader.formats.example",
    "VarLenFeature": "shmloader.formats.example",
    "decode_example": "shmloader.formats.example",
    "encode_example": "shmloader.formats.example",
    "ExampleDecoder": "shmloader.formats.example",
    "ExampleBatchDecoder": "shmloader.formats.example",
    "write_file_shards": "shmloader.sources.file_shards",
    # sources
    "Shard": "shmloader.sources.base",
    "Source": "shmloader.sources.base",
    "ReadResult": "shmloader.sources.base",
    "SkippedRecord": "shmloader.sources.skipped",
    "RecordFileSource": "shmloader.sources.records",
    "ParquetSource": "shmloader.sources.parquet",
    "ArrowSource": "shmloader.sources.arrow",
    "CSVSource": "shmloader.sources.csv",
    "JSONLSource": "shmloader.sources.jsonl",
    "WebDatasetSource": "shmloader.sources.webdataset",
    "FileSource": "shmloader.sources.files",
    "source_for_paths": "shmloader.sources.factory",
    # master
    "Master": "shmloader.master.server",
    "MasterClient": "shmloader.master.client",
    "Progress": "shmloader.master.progress",
    # dataset
    "SharedTaskDataset": "shmloader.dataset.dataset",
    "DataLoader": "shmloader.dataset.loader",
    "merge_states": "shmloader.dataset.resume.checkpoint",
    "DCPState": "shmloader.dataset.resume.dcp",
    "Stats": "shmloader.stats.stats",
    # augmentation
    "task_rng": "shmloader.augment",
}

# The same names for type checkers and IDEs; at run time each loads on first use.
if TYPE_CHECKING:
    from shmloader.augment import task_rng
    from shmloader.dataset.dataset import SharedTaskDataset
    from shmloader.dataset.loader import DataLoader
    from shmloader.dataset.resume.checkpoint import merge_states
    from shmloader.dataset.resume.dcp import DCPState
    from shmloader.errors import (
        ConfigError,
        CorruptRecordError,
        DataError,
        DecodeError,
        IndexMismatchError,
        LeaseError,
        MasterError,
        SchemaMismatchError,
        ShmloaderError,
        ShmSpaceError,
        StoreClosedError,
        TaskQuarantinedError,
        TruncatedRecordError,
    )
    from shmloader.formats.example import (
        ExampleBatchDecoder,
        ExampleDecoder,
        FixedLenFeature,
        VarLenFeature,
        decode_example,
        encode_example,
    )
    from shmloader.formats.payloads import payload_rows
    from shmloader.formats.tfrecord import RecordFile, RecordWriter, read_records, write_records
    from shmloader.master.client import MasterClient
    from shmloader.master.progress import Progress
    from shmloader.master.server import Master
    from shmloader.sources.arrow import ArrowSource
    from shmloader.sources.base import ReadResult, Shard, Source
    from shmloader.sources.csv import CSVSource
    from shmloader.sources.factory import source_for_paths
    from shmloader.sources.file_shards import write_file_shards
    from shmloader.sources.files import FileSource
    from shmloader.sources.jsonl import JSONLSource
    from shmloader.sources.parquet import ParquetSource
    from shmloader.sources.records import RecordFileSource
    from shmloader.sources.skipped import SkippedRecord
    from shmloader.sources.webdataset import WebDatasetSource
    from shmloader.stats.stats import Stats

__all__ = [
    "ArrowSource",
    "CSVSource",
    "ConfigError",
    "CorruptRecordError",
    "DCPState",
    "DataError",
    "DataLoader",
    "DecodeError",
    "ExampleBatchDecoder",
    "ExampleDecoder",
    "FileSource",
    "FixedLenFeature",
    "IndexMismatchError",
    "JSONLSource",
    "LeaseError",
    "Master",
    "MasterClient",
    "MasterError",
    "ParquetSource",
    "Progress",
    "ReadResult",
    "RecordFile",
    "RecordFileSource",
    "RecordWriter",
    "SchemaMismatchError",
    "Shard",
    "SharedTaskDataset",
    "ShmSpaceError",
    "ShmloaderError",
    "SkippedRecord",
    "Source",
    "Stats",
    "StoreClosedError",
    "TaskQuarantinedError",
    "TruncatedRecordError",
    "VarLenFeature",
    "WebDatasetSource",
    "__version__",
    "decode_example",
    "encode_example",
    "merge_states",
    "payload_rows",
    "read_records",
    "source_for_paths",
    "task_rng",
    "write_file_shards",
    "write_records",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'shmloader' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
