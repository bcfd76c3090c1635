"""The docs site as a user reads it: built with MkDocs (strict) from this checkout.

The API reference must be something a user reads instead of the source: every public name of
``shmloader`` has an entry; every class and function shows its signature with types; every
property says what it is; no Sphinx role (``:meth:``) shows literally; every pointer to a guide
is a link that leads to a page and section that exist. And the pages' code is the examples'
code (scripts/sync_doc_examples.py), so a page reads whole on GitHub too.
"""

from __future__ import annotations

import html
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import shmloader

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out


@pytest.fixture(scope="module")
def reference(site: Path) -> str:
    return (site / "reference" / "index.html").read_text(encoding="utf-8")


def _entry(page: str, identifier: str) -> str | None:
    """What follows the heading of ``identifier``'s entry, up to the next entry's heading."""
    match = re.search(
        rf'<h(\d) id="{re.escape(identifier)}"[^>]*>.*?</h\1>(?P<body>.*?)(?=<h\d id=|\Z)',
        page,
        re.S,
    )
    return match["body"] if match else None


def _text(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", fragment)).split())


def _public_entry(page: str, name: str) -> str | None:
    return _entry(page, f"shmloader.{name}")


def _inherits_a_bare_constructor(obj: object) -> bool:
    """A class with no constructor of ours (an exception raised with a message, an interface
    to subclass): there is no signature to show."""
    inits = [vars(cls).get("__init__") for cls in getattr(obj, "__mro__", ())]
    return inspect.isclass(obj) and not any(
        getattr(init, "__module__", "").startswith("shmloader") for init in inits
    )


def test_every_public_name_has_an_entry_with_its_signature(reference: str) -> None:
    missing, unsigned = [], []
    for name in shmloader.__all__:
        obj = getattr(shmloader, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        body = _public_entry(reference, name)
        if body is None:
            missing.append(name)
            continue
        signature = re.match(r'\s*<div class="doc-signature[^"]*">(.*?)</div>', body, re.S)
        shown = signature is not None and _text(signature[1]).startswith(f"{name}(")
        if not shown and not _inherits_a_bare_constructor(obj):
            unsigned.append(name)
    assert not missing, f"no entry in docs/reference.md: {missing}"
    assert not unsigned, f"entries without a signature: {unsigned}"


def test_the_dataset_signature_shows_types_and_default_values(reference: str) -> None:
    body = _public_entry(reference, "SharedTaskDataset")
    assert body is not None
    # Quotes as a formatter gives them where one is installed (ruff: "auto"), else as Python
    # writes them ('auto'): the README's test command installs no formatter.
    signature = _text(body.split("</div>", 1)[0]).replace("'", '"')
    # Defaults defined once elsewhere (JobConfig) show their values, not their names.
    for shown in (
        'num_readers: int | Literal["auto"] = 2',
        "shuffle: bool = True",
        "seed: int = 0",
    ):
        assert shown in signature, signature


def test_every_property_is_described(reference: str) -> None:
    bare, seen = [], 0
    for match in re.finditer(r'<h\d id="(shmloader\.[\w.]+)"', reference):
        body = _entry(reference, match[1]) or ""
        if "doc-label-property" not in reference[match.end() : match.end() + 1500].split("</h")[0]:
            continue
        seen += 1
        contents = re.search(r'<div class="doc doc-contents[^"]*">(.*?)</div>', body, re.S)
        if contents is None or not _text(contents[1]):
            bare.append(match[1])
    assert seen > 20  # SharedTaskDataset's alone
    assert not bare, f"properties without a description: {bare}"


def test_no_sphinx_role_shows_literally(reference: str) -> None:
    roles = re.findall(r":(?:meth|class|func|attr|mod|data|exc|obj):", _text(reference))
    assert not roles, f"{len(roles)} Sphinx roles shown as text"


def test_every_pointer_to_a_guide_is_a_link_that_leads_somewhere(
    site: Path, reference: str
) -> None:
    text_outside_links = _text(re.sub(r"<a [^>]*>.*?</a>", " ", reference, flags=re.S))
    assert not re.search(r"docs/[\w/-]+\.md", text_outside_links), "a docs/ pointer not linked"
    links = re.findall(r'<a href="\.\./([\w/-]+/)(?:#([\w-]+))?">docs/', reference)
    assert links
    for page, anchor in links:
        target = site / page / "index.html"
        assert target.is_file(), page
        if anchor:
            assert f'id="{anchor}"' in target.read_text(encoding="utf-8"), f"{page}#{anchor}"


def test_pages_show_the_examples_code_as_it_is() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "sync_doc_examples.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    page = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    quickstart = (ROOT / "examples" / "quickstart.py").read_text(encoding="utf-8")
    assert quickstart in page  # readable on GitHub, where the site's includes are not
    # The site's code blocks are about 80 characters wide: the first example does not scroll.
    assert max(len(line) for line in quickstart.splitlines()) < 80
