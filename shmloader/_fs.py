"""File access through ``pyarrow.fs``, so local paths and object-store URIs behave alike."""

from __future__ import annotations

import glob as _glob
import logging
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatch
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from .errors import ConfigError, DataError

_GLOB_CHARS = set("*?[")
log = logging.getLogger(__name__)


def _is_uri(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


# Filesystems given explicitly (a source's ``filesystem=``), by the URI prefix of the paths
# they serve: ``resolve`` looks here first, longest prefix first. Registered in every process
# that holds such a source (its constructor, and its unpickling in a reader).
_GIVEN: dict[str, pafs.FileSystem] = {}
_GIVEN_ORDER: list[str] = []  # its prefixes, longest first


def _serve(prefix: str, fs: pafs.FileSystem) -> None:
    _GIVEN[prefix] = fs
    _GIVEN_ORDER[:] = sorted(_GIVEN, key=len, reverse=True)


def give_filesystem(
    fs: pafs.FileSystem, paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
) -> list[str]:
    """Serve ``paths`` (paths inside ``fs``, or URIs of its kind) from ``fs``, in this
    process: returns them as URIs (``s3://bucket/key``), which ``resolve`` then answers with
    ``fs`` and names in errors. What is served is each path's folder (a glob's, up to its
    first wildcard), so a list of many files makes few prefixes. Two filesystems given for
    one folder in one process: the one given last serves it."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    scheme = f"{fs.type_name}://"
    uris = []
    for item in items:
        p = os.fspath(item)
        uri = p if "://" in p else scheme + p.lstrip("/")
        if not uri.startswith(scheme):
            raise ConfigError(
                f"{p}: a {fs.type_name} filesystem was given; give paths inside it "
                f"(bucket/key) or {scheme} URIs"
            )
        wild = min((i for i, c in enumerate(uri) if c in _GLOB_CHARS), default=len(uri))
        folder = uri[:wild].rsplit("/", 1)[0] + "/"
        _serve(folder, fs)
        uris.append(uri)
    return uris


def given_roots(fs: pafs.FileSystem) -> list[str]:
    """The prefixes ``fs`` serves in this process (a source pickles them with itself)."""
    return [prefix for prefix, given in _GIVEN.items() if given is fs]


def serve_roots(fs: pafs.FileSystem, roots: Sequence[str]) -> None:
    """Serve ``roots`` from ``fs`` here too (a reader unpickling a source)."""
    for root in roots:
        _serve(root, fs)


def resolve(path: str | os.PathLike[str]) -> tuple[pafs.FileSystem, str]:
    """Return the filesystem that holds ``path`` and the path inside it."""
    p = os.fspath(path)
    if _GIVEN_ORDER:
        for prefix in _GIVEN_ORDER:
            if p.startswith(prefix):
                return _GIVEN[prefix], p.split("://", 1)[1]
    if _is_uri(p):
        fs, inner = pafs.FileSystem.from_uri(p)
        return fs, inner
    if p.startswith("file://"):
        p = p[len("file://") :]
    return pafs.LocalFileSystem(), os.path.abspath(p)


def local_path(path: str) -> str | None:
    """The path of ``path`` on this machine's own file system, or None for a remote store."""
    fs, inner = resolve(path)
    return inner if isinstance(fs, pafs.LocalFileSystem) else None


def display_path(fs: pafs.FileSystem, inner: str) -> str:
    """The path as a user would type it (URI for remote stores)."""
    if isinstance(fs, pafs.LocalFileSystem):
        return inner
    return f"{fs.type_name}://{inner}"


def expand_paths(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    directories: bool = False,
) -> list[str]:
    """Expand a glob, a path or a list of them into a sorted, de-duplicated list of files.

    Sorting makes plans (and so seeded task orders) independent of directory listing order.
    A pattern that matches nothing is an error: an empty dataset is almost always a typo.
    ``directories``: a directory stands for the files under it, at any depth, as
    ``pyarrow.dataset`` reads a directory (names starting with ``.`` or ``_``, such as
    ``_SUCCESS`` or ``_metadata``, are left out, with what is under them); without it, a
    directory is refused.
    """
    items: Iterable[str | os.PathLike[str]]
    items = [paths] if isinstance(paths, (str, os.PathLike)) else paths
    out: list[str] = []
    for item in items:
        p = os.fspath(item)
        if not any(c in p for c in _GLOB_CHARS):
            fs, inner = resolve(p)
            info = fs.get_file_info(inner)
            if info.type == pafs.FileType.NotFound:
                raise ConfigError(f"{p}: no such file")
            if info.type == pafs.FileType.Directory and directories:
                out.extend(_files_under(p, fs, inner))
                continue
            if info.type == pafs.FileType.Directory:
                raise ConfigError(f"{p} is a directory; give a file, a list or a glob like {p}/*")
            # Absolute and normalised, as globs give them: one file named two ways
            # ("a.tfrecord", "./a.tfrecord", its absolute path) is planned once, not twice.
            out.append(p if _is_uri(p) else inner)
            continue
        matched = _glob_one(p)
        if not matched:
            raise ConfigError(f"{p}: the pattern matches no file")
        out.extend(matched)
    return _one_name_per_file(sorted(dict.fromkeys(out)))


def _files_under(path: str, fs: pafs.FileSystem, inner: str) -> list[str]:
    """The data files under directory ``path`` (``inner`` in ``fs``), named as ``path`` is
    (a URI stays one); ConfigError if there are none."""
    base = inner.rstrip("/")
    found = []
    for info in fs.get_file_info(pafs.FileSelector(base, recursive=True)):
        relative = info.path[len(base) :].lstrip("/")
        if info.type != pafs.FileType.File or any(
            part.startswith((".", "_")) for part in relative.split("/")
        ):
            continue
        found.append(path.rstrip("/") + "/" + relative if _is_uri(path) else info.path)
    if not found:
        raise ConfigError(f"{path} is a directory with no data files in it")
    return found


def _one_name_per_file(paths: list[str]) -> list[str]:
    """``paths`` without second names of one local file (a symlink beside its target, hard
    links, a glob matching both): planned under each name, its records would come twice per
    epoch. The name kept is the first that is not a symlink (a "latest" link may move later),
    else the first in sorted order."""
    names: dict[tuple[int, int], list[str]] = {}
    keys: list[tuple[int, int] | None] = []
    for p in paths:
        key = None
        if not _is_uri(p):
            try:
                st = os.stat(p)
            except OSError:
                pass  # listed a moment ago: opening it says what is wrong, naming it
            else:
                if st.st_ino:  # 0: a file system without inode numbers; names stay apart
                    key = (st.st_dev, st.st_ino)
                    names.setdefault(key, []).append(p)
        keys.append(key)
    kept = {
        key: next((n for n in group if not os.path.islink(n)), group[0])
        for key, group in names.items()
    }
    out = []
    for p, key in zip(paths, keys, strict=True):
        if key is not None and kept[key] != p:
            log.warning(
                "%s is the same file as %s (a link): its records are planned once, under %s",
                p,
                kept[key],
                kept[key],
            )
            continue
        out.append(p)
    return out


def _glob_one(pattern: str) -> list[str]:
    if not _is_uri(pattern):
        local = pattern[len("file://") :] if pattern.startswith("file://") else pattern
        return [os.path.abspath(m) for m in _glob.glob(local, recursive=True) if os.path.isfile(m)]
    fs, inner = resolve(pattern)
    prefix = pattern[: len(pattern) - len(inner)] if pattern.endswith(inner) else ""
    # Longest directory prefix without glob characters is listed recursively, then filtered.
    parts = inner.split("/")
    base_parts: list[str] = []
    for part in parts:
        if any(c in part for c in _GLOB_CHARS):
            break
        base_parts.append(part)
    base = "/".join(base_parts)
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    return [
        prefix + i.path for i in infos if i.type == pafs.FileType.File and fnmatch(i.path, inner)
    ]


@dataclass(frozen=True)
class FileStamp:
    """Size and modification time: what tells a cached index that its data file changed."""

    size: int
    mtime_ns: int


def stamp(path: str) -> FileStamp:
    fs, inner = resolve(path)
    info = fs.get_file_info(inner)
    if info.type != pafs.FileType.File:
        raise DataError("no such file (or not a regular file)", path=path)
    mtime_ns = info.mtime_ns if info.mtime_ns is not None else 0
    return FileStamp(size=int(info.size or 0), mtime_ns=int(mtime_ns))


def open_random(path: str) -> Any:
    """Open for random access (``seek``/``read``/``read_at``); errors name the file."""
    fs, inner = resolve(path)
    try:
        return fs.open_input_file(inner)
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"cannot open for reading: {exc}", path=path) from exc


