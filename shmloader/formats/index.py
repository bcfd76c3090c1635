"""Sidecar offset indexes: where each record of a data file starts, cached on disk.

Counting records or jumping to record ``i`` in a framed file otherwise means reading every
byte before it. An index stores ``n + 1`` uint64 offsets (the last is where the last record
ends), so a count is ``len - 1`` and the byte span of ``[start, stop)`` is two lookups.

The index is generic: ``kind`` names what the offsets mean (``"tfrecord"``, later JSONL line
starts or tar members), and different kinds for one data file live side by side.

Where it lives: next to the data file as ``<data path>.<kind>.shmidx`` when that directory
is local and writable; otherwise in a cache directory (``index_dir`` argument, else
``$SHMLOADER_INDEX_DIR``, else ``$XDG_CACHE_HOME/shmloader/index`` defaulting to
``~/.cache/shmloader/index``) under a name derived from a SHA-256 of the full path. Remote
data (``s3://`` ...) is never written to; a sidecar already stored next to it is still used.

File layout (little-endian)::

    magic   8 bytes  b"\\x89SHMIDX\\n"
    version u32      1
    kindlen u16      length of the kind string
    size    u64      data file size when indexed      } shmloader._fs.stamp
    mtime   i64      data file mtime_ns when indexed  }
    count   u64      number of records n
    kind    kindlen bytes (UTF-8)
    offsets (n + 1) x u64
    [version 2 only: nlost u64, then nlost x u64 record numbers, increasing]
    crc     u32      CRC32C of every byte before it

Version 2 adds the *lost* records: numbers whose byte range ``[offsets[k], offsets[k + 1])``
is framing damage that a scan stepped over (``on_error="skip"``; see docs/formats.md,
"Damaged framing"). Each such range keeps one record number, so every reader numbers the
records after it alike. An index with no lost records is written as version 1, byte for byte
what earlier versions wrote, so they keep reading it; an earlier version meeting a version 2
index treats it as damaged and rebuilds it (which fails on the damaged file, as it always did).

Staleness vs damage: an index whose size/mtime no longer match the data file is *stale*, an
expected event (the file was appended to or rewritten): :func:`load_offsets` returns ``None``
for it and :func:`cached_offsets` rebuilds it. An index that fails its own checks (magic,
version, kind, length, CRC, decreasing offsets) is *damaged*: :func:`load_offsets` raises
:class:`~shmloader.errors.IndexMismatchError`; :func:`cached_offsets` logs a warning, rebuilds
and replaces it, because the index is only a cache of facts the data file still holds.

Writes go to a temporary file in the target directory that is then renamed over the index,
so a concurrent reader sees either the old index or the new one, never half of one. Index
files are not fsync'ed: after a crash an index may be empty or torn, which its CRC detects,
and it is rebuilt.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import stat
import struct
import tempfile
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from .. import _fs
from ..errors import ConfigError, IndexMismatchError
from .checksum import crc32c

__all__ = [
    "INDEX_SUFFIX",
    "IndexEntry",
    "cached_index",
    "cached_offsets",
    "default_index_dir",
    "fallback_index_path",
    "find_index",
    "is_temporary_name",
    "load_offsets",
    "read_index",
    "save_offsets",
    "sidecar_path",
]

log = logging.getLogger(__name__)

INDEX_SUFFIX = ".shmidx"
_MAGIC = b"\x89SHMIDX\n"
_VERSION = 1
_VERSION_LOST = 2  # version 1 plus the lost records
_HEADER = struct.Struct("<8sIHQqQ")
_CRC = struct.Struct("<I")
_KIND_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_OFFSET_DTYPE = np.dtype("<u8")
_NO_LOST = np.zeros(0, dtype=_OFFSET_DTYPE)


class IndexEntry(NamedTuple):
    """A fresh index: where it is, its ``n + 1`` offsets and its lost record numbers
    (empty unless a scan stepped over damaged framing). Both arrays are read-only."""

    where: str
    offsets: np.ndarray
    lost: np.ndarray


def _check_kind(kind: str) -> None:
    if not _KIND_RE.match(kind):
        raise ConfigError(
            f"index kind {kind!r} is invalid: use 1-64 letters, digits, '_' or '-' "
            "(it becomes part of a file name)"
        )


def sidecar_path(path: str, kind: str) -> str:
    """``<data path>.<kind>.shmidx``: the preferred location, next to the data; a data file
    whose name already ends in ``.<kind>`` gets ``<data path>.shmidx`` (``x.tfrecord.shmidx``,
    not ``x.tfrecord.tfrecord.shmidx``)."""
    _check_kind(kind)
    if path.endswith(f".{kind}"):
        return f"{path}{INDEX_SUFFIX}"
    return f"{path}.{kind}{INDEX_SUFFIX}"


# The endings of names a file is written under before it is renamed to its own (the atomic
# write: write ``x.tfrecord.tmp``, then rename it to ``x.tfrecord``); ``.partial`` is what
# ``shmloader convert`` writes shards under.
TEMPORARY_SUFFIXES = (".tmp", ".temp", ".part", ".partial", "~")


def is_temporary_name(path: str) -> bool:
    """Whether ``path``'s name ends like a file about to be renamed (:data:`TEMPORARY_SUFFIXES`,
    any case). Writers leave such a file without an index: an index is found by the data
    file's path, so one written for ``x.tfrecord.tmp`` (as ``x.tfrecord.tmp.tfrecord.shmidx``)
    would stay behind, orphaned, once the file is renamed, and never be used."""
    name = os.path.basename(os.fspath(path).rstrip("/")).lower()
    return name.endswith(TEMPORARY_SUFFIXES)


def _older_sidecar_path(path: str, kind: str) -> str | None:
    """Where shmloader 0.1 put the sidecar of a file named ``x.<kind>`` (``x.<kind>.<kind>
    .shmidx``): still read, so an indexed dataset is not indexed again; never written."""
    older = f"{path}.{kind}{INDEX_SUFFIX}"
    return older if older != sidecar_path(path, kind) else None


def default_index_dir(index_dir: str | None = None) -> str:
    """The fallback directory: argument, else ``$SHMLOADER_INDEX_DIR``, else the user cache."""
    if index_dir:
        return os.path.abspath(os.path.expanduser(index_dir))
    env = os.environ.get("SHMLOADER_INDEX_DIR")
    if env:
        return os.path.abspath(os.path.expanduser(env))
    return os.path.join(user_cache_dir(), "index")


def user_cache_dir() -> str:
    """shmloader's folder in the user's cache: ``$XDG_CACHE_HOME/shmloader``, defaulting to
    ``~/.cache/shmloader``."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "shmloader")


