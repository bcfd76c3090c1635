"""A folder of files as WebDataset tar shards (``shmloader convert FOLDER --output-dir DIR``).

:class:`~shmloader.FileSource` reads a folder as it is, and needs nothing else on a local
disk. Shards pay off where a file costs a request: an object store holding a million small
images answers a million GETs per epoch for them, and a few hundred for the same images in
shards of 256 MiB. So the writer exists, and writes what peers read too:

* **tar, in WebDataset's layout.** One sample per file, named ``<key>.<ext>`` where ``key``
  is the file's path under the folder without its ending (``cat/001.jpg`` -> key ``cat/001``,
  field ``jpg``): the class folder survives in ``sample["__key__"]``. Dots inside a file's
  stem become ``_`` (WebDataset takes the key up to the name's first dot). Readable by
  :class:`~shmloader.WebDatasetSource`, ``webdataset`` and ``tar``; nothing of shmloader's
  own is needed to read them back.
* **In the source's record order**, not the listing's: record ``i`` of the folder is file
  ``i * step mod n`` (docs/sources.md, "FileSource"), so every shard, and every task read
  from one, holds files from every class folder. Shards written in listing order would hold
  one class each, and a task's batches with them.
* **Whole or not at all.** Shards are written under ``.partial`` names, read back (which
  builds their indexes) and renamed at the end; a failed run removes what it wrote.
"""

from __future__ import annotations

import io
import math
import os
import re
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow.fs as pafs

from .._fs import claim_output_folder, resolve
from ..errors import ConfigError, DataError
from ..formats.index import sidecar_path
from .files import FileSource
from .webdataset import WebDatasetSource

SHARD_BYTES = 256 << 20  # the size a shard aims at when files_per_shard is not given
_READ_FILES = 64  # files read at a time (their bytes are held until written)
_PARTIAL = ".partial"
_PREFIX = re.compile(r"[A-Za-z0-9._-]+")


@dataclass(frozen=True)
class WrittenShard:
    """A shard written: its path and how many files it holds."""

    path: str
    files: int


def write_file_shards(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    output_dir: str,
    *,
    files_per_shard: int | None = None,
    prefix: str = "part",
    filesystem: pafs.FileSystem | None = None,
) -> list[WrittenShard]:
    """Write the files of ``paths`` (a folder, a glob or a list, as
    :class:`~shmloader.FileSource` takes them) into ``<prefix>-00000-of-000NN.tar`` shards in
    ``output_dir`` (see the module doc); ``files_per_shard`` None: about
    :data:`SHARD_BYTES` per shard, from the files' mean size. Returns the shards in order."""
    if files_per_shard is not None and files_per_shard < 1:
        raise ConfigError(f"files_per_shard must be at least 1, got {files_per_shard}")
    if not _PREFIX.fullmatch(prefix):
        raise ConfigError(f"prefix {prefix!r}: use letters, digits, '.', '_' or '-'")
    source = FileSource(paths, filesystem=filesystem)
    (shard,) = source.plan()
    total = shard.num_records
    if files_per_shard is None:
        mean = source.shard_bytes()[shard.path] / max(total, 1)
        files_per_shard = max(1, min(total, int(SHARD_BYTES // max(mean, 1))))
    count = math.ceil(total / files_per_shard)
    out = _Output(output_dir, prefix)
    written: list[WrittenShard] = []
    keys: dict[str, str] = {}  # key -> the file that has it, to refuse two files one key
    try:
        for number in range(count):
            start = number * files_per_shard
            stop = min(total, start + files_per_shard)
            partial = out.path(f"{prefix}-{number:05d}-of-{count:05d}.tar{_PARTIAL}")
            with out.open(partial) as sink, tarfile.open(fileobj=sink, mode="w") as tar:
                out.written.append(partial)
                for first in range(start, stop, _READ_FILES):
                    batch = source.read(shard, first, min(stop, first + _READ_FILES))
                    names = batch.column("path").to_pylist()
                    for name, data in zip(names, batch.column("data").to_pylist(), strict=True):
                        member = _member_name(name, source.root, keys)
                        info = tarfile.TarInfo(member)
                        info.size, info.mode = len(data), 0o644  # mtime 0: the same bytes each run
                        tar.addfile(info, io.BytesIO(data))
            written.append(WrittenShard(partial, stop - start))
        return [out.finish(shard) for shard in written]
    except BaseException:
        out.abort()
        raise


def _member_name(path: str, root: str, keys: dict[str, str]) -> str:
    """``path``'s name in a shard: ``<key>.<ext>`` (see the module doc)."""
    relative = path[len(root) + 1 :] if root else path.lstrip("/")
    folder, _, base = relative.rpartition("/")
    stem, dot, ending = base.rpartition(".")
    if not dot or not stem:  # no ending (or a name that is all ending): the bytes as .bin
        stem, ending = base, "bin"
    key = f"{folder}/{stem.replace('.', '_')}" if folder else stem.replace(".", "_")
    other = keys.setdefault(key, path)
    if other != path:
        raise ConfigError(
            f"{other} and {path} would be one sample in the shards (key {key!r}: WebDataset "
            "takes the key up to a name's first dot); rename one of them"
        )
    return f"{key}.{ending.lower()}"


class _Output:
    """The output folder: partial shards written into it, then renamed or removed."""

    def __init__(self, output_dir: str, prefix: str) -> None:
        self.fs, self.dir = claim_output_folder(
            output_dir, prefix, ".tar", "remove them or pick another prefix or output folder"
        )
        self.output_dir = output_dir.rstrip("/")
        self.written: list[str] = []  # every shard written so far (partial or final name)

    def path(self, name: str) -> str:
        return f"{self.output_dir}/{name}"

    def open(self, path: str) -> pafs.NativeFile:
        return self.fs.open_output_stream(resolve(path)[1])

    def finish(self, shard: WrittenShard) -> WrittenShard:
        """Rename a partial shard to its final name and check that it reads back whole (which
        indexes it, as training would on its first plan)."""
        final = shard.path.removesuffix(_PARTIAL)
        self.fs.move(resolve(shard.path)[1], resolve(final)[1])
        self.written[self.written.index(shard.path)] = final  # abort() removes it from now on
        found = sum(s.num_records for s in WebDatasetSource(final).plan())
        if found != shard.files:
            raise DataError(f"wrote {shard.files} files but reading back finds {found}", path=final)
        return WrittenShard(final, shard.files)

    def abort(self) -> None:
        """Remove every shard this run wrote, and the indexes of those read back: a failed
        run leaves nothing behind."""
        for path in self.written:
            for leftover in (path, sidecar_path(path, "wds")):
                inner = resolve(leftover)[1]
                if self.fs.get_file_info(inner).type == pafs.FileType.File:
                    self.fs.delete_file(inner)
        self.written = []
