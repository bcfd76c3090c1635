"""TFRecord files: byte-compatible with TensorFlow, read by range through a sidecar index.

Framing (all little-endian)::

    uint64 length | uint32 masked_crc32c(length bytes) | payload | uint32 masked_crc32c(payload)

``compression`` is ``None``, ``"gzip"`` or ``"zlib"`` as TensorFlow's TFRecordOptions write
them (the whole stream compressed, not each record); readers also accept ``"auto"`` (the
detection rule is in :mod:`shmloader.formats._compression` and docs/formats.md).

Record offsets come from a sidecar index (:mod:`shmloader.formats.index`, kind
``"tfrecord"``, or ``"tfrecord-gzip"`` / ``"tfrecord-zlib"`` whose offsets are positions in
the *uncompressed* stream). A range of an uncompressed file is read with one seek and one
read per 2 MiB block; a range of a compressed file has to be inflated from the file's start.
"""

from __future__ import annotations

import logging
import os
from array import array
from collections.abc import Iterable, Iterator
from types import TracebackType

import numpy as np

from ..errors import ON_ERROR_CHOICES, ConfigError, CorruptRecordError, OnError
from . import _framing, _resync
from ._compression import Progress, Sink, check_compression, open_source, resolve_compression
from ._framing import FRAME_OVERHEAD, U32, Bad, Run, decode_frames, encode_frame, frame_header
from ._mapped import MappedSource
from ._resync import LostRange, ResyncScan, read_lost
from .checksum import masked_crc32c
from .index import cached_index, is_temporary_name, save_offsets

__all__ = [
    "LostRange",
    "RecordFile",
    "RecordWriter",
    "ResyncScan",
    "decode_frames",
    "encode_frame",
    "index_kind",
    "read_records",
    "scan_offsets",
    "scan_resync",
    "write_records",
]

log = logging.getLogger(__name__)
_NO_LOST = np.zeros(0, dtype=np.uint64)

# The writer hands the file system this much at a time instead of four writes per record.
_WRITE_BUFFER = 1 << 20


def index_kind(compression: str | None) -> str:
    """The sidecar index kind for a TFRecord file with this compression."""
    return "tfrecord" if compression is None else f"tfrecord-{compression}"


