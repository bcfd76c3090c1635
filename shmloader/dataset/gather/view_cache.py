"""Views of segments parsed before, for the next segment placed where they were.

Opening a segment means parsing its Arrow IPC file and making a view of every column (IPC
footer, schema, extension types, numpy views): as much work as gathering thousands of tabular
rows. But segments of one dataset are written
alike (same schema, usually the same row count), and a gatherer maps each new one where an
earlier one was (``shm/spare_maps.py``, first-fit placement in ``shm/region.py``).

Views are numbers about places: column ``c`` starts at byte ``x`` of the mapping. Where a
file is mapped at the same place in the region as one parsed before, and all the bytes that
are not column data are equal, the parse would give the same places: the old views read the
new file. The bytes compared are everything before the first data buffer (the file magic, the
schema, the record batch's metadata with every buffer's offset, length and null count) and
after the last one (the footer), so no change a parse could see goes unnoticed; the data
buffers in between are what the views point at.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import pyarrow as pa

from ...shm.region import Placed
from ...shm.template import buffer_spans
from .gather import SegmentViews


class _Parsed(NamedTuple):
    size: int
    head: pa.Buffer  # the file's bytes before its first data buffer (copied)
    tail_at: int
    tail: pa.Buffer  # the file's bytes from the end of its last data buffer (copied)
    views: SegmentViews


class ParsedViews:
    """Views of parsed segments by their place in the region (at most ``max_count``)."""

    def __init__(self, max_count: int) -> None:
        self.max_count = max_count
        self._by_offset: OrderedDict[int, _Parsed] = OrderedDict()
        self.hits = 0  # how many opens were spared a parse (for tests and benchmarks)

    def __len__(self) -> int:
        return len(self._by_offset)

    def find(self, placed: Placed) -> SegmentViews | None:
        """The views of the file now at ``placed`` if one parsed there before had the same
        metadata bytes (then they read this file), else None."""
        known = self._by_offset.get(placed.offset)
        buffer = placed.buffer
        if known is None or known.size != buffer.size:
            return None
        if not (
            buffer.slice(0, known.head.size).equals(known.head)
            and buffer.slice(known.tail_at).equals(known.tail)
        ):
            return None
        self._by_offset.move_to_end(placed.offset)
        self.hits += 1
        return known.views

    def remember(self, placed: Placed, batch: pa.RecordBatch, views: SegmentViews) -> None:
        """Keep ``views`` (of ``batch``, parsed from the file at ``placed``) for the next file
        placed there. Not kept if some column's data is not inside the file."""
        buffer = placed.buffer
        spans = _data_spans(batch, buffer)
        if spans is None:
            self._by_offset.pop(placed.offset, None)
            return
        first, end = spans
        head = pa.py_buffer(buffer.slice(0, first).to_pybytes())
        tail = pa.py_buffer(buffer.slice(end).to_pybytes())
        self._by_offset[placed.offset] = _Parsed(buffer.size, head, end, tail, views)
        self._by_offset.move_to_end(placed.offset)
        while len(self._by_offset) > self.max_count:
            self._by_offset.popitem(last=False)

    def clear(self) -> None:
        self._by_offset.clear()


def _data_spans(batch: pa.RecordBatch, file: pa.Buffer) -> tuple[int, int] | None:
    """Where the batch's data buffers begin and end in ``file`` (offsets), or None if one of
    them lies outside it (a copy made by the reader: those views would not follow the file)."""
    first, end = file.size, 0
    for column in batch.columns:
        spans = buffer_spans(column, file)
        if spans is None:
            return None
        for offset, length in spans:
            first = min(first, offset)
            end = max(end, offset + length)
    return (first, end) if end else (file.size, file.size)  # no data: compare it all
