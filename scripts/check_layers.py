"""The layers contract of ``shmloader/``: no import cycle, no import from a lower layer up.

Every import counts: at the top of a module, under ``if TYPE_CHECKING:`` and inside a
function. A cycle held together by a function-local or type-checking import is still a
cycle: the modules cannot be read, tested or moved apart. ``LAYERS`` lists the layers from
the bottom up; a module may import its own layer and the layers below it, never one above.
A row of several names is one level of siblings that may not import each other (the gather
and the resume code know nothing of one another). Each module belongs to the longest name
that prefixes it; ``pkg.__init__`` names a package's ``__init__.py`` alone. A module no name
covers is an error too, so a new folder has to be given its place.

Run ``python scripts/check_layers.py`` to print what breaks the contract (exit 1), or nothing
(exit 0); ``tests/test_layers.py`` runs it in the suite.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

Layer = str | tuple[str, ...]

LAYERS: tuple[Layer, ...] = (
    # what every part uses: errors, generated protobuf code, small helpers
    "shmloader._proto",
    "shmloader.errors",
    (
        "shmloader._env",
        "shmloader._flock",
        "shmloader._lazy",
        "shmloader._fs",
        "shmloader._keywords",
        "shmloader.augment",
    ),
    # records on disk, then sources of rows, then shared memory
    "shmloader.formats",
    "shmloader.sources",
    "shmloader.shm",
    # the master, the readers that lease from it, the figures a trainer reports
    "shmloader.master",
    "shmloader.reader",
    "shmloader.stats",
    # the trainer side, values at the bottom, the faces on top (docs/architecture.md)
    "shmloader.dataset.core",
    ("shmloader.dataset.gather", "shmloader.dataset.resume"),
    "shmloader.dataset.waiting",
    "shmloader.dataset.order",
    "shmloader.dataset.accounting",
    "shmloader.dataset.runtime",
    "shmloader.dataset.dataset",
    "shmloader.dataset.loader",
    "shmloader.dataset.__init__",
    # the public names, then the command line
    "shmloader.__init__",
    "shmloader.cli",
    "shmloader.__main__",
)


@dataclass(frozen=True)
class Import:
    """One import of a module of the package by another: where, and how it is written."""

    importer: str
    imported: str
    line: int
    kind: str  # "top", "TYPE_CHECKING" or "in a function"

    def __str__(self) -> str:
        where = "" if self.kind == "top" else f" ({self.kind})"
        return f"{self.importer}:{self.line} imports {self.imported}{where}"


def module_names(package: Path) -> dict[str, Path]:
    """Every module of ``package`` by dotted name; a package's ``__init__.py`` is
    ``pkg.__init__``."""
    root = package.parent
    names = {}
    for path in sorted(package.rglob("*.py")):
        names[".".join(path.relative_to(root).with_suffix("").parts)] = path
    return names


def _target(names: dict[str, Path], module: str) -> str | None:
    if module in names:
        return module
    if module + ".__init__" in names:
        return module + ".__init__"
    return None


def _imported(
    names: dict[str, Path], importer: str, node: ast.Import | ast.ImportFrom
) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            parts = alias.name.split(".")
            # ``import a.b.c`` loads a, a.b and a.b.c: the deepest that is ours is the edge
            for end in range(len(parts), 0, -1):
                found = _target(names, ".".join(parts[:end]))
                if found is not None:
                    yield found
                    break
        return
    if node.level:
        here = importer.split(".")[:-1]  # the package a module (or __init__) is in
        base = here[: len(here) - (node.level - 1)]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    for alias in node.names:
        found = _target(names, f"{module}.{alias.name}") or _target(names, module)
        if found is not None:
            yield found


def _is_type_checking(test: ast.expr) -> bool:
    return isinstance(test, ast.Name | ast.Attribute) and ast.unparse(test).endswith(
        "TYPE_CHECKING"
    )


def imports(package: Path) -> list[Import]:
    """Every import of one module of ``package`` by another, however it is written."""
    names = module_names(package)
    found: list[Import] = []
    for importer, path in names.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))

        def walk(node: ast.AST, kind: str, importer: str = importer) -> None:
            for child in ast.iter_child_nodes(node):
                child_kind = kind
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                    child_kind = "in a function" if kind == "top" else kind
                elif isinstance(child, ast.If) and _is_type_checking(child.test):
                    child_kind = "TYPE_CHECKING"
                if isinstance(child, ast.Import | ast.ImportFrom):
                    for imported in dict.fromkeys(_imported(names, importer, child)):
                        if imported != importer:
                            found.append(Import(importer, imported, child.lineno, child_kind))
                walk(child, child_kind)

        walk(tree, "top")
    return found


def layer_of(module: str, layers: Sequence[Layer] = LAYERS) -> tuple[int, str] | None:
    """The level of ``module`` and the name that placed it there; None when none covers it."""
    best: tuple[int, str] | None = None
    for level, layer in enumerate(layers):
        for name in (layer,) if isinstance(layer, str) else layer:
            covers = module == name or (
                not name.endswith(".__init__") and module.startswith(name + ".")
            )
            if covers and (best is None or len(name) > len(best[1])):
                best = (level, name)
    return best


def cycles(edges: Sequence[Import]) -> list[list[str]]:
    """The import cycles among the modules, each as its modules in sorted order (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.importer, set()).add(edge.imported)
        graph.setdefault(edge.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def violations(package: Path, layers: Sequence[Layer] = LAYERS) -> list[str]:
    """What breaks the contract, one line each: cycles, upward imports, sibling imports and
    modules without a layer."""
    edges = imports(package)
    problems = [
        f"module without a layer: {m}" for m in module_names(package) if not layer_of(m, layers)
    ]
    for cycle in cycles(edges):
        members = set(cycle)
        inside = [str(e) for e in edges if e.importer in members and e.imported in members]
        problems.append(f"import cycle of {len(cycle)} modules: " + "; ".join(inside))
    for edge in edges:
        here, there = layer_of(edge.importer, layers), layer_of(edge.imported, layers)
        if here is None or there is None:
            continue
        if there[0] > here[0]:
            problems.append(f"upward import: {edge} (layer {there[1]} is above {here[1]})")
        elif there[0] == here[0] and there[1] != here[1]:
            problems.append(f"sibling import: {edge} ({here[1]} and {there[1]} are siblings)")
    return problems


def main() -> int:
    package = Path(__file__).resolve().parent.parent / "shmloader"
    problems = violations(package)
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
