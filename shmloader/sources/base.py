"""The one protocol every data source speaks, used by the master and by reader processes.

A source is a *description* of a dataset that can be sent to another process (it is pickled
into spawned readers, so keep it small: paths and settings, never open files or data).
``plan()`` says what exists; ``read()`` turns a record range into one Arrow RecordBatch.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar, cast, runtime_checkable

import pyarrow as pa
import pyarrow.fs as pafs

from .._fs import give_filesystem, given_roots, serve_roots
from ..errors import ON_ERROR_CHOICES, ConfigError, DataError, OnError
from .columns import FixedColumns
from .skipped import SkippedRecord as SkippedRecord  # part of the protocol: named here too
from .streamed import StreamedColumns


@dataclass(frozen=True)
class Shard:
    """One unit of a plan: a file (or a fixed part of one) holding ``num_records`` records.

    Tasks never span two shards. ``path`` is what the source's ``read`` expects back.
    """

    path: str
    num_records: int


class ReadResult:
    """Records of a range as one batch, plus the ones skipped (in record order).

    A source may hand over what the batch is built from instead: fixed-width numpy columns
    (:class:`~shmloader.sources.columns.FixedColumns`), or chunks of them decoded as they
    are taken (:class:`~shmloader.sources.streamed.StreamedColumns`, which also knows the
    skipped records). ``batch`` builds the batch on first use; a reader writes
    :attr:`content` into shared memory without building it (one copy fewer per byte).
    """

    __slots__ = ("_content", "_skipped", "_stream")

    def __init__(
        self,
        batch: pa.RecordBatch | FixedColumns | StreamedColumns,
        skipped: tuple[SkippedRecord, ...] = (),
    ) -> None:
        if not isinstance(batch, (pa.RecordBatch, StreamedColumns)):
            _refuse_content(batch)
        self._content = batch
        self._stream = batch if isinstance(batch, StreamedColumns) else None
        if self._stream is not None and skipped:
            raise ValueError("a StreamedColumns result finds its skipped records itself")
        self._skipped = tuple(skipped)

    @property
    def skipped(self) -> tuple[SkippedRecord, ...]:
        if self._stream is not None:
            if not self._stream.done:
                self.batch  # noqa: B018 - decodes the rest, which finds the skipped records
            return self._stream.skipped
        return self._skipped

    @property
    def batch(self) -> pa.RecordBatch:
        if not isinstance(self._content, pa.RecordBatch):
            self._content = self._content.to_batch()
        return self._content

    @property
    def content(self) -> pa.RecordBatch | FixedColumns | StreamedColumns:
        """The records as the source made them: the batch, or what it is built from."""
        return self._content

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReadResult):
            return NotImplemented
        return self.batch.equals(other.batch) and self.skipped == other.skipped

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ReadResult({self.batch.num_rows} rows, skipped={self.skipped!r})"


def _refuse_content(batch: object) -> None:
    """TypeError unless ``batch`` is FixedColumns: a source of the user's own handing a Table
    or a dict failed later, in the reader, with an AttributeError about ``builder``."""
    if not isinstance(batch, FixedColumns):
        raise TypeError(
            f"ReadResult takes one pyarrow.RecordBatch, got {type(batch).__module__}."
            f"{type(batch).__qualname__}: make one RecordBatch of the rows (e.g. "
            "pa.RecordBatch.from_pydict(columns))"
        )


@runtime_checkable
class Source(Protocol):
    """What the master (``plan``) and the readers (``read``/``read_result``) need."""

    def plan(self) -> list[Shard]:
        """All shards with exact record counts, in a stable order; no full decode."""
        ...

    def read(self, shard: Shard, start: int, stop: int) -> pa.RecordBatch:
        """Records ``[start, stop)`` of ``shard`` as one batch (skipped ones left out)."""
        ...

    def read_result(self, shard: Shard, start: int, stop: int) -> ReadResult:
        """Like ``read`` but also says which records were skipped, for stats."""
        ...


@runtime_checkable
class SizedShards(Protocol):
    """A source whose shards are not files, which says how many bytes each one reads, so that
    tasks are sized from the data (``master/task_size.py``) as they are for shards that are
    files (``FileSource``: a shard is a listing of files)."""

    def shard_bytes(self) -> dict[str, int]:
        """Shard path -> the bytes a read of all its records reads (an estimate will do)."""
        ...


_S = TypeVar("_S", bound="BaseSource")


@runtime_checkable
class VaryingLists(Protocol):
    """A source that decides by itself whether a 1-D column of numbers is one tensor per
    batch (every row the same length) or a variable-length list, and can be told that such
    columns are lists whatever lengths it sees: what ``SharedTaskDataset(ragged=...)`` asks
    of its source, since the user who chooses how ragged columns are batched expects them."""

    def with_varying_lists(self) -> VaryingLists:
        """A copy of the source whose 1-D columns of numbers are all variable-length."""
        ...


def with_varying_lists(source: Source) -> Source:
    """``source`` with its 1-D columns of numbers all variable-length (:class:`VaryingLists`);
    a source that cannot be told so, as it is."""
    if isinstance(source, VaryingLists):
        return cast(Source, source.with_varying_lists())
    return source


class BaseSource:
    """Shared plumbing: plan caching, range checks and ``read`` in terms of ``read_result``.

    Per-process caches (open files, builders) are named in ``_LOCAL``: they are left out when
    the source is pickled into a reader and rebuilt there by ``_init_local``.
    """

    _LOCAL: tuple[str, ...] = ()
    #: Every 1-D column of numbers a variable-length list, whatever lengths the data shows
    #: (:meth:`with_varying_lists`); otherwise one whose rows all have one length is a tensor.
    lists_vary = False

    def with_varying_lists(self: _S) -> _S:
        """A copy of this source whose 1-D columns of numbers are variable-length lists
        (see :class:`VaryingLists`); the copy decides its schema anew."""
        varying = copy.copy(self)  # through __getstate__: per-process caches are left out
        varying.lists_vary = True
        varying.forget_decided_types()
        return varying

    def forget_decided_types(self) -> None:
        """Drop what was inferred from the data about column types (a schema not given), to
        be decided again under :attr:`lists_vary`."""

    def __init__(self) -> None:
        self._plan: list[Shard] | None = None
        self.filesystem: pafs.FileSystem | None = None
        self._filesystem_roots: list[str] = []

    def _given(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        filesystem: pafs.FileSystem | None,
    ) -> str | os.PathLike[str] | Sequence[str | os.PathLike[str]]:
        """``paths`` to expand: as given, or with ``filesystem`` (a ``pyarrow.fs`` filesystem:
        an object store with its own endpoint and credentials) their URIs, served from it in
        this process and in every reader the source is pickled into."""
        if filesystem is None:
            return paths
        if not isinstance(filesystem, pafs.FileSystem):
            raise ConfigError(
                f"filesystem must be a pyarrow.fs.FileSystem (S3FileSystem(endpoint_override="
                f"...), ...), got {type(filesystem).__name__}"
            )
        uris = give_filesystem(filesystem, paths)
        self.filesystem = filesystem
        self._filesystem_roots = given_roots(filesystem)
        return uris

    def _init_local(self) -> None:
        """Create the per-process caches named in ``_LOCAL``."""

    def check_known(self, path: str) -> None:
        """ConfigError unless ``path`` is one of this source's files: a task names a path,
        and a reader must never open one that is not part of the planned dataset."""
        known = self.__dict__.get("_known_paths")
        if known is None:
            known = self._known_paths = frozenset(getattr(self, "paths", ()))
        if path not in known:
            raise ConfigError(f"{path} is not one of this source's files")

    def plan(self) -> list[Shard]:
        if self._plan is None:
            self._plan = list(self._make_plan())
        return list(self._plan)

    def _make_plan(self) -> Sequence[Shard]:
        raise NotImplementedError

    def read(self, shard: Shard, start: int, stop: int) -> pa.RecordBatch:
        return self.read_result(shard, start, stop).batch

    def read_result(self, shard: Shard, start: int, stop: int) -> ReadResult:
        check_range(shard, start, stop)
        return self._read(shard, start, stop)

    def _read(self, shard: Shard, start: int, stop: int) -> ReadResult:
        raise NotImplementedError

    def __getstate__(self) -> dict[str, object]:
        # The plan travels: it is cheap to send and saves readers re-listing an object store.
        state = dict(self.__dict__)
        for key in self._LOCAL:
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        filesystem = getattr(self, "filesystem", None)
        if filesystem is not None:  # its files are served from it here too
            serve_roots(filesystem, self._filesystem_roots)
        self._init_local()


def check_range(shard: Shard, start: int, stop: int) -> None:
    if not 0 <= start <= stop <= shard.num_records:
        raise ConfigError(
            f"{shard.path}: record range [{start}, {stop}) is outside the shard's "
            f"{shard.num_records} records"
        )


def check_held(path: str, start: int, stop: int, held: int) -> None:
    """DataError unless the file still holds records ``[start, stop)``: ``held`` is what it
    holds now, and a task's range comes from the plan, made before the file shrank (rewritten
    or truncated while the dataset ran). Without this a read returns fewer rows, or fails
    with an IndexError that names nothing."""
    if stop > held:
        raise DataError(
            f"records [{start}, {stop}) were planned, but the file holds {held} now: it "
            "changed (was rewritten or truncated) after the dataset planned it",
            path=path,
        )


def check_callable(name: str, fn: object) -> None:
    """ConfigError unless ``fn`` (the ``name=`` given) is None or callable: said where the
    source is made, not in a reader."""
    if fn is not None and not callable(fn):
        raise ConfigError(f"{name} must be callable, got {type(fn).__name__}")


def check_schema(schema: object) -> None:
    """ConfigError unless ``schema`` is None or a ``pyarrow.Schema``."""
    if schema is not None and not isinstance(schema, pa.Schema):
        raise ConfigError(f"schema must be a pyarrow.Schema, got {type(schema).__name__}")


def check_on_error(on_error: str) -> OnError:
    if on_error not in ON_ERROR_CHOICES:
        raise ConfigError(f"on_error must be one of {ON_ERROR_CHOICES}, got {on_error!r}")
    return cast(OnError, on_error)
