"""The TFRecord frame and the loops that walk it; the public face is shmloader.formats.tfrecord.

A frame is ``uint64 length | uint32 masked_crc32c(length bytes) | payload | uint32
masked_crc32c(payload)``, all little-endian, so a frame is ``length + 16`` bytes.

Every loop here works on one large ``bytes`` buffer with ``struct.unpack_from`` and
collects results into lists, because per-record Python work (not I/O) is what limits
throughput: one call of :func:`scan` handles thousands of frames, and the readers above it
issue one read per few megabytes, never one per record.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any, NamedTuple

import crc32c as _crc32c_impl
import numpy as np

from ..errors import CorruptRecordError, IndexMismatchError, TruncatedRecordError
from ._compression import ByteSource
from .checksum import MASK_DELTA, masked_crc32c
from .payloads import Payloads, strided_rows

HEADER = struct.Struct("<QI")
U32 = struct.Struct("<I")
HEADER_SIZE = 12
FRAME_OVERHEAD = 16
# Sequential scans read this much at a time; indexed range reads group records into blocks
# of at most BLOCK bytes (a single larger record is read on its own). A block is read, checked,
# decoded and copied into shared memory while it is still in the CPU cache (L2/L3), which
# a larger block outgrows; a smaller one costs more calls per record. 2 MiB is where a reader's
# steps cost least (benchmarks/bench_reader_steps.py).
CHUNK = 4 << 20
BLOCK = 2 << 20
# A damaged length that passed its CRC by chance could ask for exabytes: never read more
# than this in one call, and stop at the end of the file.
MAX_READ = 256 << 20

OK, BAD_LENGTH, BAD_PAYLOAD = 0, 1, 2

# Length field -> its masked CRC. Record sizes repeat (often one size per file), so a dict
# hit replaces a slice and a CRC call per record. Bounded so odd files cannot grow it.
_LENGTH_CRCS: dict[int, int] = {}
_LENGTH_CRCS_MAX = 1 << 16


def length_crc(length: int) -> int:
    crc = _LENGTH_CRCS.get(length)
    if crc is None:
        crc = masked_crc32c(struct.pack("<Q", length))
        if len(_LENGTH_CRCS) >= _LENGTH_CRCS_MAX:
            _LENGTH_CRCS.clear()
        _LENGTH_CRCS[length] = crc
    return crc


def frame_header(length: int) -> bytes:
    return HEADER.pack(length, length_crc(length))


def encode_frame(payload: bytes) -> bytes:
    """One complete frame for ``payload`` (bytes-like), byte-identical to TensorFlow's."""
    return b"".join((frame_header(len(payload)), payload, U32.pack(masked_crc32c(payload))))


def scan(
    buf: bytes, pos: int, offsets: list[int], payloads: list[bytes] | None, verify: bool
) -> tuple[int, int, int]:
    """Walk complete frames of ``buf`` from ``pos``; append their starts (and payloads).

    Returns ``(pos, status, need)``: ``pos`` is where walking stopped; ``status`` is OK when
    the buffer ran out (``need`` is then the size of the frame that did not fit, 12 when even
    its header is incomplete, 0 when ``pos == len(buf)``), else BAD_LENGTH / BAD_PAYLOAD for
    the frame at ``pos``. The length CRC is always checked (a wrong length would derail every
    later frame); the payload CRC only with ``verify``.
    """
    end_of_buf = len(buf)
    unpack_header = HEADER.unpack_from
    unpack_u32 = U32.unpack_from
    crc = _crc32c_impl.crc32c
    known = _LENGTH_CRCS
    add_offset = offsets.append
    add_payload = payloads.append if payloads is not None else None
    delta = MASK_DELTA
    while True:
        if end_of_buf - pos < HEADER_SIZE:
            return pos, OK, (HEADER_SIZE if end_of_buf > pos else 0)
        length, stored = unpack_header(buf, pos)
        expected = known.get(length)
        if expected is None:
            expected = length_crc(length)
        if stored != expected:
            return pos, BAD_LENGTH, 0
        end = pos + length + FRAME_OVERHEAD
        if end > end_of_buf:
            return pos, OK, length + FRAME_OVERHEAD
        if verify:
            payload = buf[pos + HEADER_SIZE : end - 4]
            c = crc(payload)
            if (((c >> 15) | (c << 17)) + delta) & 0xFFFFFFFF != unpack_u32(buf, end - 4)[0]:
                return pos, BAD_PAYLOAD, 0
            if add_payload is not None:
                add_payload(payload)
        elif add_payload is not None:
            add_payload(buf[pos + HEADER_SIZE : end - 4])
        add_offset(pos)
        pos = end


