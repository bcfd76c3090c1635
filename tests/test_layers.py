"""The layers contract (scripts/check_layers.py): no import cycle and no upward import anywhere
in ``shmloader/``, counting imports under ``TYPE_CHECKING`` and inside functions; and the
consumption book loads without torch."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _checker() -> ModuleType:
    path = ROOT / "scripts" / "check_layers.py"
    spec = importlib.util.spec_from_file_location("check_layers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_layers"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


check_layers = _checker()


def test_the_package_keeps_its_layers() -> None:
    assert check_layers.violations(ROOT / "shmloader") == []


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    package = tmp_path / "pkg"
    for name, text in {"__init__.py": "", **files}.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return package


LAYERS = ("pkg.low", ("pkg.left", "pkg.right"), "pkg.high", "pkg.__init__")


def test_a_cycle_held_by_type_checking_and_a_function_local_import_is_found(
    tmp_path: Path,
) -> None:
    package = _package(
        tmp_path,
        {
            "low.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import high\n"
            ),
            "high.py": "def f():\n    from .low import x\n",
            "left.py": "",
            "right.py": "",
        },
    )
    problems = check_layers.violations(package, LAYERS)
    assert any(p.startswith("import cycle of 2 modules") for p in problems), problems
    assert "pkg.low:3 imports pkg.high (TYPE_CHECKING)" in " ".join(problems)
    assert "pkg.high:2 imports pkg.low (in a function)" in " ".join(problems)
    assert any(p.startswith("upward import: pkg.low:3") for p in problems), problems


def test_sibling_and_unplaced_modules_are_refused(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "low.py": "",
            "left.py": "import pkg.right\n",
            "right.py": "",
            "high.py": "from pkg import left, low\n",
            "stray/__init__.py": "",
            "stray/thing.py": "from .. import low\n",
        },
    )
    problems = check_layers.violations(package, LAYERS)
    assert problems == [
        "module without a layer: pkg.stray.__init__",
        "module without a layer: pkg.stray.thing",
        "sibling import: pkg.left:1 imports pkg.right (pkg.left and pkg.right are siblings)",
    ]


def test_a_clean_package_passes(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "low.py": "X = 1\n",
            "left.py": "from .low import X\n",
            "right.py": "from pkg.low import X\n",
            "high.py": "from . import left, right\ndef f():\n    from .low import X\n",
            "__init__.py": "from .high import f\n",
        },
    )
    assert check_layers.violations(package, LAYERS) == []


@pytest.mark.parametrize(
    "module",
    [
        "shmloader.dataset.accounting.book",
        "shmloader.dataset.core.indices",
        "shmloader.dataset.order.blocks",
        "shmloader.dataset.waiting.budget_pressure",
        "shmloader.dataset.runtime.options",
    ],
)
def test_the_book_the_order_and_the_values_load_without_torch(module: str) -> None:
    code = f"import sys, {module}\nprint('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "False"