def open_stream(path: str, compression: str | None = None) -> Any:
    """Open for sequential reading, optionally decompressing (``gzip``, ...)."""
    fs, inner = resolve(path)
    try:
        return fs.open_input_stream(inner, compression=compression)
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"cannot open for reading: {exc}", path=path) from exc


def open_output(path: str) -> Any:
    fs, inner = resolve(path)
    if isinstance(fs, pafs.LocalFileSystem):
        parent = os.path.dirname(inner)
        if parent:
            os.makedirs(parent, exist_ok=True)
    try:
        return fs.open_output_stream(inner, compression=None)
    except (OSError, pa.ArrowException) as exc:
        raise ConfigError(f"{path}: cannot open for writing: {exc}") from exc


def claim_output_folder(
    output_dir: str, prefix: str, ending: str, fix: str
) -> tuple[pafs.FileSystem, str]:
    """``output_dir``'s filesystem and path in it, the folder created, for a run that writes
    shards named ``<prefix>-00000[-of-00000]<ending>`` into it: a ConfigError ending in ``fix``
    if it is a file, or holds shards of those names (a run's would mix with, or be renamed
    over, them)."""
    shard_name = re.compile(rf"{re.escape(prefix)}-\d{{5}}(-of-\d{{5}})?{re.escape(ending)}")
    fs, inner = resolve(output_dir)
    if fs.get_file_info(inner).type == pafs.FileType.File:
        raise ConfigError(f"output folder {output_dir} is a file; {fix}")
    selector = pafs.FileSelector(inner, allow_not_found=True)
    taken = sorted(i.base_name for i in fs.get_file_info(selector) if shard_name.match(i.base_name))
    if taken:
        raise ConfigError(
            f"{output_dir} already holds shards named {prefix}-* ({taken[0]}, ...); {fix}"
        )
    fs.create_dir(inner, recursive=True)
    return fs, inner
