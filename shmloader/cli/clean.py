"""``shmloader clean``: remove shared memory left by dead processes, show what stays."""

from __future__ import annotations

import argparse
from typing import Any

from ..shm.reap import reap_stale
from ..shm.sizes import format_size
from ..shm.space import BASE_DIR_ENV


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "clean",
        help="remove shared-memory stores of dead processes",
        description=(
            "Remove segment stores whose owner process is gone (e.g. a trainer killed with "
            "SIGKILL) and half-written segments of dead readers; stores of live owners are "
            "listed and left. Safe to run while training jobs run."
        ),
    )
    parser.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    parser.add_argument(
        "--base",
        metavar="DIR",
        default=None,
        help=f"base directory of the stores (default: ${BASE_DIR_ENV} or /dev/shm)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    report = reap_stale(args.base, dry_run=args.dry_run)
    if not report.entries:
        print(f"nothing of shmloader in {report.base_dir}")
        return 0
    width = max(len(e.action) for e in report.entries)
    for e in report.entries:
        print(f"{e.action:<{width}}  {format_size(e.nbytes):>10}  {e.path}  ({e.reason})")
    freed = sum(e.nbytes for e in report.removed)
    held = sum(e.nbytes for e in report.left)
    done, verb = ("to remove", "would free") if args.dry_run else ("removed", "freed")
    print(
        f"{len(report.removed)} {done} ({verb} {format_size(freed)}), "
        f"{len(report.left)} left ({format_size(held)}), {len(report.failed)} failed"
    )
    return 1 if report.failed else 0
