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
    # sources
    "Shard": "shmloader.sources.base",
    "Source": "shmloader.sources.base",
    "ReadResult": "shmloader.sources.base",
    "SkippedRecord": "shmloader.sources.base",
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
