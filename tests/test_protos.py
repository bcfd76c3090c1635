"""The committed shmloader/_proto modules match the .proto sources (scripts/gen_protos.py)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gen_protos.py"

# grpcio-tools is a test dependency (shmloader[test]): a stale generated module must fail the
# suite, never be skipped past.
import grpc_tools.protoc  # noqa: E402, F401


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_protos", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _load_script()


def test_generated_modules_are_up_to_date() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_lists_changed_missing_and_orphaned_files(tmp_path: Path) -> None:
    out = tmp_path / "_proto"
    shutil.copytree(ROOT / "shmloader" / "_proto", out)
    assert gen.check(out) == []
    with (out / "example_pb2.py").open("a") as f:
        f.write("# edited by hand\n")
    (out / "example_pb2.pyi").unlink()
    (out / "gone_pb2.py").write_text("")
    assert gen.check(out) == [
        "example_pb2.pyi: missing (not generated yet)",
        "gone_pb2.py: no .proto generates it any more (delete it)",
        "example_pb2.py: differs from a fresh generation",
    ]
    text = (out / "example_pb2.py").read_text()
    (out / "example_pb2.py").write_text(
        text.replace("# Protobuf Python Version: ", "# Protobuf Python Version: 0.0.0-old-")
    )
    (problem,) = [p for p in gen.check(out) if p.startswith("example_pb2.py:")]
    assert "(committed by protoc for protobuf 0.0.0-old-" in problem


def test_a_newer_generators_version_stamp_is_not_staleness(tmp_path: Path) -> None:
    """grpcio-tools stamps its own version into the code it generates: another release of the
    same protoc gives the same code with another stamp, which --check passes (regenerating
    would only raise the grpcio floor users need)."""
    out = tmp_path / "_proto"
    shutil.copytree(ROOT / "shmloader" / "_proto", out)
    stub = out / "master_pb2_grpc.py"
    text = stub.read_text()
    assert "GRPC_GENERATED_VERSION = '" in text
    stub.write_text(
        text.replace("GRPC_GENERATED_VERSION = '", "GRPC_GENERATED_VERSION = '99.0.0-or-")
    )
    assert gen.check(out) == []
    stub.write_text(text.replace("class MasterStub", "class RenamedStub"))
    assert gen.check(out) == ["master_pb2_grpc.py: differs from a fresh generation"]


def test_services_imports_and_descriptor_names(tmp_path: Path) -> None:
    """A proto importing another and declaring a service yields an importable package."""
    proto_dir = tmp_path / "genprobe" / "proto"
    proto_dir.mkdir(parents=True)
    (proto_dir / "base.proto").write_text(
        'syntax = "proto3";\npackage genprobe;\nmessage Ping { int64 n = 1; }\n'
        "// service NotReal { } in a comment does not count\n"
    )
    (proto_dir / "svc.proto").write_text(
        'syntax = "proto3";\npackage genprobe;\nimport "genprobe/proto/base.proto";\n'
        "service Echo {\n  rpc Call (Ping) returns (Ping);\n}\n"
    )
    out = tmp_path / "genprobe" / "_gen"
    out.mkdir()
    (out / "__init__.py").write_text("")
    (tmp_path / "genprobe" / "__init__.py").write_text("")
    names = gen.generate(out, proto_dir, tmp_path)
    assert names == [
        "base_pb2.py",
        "base_pb2.pyi",
        "svc_pb2.py",
        "svc_pb2.pyi",
        "svc_pb2_grpc.py",
    ]
    svc = (out / "svc_pb2.py").read_text()
    assert "from . import base_pb2 as genprobe_dot_proto_dot_base__pb2" in svc
    assert "from . import base_pb2 as" in (out / "svc_pb2_grpc.py").read_text()
    assert "from . import base_pb2 as _base_pb2" in (out / "svc_pb2.pyi").read_text()
    assert not any("from genprobe" in (out / n).read_text() for n in names)
    sys.path.insert(0, str(tmp_path))
    try:
        grpc_mod = importlib.import_module("genprobe._gen.svc_pb2_grpc")
        base = importlib.import_module("genprobe._gen.base_pb2")
    finally:
        sys.path.remove(str(tmp_path))
    assert hasattr(grpc_mod, "EchoStub") and hasattr(grpc_mod, "add_EchoServicer_to_server")
    assert base.DESCRIPTOR.name == "genprobe/proto/base.proto"


def test_our_example_proto_is_registered_under_its_path() -> None:
    from shmloader._proto import example_pb2

    assert example_pb2.DESCRIPTOR.name == "shmloader/proto/example.proto"
    assert example_pb2.DESCRIPTOR.package == "shmloader.tfexample"


def test_fix_imports_touches_only_our_package() -> None:
    text = (
        "from google.protobuf import descriptor as _descriptor\n"
        "from shmloader.proto import example_pb2 as shmloader_dot_proto_dot_example__pb2\n"
        "import grpc\n"
    )
    assert gen.fix_imports(text, "shmloader.proto") == (
        "from google.protobuf import descriptor as _descriptor\n"
        "from . import example_pb2 as shmloader_dot_proto_dot_example__pb2\n"
        "import grpc\n"
    )
