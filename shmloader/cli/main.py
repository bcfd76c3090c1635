"""The ``shmloader`` command: one sub-command per module in this package."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Each module defines ``register(subparsers)`` which adds its parser and sets ``func``.
_COMMANDS: list[str] = ["bench", "clean", "convert", "index", "master", "top"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shmloader",
        description="Elastic, zero-copy data loading for PyTorch.",
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMANDS:
        importlib.import_module(f"shmloader.cli.{name}").register(sub)
    return parser


def _version() -> str:
    from shmloader import __version__

    return f"shmloader {__version__}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    code = func(args)
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
