"""A record a source left out under ``on_error="skip"``: counted and reported, never silent.

A value of its own, below the modules that carry it: a range's result (``base.ReadResult``)
and the columns a reader takes a block at a time (``streamed.StreamedColumns``, which finds
the skipped records as it decodes) both hold these, and the one does not import the other
for it. ``shmloader.sources.base`` names it too, with the rest of the protocol.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SkippedRecord:
    """A record left out under ``on_error="skip"``; counted and reported, never silent.

    ``path`` is the file, ``index`` the record's number in it, ``offset`` its byte offset
    (None where the format has none) and ``error`` what was wrong with it."""

    path: str
    index: int
    offset: int | None
    error: str
