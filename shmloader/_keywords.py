"""A misspelt keyword argument is reported with the name it was probably meant to be.

Python says only ``__init__() got an unexpected keyword argument 'num_reader'``. The
constructors users call most take many keyword-only options; :func:`suggest_keywords` wraps
one so that such a call raises the same ``TypeError``, naming the class and the closest valid
names (``difflib``). The check is one set lookup per keyword, at construction only.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Iterable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def unknown_keyword_error(owner: str, given: Iterable[str], known: Iterable[str]) -> TypeError:
    """The error for keywords of ``given`` not in ``known``, with the closest names."""
    choices = sorted(set(known))
    unknown = [name for name in given if name not in set(choices)]
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(name, choices, n=1, cutoff=0.7)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        parts.append(f"{name!r}{hint}")
    noun = "argument" if len(unknown) == 1 else "arguments"
    return TypeError(
        f"{owner}() got an unexpected keyword {noun} {', '.join(parts)}; "
        f"it takes: {', '.join(choices)}"
    )


def suggest_keywords(
    also: Callable[[], Iterable[str]] | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a class's ``__init__``: an unknown keyword raises ``TypeError`` naming the
    closest valid ones. ``also``: names accepted through ``**kwargs`` besides the signature's
    own (``shmloader.DataLoader`` passes torch's DataLoader options on)."""

    def decorate(init: Callable[P, R]) -> Callable[P, R]:
        params = inspect.signature(init).parameters
        own = {name for name, p in params.items() if p.kind in _NAMED and name != "self"}
        owner = init.__qualname__.rsplit(".", 1)[0]
        known: set[str] | None = None

        @functools.wraps(init)
        def checked(*args: P.args, **kwargs: P.kwargs) -> R:
            nonlocal known
            if known is None:
                known = own | set(also() if also is not None else ())
            if not known.issuperset(kwargs):
                raise unknown_keyword_error(owner, kwargs, known)
            return init(*args, **kwargs)

        return checked

    return decorate
