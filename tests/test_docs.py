"""The docs cannot drift from the code: every Python block in the docs and the README parses,
and every ``shmloader.X(...)`` it calls names a public callable that takes the keywords given;
a block that lists signatures (``Name(params) -> result``, one per line or over several) lists
each public one as it is, parameters and keyword-only marker alike. (The pages' runnable
examples are copies of files in examples/, which tests/test_examples.py runs.)"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import shmloader

ROOT = Path(__file__).resolve().parent.parent
PAGES = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks(page: Path) -> list[tuple[int, str]]:
    """(line, source) of each ```python block of ``page`` (the examples' copies too)."""
    text = page.read_text()
    out = []
    for m in BLOCK.finditer(text):
        source = m.group(1)
        out.append((text[: m.start()].count("\n") + 1, source))
    return out


def calls_of_shmloader(tree: ast.AST) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "shmloader"
    ]


def signatures(source: str) -> list[ast.FunctionDef] | None:
    """The signatures a block lists, as ``def`` nodes; None if it is not such a list."""
    lines = [line.split("  #")[0].rstrip() for line in source.splitlines()]
    chunks, current = [], ""
    for line in lines:
        if not line.strip():
            continue
        current += " " + line.strip()
        if current.count("(") == current.count(")"):
            chunks.append(current.strip())
            current = ""
    if current or not chunks:
        return None
    out = []
    for chunk in chunks:
        m = re.fullmatch(r"([A-Za-z_][A-Za-z_0-9.]*)\((.*)\)(\s*->.*)?", chunk)
        if m is None:
            return None
        name = m.group(1).rsplit(".", 1)[-1]
        try:
            tree = ast.parse(f"def {name}({m.group(2)}){m.group(3) or ''}: ...")
        except SyntaxError:
            return None
        node = tree.body[0]
        assert isinstance(node, ast.FunctionDef)
        out.append(node)
    return out


def signature_problems(line: int, defs: list[ast.FunctionDef]) -> list[str]:
    """Where a listed signature of a public name differs from the code's."""
    problems = []
    for node in defs:
        target = getattr(shmloader, node.name, None)
        if target is None or not callable(target):
            continue
        real = [
            (p.name, p.kind is p.KEYWORD_ONLY)
            for p in inspect.signature(target).parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        args = node.args
        listed = [(a.arg, False) for a in [*args.posonlyargs, *args.args]]
        listed += [(a.arg, True) for a in args.kwonlyargs]
        if listed != real:
            problems.append(f"line {line}: {node.name}{listed} but the code has {real}")
    return problems


def test_the_pages_have_python_blocks_to_check() -> None:
    assert sum(len(python_blocks(p)) for p in PAGES) > 20


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_block_parses_and_calls_what_exists(page: Path) -> None:
    problems = []
    for line, source in python_blocks(page):
        try:
            tree = ast.parse(source)
        except SyntaxError as exc:
            defs = signatures(source)
            if defs is None:
                problems.append(f"line {line}: does not parse: {exc.msg} (block line {exc.lineno})")
            else:
                problems += signature_problems(line, defs)
            continue
        for call in calls_of_shmloader(tree):
            assert isinstance(call.func, ast.Attribute)
            name = call.func.attr
            where = f"line {line + call.lineno}: shmloader.{name}"
            target = getattr(shmloader, name, None)
            if target is None:
                problems.append(f"{where} does not exist")
                continue
            if not callable(target):
                continue
            try:
                params = inspect.signature(target).parameters
            except (TypeError, ValueError):
                continue
            if any(p.kind is p.VAR_KEYWORD for p in params.values()):
                continue
            for kw in call.keywords:
                if kw.arg is not None and kw.arg not in params:
                    problems.append(f"{where} takes no {kw.arg}=")
    assert not problems, "\n".join(problems)


# The comment that names where a page's copy of an example comes from
# (scripts/sync_doc_examples.py keeps the copy equal to it).
EXAMPLE = re.compile(r"^<!-- example: (examples/[\w/.-]+?)(?::[\w-]+)? -->$", re.MULTILINE)


def test_every_example_a_page_shows_is_run_by_a_test() -> None:
    """A page that shows an example file shows code that runs: a test runs each file a page
    copies, naming it (tests/test_examples.py runs the scripts, tests/test_kubernetes_manifests.py
    the manifests' commands, tests/test_ray_train.py the Ray Train example), so a shown example
    cannot rot unseen."""
    included = {m[1] for page in PAGES for m in EXAMPLE.finditer(page.read_text())}
    assert included, "no page shows an example file"
    runner = "".join(
        (ROOT / "tests" / name).read_text()
        for name in ("test_examples.py", "test_kubernetes_manifests.py", "test_ray_train.py")
    )
    for path in sorted(included):
        assert (ROOT / path).is_file(), f"a page shows {path}, which does not exist"
        assert f'"{Path(path).name}"' in runner, f"{path} is shown by a page but no test runs it"
