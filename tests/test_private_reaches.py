"""Tests stand on public seams: a test that reads or sets a private attribute (``obj._name``) of
an object of shmloader pins how the code is written, not what it does, and breaks at each
refactor that keeps the behaviour. This file counts such reaches in ``tests/*.py`` and fails
above ``LIMIT``; each one left is marked at its site by a comment ``# private: <why no public
seam fits>``.

A reach is an attribute whose name begins with an underscore and is not a dunder (``__x__``),
read or written on anything but ``self``, ``cls``, ``super()`` or a name bound by ``import x`` /
``import x as y`` to a module outside shmloader and tests (``os._exit`` is the standard
library's own public way out); or the same name as the string literal of ``setattr``,
``getattr``, ``delattr``, ``hasattr`` or ``monkeypatch.setattr`` on such an object. The code of
a script a test runs from a string literal (``python -c``) is counted as well."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path
from typing import NamedTuple

TESTS = Path(__file__).parent

# The reaches left, each justified at its site by a ``# private:`` comment.
LIMIT = 1

_BY_NAME = {"setattr", "getattr", "delattr", "hasattr"}
_OWN_NAMES = {"self", "cls"}


class Reach(NamedTuple):
    file: str
    line: int
    expr: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.expr}"


def _is_private(attr: str) -> bool:
    return attr.startswith("_") and not (attr.startswith("__") and attr.endswith("__"))


def _outside_modules(tree: ast.Module, helpers: set[str]) -> set[str]:
    """Names bound by ``import x`` / ``import x as y`` to modules neither of shmloader nor of
    tests: their underscored attributes are those libraries' business."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top in ("shmloader", "tests") or top in helpers:
                    continue
                names.add(alias.asname or top)
    return names


def _exempt(owner: ast.expr, modules: set[str]) -> bool:
    if isinstance(owner, ast.Name):
        return owner.id in _OWN_NAMES or owner.id in modules
    return (
        isinstance(owner, ast.Call)
        and isinstance(owner.func, ast.Name)
        and owner.func.id == "super"
    )


def _by_name(node: ast.Call) -> tuple[ast.expr, str] | None:
    """``setattr(obj, "_x", ...)``, ``monkeypatch.setattr(obj, "_x", ...)`` and kin: the owner
    and the private name, or None."""
    func = node.func
    name = (
        func.id
        if isinstance(func, ast.Name)
        else func.attr
        if isinstance(func, ast.Attribute)
        else ""
    )
    if name not in _BY_NAME or len(node.args) < 2:
        return None
    literal = node.args[1]
    if (
        isinstance(literal, ast.Constant)
        and isinstance(literal.value, str)
        and _is_private(literal.value)
    ):
        return node.args[0], literal.value
    return None


def _script(node: ast.Constant) -> str | None:
    """The code of a string literal of more than one line that parses as statements (a script
    a test runs in another process), or None for text."""
    if not isinstance(node.value, str) or "\n" not in node.value.strip():
        return None
    code = textwrap.dedent(node.value)
    try:
        body = ast.parse(code).body
    except SyntaxError:
        return None
    if all(isinstance(s, ast.Expr) and isinstance(s.value, (ast.Constant, ast.Name)) for s in body):
        return None  # words that happen to parse
    return code


