"""Stepping over damaged framing (``on_error="skip"``): resynchronising a scan, and saying
what was lost.

A corrupt length field (its CRC fails) or a file cut inside its last record leaves the frames
after it with no known start: a plain scan stops there, and an index built by one cannot say
where the records after the damage are. A scan that steps over damage looks, byte by byte
after the bad header, for the first offset where a whole frame checks out (length CRC *and*
payload CRC: a random match needs two 32-bit checksums to agree, and the length must fit the
stream), and goes on from there. The damaged bytes between keep **one record number** in the
index (its *lost* record, see :mod:`shmloader.formats.index`), so every reader numbers the
records after it alike, and reading that number yields an error that says which bytes were
stepped over and how many records they held where that can be known.

Limits, said where users read them (docs/formats.md): inside a damaged range, a payload that
itself holds a valid TFRecord frame would be taken for a record; a record of 2**40 bytes or
more is not looked for (its length's top bytes are not zero).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..errors import CorruptRecordError, IndexMismatchError, TruncatedRecordError
from ._compression import ByteSource
from ._framing import (
    BAD_LENGTH,
    BAD_PAYLOAD,
    CHUNK,
    FRAME_OVERHEAD,
    HEADER,
    HEADER_SIZE,
    MAX_READ,
    U32,
    frame_error,
    length_crc,
    read_at_least,
    scan,
)
from .checksum import masked_crc32c


class LostRange(NamedTuple):
    """Damaged framing a scan stepped over: the record number it keeps, its byte range
    ``[start, stop)`` (in the uncompressed stream) and the error that describes it."""

    record: int
    start: int
    stop: int
    error: CorruptRecordError


class ResyncScan(NamedTuple):
    """What a scan that steps over damage found: ``offsets`` (n + 1, lost records
    included), the lost ranges, and (with ``verify``) records whose payload CRC fails,
    which keep their number like any record and are skipped when read."""

    offsets: np.ndarray
    lost: tuple[LostRange, ...]
    bad: tuple[CorruptRecordError, ...]


class _Window:
    """The stream's bytes from absolute offset ``base`` on, read as needed."""

    def __init__(self, source: ByteSource) -> None:
        self.source = source
        self.buf = b""
        self.base = source.position
        self.eof = False

    @property
    def end(self) -> int:
        return self.base + len(self.buf)

    def drop_before(self, offset: int) -> None:
        cut = offset - self.base
        if cut > 0:
            self.buf = self.buf[cut:]
            self.base = offset

    def more(self, n: int) -> bool:
        """Append at least ``n`` more bytes (fewer at the end); whether any came."""
        if self.eof:
            return False
        chunk = read_at_least(self.source, max(CHUNK, n))
        if not chunk:
            self.eof = True
            return False
        self.buf = self.buf + chunk if self.buf else chunk
        return True


def scan_resync(source: ByteSource, path: str, *, verify: bool) -> ResyncScan:
    """Offsets of every frame of ``source``, stepping over damaged framing (module doc).

    The clean path is :func:`~shmloader.formats._framing.scan` over large reads, as in a
    plain scan, so files without damage cost the same.
    """
    w = _Window(source)
    parts: list[np.ndarray] = []
    lost: list[LostRange] = []
    bad: list[CorruptRecordError] = []
    count = 0
    pos = w.base
    while True:
        found: list[int] = []
        rel, status, need = scan(w.buf, pos - w.base, found, None, verify)
        if found:
            parts.append(np.asarray(found, dtype=np.uint64) + np.uint64(w.base))
            count += len(found)
        pos = w.base + rel
        if status == BAD_PAYLOAD:  # the frame is where its header says: a record, bad
            bad.append(frame_error(status, w.buf, rel, path=path, offset=pos, index=count))
            parts.append(np.array([pos], dtype=np.uint64))
            count += 1
            pos += HEADER.unpack_from(w.buf, rel)[0] + FRAME_OVERHEAD
            continue
        if status == BAD_LENGTH:
            head = w.buf[rel : rel + HEADER_SIZE]
            stop = _resync(w, pos)
            # Only the range's own bytes, as a reader of the index sees them (read_lost): a
            # range shorter than a header (stray bytes before a sound frame) has no header.
            head = head[: stop - pos]
            whole = w.buf[pos - w.base : stop - w.base] if w.base <= pos else None
            error = lost_error(
                head, whole, pos, stop, at_end=stop == w.end and w.eof, path=path, index=count
            )
            lost.append(LostRange(count, pos, stop, error))
            parts.append(np.array([pos], dtype=np.uint64))
            count += 1
            pos = stop
            continue
        w.drop_before(pos)
        if w.more(need - len(w.buf)):
            continue
        if w.buf:  # the stream ends inside a frame: its last record is cut short
            head = w.buf[:HEADER_SIZE]
            error = lost_error(head, w.buf, pos, w.end, at_end=True, path=path, index=count)
            lost.append(LostRange(count, pos, w.end, error))
            parts.append(np.array([pos], dtype=np.uint64))
            count += 1
        parts.append(np.array([w.end], dtype=np.uint64))
        return ResyncScan(np.concatenate(parts), tuple(lost), tuple(bad))


def _resync(w: _Window, start: int) -> int:
    """The first offset after ``start`` where a whole valid frame starts, or the stream's end.

    Bytes from ``start`` stay in the window while the range is at most MAX_READ, so that
    :func:`lost_error` can look at all of it.
    """
    q = start + 1
    while True:
        hit, resume, need = _find_frame(w.buf, q - w.base, w.eof)
        if hit is not None:
            return w.base + hit
        q = w.base + resume
        if w.eof:
            return w.end
        w.drop_before(start if w.end - start <= MAX_READ else q)
        w.more(need)