def frame_error(
    status: int, buf: bytes, pos: int, *, path: str, offset: int, index: int | None
) -> CorruptRecordError:
    """The exception for a frame that :func:`scan` stopped at, with both CRCs in the text."""
    length, stored = HEADER.unpack_from(buf, pos)
    if status == BAD_LENGTH:
        why = (
            f"length CRC mismatch (stored 0x{stored:08x}, computed "
            f"0x{length_crc(length):08x} for length field {length}): the header is corrupt"
        )
    else:
        end = pos + length + FRAME_OVERHEAD
        (stored_payload,) = U32.unpack_from(buf, end - 4)
        actual = masked_crc32c(memoryview(buf)[pos + HEADER_SIZE : end - 4])
        why = (
            f"payload CRC mismatch in a {length}-byte record (stored "
            f"0x{stored_payload:08x}, computed 0x{actual:08x}): the payload is corrupt"
        )
    return CorruptRecordError(why, path=path, offset=offset, index=index)


def truncation_error(
    buf: bytes, pos: int, *, path: str, offset: int, index: int
) -> TruncatedRecordError:
    have = len(buf) - pos
    if have < HEADER_SIZE:
        why = f"the file ends inside a record header ({have} of {HEADER_SIZE} bytes)"
    else:
        (length,) = struct.unpack_from("<Q", buf, pos)
        why = (
            f"the file ends inside a record ({have} of {length + FRAME_OVERHEAD} bytes; "
            "often a writer that did not finish)"
        )
    return TruncatedRecordError(why, path=path, offset=offset, index=index)


def read_at_least(source: ByteSource, n: int) -> bytes:
    """``n`` bytes from ``source`` (fewer only at its end), in reads of at most MAX_READ."""
    first = source.read(min(n, MAX_READ))
    if len(first) >= n or not first:
        return first
    parts = [first]
    got = len(first)
    while got < n:
        more = source.read(min(n - got, MAX_READ))
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def iter_chunks(
    source: ByteSource, path: str, *, verify: bool, want_payloads: bool
) -> Iterator[tuple[int, list[int], list[bytes]]]:
    """Walk the whole stream: per chunk, ``(base offset, frame starts - base, payloads)``.

    Raises CorruptRecordError at the first bad frame and TruncatedRecordError when the
    stream ends inside a frame, naming offset and record index.
    """
    buf = b""
    pos = 0
    base = source.position
    index = 0
    need = 0
    while True:
        rest = len(buf) - pos
        chunk = read_at_least(source, max(CHUNK, need - rest))
        if not chunk:
            if rest:
                raise truncation_error(buf, pos, path=path, offset=base + pos, index=index)
            return
        base += pos
        buf = buf[pos:] + chunk if rest else chunk
        offsets: list[int] = []
        payloads: list[bytes] = []
        pos, status, need = scan(buf, 0, offsets, payloads if want_payloads else None, verify)
        if offsets:
            yield base, offsets, payloads
            index += len(offsets)
        if status != OK:
            raise frame_error(status, buf, pos, path=path, offset=base + pos, index=index)


class Run(NamedTuple):
    """Consecutive good records: the first one's index, their byte offsets and payloads.

    Payloads are ``bytes``, or zero-copy ``memoryview`` slices of the block read when views
    were asked for (:func:`iter_indexed_runs`).
    """

    first: int
    offsets: list[int]
    payloads: list[Any]


class Bad(NamedTuple):
    """A corrupt record met with ``skip_bad``: its record index, byte offset and error."""

    record: int
    offset: int
    error: CorruptRecordError


