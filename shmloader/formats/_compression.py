"""Byte streams under the TFRecord framing: plain files, gzip and zlib (TensorFlow's options).

TensorFlow's ``TFRecordOptions(compression_type="GZIP" | "ZLIB")`` compresses the *whole*
stream of frames (not each record), as one gzip member or one zlib stream. Reading record
``i`` therefore means inflating everything before it; see docs/formats.md.

Detection (``compression="auto"``) looks at the first bytes, in this order:

1. fewer than 2 bytes: uncompressed (an empty file holds zero records);
2. the first 12 bytes are a valid TFRecord length header (its masked CRC matches):
   uncompressed. This comes first because a record length whose low bytes happen to be
   ``1f 8b`` (35,615 + k * 65,536) would otherwise be taken for gzip; a compressed stream
   passes this check by chance once in 2**32;
3. ``1f 8b`` (gzip magic): gzip;
4. a valid zlib header (deflate method, window <= 32 KiB, header checksum divisible by 31,
   no preset dictionary): zlib;
5. otherwise by extension: ``.gz`` gzip, ``.zz`` / ``.zlib`` zlib, anything else
   uncompressed (and reading then reports the corrupt header at offset 0).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from .. import _fs
from ..errors import ConfigError, CorruptRecordError, DataError, TruncatedRecordError
from .checksum import masked_crc32c

COMPRESSIONS: tuple[str | None, ...] = (None, "gzip", "zlib")
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "zlib": zlib.MAX_WBITS}
_EXTENSIONS = {".gz": "gzip", ".gzip": "gzip", ".zz": "zlib", ".zlib": "zlib"}
# Compressed input is read in pieces of this size; uncompressed reads are sized by callers.
_RAW_CHUNK = 1 << 20

Progress = Callable[[int], object]


def resolve_compression(path: str, compression: str | None) -> str | None:
    """Validate ``compression`` and resolve ``"auto"`` by looking at the file."""
    if compression == "auto":
        return detect_compression(path)
    return check_compression(compression)


def check_compression(compression: str | None) -> str | None:
    if compression not in COMPRESSIONS:
        raise ConfigError(
            f"compression={compression!r} is not supported; use None, 'gzip', 'zlib' "
            "(or 'auto' when reading)"
        )
    return compression


def detect_compression(path: str) -> str | None:
    """Apply the rule in this module's docstring to the file's first 12 bytes."""
    with _fs.open_stream(path) as stream:
        try:
            head = bytes(stream.read(12))
        except (OSError, pa.ArrowException) as exc:
            raise DataError(f"cannot read: {exc}", path=path, offset=0) from exc
    return sniff_compression(head, path)


def sniff_compression(head: bytes, name: str = "") -> str | None:
    if len(head) < 2:
        return None
    if len(head) >= 12 and struct.unpack_from("<I", head, 8)[0] == masked_crc32c(head[:8]):
        return None
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    cmf, flg = head[0], head[1]
    if cmf & 0x0F == 8 and cmf >> 4 <= 7 and (cmf << 8 | flg) % 31 == 0 and not flg & 0x20:
        return "zlib"
    lowered = name.lower()
    for ext, kind in _EXTENSIONS.items():
        if lowered.endswith(ext):
            return kind
    return None


class ByteSource:
    """Sequential reads of the (uncompressed) frame stream; ``position`` is its offset."""

    position: int

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes; fewer only at the end of the stream."""
        raise NotImplementedError

    def view(self, n: int) -> memoryview | None:
        """The next ``n`` bytes without a copy, where the source has them in memory (a mapped
        file); None where it has not, and then nothing was read."""
        return None

    def mapped_at(self) -> tuple[Any, int] | None:
        """``(mapping, offset)``: the mapping whose byte ``offset`` the next :meth:`view` will
        start at, where the source is a mapped file; None where it is not."""
        return None

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> ByteSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PlainSource(ByteSource):
    """An uncompressed file from ``start``: one seek, then large sequential reads."""

    def __init__(self, path: str, start: int = 0, progress: Progress | None = None) -> None:
        self._path = path
        self._progress = progress
        self._file: Any = _fs.open_random(path) if start else _fs.open_stream(path)
        self.position = start
        if start:
            self._guard(self._file.seek, start)

    def _guard(self, call: Callable[..., Any], *args: int) -> Any:
        try:
            return call(*args)
        except (OSError, pa.ArrowException) as exc:
            raise DataError(f"read failed: {exc}", path=self._path, offset=self.position) from exc

    def read(self, n: int) -> bytes:
        data: bytes = self._guard(self._file.read, n)
        if 0 < len(data) < n:
            # Streams may return short reads before the end; only an empty read is the end.
            parts = [data]
            got = len(data)
            while got < n:
                more: bytes = self._guard(self._file.read, n - got)
                if not more:
                    break
                parts.append(more)
                got += len(more)
            data = b"".join(parts)
        self.position += len(data)
        if self._progress is not None and data:
            self._progress(len(data))
        return data

    def close(self) -> None:
        self._file.close()


