"""``shmloader index PATH... [--check] [--force]``: build or verify TFRecord sidecar indexes.

Building indexes ahead of training moves the one full scan per file out of the first epoch's
planning (where every trainer would wait for it) into a separate, resumable step.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np
from tqdm import tqdm

from .._fs import expand_paths, stamp
from ..errors import ConfigError, DataError, IndexMismatchError
from ..formats._compression import Progress, resolve_compression
from ..formats.index import INDEX_SUFFIX, find_index, save_offsets
from ..formats.tfrecord import index_kind, scan_offsets

_COMPRESSION_CHOICES = {"auto": "auto", "none": None, "gzip": "gzip", "zlib": "zlib"}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "index",
        help="build or check the sidecar record index of TFRecord files",
        description=(
            "Build (or reuse) the sidecar offset index of each TFRecord file and print its "
            "record count. Exit status: 0 all good, 1 a file is corrupt or an index could "
            "not be written, 2 bad arguments."
        ),
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="files, URIs or quoted globs")
    parser.add_argument(
        "--check",
        action="store_true",
        help="read every record and verify both CRCs (and that an existing index matches)",
    )
    parser.add_argument(
        "--force", action="store_true", help="rebuild indexes even when a fresh one exists"
    )
    parser.add_argument(
        "--compression",
        choices=sorted(_COMPRESSION_CHOICES),
        default="auto",
        help="compression of the files (default: detect per file)",
    )
    parser.add_argument(
        "--index-dir",
        default=None,
        help="where indexes go when a data directory is not writable "
        "(default: $SHMLOADER_INDEX_DIR or ~/.cache/shmloader/index)",
    )
    parser.set_defaults(func=run)


def _refuse_other_formats(paths: list[str]) -> None:
    """Files named as another format (a Parquet or JSONL file, say) would read as corrupt
    record files; those sources keep indexes of their own, built by ``plan()``. Files with
    no known ending are taken for record files, as ``RecordFileSource`` takes them."""
    from ..sources.factory import kind_of

    for path in paths:
        try:
            kind = kind_of(path)
        except ConfigError:
            continue  # no known ending: a record file
        if kind != "records":
            raise ConfigError(
                f"{path} is named as a {kind} file: this command indexes TFRecord files "
                "(other sources build their own index when planned)"
            )


def run(args: argparse.Namespace) -> int:
    try:
        # A glob like data/* also matches the indexes themselves.
        paths = [p for p in expand_paths(args.paths) if not p.endswith(INDEX_SUFFIX)]
        if not paths:
            raise ConfigError(f"{' '.join(args.paths)}: only index files match")
        _refuse_other_formats(paths)
        sizes = [stamp(p).size for p in paths]
    except (ConfigError, DataError) as exc:
        print(f"shmloader index: {exc}", file=sys.stderr)
        return 2
    compression = _COMPRESSION_CHOICES[args.compression]
    failures: list[str] = []
    total = 0
    with tqdm(
        total=sum(sizes),
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc="indexing",
        file=sys.stderr,
        disable=None,
    ) as bar:
        for path, size in zip(paths, sizes, strict=True):
            done_before = bar.n
            try:
                count, how = _index_one(path, compression, args, bar.update)
            except (DataError, ConfigError) as exc:
                failures.append(str(exc))
                tqdm.write(f"{'FAILED':>14}  {exc}", file=sys.stderr)
                continue
            finally:
                bar.update(done_before + size - bar.n)  # cached or failed files count too
            total += count
            tqdm.write(f"{count:>14,}  {how:<7}  {path}")
    good = len(paths) - len(failures)
    print(f"{total:>14,}  total    {good} file(s) indexed" + _failed_note(failures))
    if failures:
        print(f"shmloader index: first failure: {failures[0]}", file=sys.stderr)
        return 1
    return 0


def _failed_note(failures: list[str]) -> str:
    return f", {len(failures)} failed" if failures else ""


def _index_one(
    path: str, compression: str | None, args: argparse.Namespace, progress: Progress
) -> tuple[int, str]:
    """Record count of ``path`` and what was done: cached, built, checked."""
    resolved = resolve_compression(path, compression)
    kind = index_kind(resolved)
    found = None
    if not args.force:
        try:
            found = find_index(path, kind, index_dir=args.index_dir)
        except IndexMismatchError as exc:
            tqdm.write(f"{'replacing':>14}  {exc}", file=sys.stderr)
    if found is not None and not args.check:
        return len(found[1]) - 1, "cached"
    before = stamp(path)
    offsets = scan_offsets(path, compression=resolved, verify=args.check, progress=progress)
    if found is not None:
        if not np.array_equal(found[1], offsets):
            raise IndexMismatchError(
                f"the index {found[0]} does not match the records in the file "
                "(rebuild with --force)",
                path=path,
            )
        return len(offsets) - 1, "checked"
    save_offsets(path, kind, offsets, index_dir=args.index_dir, stamp=before)
    return len(offsets) - 1, "built"
