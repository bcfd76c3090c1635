"""Line-offset indexes for the text sources (JSON Lines, CSV), found with numpy, not per line.

A record is a non-blank line. Blank lines are left out of the index, so they are neither
counted nor read; what counts as blank is the caller's ``blank`` byte set (lines made only of
those bytes and the ``\\n``). Record ``i`` spans ``offsets[i]`` up to ``offsets[i + 1]``: its
line, its line break and any blank lines after it, which every parser used here ignores.
Only ``\\n`` ends a line (``\\r\\n`` works: ``\\r`` is whitespace to both parsers).

The scan reads the file sequentially in large blocks and, per block, finds line breaks with
``np.flatnonzero`` and classifies each line with two ``reduceat`` calls (any non-blank byte;
parity of quote characters), so its cost is a few numpy passes over the bytes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa

from .._fs import open_random, open_stream
from ..errors import DataError

BLOCK_SIZE = 16 << 20
_NEWLINE = 0x0A

OddQuotes = Callable[[int, int], Exception]
"""Builds the error for a line with an odd number of quote characters: (byte offset, line
number among the non-blank lines)."""


def scan_lines(
    path: str,
    *,
    blank: bytes,
    quote: int | None = None,
    odd_quotes: OddQuotes | None = None,
    block_size: int = BLOCK_SIZE,
) -> np.ndarray:
    """Start offsets of the non-blank lines of ``path`` plus the file size (``n + 1`` uint64).

    With ``quote``, a line holding an odd number of that byte raises ``odd_quotes(offset,
    line)``: in CSV it means a quoted field runs over a line break, which a line index cannot
    represent.
    """
    table = np.ones(256, dtype=bool)  # byte -> "not blank"
    table[list(blank)] = False
    table[_NEWLINE] = False
    starts: list[np.ndarray] = []
    emitted = 0
    line_start = 0  # where the line that is still open begins
    line_nonblank = False  # whether that line has a non-blank byte so far
    line_odd = False  # parity of quote bytes in it so far
    pos = 0
    with open_stream(path) as stream:
        while True:
            try:
                chunk = stream.read(block_size)
            except (OSError, pa.ArrowException) as exc:
                raise DataError(f"cannot read: {exc}", path=path, offset=pos) from exc
            if not chunk:
                break
            arr = np.frombuffer(chunk, dtype=np.uint8)
            breaks = np.flatnonzero(arr == _NEWLINE)
            # Segments: each ends with its line break, the last may be an unterminated tail.
            seg = np.concatenate(([0], breaks + 1))
            if seg[-1] == len(arr):
                seg = seg[:-1]
            nonblank = np.logical_or.reduceat(table[arr], seg)
            odd = None
            if quote is not None:
                odd = np.bitwise_xor.reduceat((arr == quote).view(np.uint8), seg).astype(bool)
            k = len(breaks)
            if k:
                line_starts = pos + seg[:k].astype(np.int64)
                line_starts[0] = line_start
                keep = nonblank[:k].copy()
                keep[0] |= line_nonblank
                if odd is not None and odd_quotes is not None:
                    parity = odd[:k].copy()
                    parity[0] ^= line_odd
                    bad = np.flatnonzero(parity & keep)
                    if len(bad):
                        first = int(bad[0])
                        line_no = emitted + int(np.count_nonzero(keep[:first]))
                        raise odd_quotes(int(line_starts[first]), line_no)
                kept = line_starts[keep]
                starts.append(kept)
                emitted += len(kept)
                line_nonblank = line_odd = False
                line_start = pos + len(arr)
                if len(seg) > k:  # an unterminated tail opens the next line
                    line_start = pos + int(seg[k])
                    line_nonblank = bool(nonblank[k])
                    line_odd = bool(odd[k]) if odd is not None else False
            else:
                line_nonblank |= bool(nonblank[0])
                line_odd ^= bool(odd[0]) if odd is not None else False
            pos += len(arr)
    if line_nonblank and line_start < pos:
        if line_odd and odd_quotes is not None:
            raise odd_quotes(line_start, emitted)
        starts.append(np.array([line_start], dtype=np.int64))
    starts.append(np.array([pos], dtype=np.int64))
    return np.concatenate(starts).astype(np.uint64)


def read_span(path: str, begin: int, end: int) -> bytes:
    """Bytes ``[begin, end)`` of ``path`` in one read; a short read means the file shrank."""
    with open_random(path) as f:
        try:
            data = bytes(f.read_at(end - begin, begin)) if end > begin else b""
        except (OSError, pa.ArrowException) as exc:
            raise DataError(f"cannot read bytes [{begin}, {end}): {exc}", path=path) from exc
    if len(data) != end - begin:
        raise DataError(
            f"read {len(data)} bytes where the index promises {end - begin}; the file changed "
            "while in use (its index is rebuilt on the next plan)",
            path=path,
            offset=begin + len(data),
        )
    return data