def private_reaches(
    source: str, file: str = "<source>", helpers: frozenset[str] = frozenset(), first_line: int = 1
) -> list[Reach]:
    """The private reaches in one file's ``source``, whose first line is ``first_line`` of
    ``file``; ``helpers``: the module names of tests' own helper files (``_dataset_helpers``),
    whose imports are not outside modules."""
    tree = ast.parse(source, filename=file)
    at = first_line - 1
    modules = _outside_modules(tree, set(helpers))
    found: list[Reach] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            if not _exempt(node.value, modules):
                found.append(Reach(file, at + node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call):
            hit = _by_name(node)
            if hit is not None and not _exempt(hit[0], modules):
                expr = f"{ast.unparse(hit[0])}.{hit[1]} (by name)"
                found.append(Reach(file, at + node.lineno, expr))
        elif isinstance(node, ast.Constant) and (code := _script(node)) is not None:
            found += private_reaches(code, file, helpers, at + node.lineno)
    return sorted(found)


def all_reaches() -> list[Reach]:
    helpers = frozenset(path.stem for path in TESTS.glob("*.py"))
    found: list[Reach] = []
    for path in sorted(TESTS.glob("*.py")):
        if path.name == Path(__file__).name:
            continue  # its samples are reaches on purpose
        found += private_reaches(path.read_text(), path.name, helpers)
    return found


def over_limit(reaches: list[Reach], limit: int) -> str | None:
    """The failure message when ``reaches`` are more than ``limit``, listing each as
    file:line:expr; None within it."""
    if len(reaches) <= limit:
        return None
    listing = "\n".join(map(str, reaches))
    return (
        f"{len(reaches)} private reaches in tests/ (at most {limit}); test through public "
        f"seams, or justify one with a '# private:' comment and raise LIMIT:\n{listing}"
    )


def unjustified(reaches: list[Reach], lines_of: dict[str, list[str]]) -> list[Reach]:
    """The reaches without a ``# private:`` comment at their site: on their line, or in the
    lines just above it that are comments or hold reaches themselves (one comment may
    justify a few reaches in a row)."""
    reach_lines = {(r.file, r.line) for r in reaches}
    missing = []
    for reach in reaches:
        lines = lines_of[reach.file]
        at = reach.line - 1  # 0-based
        site = [lines[at]]
        while at > 0 and (
            lines[at - 1].lstrip().startswith("#") or (reach.file, at) in reach_lines
        ):
            at -= 1
            site.append(lines[at])
        if not any("# private:" in line for line in site):
            missing.append(reach)
    return missing


SAMPLE = """\
import os
import numpy as np
import _dataset_helpers as h
from shmloader import dataset
import shmloader.shm.region as region
class A(B):
    def f(self):
        self._a = super()._b() + A._c
        os._exit(np._d + cls._e.__len__())
        ds = dataset()
        ds._launched.append(ds.runtime.pool._procs)
        h._f; region._free; ds.__g
        monkeypatch.setattr(ds, "_h", 1); getattr(os, "_i"); setattr(ds, "j", 2)
        script = \'\'\'
            import sys
            store._maps.clear()  # private: the sample's one justified reach
            \'\'\'
"""


def test_the_counter_finds_reaches() -> None:
    found = private_reaches(SAMPLE, "t.py", helpers=frozenset({"_dataset_helpers"}))
    assert [(r.line, r.expr) for r in found] == [
        (8, "A._c"),
        (11, "ds._launched"),
        (11, "ds.runtime.pool._procs"),
        (12, "ds.__g"),
        (12, "h._f"),
        (12, "region._free"),
        (13, "ds._h (by name)"),
        (16, "store._maps"),  # in the script a test would run
    ]
    assert unjustified(found, {"t.py": SAMPLE.splitlines()}) == found[:-1]


def test_a_comment_above_justifies_the_reaches_just_below_it() -> None:
    source = "# private: why\n# and more\nwith p._lock:\n    p._hook()\n\nq._x\n"
    found = private_reaches(source, "t.py")
    assert [r.expr for r in found] == ["p._lock", "p._hook", "q._x"]
    assert unjustified(found, {"t.py": source.splitlines()}) == found[2:]


def test_the_check_fails_above_the_limit() -> None:
    found = private_reaches("x._y\nz = 1\nz._w\n", "t.py")
    assert over_limit(found, 2) is None
    message = over_limit(found, 1)
    assert message is not None and "t.py:1:x._y" in message and "t.py:3:z._w" in message


def test_tests_reach_little_into_private_attributes() -> None:
    message = over_limit(all_reaches(), LIMIT)
    assert message is None, message


def test_each_reach_left_says_why() -> None:
    reaches = all_reaches()
    lines_of = {r.file: (TESTS / r.file).read_text().splitlines() for r in reaches}
    missing = unjustified(reaches, lines_of)
    assert not missing, "reaches without a '# private:' comment:\n" + "\n".join(map(str, missing))
