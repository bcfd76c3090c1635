#!/usr/bin/env python3
"""Regenerate ``shmloader/_proto`` from ``shmloader/proto/*.proto`` with grpc_tools.protoc.

The generated modules are committed (users need no protoc), so they can go stale when a
``.proto`` changes; ``--check`` regenerates into a temporary folder and fails, listing the
files that differ, so the test suite catches a forgotten regeneration.

Protos are compiled by their path from the repository root (``shmloader/proto/x.proto``), which
is also the file name they get in protobuf's global descriptor pool: a bare ``example.proto``
would clash with any other package that registers one (the ``tfrecord`` package does), just as
TensorFlow registers ``tensorflow/core/example/example.proto``. So a proto importing another
writes ``import "shmloader/proto/x.proto";``. protoc then emits ``from shmloader.proto import
x_pb2``, a module that does not exist: imports of our generated modules are rewritten to
package-relative ones (``from . import x_pb2``) so ``shmloader._proto`` is self-contained.

The generated code checks the protobuf runtime it runs on: the runtime must not be older than
the protoc bundled with grpcio-tools (the ``# Protobuf Python Version`` header line), and
``*_pb2_grpc.py`` needs ``grpcio`` at least the grpcio-tools version. Regenerating with a newer
grpcio-tools therefore raises the dependency floors in pyproject.toml; ``--check`` compares
the code without those stamps, so a newer grpcio-tools on the same protoc is not "stale".

Usage::

    python scripts/gen_protos.py           # regenerate in place
    python scripts/gen_protos.py --check   # exit 1 and list stale files
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "shmloader" / "proto"
OUT_DIR = ROOT / "shmloader" / "_proto"
# Hand-written files in the output folder, never generated nor reported as stale.
KEEP = frozenset({"__init__.py"})
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
_SERVICE_RE = re.compile(r"^\s*service\s+\w+\s*\{", re.MULTILINE)
_VERSION_RE = re.compile(r"^# Protobuf Python Version: (\S+)$", re.MULTILINE)
# What a generator stamps with its own version: the header line, the protobuf runtime check's
# major, minor and patch, and the grpcio floor of *_pb2_grpc.py. A newer grpcio-tools of the
# same protoc stamps a newer version on the same code; that is no staleness (and regenerating
# would raise the floors users need), so the check compares the code with the stamps masked.
_STAMPS = (
    _VERSION_RE,
    re.compile(r"(?<=ValidateProtobufRuntimeVersion\()(\s*[\w.]+,\s*\d+,\s*\d+,\s*\d+,)"),
    re.compile(r"^GRPC_GENERATED_VERSION = .*$", re.MULTILINE),
)


def proto_files(proto_dir: Path = PROTO_DIR) -> list[Path]:
    return sorted(p.resolve() for p in proto_dir.glob("*.proto"))


def has_service(proto: Path) -> bool:
    """gRPC stubs only for files that declare a service: others would get an empty module."""
    text = re.sub(r"//[^\n]*", "", proto.read_text(encoding="utf-8"))
    return _SERVICE_RE.search(text) is not None


def _protoc_include() -> str:
    # google/protobuf/*.proto (well-known types) ship inside grpc_tools.
    import grpc_tools

    return str(Path(grpc_tools.__file__).resolve().parent / "_proto")


def _run_protoc(protos: Sequence[Path], root: Path, out_dir: Path, *, grpc: bool) -> None:
    if not protos:
        return
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{root}",
        f"-I{_protoc_include()}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
    ]
    if grpc:
        cmd.append(f"--grpc_python_out={out_dir}")
    cmd.extend(p.relative_to(root).as_posix() for p in protos)
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=root)
    if result.returncode != 0:
        raise SystemExit(f"protoc failed ({' '.join(cmd)}):\n{result.stderr.strip()}")


def fix_imports(text: str, proto_package: str) -> str:
    """Rewrite ``from <proto_package> import x_pb2`` to ``from . import x_pb2``."""
    return re.sub(
        rf"^from {re.escape(proto_package)} import (\w+)",
        r"from . import \1",
        text,
        flags=re.MULTILINE,
    )


def generate(out_dir: Path, proto_dir: Path = PROTO_DIR, root: Path = ROOT) -> list[str]:
    """Compile every proto of ``proto_dir`` into ``out_dir``; return the generated file names."""
    protos = proto_files(proto_dir)
    if not protos:
        raise SystemExit(f"no .proto files in {proto_dir}")
    root = root.resolve()
    relative = proto_dir.resolve().relative_to(root)
    with tempfile.TemporaryDirectory(prefix="shmloader-protoc-") as tmp:
        build = Path(tmp)
        _run_protoc([p for p in protos if not has_service(p)], root, build, grpc=False)
        _run_protoc([p for p in protos if has_service(p)], root, build, grpc=True)
        produced = build / relative
        names = sorted(n for n in os.listdir(produced) if n.endswith(GENERATED_SUFFIXES))
        package = ".".join(relative.parts)
        for name in names:
            text = (produced / name).read_text(encoding="utf-8")
            (out_dir / name).write_text(fix_imports(text, package), encoding="utf-8")
    return names


def _existing_generated(out_dir: Path) -> set[str]:
    if not out_dir.is_dir():
        return set()
    return {n for n in os.listdir(out_dir) if n.endswith(GENERATED_SUFFIXES) and n not in KEEP}


def _version_of(path: Path) -> str | None:
    if not path.is_file():
        return None
    match = _VERSION_RE.search(path.read_text(encoding="utf-8"))
    return match.group(1) if match else None


def _unstamped(path: Path) -> str:
    """The file's text with the generator's version stamps masked (see ``_STAMPS``)."""
    text = path.read_text(encoding="utf-8")
    for stamp in _STAMPS:
        text = stamp.sub("<stamp>", text)
    return text


def check(out_dir: Path = OUT_DIR) -> list[str]:
    """Problems that make ``out_dir`` differ from a fresh generation (empty: up to date)."""
    with tempfile.TemporaryDirectory(prefix="shmloader-gen-protos-") as tmp:
        fresh_dir = Path(tmp)
        fresh = set(generate(fresh_dir))
        existing = _existing_generated(out_dir)
        problems = [f"{name}: missing (not generated yet)" for name in sorted(fresh - existing)]
        problems += [
            f"{name}: no .proto generates it any more (delete it)"
            for name in sorted(existing - fresh)
        ]
        for name in sorted(fresh & existing):
            if _unstamped(fresh_dir / name) == _unstamped(out_dir / name):
                continue
            problem = f"{name}: differs from a fresh generation"
            old, new = _version_of(out_dir / name), _version_of(fresh_dir / name)
            if old != new:
                # A different grpcio-tools is the usual cause, not a changed .proto.
                problem += f" (committed by protoc for protobuf {old}, this one is {new})"
            problems.append(problem)
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="regenerate into a temporary folder and exit 1 if shmloader/_proto is stale",
    )
    args = parser.parse_args(argv)
    if args.check:
        problems = check()
        if problems:
            print(f"{OUT_DIR.relative_to(ROOT)} is stale; run python scripts/gen_protos.py:")
            for problem in problems:
                print(f"  {problem}")
            return 1
        print(f"{OUT_DIR.relative_to(ROOT)} is up to date")
        return 0
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for stale in _existing_generated(OUT_DIR):
        (OUT_DIR / stale).unlink()
    for name in generate(OUT_DIR):
        print(f"wrote {OUT_DIR.relative_to(ROOT) / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
