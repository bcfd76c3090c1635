"""WebDataset tar shards as a source: samples grouped from tar members by key.

"dir/000123.jpg" and "dir/000123.cls" form the sample ``{"__key__": "dir/000123", "jpg": ...,
"cls": ...}``; the grouping rules are webdataset's (see :mod:`shmloader.sources._tar`), so
counts agree with what webdataset yields from the same shard.

``plan()`` counts samples from an index (kind ``wds``) of each sample's first header offset,
built by one walk over the tar headers (member contents are skipped, not read, when they are
large). A read seeks to the range's first sample, reads its bytes once and cuts the members
out of them.

Without ``decode`` a batch has a ``__key__`` string column and one binary column per field,
the fields being those of the first sample of the first non-empty shard. A sample that lacks
one of them, or has another one, is a bad record (SchemaMismatchError naming shard, sample
index, byte offset, key and field; skipped under ``on_error="skip"``): columns hold no nulls,
so nothing is filled in silently. ``decode(sample) -> mapping`` receives the dict of field ->
bytes plus ``"__key__"`` and may handle optional fields itself (``np.load(io.BytesIO(...))``
for ``npy``, ``int(...)`` for ``cls``). A damaged tar header is not a record: it raises a
CorruptRecordError naming the byte offset even under ``on_error="skip"``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from .._fs import open_random, stamp
from .._keywords import suggest_keywords
from ..errors import DataError, IndexMismatchError, OnError
from ._indexed import At, Decode, IndexedSource
from ._lines import read_span
from ._tar import samples, walk
from .base import ReadResult, Shard
from .skipped import SkippedRecord

_READ_BLOCK = 1 << 20


class WebDatasetSource(IndexedSource):
    """WebDataset ``.tar`` shards (uncompressed), their members grouped into samples by key.

    Args:
        paths: A glob, a path or a list of them.
        decode: ``decode(sample) -> mapping``, a sample being ``{"__key__": str, field:
            bytes, ...}`` (``None``: a ``__key__`` column and one binary column per field).
        on_error: ``"raise"``, or ``"skip"``: bad samples are left out, reported as skipped.
        index_dir: Folder for member indexes that cannot be written beside the data.
        schema: Schema of ``decode``'s output (``None``: inferred from a sample).
        filesystem: A ``pyarrow.fs.FileSystem`` to read the paths through.
    """

    kind = "wds"

    @suggest_keywords()
    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        decode: Decode | None = None,
        on_error: OnError = "raise",
        index_dir: str | None = None,
        schema: pa.Schema | None = None,
        filesystem: pafs.FileSystem | None = None,
    ) -> None:
        super().__init__(
            paths,
            decode=decode,
            on_error=on_error,
            schema=schema,
            index_dir=index_dir,
            filesystem=filesystem,
        )

    def _build_offsets(self, path: str) -> Any:
        size = stamp(path).size
        with open_random(path) as f:
            read = _BlockReader(f, path)
            _refuse_compressed(read(0, min(size, 8)), path)
            starts = [start for _, start, _ in samples(walk(read, path, 0, size))]
        return np.array([*starts, size], dtype=np.uint64)

    def raws(self, path: str, start: int, stop: int) -> tuple[list[Any], list[At]]:
        offs = self.offsets(path)
        base, end = int(offs[start]), int(offs[stop])
        span = read_span(path, base, end)

        def read(offset: int, n: int) -> bytes:
            return span[offset - base : offset - base + n]

        found = list(samples(walk(read, path, base, end)))
        expected = offs[start:stop].tolist()
        if [s for _, s, _ in found] != expected:
            raise IndexMismatchError(
                f"samples [{start}, {stop}) are not where the index says: the file changed "
                "after it was indexed (if its size and mtime did not change, delete its "
                ".wds.shmidx index)",
                path=path,
                offset=base,
            )
        raws = [
            {"__key__": key} | {f: span[m.data - base : m.data - base + m.size] for f, m in fields}
            for key, _, fields in found
        ]
        where = [At(start + i, s, f" (sample key {key!r})") for i, (key, s, _) in enumerate(found)]
        return raws, where

    def _read(self, shard: Shard, start: int, stop: int) -> ReadResult:
        path = shard.path
        raws, where = self.raws(path, start, stop)
        skipped: list[SkippedRecord] = []
        batch = self.to_batch(path, raws, where, skipped)
        skipped.sort(key=lambda s: s.index)
        return ReadResult(batch, tuple(skipped))


# Magic numbers of compressed streams: a compressed shard has no random access to samples.
_COMPRESSED = {
    b"\x1f\x8b": ("gzip", "gunzip"),
    b"BZh": ("bzip2", "bunzip2"),
    b"\xfd7zXZ\x00": ("xz", "unxz"),
    b"\x28\xb5\x2f\xfd": ("zstd", "unzstd"),
}


def _refuse_compressed(head: bytes, path: str) -> None:
    """A ``.tar.gz`` shard would fail as a damaged tar header ("checksum"), which sends the
    user looking for corruption; say what it is and what to do instead."""
    for magic, (name, tool) in _COMPRESSED.items():
        if head.startswith(magic):
            raise DataError(
                f"a {name}-compressed stream, not a tar archive: WebDatasetSource reads "
                f"uncompressed .tar shards (a task seeks to its samples). Decompress it "
                f"(`{tool}`) or write the shards uncompressed",
                path=path,
                offset=0,
            )


class _BlockReader:
    """``read(offset, n)`` over a file in 1 MiB blocks: headers of small members come from
    one block; a large member's contents are skipped by reading the next block after it."""

    def __init__(self, f: Any, path: str) -> None:
        self.f = f
        self.path = path
        self.base = 0
        self.buf = b""

    def __call__(self, offset: int, n: int) -> bytes:
        rel = offset - self.base
        if rel >= 0 and rel + n <= len(self.buf):
            return self.buf[rel : rel + n]
        try:
            if n > _READ_BLOCK:
                return bytes(self.f.read_at(n, offset))
            self.buf, self.base = bytes(self.f.read_at(_READ_BLOCK, offset)), offset
        except (OSError, pa.ArrowException) as exc:
            raise DataError(f"cannot read: {exc}", path=self.path, offset=offset) from exc
        return self.buf[:n]
