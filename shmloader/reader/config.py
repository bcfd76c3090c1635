"""What a reader is started with: the master to lease from, the source, the store, the settings.

A value of its own, below the reader's loop (``process.py``) that runs on it and the code that
carries it across the trainer's pipe (``by_value.py``): the trainer builds one per reader, the
pool pickles it, and the reader unpickles it before anything else runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..master.credentials import Credentials
from ..sources.base import Source
from .unchanged import FileIdentity


@dataclass(frozen=True)
class ReaderConfig:
    """Everything a reader needs; pickled once to the new process (by_value.py)."""

    index: int
    master_address: str
    consumer: str
    source: Source
    store: Any  # shmloader.shm.store.StoreHandle
    allowed_paths: frozenset[str]
    lease_timeout: float
    # The trainer's token and TLS CA (master/credentials.py), as its own client uses them.
    credentials: Credentials = field(default_factory=Credentials)
    rank: int | None = None  # the consumer's (DDP), to register it again if the master forgot it
    idle_poll: float = 0.05
    lease_ahead: int = 4  # tasks asked for per lease call
    # (epoch, seq) consumed before a resume: announced empty, not read again
    skip_tasks: frozenset[tuple[int, int]] = frozenset()
    seed: int = 0  # the dataset's: with epoch and task, the seed of task_rng() (augment.py)
    # Each local file's identity when the dataset started: a file replaced since is refused.
    files: Mapping[str, FileIdentity] = field(default_factory=dict)
    # Decoded tasks kept in the store across epochs (SharedTaskDataset(cache=True)).
    cache: bool = False