def fallback_index_path(path: str, kind: str, *, index_dir: str | None = None) -> str:
    """Location in the cache directory; the hash of the full path keeps equal names apart."""
    _check_kind(kind)
    full = _canonical(path)
    digest = hashlib.sha256(full.encode("utf-8")).hexdigest()[:32]
    base = os.path.basename(full.rstrip("/"))[:64] or "data"
    return os.path.join(default_index_dir(index_dir), f"{base}-{digest}.{kind}{INDEX_SUFFIX}")


def _canonical(path: str) -> str:
    fs, inner = _fs.resolve(path)
    return _fs.display_path(fs, inner)


def _is_local(path: str) -> bool:
    fs, _ = _fs.resolve(path)
    return isinstance(fs, pafs.LocalFileSystem)


def _candidates(path: str, kind: str, index_dir: str | None) -> list[str]:
    canonical = _canonical(path)
    older = _older_sidecar_path(canonical, kind)
    return [
        sidecar_path(canonical, kind),
        *([older] if older else []),
        fallback_index_path(path, kind, index_dir=index_dir),
    ]


def read_index(path: str, kind: str, *, index_dir: str | None = None) -> IndexEntry | None:
    """The first fresh index of ``path`` (location, offsets, lost records), or ``None``.

    The sidecar is tried first, then the cache directory. Raises
    :class:`IndexMismatchError` when an index exists but is damaged and none is fresh, and
    :class:`DataError` when the data file itself is missing.
    """
    current = _fs.stamp(path)
    damage: IndexMismatchError | None = None
    for candidate in _candidates(path, kind, index_dir):
        raw = _read_index_file(candidate)
        if raw is None:
            continue
        try:
            size, mtime_ns, offsets, lost = _parse(raw, kind, candidate)
        except IndexMismatchError as exc:
            damage = damage or exc
            continue
        if size == current.size and mtime_ns == current.mtime_ns:
            return IndexEntry(candidate, offsets, lost)
    if damage is not None:
        raise damage
    return None


