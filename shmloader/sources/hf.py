"""A Hugging Face ``datasets.Dataset`` object as the files an :class:`ArrowSource` reads.

Readers are other processes: they read files, never a Python object. A dataset loaded from
disk or the hub is already Arrow files (its ``cache_files``), memory-mapped: when those files
hold exactly its rows and columns, in order, they are read as they are, with no copy. Any
other dataset (built in memory, or shuffled, selected or filtered: an indices mapping over
its files; or with columns renamed or cast, which ``datasets`` replays in memory) is written
once into one Arrow IPC file in a cache folder, named by the dataset's fingerprint, and read
from there; the next run with the same dataset finds it.

The ``datasets`` package is not imported here: the object is only asked for what every
``datasets.Dataset`` has (``cache_files``, ``column_names``, ``features``, ``_fingerprint``,
``with_format``).
"""

from __future__ import annotations

import os
from typing import Any, Protocol, TypeGuard, runtime_checkable

import pyarrow as pa
import pyarrow.ipc

from ..errors import ConfigError
from ..formats.index import user_cache_dir

CACHE_ENV = "SHMLOADER_DATASETS_DIR"


@runtime_checkable
class HFDataset(Protocol):
    """What shmloader asks of a ``datasets.Dataset`` (for type hints; the package is not
    needed to name it)."""

    @property
    def cache_files(self) -> list[dict[str, str]]: ...

    @property
    def column_names(self) -> list[str]: ...

    def __len__(self) -> int: ...


WRITE_ROWS = 65_536  # rows per record batch written into the cache file


def is_hf_dataset(value: object) -> TypeGuard[HFDataset]:
    """Whether ``value`` is a ``datasets.Dataset`` (not a ``DatasetDict``, nor an iterable
    dataset, which have no files to lease ranges of)."""
    module = type(value).__module__ or ""
    return module.split(".")[0] == "datasets" and type(value).__name__ == "Dataset"


def refuse_other_hf(value: Any) -> None:
    """A ConfigError that says what to give instead, for a DatasetDict or IterableDataset."""
    module = type(value).__module__ or ""
    if module.split(".")[0] != "datasets":
        return
    name = type(value).__name__
    if name == "DatasetDict":
        raise ConfigError(
            f"a DatasetDict holds several splits ({', '.join(value)}); give one split, "
            "e.g. dataset['train']"
        )
    if name in ("IterableDataset", "IterableDatasetDict"):
        raise ConfigError(
            f"a datasets.{name} streams records and has no files to lease ranges of; load it "
            "as a datasets.Dataset (load_dataset(..., streaming=False)) or save it to disk"
        )


def hf_dataset_files(dataset: Any, cache_dir: str | None = None) -> list[str]:
    """The Arrow files that hold ``dataset``'s rows and columns, in order: its own, or one
    written for it into ``cache_dir`` (else ``$SHMLOADER_DATASETS_DIR``, else
    ``$XDG_CACHE_HOME/shmloader/datasets``)."""
    own = [entry["filename"] for entry in dataset.cache_files]
    if own and _files_are_the_dataset(dataset, own):
        return own
    folder = cache_dir or os.environ.get(CACHE_ENV) or os.path.join(user_cache_dir(), "datasets")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"dataset-{dataset._fingerprint}.arrow")
    if not os.path.exists(path):
        _write(dataset, path)
    return [path]


def _files_are_the_dataset(dataset: Any, files: list[str]) -> bool:
    """Whether ``files`` (IPC streams, as ``datasets`` writes) hold the dataset as it is: no
    indices mapping, as many rows, and its columns with the same types."""
    if getattr(dataset, "_indices", None) is not None:
        return False
    rows = 0
    schema = None
    for path in files:
        try:
            with pa.memory_map(path) as f:
                reader = pa.ipc.open_stream(f)
                schema = schema or reader.schema
                rows += sum(b.num_rows for b in reader)
        except (OSError, pa.ArrowInvalid):
            return False
    if rows != len(dataset) or schema is None:
        return False
    wanted = dataset.features.arrow_schema
    names = set(schema.names)
    return all(f.name in names and schema.field(f.name).type == f.type for f in wanted)


def _write(dataset: Any, path: str) -> None:
    """``dataset``'s rows, in order, as one IPC file (with a footer: counted without reading),
    written whole or not at all."""
    temp = f"{path}.{os.getpid()}.tmp"
    table_format = dataset.with_format("arrow")
    try:
        with pa.OSFile(temp, "wb") as sink:
            writer = None
            for batch in table_format.iter(batch_size=WRITE_ROWS):
                if writer is None:
                    writer = pa.ipc.new_file(sink, batch.schema)
                writer.write_table(batch)
            if writer is None:
                writer = pa.ipc.new_file(sink, dataset.features.arrow_schema)
            writer.close()
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise
