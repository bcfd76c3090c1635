#!/usr/bin/env python3
"""Check that every reference to a section of a docs page names a section that exists.

Error messages, docstrings and pages point readers to ``docs/<page>.md, "<section>"`` (or
``'<section>'``, or ``section "<section>"``), and pages link to ``page.md#anchor``. When a page
is split or a heading renamed, those pointers go stale silently: a user told to read a section
that is not there. This lists every such reference in the project's files and fails on those
whose page or section is missing.

A section is a heading of the page, or the bold label that opens a list item (``- **A trainer
that stalls.**``), since the pages use both as places to point to. A reference may shorten a
heading to its first words (``"Several trainers"``); backticks and line breaks (with a
comment's ``#`` or ``//``) are ignored on both sides. Run from anywhere: ``python
scripts/check_doc_refs.py``; exit status 1 lists the broken references.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("docs", "shmloader", "tests", "examples", "benchmarks", "scripts")
SUFFIXES = {".md", ".py", ".proto", ".toml", ".ini", ".txt", ".cfg"}
# docs/page.md, "Section"  |  docs/page.md, section 'Section'  (the section may span lines)
QUOTED = re.compile(
    r"docs/(?P<page>[\w-]+)\.md,\s+(?:section\s+)?(?P<q>[\"'])(?P<section>[^\"']{1,200}?)(?P=q)"
)
# [text](page.md#anchor) or [text](docs/page.md#anchor), also a page's own (#anchor)
ANCHOR = re.compile(r"\]\((?:(?:docs/)?(?P<page>[\w-]+)\.md)?#(?P<anchor>[\w-]+)\)")
HEADING = re.compile(r"^#+\s+(.+?)\s*$", re.M)
LABEL = re.compile(r"^\s*[-*]\s+\*\*(.+?)\*\*", re.M)


def normalize(text: str) -> str:
    """Drop backticks, line breaks with their comment markers, and repeated blanks."""
    text = re.sub(r"\n\s*(?:#|//)?\s*", " ", text.replace("`", ""))
    return re.sub(r"\s+", " ", text).strip()


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, blanks to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def sections(page: Path) -> tuple[list[str], list[str], set[str]]:
    """The page's headings and list-item labels (normalized), and its headings' anchors."""
    text = page.read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)  # '# comment' in code is no heading
    headings = HEADING.findall(text)
    labels = [normalize(label).rstrip(".:") for label in LABEL.findall(text)]
    return [normalize(h) for h in headings], labels, {slug(h) for h in headings}


def names_section(ref: str, headings: list[str], labels: list[str]) -> bool:
    """True when ``ref`` is a heading, the first words of one, or a list item's label."""
    ref = normalize(ref).rstrip(".")
    if ref in labels:
        return True
    return any(h.startswith(ref) and not h[len(ref) : len(ref) + 1].isalnum() for h in headings)


def tracked_files() -> list[Path]:
    """The project's text files (the docs and everything that points into them), but this one,
    whose docstring shows the forms it looks for. Folders are listed rather than asked of git,
    so the check runs in an unpacked sdist too."""
    files = [ROOT / "README.md"]
    for folder in FOLDERS:
        files += sorted(p for p in (ROOT / folder).rglob("*") if p.suffix in SUFFIXES)
    return [p for p in files if p != Path(__file__).resolve() and "__pycache__" not in p.parts]


def broken_references() -> tuple[list[str], int]:
    """Each broken reference as 'file:line: what is wrong', and how many were checked."""
    docs = {p.stem: sections(p) for p in (ROOT / "docs").glob("*.md")}
    docs["README"] = sections(ROOT / "README.md")
    # A link from a page in a folder of docs/ names a page of that folder (as MkDocs reads it).
    nested = {f"{p.parent.name}/{p.stem}": sections(p) for p in (ROOT / "docs").glob("*/*.md")}
    problems: list[str] = []
    checked = 0
    for path in tracked_files():
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        rel = path.relative_to(ROOT)
        for m in QUOTED.finditer(text):
            checked += 1
            where = f"{rel}:{text.count(chr(10), 0, m.start()) + 1}"
            page, ref = m["page"], normalize(m["section"])
            if page not in docs:
                problems.append(f'{where}: docs/{page}.md does not exist ("{ref}")')
            elif not names_section(ref, *docs[page][:2]):
                problems.append(f'{where}: docs/{page}.md has no section "{ref}"')
        if path.suffix != ".md":
            continue
        for m in ANCHOR.finditer(text):
            checked += 1
            where = f"{rel}:{text.count(chr(10), 0, m.start()) + 1}"
            page = m["page"] or path.stem
            folder = path.parent.name if path.parent.parent == ROOT / "docs" else None
            pages = (
                docs
                if folder is None
                else {k.split("/")[1]: v for k, v in nested.items() if k.startswith(f"{folder}/")}
            )
            if page not in pages:
                problems.append(f"{where}: {page}.md does not exist (#{m['anchor']})")
            elif m["anchor"] not in pages[page][2]:
                problems.append(f"{where}: {page}.md has no heading with anchor #{m['anchor']}")
    return problems, checked


def main() -> int:
    problems, checked = broken_references()
    for line in problems:
        print(line)
    print(f"{checked} references checked, {len(problems)} broken", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
