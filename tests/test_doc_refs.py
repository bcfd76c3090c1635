"""Every `docs/<page>.md, "<section>"` reference and `page.md#anchor` link names a section that
exists (scripts/check_doc_refs.py): error messages and docstrings send users to those sections,
and a page split or a heading renamed must not leave them pointing nowhere."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "check_doc_refs.py"


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_doc_refs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


refs = _load_script()


def test_every_docs_reference_names_an_existing_section() -> None:
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_reference_matches_a_heading_its_first_words_or_a_label() -> None:
    headings = [refs.normalize("Several trainers without `world_size` (elastic)"), "Epochs, break"]
    labels = ["A trainer that stalls"]
    assert refs.names_section("Several trainers", headings, labels)
    assert refs.names_section("Several trainers without world_size", headings, labels)
    assert refs.names_section("Epochs", headings, labels)
    assert refs.names_section("A\n    # trainer that stalls", headings, labels)
    assert not refs.names_section("Several", ["Severalties"], [])
    assert not refs.names_section("Several train", headings, labels)
    assert not refs.names_section("A trainer that stalls", headings, [])
    assert refs.slug("SIGTERM and preemption handlers") == "sigterm-and-preemption-handlers"


def test_a_stale_page_or_section_is_reported() -> None:
    # built, so that this file holds no stale reference itself
    real, missing = "dataset", "nowhere"
    text = f"see docs/{real}.md, \"No such section\", and docs/{missing}.md, 'Stats'"
    found = [(m["page"], m["section"]) for m in refs.QUOTED.finditer(text)]
    assert found == [("dataset", "No such section"), ("nowhere", "Stats")]
    headings, labels, _ = refs.sections(ROOT / "docs" / "dataset.md")
    assert not refs.names_section("No such section", headings, labels)
    assert refs.names_section("Order and shuffling", headings, labels)