def _find_frame(buf: bytes, q: int, eof: bool) -> tuple[int | None, int, int]:
    """``(hit, resume, need)``: the first offset from ``q`` holding a whole valid frame; else
    where to go on looking once ``need`` more bytes came (a candidate whose frame runs past
    the buffer, or the first offset whose header is incomplete)."""
    n = len(buf)
    last = n - HEADER_SIZE  # the last offset where a whole header fits
    if q > last:
        return None, q, HEADER_SIZE
    arr = np.frombuffer(buf, dtype=np.uint8)
    # A length below 2**40 has zero top bytes: a cheap filter before any CRC.
    small = (
        (arr[q + 5 : last + 6] == 0) & (arr[q + 6 : last + 7] == 0) & (arr[q + 7 : last + 8] == 0)
    )
    # Nor is a header of twelve zero bytes valid (length 0 has masked CRC 0x07980329): zero
    # fill, common damage, would otherwise pass the filter at every byte, each a Python step.
    nonzero = np.concatenate(([0], np.cumsum(arr[q:] != 0, dtype=np.int64)))
    small &= nonzero[HEADER_SIZE:] > nonzero[:-HEADER_SIZE]
    for c in (np.flatnonzero(small) + q).tolist():
        length, stored = HEADER.unpack_from(buf, c)
        if stored != length_crc(length):
            continue
        end = c + length + FRAME_OVERHEAD
        if end > n:
            if eof:
                continue
            return None, c, end - n
        if (
            masked_crc32c(memoryview(buf)[c + HEADER_SIZE : end - 4])
            == U32.unpack_from(buf, end - 4)[0]
        ):
            return c, c, 0
    return None, last + 1, HEADER_SIZE


def lost_error(
    head: bytes,
    whole: bytes | None,
    start: int,
    stop: int,
    *,
    at_end: bool,
    path: str,
    index: int,
) -> CorruptRecordError:
    """The error of a lost range: what is wrong at ``start``, the bytes stepped over and how
    many records they held (known when they are one frame with a damaged header and an
    intact payload, or one record cut short at the end; otherwise said to be unknown).

    ``head``: the range's first bytes (up to a header); ``whole``: all of it, or None when
    it was too large to keep.
    """
    size = stop - start
    truncated = len(head) < HEADER_SIZE
    if truncated and not at_end:
        # A sound frame starts fewer than HEADER_SIZE bytes on: these bytes were inserted, or
        # are what is left of a header cut short with more data after it (files joined).
        truncated = False
        why = f"{size} stray bytes where a record header was expected (too few to be one)"
        held = _held(whole)
    elif truncated:
        why = f"the file ends inside a record header ({len(head)} of {HEADER_SIZE} bytes)"
        held = "part of one record header: 1 record lost"
    else:
        length, stored = HEADER.unpack_from(head, 0)
        truncated = stored == length_crc(length)
        if truncated:
            why = (
                f"the file ends inside a record ({size} of {length + FRAME_OVERHEAD} bytes; "
                "often a writer that did not finish)"
            )
            held = "one record cut short: 1 record lost"
        else:
            why = (
                f"length CRC mismatch (stored 0x{stored:08x}, computed "
                f"0x{length_crc(length):08x} for length field {length}): the header is corrupt"
            )
            held = _held(whole)
    if truncated and not at_end:
        raise IndexMismatchError(
            "the index marks damage here that the file no longer holds; the file changed "
            "after it was indexed (run `shmloader index --force`)",
            path=path,
            offset=start,
            index=index,
        )
    resumes = "the end of the data" if at_end else f"byte {stop}, where a valid record starts"
    message = (
        f"{why}; bytes {start}..{stop} ({size} bytes) were stepped over ({held}); reading "
        f"resumes at {resumes}"
    )
    cls = TruncatedRecordError if truncated else CorruptRecordError
    return cls(message, path=path, offset=start, index=index)


def _held(whole: bytes | None) -> str:
    if whole is not None and len(whole) >= FRAME_OVERHEAD:
        payload = memoryview(whole)[HEADER_SIZE:-4]
        if masked_crc32c(payload) == U32.unpack_from(whole, len(whole) - 4)[0]:
            return "one record whose length field is damaged, its payload CRC intact: 1 record lost"
    return "how many records they held cannot be known"


def read_lost(
    source: ByteSource, path: str, index: int, start: int, stop: int, *, at_end: bool
) -> CorruptRecordError:
    """Read past lost record ``index`` (``source`` is at ``start``) and return its error.

    A range larger than MAX_READ is read in pieces and not kept (its first bytes still say
    what is wrong). Fewer bytes than the index says raise IndexMismatchError.
    """
    size = stop - start
    first = read_at_least(source, min(size, MAX_READ))
    got = len(first)
    while got < size:
        more = len(source.read(min(size - got, CHUNK)))
        if not more:
            break
        got += more
    if got < size:
        raise IndexMismatchError(
            f"the file ends {size - got} bytes before where its index says lost record {index} "
            "ends; the file changed after it was indexed",
            path=path,
            offset=start + got,
        )
    whole = first if len(first) == size else None
    return lost_error(
        first[:HEADER_SIZE], whole, start, stop, at_end=at_end, path=path, index=index
    )