def iter_indexed_runs(
    source: ByteSource,
    path: str,
    offsets: np.ndarray,
    start: int,
    stop: int,
    *,
    skip_bad: bool,
    verify: bool,
    views: bool = False,
) -> Iterator[Run | Bad]:
    """Records ``[start, stop)`` of a source positioned at ``offsets[start]``, in runs.

    Reads whole blocks of records (one read each). A block is first checked as a whole, with
    the frame starts the index gives (:func:`split_indexed`): no Python work per record but
    one slice and one CRC call. A block that fails that check is walked frame by frame to
    find what is wrong: frames not where the index says raise IndexMismatchError; with
    ``skip_bad`` a corrupt record becomes a :class:`Bad` and reading resumes at the next
    indexed offset.

    ``views``: payloads are ``memoryview`` slices of the block instead of ``bytes`` copies
    (each keeps its whole block alive; blocks are never reused, so a view stays valid).
    """
    i = start
    while i < stop:
        lo = int(offsets[i])
        # The key in the offsets' own type: a Python int against uint64 offsets makes numpy
        # convert the whole array on every call.
        end = offsets.dtype.type(lo + BLOCK)
        j = int(np.searchsorted(offsets, end, side="right")) - 1
        j = min(max(j, i + 1), stop)
        hi = int(offsets[j])
        sliced_from = None if views else source.mapped_at()  # bytes copies: from the mapping
        mapped = source.view(hi - lo)
        buf = read_at_least(source, hi - lo) if mapped is None else mapped
        if len(buf) < hi - lo:
            raise IndexMismatchError(
                f"the file ends {hi - lo - len(buf)} bytes before where its index says record "
                f"{j - 1} ends; the file changed after it was indexed",
                path=path,
                offset=lo + len(buf),
            )
        rel = offsets[i : j + 1].astype(np.int64) - lo
        payloads = split_indexed(
            memoryview(buf) if views else buf, rel, verify, sliced_from=sliced_from
        )
        if payloads is not None:
            yield Run(i, (rel[:-1] + lo).tolist(), payloads)
        else:
            whole = bytes(buf)  # a mapped block too: the walk takes bytes (a rare path)
            for item in _walk_block(whole, lo, rel.tolist(), i, j, path, skip_bad, verify):
                if views and isinstance(item, Run):
                    item = item._replace(payloads=[memoryview(p) for p in item.payloads])
                yield item
        i = j


def split_indexed(
    buf: bytes | memoryview,
    rel: np.ndarray,
    verify: bool,
    *,
    sliced_from: tuple[Any, int] | None = None,
) -> list[Any] | None:
    """The payloads of ``buf`` if it holds exactly the valid frames starting at ``rel[:-1]``.

    ``rel`` gives each frame's start in ``buf`` and, last, ``len(buf)``. Lengths, length CRCs
    and payload CRCs are compared for all frames at once with numpy; None means some frame is
    not what the index says or is corrupt, and the caller walks the block to say which.
    The payloads are slices of ``buf``, or with ``sliced_from=(mapping, offset)`` (``buf`` lies
    at ``offset`` in a file mapping, ``_mapped.py``) slices of the mapping itself: slicing
    ``bytes`` or a mapping gives ``bytes`` copies in one step, slicing a ``memoryview`` gives
    views. When all are one length, they come in a :class:`Payloads` that also views them as
    the rows of one array.
    """
    starts = rel[:-1]
    lengths = np.diff(rel) - FRAME_OVERHEAD
    if not len(starts) or int(rel[-1]) != len(buf):
        return None
    shortest, longest = int(lengths.min()), int(lengths.max())
    if shortest < 0:
        return None
    if shortest == longest:
        return _split_one_length(buf, len(starts), shortest, verify, sliced_from)
    data = np.frombuffer(buf, np.uint8)
    header = data[starts[:, None] + np.arange(HEADER_SIZE)]
    # As int64 like ``lengths``: uint64 against int64 would compare as float64, a cast per frame.
    if not np.array_equal(header[:, :8].copy().view("<i8")[:, 0], lengths):
        return None
    known = np.unique(lengths)
    crcs = np.array([length_crc(int(n)) for n in known], dtype=np.uint32)
    if not np.array_equal(
        header[:, 8:].copy().view("<u4")[:, 0], crcs[np.searchsorted(known, lengths)]
    ):
        return None
    ends = rel[1:] - 4
    whole, at = sliced_from or (buf, 0)
    spans = zip((starts + (at + HEADER_SIZE)).tolist(), (ends + at).tolist(), strict=True)
    payloads = [whole[a:b] for a, b in spans]
    if verify and not _crcs_match(payloads, data[ends[:, None] + np.arange(4)]):
        return None
    return payloads


