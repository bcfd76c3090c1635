"""Walking tar headers directly: members with their header offsets, without ``tarfile``.

``tarfile`` hides where a member's headers start, and an index needs exactly that: the first
byte of a member is its first *extended* header (a GNU ``L`` long-name header or a pax ``x``
header) when it has one. Handled: ustar (with the ``prefix`` field), GNU long names (``L``)
and long links (``K``, ignored), pax ``path`` and ``size`` records, pax global headers (``g``,
ignored), base-256 sizes, header checksums. Sparse members (``S``) are refused.

Grouping into WebDataset samples follows webdataset's ``base_plus_ext`` and
``group_by_keys``: the key is the path up to the first ``.`` of the base name, the field is
the rest, lower-cased; consecutive members with the same key form one sample, and a field
seen twice starts a new sample. Members that are not regular files, names without such a dot,
and top-level ``__*__`` names are not part of any sample.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from ..errors import CorruptRecordError, TruncatedRecordError

BLOCK = 512
_ZERO = bytes(BLOCK)
_REGULAR = (b"0", b"\0", b"7")
_KEY_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")

Read = Callable[[int, int], bytes]
"""``read(offset, n)``: up to ``n`` bytes of the archive at ``offset`` (fewer at its end)."""


@dataclass(frozen=True, slots=True)
class Member:
    name: str
    start: int  # first byte of its first header (extended headers included)
    data: int  # first byte of its contents
    size: int
    regular: bool


def walk(read: Read, path: str, begin: int, end: int) -> Iterator[Member]:
    """Members whose headers start in ``[begin, end)``; stops early at the end-of-archive
    block. A member whose contents run past ``end`` is a TruncatedRecordError.

    Header checksums are verified in numpy batches of a few thousand headers and before the
    walk ends, so a caller that consumes the whole walk never keeps a member whose header
    is damaged (one that stops early must not trust what it got).
    """
    sums = _Checksums(path)
    pos = begin
    first: int | None = None
    long_name: str | None = None
    pax: dict[str, str] = {}
    while pos < end:
        header = read(pos, BLOCK)
        if header == _ZERO or (len(header) < BLOCK and not header.strip(b"\0")):
            sums.check()
            return
        if len(header) < BLOCK:
            raise TruncatedRecordError(
                "the archive ends inside a tar header", path=path, offset=pos
            )
        sums.add(pos, header)
        size = _size(header[124:136], path, pos)
        flag = header[156:157]
        data = pos + BLOCK
        if first is None:
            first = pos
        if flag in (b"L", b"K", b"x", b"g"):
            contents = read(data, size) if flag != b"g" else b""
            if flag != b"g" and len(contents) < size:
                raise TruncatedRecordError(
                    "the archive ends inside a tar header", path=path, offset=pos
                )
            if flag == b"L":
                long_name = _text(contents.rstrip(b"\0"), path, pos)
            elif flag == b"x":
                pax.update(_pax(contents, path, pos))
            pos = data + _padded(size)
            continue
        if flag == b"S":
            raise CorruptRecordError("sparse tar members are not supported", path=path, offset=pos)
        name = pax.get("path") or long_name or _ustar_name(header, path, pos)
        if "size" in pax:
            size = _pax_int(pax["size"], path, pos)
        if data + size > end:
            raise TruncatedRecordError(
                f"tar member {name!r} needs {size} bytes, the archive ends before",
                path=path,
                offset=pos,
            )
        yield Member(name, first, data, size, flag in _REGULAR)
        first, long_name, pax = None, None, {}
        pos = data + _padded(size)
    sums.check()


def sample_key(member: Member) -> tuple[str, str] | None:
    """(key, field) of a member as webdataset groups it, or None when it belongs to none."""
    if not member.regular:
        return None
    name = member.name
    if "/" not in name and name.startswith("__") and name.endswith("__"):
        return None
    match = _KEY_RE.match(name)
    if match is None:
        return None
    return match.group(1), match.group(2).lower()


def samples(members: Iterator[Member]) -> Iterator[tuple[str, int, list[tuple[str, Member]]]]:
    """(key, offset of its first header, [(field, member)...]) per sample, in archive order."""
    key: str | None = None
    start = 0
    fields: list[tuple[str, Member]] = []
    seen: set[str] = set()
    for member in members:
        split = sample_key(member)
        if split is None:
            continue
        k, field = split
        if k != key or field in seen:
            if key is not None:
                yield key, start, fields
            key, start, fields, seen = k, member.start, [], set()
        fields.append((field, member))
        seen.add(field)
    if key is not None:
        yield key, start, fields


class _Checksums:
    """Header checksums verified with one numpy pass per batch, not a Python sum each."""

    BATCH = 4096

    def __init__(self, path: str) -> None:
        self.path = path
        self.offsets: list[int] = []
        self.headers: list[bytes] = []

    def add(self, pos: int, header: bytes) -> None:
        self.offsets.append(pos)
        self.headers.append(header)
        if len(self.headers) >= self.BATCH:
            self.check()

    def check(self) -> None:
        if not self.headers:
            return
        rows = np.frombuffer(b"".join(self.headers), dtype=np.uint8).reshape(-1, BLOCK)
        field = rows[:, 148:156]
        actual = rows.sum(axis=1, dtype=np.int64) - field.sum(axis=1, dtype=np.int64) + 256
        # tarfile and GNU tar write 6 octal digits then NUL and space; others: slow path.
        digits = field[:, :6].astype(np.int64) - 0x30
        simple = ((digits >= 0) & (digits <= 7)).all(axis=1)
        stored = (digits * (8 ** np.arange(5, -1, -1))).sum(axis=1)
        for i in np.flatnonzero(~simple | (stored != actual)).tolist():
            _check_sum(self.headers[i], self.path, self.offsets[i])
        self.offsets, self.headers = [], []


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def _check_sum(header: bytes, path: str, pos: int) -> None:
    stored = header[148:156].split(b"\0", 1)[0].strip()
    try:
        expected = int(stored, 8)
    except ValueError as exc:
        raise CorruptRecordError(
            "not a tar header (bad checksum field)", path=path, offset=pos
        ) from exc
    actual = sum(header) - sum(header[148:156]) + 256  # the field counts as spaces
    if actual != expected:
        raise CorruptRecordError(
            f"tar header checksum {expected} does not match its bytes ({actual}); the archive "
            "is damaged or this is not a tar file",
            path=path,
            offset=pos,
        )


def _size(field: bytes, path: str, pos: int) -> int:
    if field[0] & 0x80:  # base-256 (GNU), for members over 8 GiB
        return int.from_bytes(field[1:], "big")
    digits = field.split(b"\0", 1)[0].strip()
    try:
        return int(digits, 8) if digits else 0
    except ValueError as exc:
        raise CorruptRecordError(f"bad tar size field {field!r}", path=path, offset=pos) from exc


def _ustar_name(header: bytes, path: str, pos: int) -> str:
    name = header[:100].split(b"\0", 1)[0]
    if header[257:263] == b"ustar\0":  # POSIX; GNU ("ustar  ") uses the prefix bytes otherwise
        prefix = header[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return _text(name, path, pos)


def _text(raw: bytes, path: str, pos: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptRecordError(
            f"tar member name {raw!r} is not UTF-8", path=path, offset=pos
        ) from exc


def _pax(contents: bytes, path: str, pos: int) -> dict[str, str]:
    """Records ``"<len> <key>=<value>\\n"`` of a pax extended header."""
    out: dict[str, str] = {}
    i = 0
    while i < len(contents) and contents[i : i + 1] not in (b"\0", b""):
        space = contents.find(b" ", i)
        try:
            length = int(contents[i:space])
        except ValueError as exc:
            raise CorruptRecordError("bad pax header record", path=path, offset=pos) from exc
        if length <= space - i:
            raise CorruptRecordError(f"bad pax record length {length}", path=path, offset=pos)
        record = contents[space + 1 : i + length - 1]  # without the trailing newline
        key, _, value = record.partition(b"=")
        out[_text(key, path, pos)] = _text(value, path, pos)
        i += length
    return out


def _pax_int(value: str, path: str, pos: int) -> int:
    try:
        return int(value)
    except ValueError as exc:
        raise CorruptRecordError(f"bad pax size {value!r}", path=path, offset=pos) from exc