class InflateSource(ByteSource):
    """A gzip (possibly multi-member) or zlib file, inflated on the fly from its start."""

    def __init__(self, path: str, compression: str, progress: Progress | None = None) -> None:
        self._path = path
        self._compression = compression
        self._wbits = _WBITS[compression]
        self._progress = progress
        self._raw = _fs.open_stream(path)
        self._inflater = zlib.decompressobj(self._wbits)
        self._input = b""
        self._raw_read = 0
        self.position = 0

    def _read_raw(self) -> bytes:
        try:
            data = bytes(self._raw.read(_RAW_CHUNK))
        except (OSError, pa.ArrowException) as exc:
            raise DataError(
                f"read failed at compressed byte {self._raw_read}: {exc}", path=self._path
            ) from exc
        self._raw_read += len(data)
        if self._progress is not None and data:
            self._progress(len(data))
        return data

    def read(self, n: int) -> bytes:
        parts: list[bytes] = []
        got = 0
        while got < n:
            if self._inflater.eof:
                if not self._input:
                    self._input = self._read_raw()
                if not self._input:
                    break
                if self._compression != "gzip":
                    raise CorruptRecordError(
                        f"data follows the end of the zlib stream (compressed byte "
                        f"{self._raw_read - len(self._input)})",
                        path=self._path,
                        offset=self.position + got,
                    )
                self._inflater = zlib.decompressobj(self._wbits)  # next gzip member
            if not self._input:
                self._input = self._read_raw()
                if not self._input:
                    if self._raw_read == 0:
                        break  # an empty file: no stream, no records
                    raise TruncatedRecordError(
                        f"the {self._compression} stream ends before its end marker",
                        path=self._path,
                        offset=self.position + got,
                    )
            try:
                out = self._inflater.decompress(self._input, n - got)
            except zlib.error as exc:
                raise self._damage(exc) from exc
            d = self._inflater
            self._input = d.unused_data if d.eof else d.unconsumed_tail
            if out:
                parts.append(out)
                got += len(out)
        self.position += got
        return b"".join(parts)

    def _damage(self, exc: zlib.error) -> CorruptRecordError:
        """The error for a stream zlib refused, located by inflating it again from the start
        in small steps: the chunk that failed here is up to a MiB of compressed data, and
        zlib says neither where in it nor how much came out before."""
        lo, hi, good = locate_damage(self._path, self._wbits)
        unit = "gzip member" if self._compression == "gzip" else "zlib stream"
        if "incorrect data check" in str(exc):
            where = (
                f"the checksum at the end of the {unit} (compressed bytes {lo}..{hi}) does "
                f"not match its data: some byte of the {unit} is damaged, and the checksum "
                "cannot say which"
            )
        else:
            where = f"the damage is at or before compressed bytes {lo}..{hi}"
        return CorruptRecordError(
            f"cannot inflate {self._compression} data ({exc}): {where}; {good} bytes "
            "inflated before it",
            path=self._path,
            offset=good,
        )

    def close(self) -> None:
        self._raw.close()


_LOCATE_STEP = 4096


def locate_damage(path: str, wbits: int) -> tuple[int, int, int]:
    """Where inflating ``path`` fails: the compressed range (``_LOCATE_STEP`` bytes) of the
    failing call, and how many bytes were inflated before it."""
    inflater = zlib.decompressobj(wbits)
    consumed = good = 0
    with _fs.open_stream(path) as raw:
        pending = b""
        while True:
            if inflater.eof and pending:
                inflater = zlib.decompressobj(wbits)  # next gzip member
            if not pending:
                pending = bytes(raw.read(_LOCATE_STEP))
                if not pending:
                    return consumed, consumed, good
            step = pending[:_LOCATE_STEP]
            try:
                good += len(inflater.decompress(step))
            except zlib.error:
                return consumed, consumed + len(step), good
            used = len(step) - len(inflater.unused_data if inflater.eof else b"")
            consumed += used
            pending = pending[used:] if inflater.eof else pending[len(step) :]


def open_source(
    path: str, compression: str | None, start: int = 0, progress: Progress | None = None
) -> ByteSource:
    """A source positioned at uncompressed offset ``start`` (compressed: inflate up to it)."""
    if compression is None:
        return PlainSource(path, start, progress)
    source = InflateSource(path, compression, progress)
    remaining = start
    try:
        while remaining:
            skipped = len(source.read(min(remaining, _RAW_CHUNK * 8)))
            if not skipped:
                raise TruncatedRecordError(
                    f"the uncompressed stream ends at {source.position}, before offset {start}",
                    path=path,
                    offset=source.position,
                )
            remaining -= skipped
    except BaseException:
        source.close()
        raise
    return source


class Sink:
    """Where the writer's frames go: the file, through a deflater when compressing."""

    def __init__(self, path: str, compression: str | None) -> None:
        self._path = path
        self._out: Any = _fs.open_output(path)
        self._deflater = (
            None
            if compression is None
            else zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, _WBITS[compression])
        )

    def write(self, data: bytes | bytearray) -> None:
        chunk = data if self._deflater is None else self._deflater.compress(data)
        if chunk:
            self._guard(lambda: self._out.write(chunk))

    def close(self) -> None:
        try:
            if self._deflater is not None:
                tail = self._deflater.flush()
                self._deflater = None
                self._guard(lambda: self._out.write(tail))
        finally:
            self._guard(self._out.close)

    def _guard(self, call: Callable[[], Any]) -> None:
        # A failed write (disk full, permissions) is not bad input: keep it an OSError, but
        # say which file.
        try:
            call()
        except (OSError, pa.ArrowException) as exc:
            raise OSError(f"{self._path}: write failed: {exc}") from exc
