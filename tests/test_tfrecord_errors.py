"""Bad input: every failure names the file and the byte offset / record index, with the
exception class that lets callers tell corruption, truncation and stale indexes apart."""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path

import pytest

from shmloader.errors import (
    CorruptRecordError,
    DataError,
    IndexMismatchError,
    TruncatedRecordError,
)
from shmloader.formats.tfrecord import (
    RecordFile,
    decode_frames,
    encode_frame,
    read_records,
    write_records,
)

RECORDS = [bytes([i]) * (10 + i) for i in range(20)]


def make_file(tmp_path: Path, name: str = "data.tfrecord") -> tuple[str, list[int]]:
    path = str(tmp_path / name)
    write_records(path, RECORDS)
    offsets = [int(o) for o in RecordFile(path).offsets]
    return path, offsets


def flip(path: str, at: int, keep_mtime: bool = False) -> None:
    """Flip one bit at byte ``at``; with ``keep_mtime`` the index still looks fresh, as
    after silent corruption on disk."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x10]))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def assert_names(exc: DataError, path: str, offset: int, index: int | None = None) -> None:
    assert path in str(exc)
    assert f"byte offset {offset}" in str(exc)
    assert exc.path == path and exc.offset == offset
    if index is not None:
        assert f"record {index}" in str(exc) and exc.index == index


def test_corrupt_length_crc(tmp_path: Path) -> None:
    path, offsets = make_file(tmp_path)
    flip(path, offsets[7] + 2)
    with pytest.raises(CorruptRecordError, match="length CRC") as info:
        list(read_records(path))
    assert not isinstance(info.value, TruncatedRecordError)
    assert_names(info.value, path, offsets[7], 7)
    # The stale index is rebuilt by a scan, which meets the same bad header.
    with pytest.raises(CorruptRecordError, match="length CRC") as info:
        _ = RecordFile(path).num_records
    assert_names(info.value, path, offsets[7], 7)


def test_corrupt_payload_crc(tmp_path: Path) -> None:
    path, offsets = make_file(tmp_path)
    flip(path, offsets[5] + 14)
    with pytest.raises(CorruptRecordError, match="payload CRC") as info:
        list(read_records(path))
    assert_names(info.value, path, offsets[5], 5)
    with pytest.raises(CorruptRecordError, match="payload CRC") as info:
        list(RecordFile(path).read_range(0, 20))
    assert_names(info.value, path, offsets[5], 5)
    # verify=False trades the payload check for speed and hands back the bytes as stored.
    got = list(read_records(path, verify=False))
    assert got[5] != RECORDS[5] and got[:5] == RECORDS[:5] and got[6:] == RECORDS[6:]


@pytest.mark.parametrize("where", ["length", "payload", "trailer"])
def test_skip_yields_errors_and_continues(tmp_path: Path, where: str) -> None:
    path, offsets = make_file(tmp_path)
    delta = {"length": 3, "payload": 13, "trailer": offsets[9] - offsets[8] - 1}[where]
    flip(path, offsets[8] + delta, keep_mtime=True)
    flip(path, offsets[12] + 13, keep_mtime=True)
    got = list(RecordFile(path).read_range(6, 15, on_error="skip"))
    assert [i for i, _, _ in got] == list(range(6, 15))
    assert [o for _, o, _ in got] == offsets[6:15]
    for i, _, value in got:
        if i in (8, 12):
            assert isinstance(value, CorruptRecordError)
            assert_names(value, path, offsets[i], i)
        else:
            assert value == RECORDS[i]
    with pytest.raises(CorruptRecordError) as info:
        list(RecordFile(path).read_range(6, 15))
    assert_names(info.value, path, offsets[8], 8)


@pytest.mark.parametrize(
    ("cut", "what"), [(5, "record header"), (12, "record ("), (20, "record (")]
)
def test_truncated_last_record(tmp_path: Path, cut: int, what: str) -> None:
    path, offsets = make_file(tmp_path)
    os.truncate(path, offsets[19] + cut)
    with pytest.raises(
        TruncatedRecordError, match=f"ends inside a {what}".replace("(", r"\(")
    ) as info:
        list(read_records(path))
    assert_names(info.value, path, offsets[19], 19)
    with pytest.raises(TruncatedRecordError) as info:
        _ = RecordFile(path).num_records
    assert_names(info.value, path, offsets[19], 19)


def test_file_shorter_than_fresh_looking_index(tmp_path: Path) -> None:
    path, offsets = make_file(tmp_path)
    rf = RecordFile(path)
    assert rf.num_records == 20  # offsets loaded now; the file shrinks afterwards
    os.truncate(path, offsets[15])
    with pytest.raises(IndexMismatchError, match="changed after it was indexed") as info:
        list(rf.read_range(10, 20))
    assert path in str(info.value)


def test_file_rewritten_under_a_loaded_index(tmp_path: Path) -> None:
    path, _ = make_file(tmp_path)
    rf = RecordFile(path)
    assert rf.num_records == 20
    write_records(path, [b"y" * 31] * 20)  # same count, other boundaries
    with pytest.raises(IndexMismatchError, match="boundaries differ") as info:
        list(rf.read_range(0, 20))
    assert path in str(info.value) and "byte offset" in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    path = str(tmp_path / "nope.tfrecord")
    with pytest.raises(DataError) as info:
        list(read_records(path))
    assert path in str(info.value)
    with pytest.raises(DataError) as info:
        RecordFile(path)
    assert path in str(info.value) and info.value.__cause__ is not None


def test_truncated_gzip(tmp_path: Path) -> None:
    path = str(tmp_path / "data.tfrecord.gz")
    write_records(path, [os.urandom(100) for _ in range(200)], compression="gzip")
    size = os.path.getsize(path)
    os.truncate(path, size // 2)
    with pytest.raises(TruncatedRecordError) as info:
        list(read_records(path))
    assert path in str(info.value) and "byte offset" in str(info.value)


def test_corrupt_gzip_and_trailing_zlib_data(tmp_path: Path) -> None:
    plain = b"".join(encode_frame(os.urandom(50)) for _ in range(100))
    bad = bytearray(gzip.compress(plain))
    bad[len(bad) // 2] ^= 0xFF
    gz = tmp_path / "bad.tfrecord.gz"
    gz.write_bytes(bytes(bad))
    with pytest.raises(CorruptRecordError) as info:
        list(read_records(gz))
    assert str(gz) in str(info.value)
    zz = tmp_path / "trailing.tfrecord.zz"
    zz.write_bytes(zlib.compress(plain) + b"junk")
    with pytest.raises(CorruptRecordError, match="follows the end of the zlib stream"):
        list(read_records(zz))


def test_gzip_damage_is_located(tmp_path: Path) -> None:
    """zlib says neither where in the compressed chunk it failed nor what came out before:
    the error must name the place (a second member whose start is damaged), and a checksum
    mismatch must say that the damage cannot be placed."""
    frames = [encode_frame(bytes(range(256)) * 8) for _ in range(50)]
    first = gzip.compress(b"".join(frames))
    second = bytearray(gzip.compress(b"".join(frames)))
    second[12] ^= 0xFF  # the deflate data of the second member, right after its header
    path = tmp_path / "two.tfrecord.gz"
    path.write_bytes(first + bytes(second))
    with pytest.raises(CorruptRecordError) as info:
        list(read_records(path))
    message = str(info.value)
    lo, hi = (int(x) for x in message.split("compressed bytes ")[1].split(";")[0].split(".."))
    assert lo <= len(first) + 12 < hi and hi - lo <= 4096, message
    assert f"{sum(map(len, frames))} bytes inflated before it" in message
    flipped = bytearray(first)
    flipped[-6] ^= 0xFF  # the member's CRC32
    path.write_bytes(bytes(flipped))
    with pytest.raises(CorruptRecordError, match="checksum cannot say which"):
        list(read_records(path))


# --- decode_frames (journal semantics) -------------------------------------------------

FRAMES = [encode_frame(p) for p in (b"alpha", b"", b"gamma" * 50)]
BUF = b"".join(FRAMES)
STARTS = [0, len(FRAMES[0]), len(FRAMES[0]) + len(FRAMES[1]), len(BUF)]


def test_decode_frames_complete_buffer() -> None:
    assert decode_frames(BUF) == ([b"alpha", b"", b"gamma" * 50], len(BUF))
    assert decode_frames(memoryview(BUF), base_offset=100) == (
        [b"alpha", b"", b"gamma" * 50],
        100 + len(BUF),
    )
    assert decode_frames(b"") == ([], 0)


def test_decode_frames_stops_at_every_torn_tail() -> None:
    for cut in range(STARTS[2], len(BUF)):
        records, end = decode_frames(BUF[:cut], base_offset=7)
        expected = 2 if cut < STARTS[3] else 3
        assert (records, end) == (
            [b"alpha", b""][:expected],
            7 + STARTS[2],
        ), cut


def test_decode_frames_bad_last_frame_is_a_torn_tail() -> None:
    damaged = bytearray(BUF)
    damaged[STARTS[2] + 20] ^= 1  # payload of the last frame
    assert decode_frames(bytes(damaged)) == ([b"alpha", b""], STARTS[2])
    zero_filled = bytes(damaged) + bytes(4096)
    assert decode_frames(zero_filled) == ([b"alpha", b""], STARTS[2])
    zero_header = BUF[: STARTS[2]] + bytes(300)
    assert decode_frames(zero_header) == ([b"alpha", b""], STARTS[2])


def test_decode_frames_raises_on_corruption_followed_by_data() -> None:
    damaged = bytearray(BUF)
    damaged[STARTS[1] + 12] ^= 1  # payload CRC of the (empty) middle frame
    with pytest.raises(CorruptRecordError, match="payload CRC") as info:
        decode_frames(bytes(damaged), path="journal.log", base_offset=1000)
    assert_names(info.value, "journal.log", 1000 + STARTS[1], 1)
    header = bytearray(BUF)
    header[STARTS[1] + 1] ^= 1  # length of the middle frame
    with pytest.raises(CorruptRecordError, match="length CRC") as info:
        decode_frames(bytes(header), path="journal.log")
    assert_names(info.value, "journal.log", STARTS[1], 1)


def test_the_first_frame_not_where_the_index_says_is_named(tmp_path: Path) -> None:
    # Records 4 and 5 become one frame of the same total size: the file keeps its size, the
    # (restored) time keeps the index fresh-looking, and the frames after them stay in place.
    path, offsets = make_file(tmp_path)
    stat = os.stat(path)
    rf = RecordFile(path)
    assert rf.num_records == 20
    with open(path, "r+b") as f:
        f.seek(offsets[4])
        f.write(encode_frame(b"z" * (offsets[6] - offsets[4] - 16)))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(IndexMismatchError, match="boundaries differ") as info:
        list(RecordFile(path).read_range(2, 20))
    # Record 5, where the index says it starts (it was at the end of the block, record 19).
    assert (info.value.index, info.value.offset) == (5, offsets[5])
