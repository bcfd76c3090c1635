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
from ..formats.index import INDEX_SUFFIX, read_index, save_offsets
from ..formats.tfrecord import index_kind, scan_offsets, scan_resync

_COMPRESSION_CHOICES = {"auto": "auto", "none": None, "gzip": "gzip", "zlib": "zlib"}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "index",
        help="build or check the sidecar record index of TFRecord files",
        description=(
            "Build (or reuse) the sidecar offset index of each TFRecord file and print its "
            "record count. Exit status: 0 all good, 1 a file is corrupt or an index could "
            "not be written (or, with --on-error skip, some damage was stepped over), "
            "2 bad arguments."
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
        "--on-error",
        choices=("raise", "skip"),
        default="raise",
        help="skip: step over damaged framing (a corrupt length field, a file cut inside its "
        "last record) and index the records after it, as RecordFileSource(on_error='skip') "
        "does; each damaged range is listed and keeps one record number (default: raise, "
        "the file fails)",
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
    damaged = 0  # files indexed around damaged framing (--on-error skip)
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
                count, how, lost = _index_one(path, compression, args, bar.update)
            except (DataError, ConfigError) as exc:
                failures.append(str(exc))
                tqdm.write(f"{'FAILED':>14}  {exc}", file=sys.stderr)
                continue
            finally:
                bar.update(done_before + size - bar.n)  # cached or failed files count too
            total += count
            damaged += bool(lost)
            tqdm.write(f"{count:>14,}  {how:<7}  {path}")
    good = len(paths) - len(failures)
    damage = f", {damaged} with damaged framing stepped over" if damaged else ""
    print(f"{total:>14,}  total    {good} file(s) indexed" + damage + _failed_note(failures))
    if failures:
        print(f"shmloader index: first failure: {failures[0]}", file=sys.stderr)
        return 1
    return 1 if damaged else 0


def _failed_note(failures: list[str]) -> str:
    return f", {len(failures)} failed" if failures else ""


def _index_one(
    path: str, compression: str | None, args: argparse.Namespace, progress: Progress
) -> tuple[int, str, int]:
    """Record count of ``path``, what was done (cached, built, checked) and how many of its
    records are damaged framing stepped over (only with ``--on-error skip``)."""
    resolved = resolve_compression(path, compression)
    kind = index_kind(resolved)
    skip = args.on_error == "skip"
    found = None
    if not args.force:
        try:
            found = read_index(path, kind, index_dir=args.index_dir)
        except IndexMismatchError as exc:
            tqdm.write(f"{'replacing':>14}  {exc}", file=sys.stderr)
    if found is not None and len(found.lost) and not skip:
        found = None  # stepped-over damage: without skip the scan below names it and fails
    if found is not None and not args.check:
        _say_lost(path, found.lost.tolist())
        return len(found.offsets) - 1, "cached", len(found.lost)
    before = stamp(path)
    lost = np.zeros(0, dtype=np.uint64)
    if skip:
        scanned = scan_resync(path, compression=resolved, verify=args.check, progress=progress)
        offsets = scanned.offsets
        lost = np.array([g.record for g in scanned.lost], dtype=np.uint64)
        for problem in (*scanned.lost, *scanned.bad):
            tqdm.write(f"{'DAMAGED':>14}  {getattr(problem, 'error', problem)}", file=sys.stderr)
    else:
        offsets = scan_offsets(path, compression=resolved, verify=args.check, progress=progress)
    if found is not None:
        if not (np.array_equal(found.offsets, offsets) and np.array_equal(found.lost, lost)):
            raise IndexMismatchError(
                f"the index {found.where} does not match the records in the file "
                "(rebuild with --force)",
                path=path,
            )
        return len(offsets) - 1, "checked", len(lost)
    save_offsets(path, kind, offsets, index_dir=args.index_dir, stamp=before, lost=lost)
    return len(offsets) - 1, "built", len(lost)


def _say_lost(path: str, lost: list[int]) -> None:
    if lost:
        numbers = ", ".join(map(str, lost))
        tqdm.write(
            f"{'DAMAGED':>14}  {path}: record(s) {numbers} are damaged framing stepped over "
            "(--force rebuilds and describes them)",
            file=sys.stderr,
        )
