"""A Griffe extension that turns shmloader's docstrings into the API reference's Markdown.

The docstrings are written for ``help()`` and IDEs as much as for the site: they name other
objects with Sphinx roles (``:meth:`close```, ``:class:`~shmloader.Source```) and send the
reader to the guides as ``docs/<page>.md, "<section>"``. Shown as they are, the site would print
the roles literally and the pointers as plain text. At build time only (mkdocs.yml loads this
file; the docstrings themselves stay as they are), this extension:

- turns each role into a cross-reference to the object's entry in the reference, shown as
  code (``close()``); one not rendered there stays code, without a link;
- turns each ``docs/<page>.md`` pointer into a link to that page, and to the section's anchor
  when it names one (the section is found as ``scripts/check_doc_refs.py`` finds it);
- shows each parameter default that is a name (``shuffle: bool = JobConfig.shuffle``, where
  a default is defined once for all) as its value (``True``), read from the live signature;
- gives an attribute set in ``__init__`` (``self.options = ...``), which has no docstring of
  its own, the text its class's ``Attributes:`` section gives it, and drops that section
  from the class's docstring, so the reference describes it once, at its own entry.

tests/test_docs_site.py builds the site and checks the result.
"""

from __future__ import annotations

import html
import importlib
import inspect
import re
from functools import cache
from pathlib import Path
from typing import Any

import griffe
from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

# :meth:`name`, :class:`~a.b.C`, :func:`title <a.b.f>`
ROLE = re.compile(r":(?P<role>meth|class|func|attr|mod|data|exc|obj):`(?P<body>[^`]+)`")
# docs/<page>.md, "<section>" (the section may span lines), or docs/page.md alone
DOCS_POINTER = re.compile(
    r"docs/(?P<page>[\w/-]+)\.md(?:,\s+(?:section\s+)?(?P<q>[\"'])(?P<section>[^\"']{1,200}?)(?P=q))?"
)
HEADING = re.compile(r"^#+\s+(.+?)\s*$", re.M)
CALLABLE_ROLES = {"meth", "func"}


@cache
def _exports() -> frozenset[str]:
    """The names importable from ``shmloader`` itself: their entries are under that path."""
    module = importlib.import_module("shmloader")
    return frozenset(module.__all__)


def _identifier(target: str, owner: str) -> str:
    """The reference entry a role names. ``owner`` is the path of the class or module the
    docstring belongs to: a bare name is a member of it, unless the top level exports it."""
    if target.startswith("shmloader."):
        return target
    head = target.split(".", 1)[0]
    if head in _exports():
        return f"shmloader.{target}"
    return f"{owner}.{target}"


def _role_markdown(match: re.Match[str], owner: str) -> str:
    role, body = match["role"], match["body"].strip()
    explicit = re.fullmatch(r"(?P<title>.+?)\s*<(?P<target>[^>]+)>", body)
    if explicit:
        title, target = explicit["title"], explicit["target"]
    else:
        target = body.lstrip("~")
        title = target.rsplit(".", 1)[-1] if body.startswith("~") else target
        if role in CALLABLE_ROLES and not title.endswith(")"):
            title += "()"
    target = target.lstrip("~").removesuffix("()")
    code = f"<code>{html.escape(title)}</code>"
    # autorefs' optional form: a link where the entry exists, plain code where it does not.
    return f'<autoref identifier="{_identifier(target, owner)}" optional>{code}</autoref>'


@cache
def _anchors(page: str) -> tuple[tuple[str, str], ...]:
    """(heading text as written, its anchor on the site) of each heading of a docs page."""
    path = DOCS / f"{page}.md"
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    out = []
    for heading in HEADING.findall(text):
        plain = heading.replace("`", "")
        out.append((re.sub(r"\s+", " ", plain), slugify(html.unescape(plain), "-")))
    return tuple(out)


def _section_anchor(page: str, section: str) -> str | None:
    """The anchor of the heading that ``section`` names: the heading, or its first words."""
    want = re.sub(r"\s+", " ", section.replace("`", "")).strip().rstrip(".")
    for heading, anchor in _anchors(page):
        if heading.startswith(want) and not heading[len(want) : len(want) + 1].isalnum():
            return anchor
    return None


