#!/usr/bin/env python3
"""Copy the examples' code into the docs pages that show it, or check that the copies match.

The pages show code that runs: each block is a copy of a file of ``examples/`` (which the suite
runs, tests/test_examples.py), or of a section of one between ``# --8<-- [start:NAME]`` and
``# --8<-- [end:NAME]``. A copy, not an include, so that a page reads whole on GitHub as well as
on the site. The block follows a comment that names its origin::

    <!-- example: examples/frameworks.py:accelerate -->
    ```python
    ...
    ```

(any language: a manifest shows as a ```yaml block).

``python scripts/sync_doc_examples.py`` rewrites every such block from its file;
``--check`` changes nothing and exits 1 listing the blocks that differ (tests/test_docs_site.py
runs it).
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(
    r"^(?P<head><!-- example: (?P<file>[\w/.-]+?)(?::(?P<section>[\w-]+))? -->\n```\w+\n)"
    r"(?P<code>.*?)^```$",
    re.M | re.S,
)
MARKER = re.compile(r"^\s*# --8<-- \[(?:start|end):[\w-]+\]\s*$")


def example_code(file: str, section: str | None) -> str:
    """The code a block shows: the whole file, or one section of it (dedented), without the
    section markers."""
    lines = (ROOT / file).read_text(encoding="utf-8").splitlines(keepends=True)
    if section is not None:
        start = next((i for i, line in enumerate(lines) if f"[start:{section}]" in line), None)
        stop = next((i for i, line in enumerate(lines) if f"[end:{section}]" in line), None)
        if start is None or stop is None or stop <= start:
            raise SystemExit(f"{file}: no section {section!r} (# --8<-- [start:{section}] ...)")
        lines = lines[start + 1 : stop]
    code = "".join(line for line in lines if not MARKER.match(line))
    return textwrap.dedent(code)


def synced(text: str) -> str:
    """``text`` (a page) with every example block copied afresh from its file."""
    return BLOCK.sub(lambda m: m["head"] + example_code(m["file"], m["section"]) + "```", text)


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    stale = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        new = synced(text)
        if new == text:
            continue
        stale.append(page.relative_to(ROOT))
        if not args.check:
            page.write_text(new, encoding="utf-8")
    if args.check and stale:
        names = ", ".join(str(p) for p in stale)
        print(f"example blocks differ from examples/ in: {names}.", file=sys.stderr)
        print("Run: python scripts/sync_doc_examples.py", file=sys.stderr)
        return 1
    for page in [] if args.check else stale:
        print(f"updated {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
