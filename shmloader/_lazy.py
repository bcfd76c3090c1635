"""A package's public names, imported on first use (PEP 562 module ``__getattr__``).

So that ``import shmloader`` (and ``shmloader.sources``, ``shmloader.master``) stays cheap:
a reader process or the CLI loads only the modules it touches, never torch or the master's
server side by accident.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, whose ``namespace`` (its globals)
    gets each name of ``exports`` (name -> module, relative to ``package`` when it starts
    with a dot) the first time it is asked for."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        full = f"{package}{module}" if module.startswith(".") else module
        value = getattr(importlib.import_module(full), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        # Not loaded names are not in the namespace yet: list them anyway (tab completion,
        # pydoc), with whatever the package holds (its loaded submodules).
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
