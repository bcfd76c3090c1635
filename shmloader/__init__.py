"""shmloader: elastic, zero-copy data loading for PyTorch.

A master splits a dataset into tasks and leases them over gRPC; reader processes decode
records into Arrow buffers in shared memory; :class:`SharedTaskDataset` indexes those buffers
zero-copy so DataLoader workers shuffle and collate without pickling.

Names are imported on first use, so ``import shmloader`` stays cheap for the CLI and for
spawned reader processes that never touch torch.
"""

from __future__ import annotations

import importlib
from typing import Any

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
    # sources
    "Shard": "shmloader.sources.base",
    "Source": "shmloader.sources.base",
    "ReadResult": "shmloader.sources.base",
    "SkippedRecord": "shmloader.sources.base",
    "RecordFileSource": "shmloader.sources.records",
    "ParquetSource": "shmloader.sources.parquet",
    "ArrowSource": "shmloader.sources.arrow",
    "CSVSource": "shmloader.sources.csv",
    "JSONLSource": "shmloader.sources.jsonl",
    "WebDatasetSource": "shmloader.sources.webdataset",
    "source_for_paths": "shmloader.sources.factory",
    # master
    "Master": "shmloader.master.server",
    "MasterClient": "shmloader.master.client",
    "Dispatcher": "shmloader.master.dispatcher",
    "DispatcherConfig": "shmloader.master.progress",
    "Journal": "shmloader.master.journal",
    "Progress": "shmloader.master.progress",
    # shared memory
    "SegmentStore": "shmloader.shm.store",
    "parse_size": "shmloader.shm.sizes",
    # dataset
    "SharedTaskDataset": "shmloader.dataset.dataset",
    "DataLoader": "shmloader.dataset.loader",
    "merge_states": "shmloader.dataset.state",
    "TaskSampler": "shmloader.dataset.sampler",
    "TaskBatchSampler": "shmloader.dataset.sampler",
    "Stats": "shmloader.stats.stats",
    # augmentation
    "task_rng": "shmloader.augment",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'shmloader' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
