"""A folder of files as a source, one record per file: an image folder (``train/<class>/*.jpg``)
read as it is, without converting it to record files first.

**Listing.** The paths (a glob, a folder, a file or a list of them) are listed once, when the
source is made, by the same rules as every source's paths (``_fs.expand_paths``): a folder
stands for every file under it at any depth, names starting with ``.`` or ``_`` left out;
local paths become absolute; the list is sorted and each file is in it once. So every process
and every run over the same files has the same files in the same order, and the listing
travels to the readers inside the pickled source rather than being made again in each. It is
kept as one bytes string of names (relative to the files' common folder, ``root``) plus an
array of where each name ends: for ImageNet's 1.28 million training files, 50 MB in each
reader, where a list of path strings would be 140 MB of Python objects (and ten times as long
to pickle and unpickle).

**One shard, spread.** A task is a range of records of one shard. Were records the files in
listing order, a task would hold the files of one folder, one class, and the sampler shuffles
rows only across a window of ``shuffle_window`` tasks: each batch would hold a handful of
classes. So record ``i`` is file ``i * step mod n`` of the ``n`` listed, ``step`` coprime with
``n`` and near ``n / 1.618`` (the golden ratio): any run of consecutive records, whatever its
length, lands evenly spread over the whole listing (a Kronecker sequence), so every task is a
sample across all the folders, of every class in its share. Nothing is stored for it.

The source is one shard of ``n`` records, and the dataset cuts it into tasks as it cuts any
source: sized from the data (``master/task_size.py``), to which this source says the bytes of
its files (:meth:`FileSource.shard_bytes`, from the mean size of 32 files spread over the
listing), so a task of 12 KB images holds about 2,700 of them and one of 150 KB about 220, and
a small ``shm_budget`` makes them smaller. The shard's path is
``<root>/files-<n>.<digest>``, the digest being that of the whole listing. It is no file: the
dataset's check of files changed under it passes over it, and this source opens and names the
files themselves. A state saved by ``state_dict()`` names the shard (``checkpoint.identity``),
so a state saved over other files (one added, removed or renamed since) is refused as a state
of another dataset, rather than resumed at positions that would now stand for other files.

**Records.** Without ``decode`` a batch has two columns: ``path`` (string: the file as
listed, an absolute local path or a URI) and ``data`` (binary: its bytes). ``decode(data,
path) -> mapping`` turns them into the record's columns (decoded, located and skipped as in
every source: :mod:`shmloader.sources._decoding`).

**Errors** name the file. A file that cannot be read (deleted, or moved, since the listing;
unreadable) raises under either ``on_error``: it is the dataset that changed, not a record that
is bad, and skipping would shrink the epoch without a word. A decode that raises, or returns
what does not fit the schema, raises naming the file, or under ``on_error="skip"`` is a
:class:`~shmloader.sources.skipped.SkippedRecord` whose ``path`` is the file and whose
``index`` is the record's number in its shard (what a task counts).
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from .._fs import expand_paths, resolve, serve_roots
from .._keywords import suggest_keywords
from ..errors import ConfigError, DataError, OnError
from ._decoding import At, decode_to_batch
from ._inferred import Candidate, InferringSource
from .base import (
    ReadResult,
    Shard,
    check_callable,
    check_on_error,
    check_range,
    check_schema,
)
from .columns import BatchBuilder, infer_schema
from .skipped import SkippedRecord

FileDecode = Callable[[bytes, str], Mapping[str, Any]]
"""``decode(data, path)``: a file's bytes and its path (as listed) -> the record's columns."""

RAW_SCHEMA = pa.schema([pa.field("path", pa.string()), pa.field("data", pa.binary())])

SIZE_SAMPLE = 32  # files whose sizes give the mean file size
GOLDEN = (5**0.5 - 1) / 2  # 1 / the golden ratio: the step that spreads records most evenly

_GONE = (
    "the file is gone: it was listed when the source was made, and was deleted or moved "
    "since (a FileSource lists its files once). Put it back, or make the source again to "
    "plan without it"
)


class FileSource(InferringSource):
    """A folder of files, one record per file: ``FileSource("train/*/*.jpg", decode=decode)``.

    The files are listed once, here, and sorted, and planned as one shard whose records are
    spread over the listing, so that every task is a sample across all the folders
    (docs/sources.md, "FileSource"). ``root`` is the files' common folder, ``num_files``
    how many there are.

    Args:
        paths: A glob, a folder (every file under it, names starting with ``.`` or ``_``
            left out), a file, or a list of them; a pattern that matches nothing is a
            :class:`~shmloader.ConfigError`.
        decode: ``decode(data: bytes, path: str) -> mapping``: a file's columns (a label
            from its folder: ``os.path.basename(os.path.dirname(path))``). ``None``: a
            record is ``{"path": str, "data": bytes}``.
        on_error: ``"skip"`` leaves out files whose decode fails or does not fit the schema
            (reported as skipped); a file that cannot be read raises a
            :class:`~shmloader.DataError` either way.
        schema: Schema of ``decode``'s output (``None``: inferred from a sample of the files).
        filesystem: A ``pyarrow.fs.FileSystem`` to read the paths through.
    """

    _LOCAL = ("_builder", "_store")

    @suggest_keywords()
    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        decode: FileDecode | None = None,
        on_error: OnError = "raise",
        schema: pa.Schema | None = None,
        filesystem: pafs.FileSystem | None = None,
    ) -> None:
        super().__init__()
        given = self._given(paths, filesystem)
        check_callable("decode", decode)
        check_schema(schema)
        if schema is not None and decode is None:
            raise ConfigError("schema= needs decode (without it the columns are path and data)")
        if schema is not None:
            BatchBuilder(schema)  # unsupported column types fail here, not in a reader
        self.decode = decode
        self.on_error = check_on_error(on_error)
        self._given_schema = schema if decode is not None else RAW_SCHEMA
        files = expand_paths(given, directories=True)
        if not files:
            raise ConfigError("no paths given")
        self.root = _common_folder(files)
        if self.filesystem is not None:  # the root is read through it, here and in readers
            serve_roots(self.filesystem, [self.root + "/"])
            self._filesystem_roots.append(self.root + "/")
        self._init_local()
        cut = len(self.root) + 1
        self._names, self._ends = _packed([f[cut:] for f in files])
        self.num_files = len(files)
        self._step = _spreading_step(self.num_files)
        digest = hashlib.blake2b(self.root.encode("utf-8", "surrogateescape"), digest_size=4)
        digest.update(b"\0" + self._names)
        self._shard_path = f"{self.root}/files-{self.num_files}.{digest.hexdigest()}"

    def _init_local(self) -> None:
        self._builder: BatchBuilder | None = None
        # The files' filesystem and the root's path in it, resolved once per process: an
        # object store's client is made once, not per file (None: not yet).
        self._store: tuple[pafs.FileSystem, str] | None = None

    def __repr__(self) -> str:
        return (
            f"FileSource({self.num_files} files under {self.root or '/'}, "
            f"on_error={self.on_error!r})"
        )

    # -- the listing ----------------------------------------------------------------------
    def _file(self, index: int) -> str:
        """File ``index`` of the sorted listing, as listed (absolute local path or URI)."""
        start, stop = int(self._ends[index]), int(self._ends[index + 1])
        return f"{self.root}/{self._names[start : stop - 1].decode('utf-8', 'surrogateescape')}"

    def _files_of(self, start: int, stop: int) -> list[str]:
        """The files of records ``[start, stop)``: record ``i`` is file ``i * step mod n``."""
        n, step = self.num_files, self._step
        return [self._file(i * step % n) for i in range(start, stop)]

    def _in_store(self, path: str) -> tuple[pafs.FileSystem, str]:
        """The filesystem of the files and ``path``'s path in it."""
        if self._store is None:
            fs, inner = resolve(self.root + "/")
            self._store = fs, inner.rstrip("/")
        fs, inner_root = self._store
        return fs, inner_root + path[len(self.root) :]

    def _mean_size(self) -> float:
        """The mean size of up to :data:`SIZE_SAMPLE` files spread evenly over the listing."""
        picks = sorted({i * self.num_files // SIZE_SAMPLE for i in range(SIZE_SAMPLE)})
        located = [self._in_store(self._file(i)) for i in picks]
        infos = located[0][0].get_file_info([inner for _, inner in located])
        return sum(info.size or 0 for info in infos) / len(infos)

    def _contents(self, path: str) -> bytes:
        """The bytes of ``path``, a file of the listing; a DataError naming it if it cannot be
        read (not retried when the file is gone or refused: reading again would not help)."""
        fs, inner = self._in_store(path)
        try:
            with fs.open_input_stream(inner) as stream:
                data: bytes = stream.read()
                return data
        except FileNotFoundError:
            raise DataError(_GONE, path=path) from None
        except PermissionError:
            raise DataError(
                "cannot read it: permission denied; give the job read access to it, or "
                "leave it out of the source's paths",
                path=path,
            ) from None
        except (OSError, pa.ArrowException) as exc:
            raise DataError(f"cannot read it: {exc}", path=path) from exc

    # -- plan ---------------------------------------------------------------------------------
    def _make_plan(self) -> list[Shard]:
        return [Shard(self._shard_path, self.num_files)]

    def shard_bytes(self) -> dict[str, int]:
        """The bytes of the files (:class:`~shmloader.sources.base.SizedShards`), from the
        mean size of up to :data:`SIZE_SAMPLE` of them, so that tasks are sized from the
        data: one request per file sampled, not per file."""
        return {self._shard_path: round(self._mean_size() * self.num_files)}

    def check_known(self, path: str) -> None:
        if path != self._shard_path:
            raise ConfigError(f"{path} is not this source's shard ({self._shard_path})")

    # -- schema -------------------------------------------------------------------------------
    def _candidates(self, path: str, start: int, stop: int) -> Iterator[Candidate]:
        """Files ``[start, stop)`` in record order, each named as its own record 0."""
        for file in self._files_of(start, stop):
            yield file, At(0, 0), file

    def _schema_of(self, path: str, item: Any) -> pa.Schema:
        assert self.decode is not None  # the schema without decode is RAW_SCHEMA
        return infer_schema(self.decode(self._contents(path), path))

    # -- records ------------------------------------------------------------------------------
    def read_result(self, shard: Shard, start: int, stop: int) -> ReadResult:
        # The planned count, not the shard's: a reader makes its Shard from the task.
        self.check_known(shard.path)
        check_range(Shard(shard.path, self.num_files), start, stop)
        return self._read(shard, start, stop)

    def _read(self, shard: Shard, start: int, stop: int) -> ReadResult:
        paths = self._files_of(start, stop)
        data = [self._contents(path) for path in paths]
        if self.decode is None:
            columns = {"path": paths, "data": data}
            return ReadResult(self.builder().from_columns(columns, len(paths)))
        decode = self.decode
        skipped: list[SkippedRecord] = []
        try:
            content = decode_to_batch(
                self.builder(),
                shard.path,
                list(zip(data, paths, strict=True)),
                [At(start + i, 0) for i in range(len(paths))],
                parse=None,
                decode=lambda item: decode(*item),
                on_error=self.on_error,
                skipped=skipped,
                fixed=True,
            )
        except DataError as exc:
            if exc.index is None:
                raise
            # Named by its file: a record's number in a shard says nothing to a user.
            raise type(exc)(
                exc.reason, path=paths[exc.index - start], fix=exc.fix
            ) from exc.__cause__
        named = [SkippedRecord(paths[s.index - start], s.index, None, s.error) for s in skipped]
        return ReadResult(content, tuple(sorted(named, key=lambda s: s.index)))


def _common_folder(files: Sequence[str]) -> str:
    """The folder every one of ``files`` (sorted) is under, without a trailing ``/``: each
    file is ``root + "/" + its name``. ConfigError for files on several filesystems or
    buckets, which have none."""
    # Characters, then cut at a "/": commonpath would make "s3://b/x" "s3:/b/x".
    prefix = os.path.commonprefix([files[0], files[-1]])  # noqa: RUF071
    cut = prefix.rfind("/")
    root = prefix[: max(cut, 0)]
    if cut < 0 or ("://" in files[0] and not root.partition("://")[2]):
        raise ConfigError(
            f"the files are on more than one filesystem or bucket ({files[0]}, ..., "
            f"{files[-1]}): give one FileSource the files of one"
        )
    return root


def _packed(names: list[str]) -> tuple[bytes, np.ndarray]:
    """``names`` as one bytes string, each ended by a NUL (no path holds one), and the
    offset after each name's NUL (``n + 1`` values from 0)."""
    encoded = [name.encode("utf-8", "surrogateescape") + b"\0" for name in names]
    ends = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(e) for e in encoded], out=ends[1:])
    return b"".join(encoded), ends


def _spreading_step(n: int) -> int:
    """The step of records over ``n`` files: coprime with ``n`` (so ``i * step mod n`` visits
    every file once) and the nearest such to ``n / 1.618``, whose multiples spread most evenly."""
    step = max(1, round(n * GOLDEN))
    while math.gcd(step, n) != 1:  # ends by n - 1 at the latest, coprime with n
        step += 1
    return step


__all__ = ["FileDecode", "FileSource"]