def find_index(
    path: str, kind: str, *, index_dir: str | None = None
) -> tuple[str, np.ndarray] | None:
    """:func:`read_index` without the lost records: ``(location, offsets)`` or ``None``.

    Lost records (version 2 indexes) are still numbered in the offsets; callers that may
    meet them use :func:`read_index`.
    """
    found = read_index(path, kind, index_dir=index_dir)
    return None if found is None else (found.where, found.offsets)


def load_offsets(path: str, kind: str, *, index_dir: str | None = None) -> np.ndarray | None:
    """The cached offsets of ``path``, or ``None`` when there is no index or it is stale.

    See :func:`find_index` for the search order and errors.
    """
    found = find_index(path, kind, index_dir=index_dir)
    return None if found is None else found[1]


def _read_index_file(candidate: str) -> bytes | None:
    fs, inner = _fs.resolve(candidate)
    try:
        info = fs.get_file_info(inner)
        if info.type != pafs.FileType.File:
            return None
        with fs.open_input_stream(inner) as stream:
            return bytes(stream.read())
    except (OSError, pa.ArrowException) as exc:
        raise IndexMismatchError(f"cannot read index: {exc}", path=candidate) from exc


def _parse(raw: bytes, kind: str, where: str) -> tuple[int, int, np.ndarray, np.ndarray]:
    def damaged(why: str, offset: int | None = None) -> IndexMismatchError:
        return IndexMismatchError(f"damaged index: {why}", path=where, offset=offset)

    if len(raw) < _HEADER.size + _CRC.size:
        raise damaged(f"only {len(raw)} bytes, shorter than a header")
    magic, version, kind_len, size, mtime_ns, count = _HEADER.unpack_from(raw, 0)
    if magic != _MAGIC:
        raise damaged("bad magic (not a shmloader index)", 0)
    if version not in (_VERSION, _VERSION_LOST):
        raise damaged(f"format version {version}, this shmloader reads versions 1 and 2", 8)
    start = _HEADER.size + kind_len
    lost_at = start + 8 * (count + 1)
    nlost = 0
    if version == _VERSION_LOST and len(raw) >= lost_at + 8 + _CRC.size:
        (nlost,) = struct.unpack_from("<Q", raw, lost_at)
    extra = 8 + 8 * nlost if version == _VERSION_LOST else 0
    expected = lost_at + extra + _CRC.size
    if len(raw) != expected:
        raise damaged(f"{len(raw)} bytes where the header implies {expected}")
    (stored_crc,) = _CRC.unpack_from(raw, len(raw) - _CRC.size)
    if crc32c(memoryview(raw)[: -_CRC.size]) != stored_crc:
        raise damaged("checksum mismatch", len(raw) - _CRC.size)
    stored_kind = raw[_HEADER.size : start].decode("utf-8", "replace")
    if stored_kind != kind:
        raise damaged(f"it indexes kind {stored_kind!r}, not {kind!r}", _HEADER.size)
    offsets = _aligned(np.frombuffer(raw, dtype=_OFFSET_DTYPE, count=count + 1, offset=start))
    if count and bool(np.any(offsets[1:] < offsets[:-1])):
        raise damaged("offsets decrease", start)
    lost = _NO_LOST
    if nlost:
        lost = _aligned(np.frombuffer(raw, dtype=_OFFSET_DTYPE, count=nlost, offset=lost_at + 8))
        if not _valid_lost(lost, count):
            raise damaged("lost record numbers out of order or out of range", lost_at)
    return int(size), int(mtime_ns), offsets, lost


def _aligned(values: np.ndarray) -> np.ndarray:
    """``values`` (a view of the file's bytes, where the kind's name leaves the numbers at any
    byte offset) as a read-only array that is aligned: numpy copies an unaligned array first
    in operations such as ``searchsorted``, on every call (a reader looks up every block it
    reads)."""
    if values.flags.aligned:
        return values
    out = values.copy()
    out.flags.writeable = False
    return out


def _valid_lost(lost: np.ndarray, count: int) -> bool:
    return bool(np.all(lost[1:] > lost[:-1])) and int(lost[-1]) < count


