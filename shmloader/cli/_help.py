"""Help text for commands whose description is their module docstring."""

from __future__ import annotations


def plain(doc: str | None) -> str | None:
    """``doc`` without reST's double backticks, which ``--help`` would print as they are.

    None stays None: ``python -OO`` strips docstrings, and argparse then shows no description.
    """
    return None if doc is None else doc.replace("``", "")