def _split_one_length(
    buf: bytes | memoryview,
    count: int,
    length: int,
    verify: bool,
    sliced_from: tuple[Any, int] | None = None,
) -> Payloads | None:
    """:func:`split_indexed` for ``count`` frames of one payload ``length`` (the usual block).

    The frames lie evenly spaced from the block's start, so every field is one strided view:
    each header must be the same 12 bytes, and the payloads are also the rows of one array
    (:func:`~shmloader.formats.payloads.payload_rows` hands that out, joining nothing).
    """
    stride = length + FRAME_OVERHEAD
    header = np.frombuffer(frame_header(length), "<u4")
    if not (strided_rows(buf, 0, count, HEADER_SIZE, stride).view("<u4") == header).all():
        return None
    whole, at = sliced_from or (buf, 0)
    firsts = range(at + HEADER_SIZE, at + count * stride, stride)
    payloads = [whole[a : a + length] for a in firsts]
    if verify and not _crcs_match(payloads, strided_rows(buf, stride - 4, count, 4, stride)):
        return None
    return Payloads(payloads, strided_rows(buf, HEADER_SIZE, count, length, stride))


def _crcs_match(payloads: list[Any], stored: np.ndarray) -> bool:
    """Whether each payload's masked CRC is its stored one (``stored``: (n, 4) bytes)."""
    crc = np.fromiter(map(_crc32c_impl.crc32c, payloads), dtype=np.uint32, count=len(payloads))
    masked = ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(MASK_DELTA)
    return bool((stored.view("<u4")[:, 0] == masked).all())


def _walk_block(
    buf: bytes,
    lo: int,
    expected: list[int],
    i: int,
    j: int,
    path: str,
    skip_bad: bool,
    verify: bool,
) -> Iterator[Run | Bad]:
    """Records ``i..j`` of a block frame by frame, checking each start against the index."""
    k = i
    pos = 0
    while k < j:
        found: list[int] = []
        payloads: list[bytes] = []
        pos, status, _ = scan(buf, pos, found, payloads, verify)
        n = len(found)
        indexed = expected[k - i : k - i + n]
        matches = found == indexed
        where = pos  # the first frame that is not where the index says
        if matches and status == OK:
            matches = pos == len(buf) and k + n == j
        elif matches:
            matches = k + n < j and pos == expected[k + n - i]
        else:
            pairs = enumerate(zip(found, indexed, strict=False))  # indexed may be shorter
            first = next((t for t, (a, b) in pairs if a != b), n)
            n, where = first, indexed[first] if first < len(indexed) else found[first]
        if not matches:
            raise IndexMismatchError(
                "record boundaries differ from the index; the file changed after it was "
                "indexed (remove the stale index or run `shmloader index --force`)",
                path=path,
                offset=lo + where,
                index=k + n,
            )
        if n:
            yield Run(k, [lo + rel for rel in found], payloads)
        k += n
        if status != OK:
            error = frame_error(status, buf, pos, path=path, offset=lo + pos, index=k)
            if not skip_bad:
                raise error
            yield Bad(k, lo + pos, error)
            k += 1
            pos = expected[k - i]


def decode_frames(
    buf: bytes | bytearray | memoryview, *, path: str = "<buffer>", base_offset: int = 0
) -> tuple[list[bytes], int]:
    """Complete, CRC-valid payloads at the start of ``buf`` and where that valid prefix ends.

    Built for append-only logs that may end in a torn write:

    * a last frame cut short (header or payload incomplete) ends the prefix, no error;
    * a frame whose length CRC fails ends the prefix if every byte from that frame's start
      to the end of ``buf`` is zero (a crash after the file grew but before data landed);
    * a frame whose payload CRC fails ends the prefix if nothing but zero bytes follows the
      end of that frame (none at all, or zero fill);
    * any other CRC failure, i.e. one followed by more (non-zero) data, raises
      :class:`CorruptRecordError`: records after it would otherwise be dropped silently.

    The returned offset is ``base_offset + length of the valid prefix`` (``base_offset`` is
    where ``buf`` starts in the file; it is also used in error messages). A memoryview or
    bytearray is copied once.
    """
    data = buf if isinstance(buf, bytes) else bytes(buf)
    records: list[bytes] = []
    starts: list[int] = []
    pos, status, _ = scan(data, 0, starts, records, True)
    if status == OK:
        return records, base_offset + pos
    if status == BAD_LENGTH:
        tail_from = pos
    else:
        (length,) = struct.unpack_from("<Q", data, pos)
        tail_from = pos + length + FRAME_OVERHEAD
    if not data[tail_from:].strip(b"\x00"):
        return records, base_offset + pos
    raise frame_error(status, data, pos, path=path, offset=base_offset + pos, index=len(records))