def _pointer_markdown(match: re.Match[str]) -> str:
    page, section = match["page"], match["section"]
    if not (DOCS / f"{page}.md").is_file():
        return match[0]
    anchor = _section_anchor(page, section) if section else None
    # The reference page is docs/reference.md, so a page is one folder up on the site.
    url = f"../{page}/" + (f"#{anchor}" if anchor else "")
    text = " ".join(match[0].split())
    return f"[{text}]({url})"


def _owner(obj: griffe.Object) -> str:
    """The class a member's docstring speaks from (its own class for a class), else the
    module."""
    node: griffe.Object | None = obj
    while node is not None and not node.is_class and not node.is_module:
        node = node.parent  # type: ignore[assignment]
    return node.path if node is not None else obj.path


def _rewrite(text: str, owner: str) -> str:
    text = ROLE.sub(lambda m: _role_markdown(m, owner), text)
    return DOCS_POINTER.sub(_pointer_markdown, text)


def _live(path: str) -> Any:
    """The object at ``path`` (``shmloader.a.b.C.f``), imported; None if it cannot be."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                value = getattr(value, name)
        except AttributeError:
            return None
        return value
    return None


# An "Attributes:" section of a Google-style class docstring, up to the next section or the end.
ATTRIBUTES = re.compile(r"^Attributes:\n(?P<body>(?:[ \t]+\S.*\n?|\n)+)", re.M)
ITEM = re.compile(r"^(?P<indent>[ \t]+)(?P<name>\w+)(?:\s*\([^)]*\))?:\s*(?P<text>.*)$")


def _attribute_texts(body: str) -> dict[str, str]:
    """name -> description of each item of an ``Attributes:`` section's body."""
    items: dict[str, list[str]] = {}
    first_indent: str | None = None
    name = None
    for line in body.splitlines():
        m = ITEM.match(line)
        if m and (first_indent is None or m["indent"] == first_indent):
            first_indent = m["indent"]
            name = m["name"]
            items[name] = [m["text"]]
        elif name is not None and line.strip():
            items[name].append(line.strip())
    return {k: " ".join(v) for k, v in items.items()}


class PublicDocs(griffe.Extension):
    """See the module docstring."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.path == "shmloader":
            self._attributes_to_members(pkg)

    def _attributes_to_members(self, module: griffe.Module) -> None:
        for member in module.members.values():
            if member.is_alias:
                continue
            if isinstance(member, griffe.Module):
                self._attributes_to_members(member)
            elif isinstance(member, griffe.Class) and member.docstring is not None:
                doc = member.docstring
                m = ATTRIBUTES.search(doc.value)
                if m is None:
                    continue
                texts = _attribute_texts(m["body"])
                bare: dict[griffe.Object, str] = {}
                for name, text in texts.items():
                    target = member.members.get(name)
                    if isinstance(target, griffe.Object) and target.docstring is None:
                        bare[target] = text
                if not bare or len(bare) != len(texts):
                    continue  # leave a section that documents anything else as it is
                for target, text in bare.items():
                    target.docstring = griffe.Docstring(
                        _rewrite(text, _owner(target)), parent=target
                    )
                doc.value = (doc.value[: m.start()] + doc.value[m.end() :]).rstrip()

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if not obj.path.startswith("shmloader") or obj.is_alias:
            return
        if obj.docstring is not None:
            obj.docstring.value = _rewrite(obj.docstring.value, _owner(obj))
        if isinstance(obj, griffe.Function):
            self._show_default_values(obj)

    @staticmethod
    def _show_default_values(func: griffe.Function) -> None:
        named = [
            p
            for p in func.parameters
            if isinstance(p.default, (griffe.ExprName, griffe.ExprAttribute))
        ]
        if not named:
            return
        live = _live(func.path)
        try:
            signature = inspect.signature(live)
        except (TypeError, ValueError):
            return
        for parameter in named:
            actual = signature.parameters.get(parameter.name)
            if actual is not None and actual.default is not inspect.Parameter.empty:
                parameter.default = repr(actual.default)
