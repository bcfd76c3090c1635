"""Pick a source class from file names, so a command line can take plain paths.

``shmloader master data/*.tfrecord`` must plan without being told the format. Classes are
imported only when chosen, so a format's optional machinery costs nothing unless used.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Sequence
from typing import Any

import pyarrow.fs as pafs

from .._fs import _GLOB_CHARS, expand_paths, give_filesystem, resolve
from ..errors import ConfigError
from ..formats.index import INDEX_SUFFIX
from .base import Source

# kind -> (module in shmloader.sources, class name)
_CLASSES = {
    "records": ("records", "RecordFileSource"),
    "parquet": ("parquet", "ParquetSource"),
    "arrow": ("arrow", "ArrowSource"),
    "csv": ("csv", "CSVSource"),
    "jsonl": ("jsonl", "JSONLSource"),
    "webdataset": ("webdataset", "WebDatasetSource"),
    "files": ("files", "FileSource"),
}
# File name endings (lower case) -> kind; compressed record files keep their kind.
_ENDINGS = {
    **{
        f"{ext}{comp}": "records"
        for ext in (".tfrecord", ".tfrecords", ".rec")
        for comp in ("", ".gz", ".zlib", ".zz")
    },
    ".parquet": "parquet",
    ".pq": "parquet",
    ".arrow": "arrow",
    ".feather": "arrow",
    ".ipc": "arrow",
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".tar": "webdataset",
    # Images, one record per file (an image folder, as torchvision's ImageFolder reads it).
    **{ext: "files" for ext in (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")},
}


# Longest first, so that "x.tfrecord.gz" is a record file, not an unknown ".gz".
_LONGEST_FIRST = sorted(_ENDINGS.items(), key=lambda e: -len(e[0]))


def kind_of(path: str) -> str:
    """The source kind a file name stands for; ConfigError for an unknown ending."""
    name = path.rstrip("/").lower()
    for ending, kind in _LONGEST_FIRST:
        if name.endswith(ending):
            return kind
    known = ", ".join(sorted(_ENDINGS))
    raise ConfigError(f"{path}: cannot tell the format from the file name; known endings: {known}")


def source_for_paths(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], **options: Any
) -> Source:
    """A source for ``paths`` (globs, files, Hugging Face ``save_to_disk`` folders), chosen by
    extension: .tfrecord/.tfrecords/.rec (optionally .gz/.zlib) -> RecordFileSource,
    .parquet -> ParquetSource, .arrow/.feather or a folder of another kind -> ArrowSource,
    .csv -> CSVSource, .jsonl/.ndjson -> JSONLSource, .tar -> WebDatasetSource, images
    (.jpg/.jpeg/.png/.webp/.bmp/.gif/.tif/.tiff) -> FileSource (one record per file); a
    folder whose files are all of one of these formats (index files aside) -> that format's
    source. ``options`` go to the class.

    Sidecar index files matched by a glob are ignored; files of different kinds are a
    ConfigError (one source reads one format).
    """
    items: list[str | os.PathLike[str]]
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not items:
        raise ConfigError("no paths given")
    if options.get("filesystem") is not None:  # paths inside it: looked at through it
        items = list(give_filesystem(options["filesystem"], items))
    found: dict[str, str] = {}  # kind -> an example path
    files: list[str] = []
    for item in items:
        p = os.fspath(item)
        if not any(c in p for c in _GLOB_CHARS) and _is_dir(p):
            # A folder whose files are all of one format is a source of that format (Parquet
            # as pyarrow.dataset writes it, JSON Lines, record files beside their indexes,
            # images one record per file); a save_to_disk folder (state.json), or any other,
            # is Arrow.
            under = [f for f in expand_paths(p, directories=True) if not f.endswith(INDEX_SUFFIX)]
            within = {_kind_or_none(f) for f in under}
            only = within.pop() if len(within) == 1 else None
            if only is not None and not _is_hf_folder(p):
                found.setdefault(only, p)
                files.extend(under)
            else:
                found.setdefault("arrow", p)
            continue
        for f in expand_paths(p):
            if not f.endswith(INDEX_SUFFIX):
                found.setdefault(kind_of(f), f)
                files.append(f)
    if len(found) > 1:
        kinds = "; ".join(f"{k} ({example})" for k, example in sorted(found.items()))
        raise ConfigError(f"the paths mix formats: {kinds}; give files of one format")
    if not found:
        raise ConfigError(f"{items}: only index files ({INDEX_SUFFIX}) match, no data")
    (kind,) = found
    module, name = _CLASSES[kind]
    cls = getattr(importlib.import_module(f"shmloader.sources.{module}"), name)
    # ArrowSource and FileSource expand folders and globs themselves (FileSource lists a
    # folder in one pass, where a list of its files would be looked up one by one); the
    # others get the expanded, sidecar-free files.
    target: Any = [os.fspath(i) for i in items] if kind in ("arrow", "files") else files
    try:
        inspect.signature(cls).bind(target, **options)
    except TypeError as exc:
        raise ConfigError(f"{name} does not take these options {sorted(options)}: {exc}") from exc
    source: Source = cls(target, **options)
    return source


def _kind_or_none(path: str) -> str | None:
    """:func:`kind_of` ``path``, None for an ending no source reads."""
    try:
        return kind_of(path)
    except ConfigError:
        return None


def _is_hf_folder(path: str) -> bool:
    fs, inner = resolve(path)
    return bool(fs.get_file_info(f"{inner}/state.json").type == pafs.FileType.File)


def _is_dir(path: str) -> bool:
    fs, inner = resolve(path)
    return bool(fs.get_file_info(inner).type == pafs.FileType.Directory)


__all__ = ["kind_of", "source_for_paths"]
