"""A task a reader failed to read, as the training loop raises it.

The loop raises the very class the reader raised (``DecodeError``, ``SchemaMismatchError``,
``CorruptRecordError``, ``ShmSpaceError``, ...), with the user's own exception chained as its
``__cause__`` and each one's reader-side traceback attached as a note, so ``except
shmloader.DecodeError`` catches it and the traceback shows the line of ``decode`` that raised.
An exception crosses the pipe by pickle, which keeps neither ``__cause__`` nor the traceback:
the chain is sent as a list, each link with its traceback as text. A link that cannot be
pickled (a class that needs arguments its ``args`` lack, say) is sent as
:class:`RaisedInReader`, which keeps its type's name and its text.

Whether the master should retry the task is decided here too (:func:`retry_may_help`): only
what a retry can fix is retried; a record that fails to decode fails the same way each time.
"""

from __future__ import annotations

import functools
import itertools
import os
import pickle
import sysconfig
import traceback
from dataclasses import dataclass

from ..errors import DataError, ShmloaderError, ShmSpaceError
from .by_value import dumps

_SHMLOADER = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "")


@functools.cache
def _not_users() -> tuple[str, ...]:
    """Where code that is not the user's lies: frames there are passed over when saying where
    an error was raised (the standard library, installed packages, shmloader itself). Found on
    the first error, not at import: every reader imports this module as it starts."""
    found = {
        os.path.join(os.path.realpath(p), "")
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if (p := sysconfig.get_paths().get(key))
    }
    return tuple(found | {_SHMLOADER})


class RaisedInReader(Exception):
    """An exception raised in a reader that could not be sent as itself: ``type_name`` is its
    class's qualified name, and the text is ``"TypeName: its message"``."""

    def __init__(self, text: str, type_name: str = "Exception") -> None:
        super().__init__(text)
        self.type_name = type_name

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.type_name))


@dataclass(frozen=True)
class Link:
    """One exception of a chain: pickled (None where it could not be), its type's name, its
    text and its traceback as text."""

    pickled: bytes | None
    type_name: str
    text: str
    traceback: str
    site: str | None = None  # the outermost link's: where the user's code raised (error_site)


def retry_may_help(exc: BaseException) -> bool:
    """Whether reading the task again may succeed: an I/O error (an ``OSError`` anywhere in
    the chain, as when a ``DataError`` wraps a read that timed out) or a budget that is full
    for now. Not a record that fails to decode or does not fit the schema, a corrupt frame, a
    segment larger than the whole budget, a source that breaks its protocol: those fail the
    same way every time, and are reported at once instead of after ``max_retries`` tries."""
    link: BaseException | None = exc
    while link is not None:
        if isinstance(link, ShmSpaceError):
            return not link.never_fits
        if isinstance(link, OSError) and not isinstance(link, ShmloaderError):
            return True
        link = link.__cause__
    return False


def pack_exception(exc: BaseException) -> tuple[Link, ...]:
    """``exc`` and its chain of causes, outermost first, as the trainer rebuilds them."""
    links: list[Link] = []
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        pickled: bytes | None = None
        try:
            blob = dumps(link)  # a class of the user's script goes by value
            pickle.loads(blob)  # some classes pickle but cannot be rebuilt
            pickled = blob
        except Exception:
            pass
        tb = "" if isinstance(link, ShmloaderError) else _users_frames(link)
        name = f"{type(link).__module__}.{type(link).__qualname__}"
        site = None if links else error_site(link)
        links.append(Link(pickled, name, f"{type(link).__name__}: {link}", tb, site))
        link = link.__cause__
    return tuple(links)


def describe_error(exc: BaseException) -> str:
    """``Failed.error``, the text the master keeps: the exception's type and text and, for
    one that is not shmloader's (or one of ours chained to one that is not, as a
    ``DecodeError`` is to what decode raised), where that was raised (:func:`error_site`)."""
    text = f"{type(exc).__name__}: {exc}"
    site = error_site(exc)
    if site is None or f"(raised at {site})" in text:  # a DataError of as_ours says it already
        return text
    return f"{text} (raised at {site})"


def error_site(exc: BaseException) -> str | None:
    """Where the user's code raised ``exc`` (or the first cause of it that is not ours), as
    ``FILE:LINE, in FUNCTION``; None where no traceback says. A read() or decode of the
    user's own failing with ``IndexError: list index out of range`` says nothing of where
    without it. The place is the innermost frame in the user's code (not the standard
    library, an installed package or shmloader); else, for the user's code installed as a
    package, the outermost frame outside shmloader (the function shmloader called: the
    innermost could be a line of ``json/decoder.py`` the user's decode called); else the
    innermost frame."""
    cause: BaseException | None = exc
    while isinstance(cause, ShmloaderError):  # e.g. a DecodeError chained to decode's error
        cause = cause.__cause__
    frames = traceback.extract_tb(cause.__traceback__) if cause is not None else []
    if not frames:
        return None
    not_users = _not_users()
    users = [f for f in frames if not os.path.realpath(f.filename).startswith(not_users)]
    foreign = [f for f in frames if not os.path.realpath(f.filename).startswith(_SHMLOADER)]
    frame = users[-1] if users else foreign[0] if foreign else frames[-1]
    return f"{frame.filename}:{frame.lineno}, in {frame.name}"


def as_ours(exc: Exception, path: str, start: int, stop: int) -> Exception:
    """A source's own exception (a ``read()`` of the user's that raised ``ValueError``) as a
    ``DataError`` naming the file and the records, chained to it, so that the loop raises a
    class of ours; shmloader's errors as they are."""
    if isinstance(exc, ShmloaderError):
        return exc
    wrapped = DataError(
        f"reading records [{start}, {stop}) raised {describe_error(exc)}", path=path
    )
    wrapped.__cause__ = exc
    return wrapped


def _users_frames(exc: BaseException) -> str:
    """``exc``'s traceback as text, without shmloader's own frames (those say nothing of
    where the user's code went wrong), unless shmloader's are all there is."""
    frames = traceback.extract_tb(exc.__traceback__)
    users = [f for f in frames if not os.path.realpath(f.filename).startswith(_SHMLOADER)]
    return "".join(traceback.format_list(users or frames))


def unpack_exception(links: tuple[Link, ...], where: str) -> BaseException:
    """The exception :func:`pack_exception` packed, its causes chained again, each with a
    note giving its traceback in the reader; ``where`` (which reader, which task) is noted on
    the outermost."""
    rebuilt: list[BaseException] = []
    for link in links:
        exc: BaseException | None = None
        if link.pickled is not None:
            try:
                exc = pickle.loads(link.pickled)
            except Exception:  # a module the trainer lacks: the text still says it all
                exc = None
        if not isinstance(exc, BaseException):
            exc = RaisedInReader(link.text, link.type_name)
        if link.traceback:
            _add_note(exc, f"Raised {where}; its traceback there:\n{link.traceback.rstrip()}")
        rebuilt.append(exc)
    for outer, inner in itertools.pairwise(rebuilt):
        outer.__cause__ = inner
    if not rebuilt:
        return RaisedInReader(f"a reader failed {where}")
    if not links[0].traceback:
        at = f", from {links[0].site}" if links[0].site else ""
        _add_note(rebuilt[0], f"Raised {where}{at}")
    return rebuilt[0]


def _add_note(exc: BaseException, note: str) -> None:
    """PEP 678 notes (Python 3.11+) are printed under the exception's line in a traceback;
    on 3.10 the note is kept in ``__notes__`` all the same."""
    add = getattr(exc, "add_note", None)
    if add is not None:
        add(note)
    else:
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]