class RecordWriter:
    """Writes TFRecord frames and, on :meth:`close`, the sidecar index of what it wrote.

    The index comes from the offsets tracked while writing (no re-scan) and is stamped with
    the file's size and mtime after the file is closed. If the ``with`` block raises, the
    records written so far are closed into a valid file but no index is written (it would
    describe a file the caller considers failed; one is built on first use if wanted).
    ``close`` flushes but does not fsync; see docs/formats.md.

    ``index``: ``None`` (the default) writes the index unless ``path`` is a temporary name
    (ends in ``.tmp``, ``.temp``, ``.part``, ``.partial`` or ``~``:
    :func:`~shmloader.formats.index.is_temporary_name`). Such a file is about to be renamed,
    and an index belongs to the path it was made for: written for ``x.tfrecord.tmp`` it would
    be left behind, orphaned, by the rename to ``x.tfrecord``, whose first read builds and
    caches the index under the final name instead (one scan). ``True`` always writes it,
    ``False`` never.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        compression: str | None = None,
        index: bool | None = None,
        index_dir: str | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.compression = check_compression(compression)
        self._index = not is_temporary_name(self.path) if index is None else bool(index)
        self._index_dir = index_dir
        self._sink: Sink | None = Sink(self.path, self.compression)
        self._buffer = bytearray()
        self._position = 0
        self._offsets = array("Q")

    @property
    def count(self) -> int:
        """Records written so far."""
        return len(self._offsets)

    def write(self, payload: bytes) -> None:
        """Append one record (any contiguous buffer); frames are buffered, so the file is
        complete only after :meth:`close`."""
        if self._sink is None:
            raise ConfigError(f"{self.path}: write() on a closed RecordWriter")
        view = memoryview(payload)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        length = view.nbytes
        buffer = self._buffer
        buffer += frame_header(length)
        buffer += view
        buffer += U32.pack(masked_crc32c(view))
        self._offsets.append(self._position)
        self._position += length + FRAME_OVERHEAD
        if len(buffer) >= _WRITE_BUFFER:
            self._flush()

    def _flush(self) -> None:
        if self._buffer and self._sink is not None:
            self._sink.write(self._buffer)
            self._buffer = bytearray()

    def close(self) -> None:
        """Flush, close and write the sidecar index (unless ``index=False``, or a temporary
        name with ``index=None``: see the class); a second call does nothing."""
        self._finish(write_index=self._index)

    def _finish(self, *, write_index: bool) -> None:
        sink = self._sink
        if sink is None:
            return
        try:
            self._flush()
        finally:
            self._sink = None
            sink.close()
        if write_index:
            offsets = np.empty(len(self._offsets) + 1, dtype=np.uint64)
            offsets[:-1] = np.frombuffer(self._offsets, dtype=np.uint64)
            offsets[-1] = self._position
            save_offsets(
                self.path, index_kind(self.compression), offsets, index_dir=self._index_dir
            )

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._finish(write_index=self._index and exc_type is None)


def write_records(
    path: str | os.PathLike[str],
    records: Iterable[bytes],
    *,
    compression: str | None = None,
    index: bool | None = None,
) -> int:
    """Write ``records`` as one TFRecord file (and its index); returns how many.

    An index is found by its data file's path (``x.tfrecord`` has ``x.tfrecord.shmidx``), so
    a file written under a temporary name and then renamed, the usual atomic write::

        write_records("x.tfrecord.tmp", records)
        os.rename("x.tfrecord.tmp", "x.tfrecord")

    gets no index from this call: ``index=None`` (the default) leaves out the index of a
    name ending in ``.tmp``, ``.temp``, ``.part``, ``.partial`` or ``~``, which the rename
    would leave behind under the old name. The first read of ``x.tfrecord`` builds its index
    (one scan of the file) and saves it next to it, under the final name. Other names get
    their index now; ``index=True`` writes it whatever the name, ``index=False`` never
    (see :class:`RecordWriter`).
    """
    with RecordWriter(path, compression=compression, index=index) as writer:
        for record in records:
            writer.write(record)
    return writer.count


def read_records(
    path: str | os.PathLike[str],
    start: int = 0,
    stop: int | None = None,
    *,
    compression: str | None = "auto",
    verify: bool = True,
) -> Iterator[bytes]:
    """Payloads of records ``[start, stop)``, checking both CRCs of each unless ``verify``
    is false (the length CRC is always checked: a wrong length derails every later record).

    The whole file (the default range) is streamed without touching any index. A partial
    range goes through :class:`RecordFile`, so it uses (and if needed builds and caches) the
    sidecar index; ``stop`` beyond the last record is then a ConfigError before any record.
    """
    p = os.fspath(path)
    _check_bounds(start, stop)
    if start == 0 and stop is None:
        resolved = resolve_compression(p, compression)
        with open_source(p, resolved) as source:
            for _, _, payloads in _framing.iter_chunks(
                source, p, verify=verify, want_payloads=True
            ):
                yield from payloads
        return
    rf = RecordFile(p, compression=compression)
    end = rf.num_records if stop is None else stop
    for _, _, payload in rf.read_range(start, end, verify=verify):
        if isinstance(payload, CorruptRecordError):  # on_error="raise" never yields one
            raise payload
        yield payload


def scan_offsets(
    path: str | os.PathLike[str],
    *,
    compression: str | None = "auto",
    verify: bool = False,
    progress: Progress | None = None,
) -> np.ndarray:
    """Offsets of every record plus the end (uint64, n + 1) by reading the whole file.

    This is how indexes are built. Length CRCs are always checked; ``verify`` also checks
    every payload CRC (``shmloader index --check``). ``progress`` is called with the number
    of file bytes consumed, as they are read.
    """
    p = os.fspath(path)
    resolved = resolve_compression(p, compression)
    parts: list[np.ndarray] = []
    with open_source(p, resolved, progress=progress) as source:
        for base, starts, _ in _framing.iter_chunks(source, p, verify=verify, want_payloads=False):
            parts.append(np.asarray(starts, dtype=np.uint64) + np.uint64(base))
        parts.append(np.array([source.position], dtype=np.uint64))
    return np.concatenate(parts)


def scan_resync(
    path: str | os.PathLike[str],
    *,
    compression: str | None = "auto",
    verify: bool = False,
    progress: Progress | None = None,
) -> ResyncScan:
    """:func:`scan_offsets` that steps over damaged framing instead of raising.

    A corrupt length field, or a file cut inside its last record, becomes one *lost* record:
    its number and byte range are in ``lost`` (with the error describing them), and scanning
    goes on at the next offset where a whole frame checks out (length and payload CRC). With
    ``verify``, records whose payload CRC fails are listed in ``bad`` (they keep their
    number). Damage in gzip/zlib data itself (it does not inflate) still raises: nothing after
    it can be reached. See docs/formats.md, "Damaged framing".
    """
    p = os.fspath(path)
    resolved = resolve_compression(p, compression)
    with open_source(p, resolved, progress=progress) as source:
        return _resync.scan_resync(source, p, verify=verify)


class RecordFile:
    """One TFRecord file with random access by record number.

    ``num_records`` and offsets come from the sidecar index, built by one scan and cached
    the first time they are needed (see :mod:`shmloader.formats.index` for where and how
    staleness is detected). The offsets are loaded once per object: if the file changes
    afterwards, reads raise IndexMismatchError instead of returning wrong records.

    ``resync=True`` (what ``on_error="skip"`` sources ask for): damaged framing met while
    the index is built is stepped over (:func:`scan_resync`), each damaged range keeping one
    record number listed in :attr:`lost`; reading that number yields its error like any
    corrupt record. With ``resync=False`` damaged framing raises when the index is built, as
    it always did, also when an index built with ``resync=True`` is found.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        compression: str | None = "auto",
        index_dir: str | None = None,
        resync: bool = False,
    ) -> None:
        self.path = os.fspath(path)
        self.compression = resolve_compression(self.path, compression)
        self.index_dir = index_dir
        self.resync = bool(resync)
        self._offsets: np.ndarray | None = None
        self._lost: np.ndarray = _NO_LOST

    def __repr__(self) -> str:
        return f"RecordFile({self.path!r}, compression={self.compression!r})"

    @property
    def kind(self) -> str:
        """The index kind (``"tfrecord"``, ``"tfrecord-gzip"``, ...): offsets in a compressed
        stream mean something else, so each compression gets its own sidecar."""
        return index_kind(self.compression)

    @property
    def offsets(self) -> np.ndarray:
        """uint64 offsets of every record plus the end (read-only, length n + 1)."""
        if self._offsets is None:
            entry = cached_index(self.path, self.kind, self._build, index_dir=self.index_dir)
            offsets, lost = entry.offsets, entry.lost
            if len(lost) and not self.resync:
                # Built by a reader that steps over damage; this one raises on it, as the
                # scan below does (naming file, record and offset), like any other build.
                offsets, lost = scan_offsets(self.path, compression=self.compression), _NO_LOST
            self._lost = lost
            self._offsets = offsets
        return self._offsets

    @property
    def lost(self) -> np.ndarray:
        """Record numbers that are damaged framing stepped over (only with ``resync``):
        reading one yields (or raises) an error naming its byte range; empty for a sound
        file. The first call loads or builds the index."""
        _ = self.offsets
        return self._lost

    def _build(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.resync:
            return scan_offsets(self.path, compression=self.compression), _NO_LOST
        found = scan_resync(self.path, compression=self.compression)
        for gone in found.lost:
            # Once per build, where it was found; readers report it again as a skipped
            # record in every epoch that reads it.
            log.warning("%s", gone.error)
        return found.offsets, np.array([g.record for g in found.lost], dtype=np.uint64)

    @property
    def num_records(self) -> int:
        """Records in the file; the first call loads or builds the index (one scan)."""
        return len(self.offsets) - 1

    def offset(self, i: int) -> int:
        """Byte offset of record ``i`` (``i == num_records`` gives the end of the data);
        for compressed files, the offset in the uncompressed stream."""
        n = self.num_records
        if not 0 <= i <= n:
            raise ConfigError(f"{self.path}: record {i} is out of range [0, {n}]")
        return int(self.offsets[i])

    def read_range(
        self, start: int, stop: int, *, on_error: OnError = "raise", verify: bool = True
    ) -> Iterator[tuple[int, int, bytes | CorruptRecordError]]:
        """``(record index, byte offset, payload)`` for records ``[start, stop)``.

        With ``on_error="skip"`` a corrupt record yields its CorruptRecordError in place of
        the payload and reading resumes at the next record's indexed offset; with
        ``"raise"`` it is raised. Either way a file that no longer matches its index raises
        IndexMismatchError. Argument errors are raised here, not on first iteration.
        """
        return self._iter_range(start, stop, self._skip_bad(start, stop, on_error), verify)

    def read_runs(
        self,
        start: int,
        stop: int,
        *,
        on_error: OnError = "raise",
        verify: bool = True,
        views: bool = False,
        mapped: bool = False,
    ) -> Iterator[Run | Bad]:
        """What :meth:`read_range` yields, a run of good records at a time (for bulk readers).

        A :class:`Run` holds consecutive good records (first index, byte offsets, payloads);
        a :class:`Bad` one skipped corrupt record (only with ``on_error="skip"``). With
        ``views=True`` the payloads are zero-copy ``memoryview`` slices of the blocks read
        (about 2 MiB each, kept alive while any of their views is) instead of ``bytes``.

        ``mapped=True``: an uncompressed local file is mapped instead of read (``_mapped.py``),
        one copy of every byte less; but a file cut shorter while it is read then kills the
        process with SIGBUS instead of raising, so only processes that can be restarted
        (readers) should ask for it.
        """
        skip_bad = self._skip_bad(start, stop, on_error)
        return self._iter_runs(start, stop, skip_bad, verify, views, mapped)

    def _skip_bad(self, start: int, stop: int | None, on_error: OnError) -> bool:
        """Check a range read's arguments; whether corrupt records are skipped."""
        if on_error not in ON_ERROR_CHOICES:
            raise ConfigError(f"on_error={on_error!r}; use one of {ON_ERROR_CHOICES}")
        _check_bounds(start, stop)
        n = self.num_records
        if stop is None or stop > n:
            raise ConfigError(f"{self.path}: range [{start}, {stop}) exceeds its {n} records")
        return on_error == "skip"

    def _iter_runs(
        self,
        start: int,
        stop: int,
        skip_bad: bool,
        verify: bool,
        views: bool = False,
        mapped: bool = False,
    ) -> Iterator[Run | Bad]:
        if start == stop:
            return
        offsets = self.offsets
        lost = self._lost
        lost = lost[(lost >= start) & (lost < stop)].tolist() if len(lost) else []
        at, end = int(offsets[start]), int(offsets[stop])
        mapping = MappedSource.open(self.path, at, end) if mapped and not self.compression else None
        with mapping or open_source(self.path, self.compression, at) as source:
            i = start
            for k in [*lost, stop]:
                yield from _framing.iter_indexed_runs(
                    source,
                    self.path,
                    offsets,
                    i,
                    k,
                    skip_bad=skip_bad,
                    verify=verify,
                    views=views,
                )
                if k == stop:
                    break
                at, end = int(offsets[k]), int(offsets[k + 1])
                error = read_lost(source, self.path, k, at, end, at_end=k + 1 == len(offsets) - 1)
                if not skip_bad:
                    raise error
                yield Bad(k, at, error)
                i = k + 1

    def _iter_range(
        self, start: int, stop: int, skip_bad: bool, verify: bool
    ) -> Iterator[tuple[int, int, bytes | CorruptRecordError]]:
        for item in self._iter_runs(start, stop, skip_bad, verify):
            if isinstance(item, Bad):
                yield item
            else:
                first = item.first
                yield from zip(
                    range(first, first + len(item.payloads)),
                    item.offsets,
                    item.payloads,
                    strict=True,
                )


def _check_bounds(start: int, stop: int | None) -> None:
    if start < 0 or (stop is not None and stop < start):
        raise ConfigError(f"invalid record range [{start}, {stop}): need 0 <= start <= stop")
