"""How a reader's configuration crosses the trainer's pipe: the user's code goes by value.

A ``decode``, a ``decode_batch``, a ``Source`` subclass, any function a user hands us may be
defined anywhere: at the top of an unguarded ``train.py``, in a notebook cell, in ``python -c``,
as a lambda or a closure. Plain pickle sends functions and classes by name, and a reader could
find names of ``__main__`` only by running the training script again (multiprocessing's spawn
does that, and an unguarded script then trains once more in every reader). cloudpickle sends
what lives in ``__main__``, lambdas and closures by value (their code, the globals they use,
their closure cells) and what an importable module defines by reference, as pickle would; a
reader unpickles the result with plain ``pickle``, and the training script never runs in it.

The bytes cross only the trainer's own pipe to the reader processes it started itself; the
master, which talks to the network, never unpickles anything.
"""

from __future__ import annotations

import functools
import io
import os
import pickle
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:
    from .config import ReaderConfig


_DYNAMIC_CODE = "<dynamic-code>"  # cloudpickle's file name for code it sends by value


@dataclass(frozen=True)
class PickledConfig:
    """What a reader is sent once: the trainer's import path and its pickled configuration."""

    sys_path: tuple[str, ...]
    blob: bytes


def trainer_sys_path(path: Sequence[str] | None = None, cwd: str | None = None) -> tuple[str, ...]:
    """The trainer's ``sys.path`` with ``''`` (the current folder: ``python -c``, a notebook,
    an interactive session) made absolute, so a reader imports the same modules by name."""
    here = os.getcwd() if cwd is None else cwd
    return tuple(p or here for p in (sys.path if path is None else path))


def dumps(value: object) -> bytes:
    """``value`` pickled by cloudpickle, functions keeping the name of the file they were
    written in. cloudpickle names every code object it sends by value ``<dynamic-code>`` (so
    that its bytes do not depend on where the code was written); a traceback in the reader,
    and the "raised at FILE:LINE" of the loop's error, would then name no file."""
    out = io.BytesIO()
    _pickler()(out, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return out.getvalue()


@functools.cache
def _pickler() -> type:
    """cloudpickle's Pickler, keeping file names (see :func:`dumps`); made on first use, so
    that cloudpickle is imported only when something is pickled."""
    import cloudpickle

    class KeepFileNames(cloudpickle.Pickler):
        def reducer_override(self, obj: object) -> object:
            if isinstance(obj, types.CodeType):
                rebuild, args = self.dispatch_table[types.CodeType](obj)
                return rebuild, tuple(
                    obj.co_filename if arg == _DYNAMIC_CODE else arg for arg in args
                )
            return super().reducer_override(obj)

    return KeepFileNames


def pickle_config(config: ReaderConfig) -> PickledConfig:
    """The configuration as a reader unpickles it; ConfigError, naming the cause, when some
    part of the source cannot be pickled (an open file, a lock, a socket it refers to)."""
    try:
        blob = dumps(config)
    except Exception as exc:  # what cloudpickle raises depends on the object: any is ours
        found = unpicklable_part(config.source, "source")
        where = f" (the part that cannot: {found})" if found else ""
        raise ConfigError(
            f"cannot send the source to its reader processes: {type(exc).__name__}: {exc}"
            f"{where}. The source and its functions are pickled (those defined in the script, a "
            "notebook or a closure by value, with the globals and closure variables they "
            "use); open files, locks, sockets and clients cannot be: create them inside the "
            "function on first use instead (docs/sources.md, 'Where functions may live')"
        ) from exc
    return PickledConfig(trainer_sys_path(), blob)


def unpickle_config(pickled: PickledConfig) -> ReaderConfig:
    """The configuration, in a reader. ConfigError, naming the module, when something sent
    by reference (a function of an importable module) cannot be imported here."""
    sys.path[:] = list(pickled.sys_path)
    try:
        config: ReaderConfig = pickle.loads(pickled.blob)
    except Exception as exc:  # an import error, or whatever a module raises as it is imported
        missing = exc.name if isinstance(exc, ImportError) else None
        what = f"module {missing!r}" if missing else "a module the source refers to"
        raise ConfigError(
            f"cannot load the source: {type(exc).__name__}: {exc}. Readers import the "
            f"functions and classes of importable modules by name, and {what} cannot be "
            "imported in a reader (the trainer's sys.path is used). Install it where the "
            "readers' Python finds it, or have it sent by value with "
            "cloudpickle.register_pickle_by_value(module) before the dataset starts "
            "(docs/sources.md, 'Where functions may live')"
        ) from exc
    return config


def unpicklable_part(value: object, name: str, depth: int = 4) -> str | None:
    """Where in ``value`` the part that cannot be pickled is, as a path of names
    ("source.decode's global 'PAYLOAD', a Struct"); None if ``value`` pickles, or nothing
    smaller than it is to blame. Looks into attributes, containers, and a function's closure
    variables and the globals its code uses: what cloudpickle sends by value with it."""
    try:
        dumps(value)
        return None
    except Exception:
        pass
    for part, part_name in _parts(value, name) if depth > 0 else ():
        found = unpicklable_part(part, part_name, depth - 1)
        if found is not None:
            return found
    return f"{name}, a {type(value).__name__}"


def _parts(value: object, name: str) -> list[tuple[object, str]]:
    """The values ``value`` is pickled with, each with a name for the user to find it by."""
    if isinstance(value, types.FunctionType):
        code, cells = value.__code__, value.__closure__ or ()
        closure = [
            (cell.cell_contents, f"{name}'s closure variable {var!r}")
            for var, cell in zip(code.co_freevars, cells, strict=True)
            if cell.cell_contents is not None
        ]
        used = [n for n in code.co_names if n in value.__globals__]
        return closure + [
            (value.__globals__[n], f"{name}'s global {n!r}")
            for n in used
            if not isinstance(value.__globals__[n], types.ModuleType)
        ]
    if isinstance(value, functools.partial):
        return [
            (value.func, f"{name}'s function"),
            *((a, f"{name}'s argument") for a in value.args),
        ]
    if isinstance(value, dict):
        return [(v, f"{name}[{k!r}]") for k, v in value.items()]
    if isinstance(value, (list, tuple, set, frozenset)):
        return [(v, f"{name}[{i}]") for i, v in enumerate(value)]
    attributes = getattr(value, "__dict__", None)
    if isinstance(attributes, dict):
        return [(v, f"{name}.{k}") for k, v in attributes.items()]
    return []