def save_offsets(
    path: str,
    kind: str,
    offsets: np.ndarray,
    *,
    index_dir: str | None = None,
    stamp: _fs.FileStamp | None = None,
    lost: np.ndarray | None = None,
) -> str:
    """Write the index of ``path`` atomically and return where it went.

    ``lost``: increasing record numbers whose byte ranges are damage a scan stepped over
    (written as a version 2 index; none, the default, writes version 1).

    ``stamp`` is the data file's size/mtime *before* the offsets were computed; pass it when
    building takes a while, so that a file changed meanwhile leaves a stale index (rebuilt on
    next use) instead of a wrong one that looks fresh. Without it the file is stamped now.
    """
    _check_kind(kind)
    arr = np.ascontiguousarray(offsets, dtype=_OFFSET_DTYPE)
    if arr.ndim != 1 or arr.size == 0:
        raise ConfigError(f"offsets for {path} must be a 1-D array of n + 1 values")
    if arr.size > 1 and bool(np.any(arr[1:] < arr[:-1])):
        raise ConfigError(f"offsets for {path} must not decrease")
    lost_arr = np.ascontiguousarray(_NO_LOST if lost is None else lost, dtype=_OFFSET_DTYPE)
    if lost_arr.size and (lost_arr.ndim != 1 or not _valid_lost(lost_arr, arr.size - 1)):
        raise ConfigError(f"lost records of {path} must increase and be below {arr.size - 1}")
    st = stamp if stamp is not None else _fs.stamp(path)
    kind_bytes = kind.encode("utf-8")
    version = _VERSION_LOST if lost_arr.size else _VERSION
    header = _HEADER.pack(_MAGIC, version, len(kind_bytes), st.size, st.mtime_ns, arr.size - 1)
    parts = [header, kind_bytes, arr.tobytes()]
    if lost_arr.size:
        parts += [struct.pack("<Q", lost_arr.size), lost_arr.tobytes()]
    body = b"".join(parts)
    blob = body + _CRC.pack(crc32c(body))

    targets = [fallback_index_path(path, kind, index_dir=index_dir)]
    if _is_local(path):
        targets.insert(0, sidecar_path(_canonical(path), kind))
    failures: list[str] = []
    mode = _readable_as(path)
    for target in targets:
        try:
            _atomic_write(target, blob, mode)
        except OSError as exc:
            failures.append(f"{target}: {exc}")
            continue
        return target
    raise ConfigError(
        f"cannot write the {kind} index of {path} anywhere ({'; '.join(failures)}); "
        "set SHMLOADER_INDEX_DIR or index_dir to a writable directory"
    )


def _readable_as(path: str) -> int:
    """Permission bits for ``path``'s index: readable by whoever may read the data (mkstemp
    makes files 0600, and on a shared dataset another user could not read the index and would
    rebuild and replace it, each in turn)."""
    try:
        return stat.S_IMODE(os.stat(_canonical(path)).st_mode) & 0o666 | 0o600
    except (OSError, ValueError):
        return 0o600  # not a local file (an object store has no modes), or gone: private


def _atomic_write(target: str, blob: bytes, mode: int = 0o600) -> None:
    directory = os.path.dirname(target)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".shmidx-", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def cached_offsets(
    path: str,
    kind: str,
    build: Callable[[], np.ndarray],
    *,
    index_dir: str | None = None,
) -> np.ndarray:
    """Offsets from a fresh index, else ``build()`` them and save the result for next time.

    A damaged index is reported in the log and replaced. Errors raised by ``build`` (a
    corrupt data file) propagate unchanged.
    """
    entry = cached_index(path, kind, lambda: (build(), _NO_LOST), index_dir=index_dir)
    return entry.offsets


def cached_index(
    path: str,
    kind: str,
    build: Callable[[], tuple[np.ndarray, np.ndarray]],
    *,
    index_dir: str | None = None,
) -> IndexEntry:
    """:func:`cached_offsets` for builders that may step over damage: ``build()`` returns
    ``(offsets, lost record numbers)``. ``where`` is ``""`` when the index was just built."""
    try:
        found = read_index(path, kind, index_dir=index_dir)
    except IndexMismatchError as exc:
        log.warning("%s; rebuilding it", exc)
        found = None
    if found is not None:
        return found
    before = _fs.stamp(path)
    built, lost = build()
    offsets = np.ascontiguousarray(built, dtype=_OFFSET_DTYPE)
    lost = np.ascontiguousarray(lost, dtype=_OFFSET_DTYPE)
    try:
        save_offsets(path, kind, offsets, index_dir=index_dir, stamp=before, lost=lost)
    except ConfigError as exc:
        # Still correct without a cache, only slower next time: say so, do not fail the read.
        log.warning("%s", exc)
    return IndexEntry("", offsets, lost)
