"""Random truncation and bit flips of a valid file: reading either fails with one of our
DataError subclasses or returns records equal to the originals; never anything else."""

from __future__ import annotations

import os
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shmloader.errors import CorruptRecordError, DataError
from shmloader.formats.tfrecord import (
    RecordFile,
    decode_frames,
    encode_frame,
    read_records,
    write_records,
)

RECORDS = [bytes([i % 251]) * (i * 7 % 97) for i in range(60)] + [os.urandom(3000)]
DATA = b"".join(encode_frame(r) for r in RECORDS)
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _read(blob: bytes) -> list[bytes]:
    # A fresh directory per example: hypothesis reruns the test body many times.
    with tempfile.TemporaryDirectory(prefix="shmloader-fuzz-") as tmp:
        path = os.path.join(tmp, "fuzz.tfrecord")
        with open(path, "wb") as f:
            f.write(blob)
        return list(read_records(path))


def _check(blob: bytes) -> None:
    try:
        got = _read(blob)
    except DataError as exc:
        assert "fuzz.tfrecord" in str(exc)
        return
    assert got == RECORDS[: len(got)]


@FUZZ
@given(cut=st.integers(0, len(DATA)))
def test_truncation(cut: int) -> None:
    try:
        got = _read(DATA[:cut])
    except DataError as exc:
        assert "fuzz.tfrecord" in str(exc) and exc.offset is not None
        return
    # Only a cut exactly between records reads cleanly, and then it is a prefix.
    assert got == RECORDS[: len(got)]
    assert len(b"".join(encode_frame(r) for r in got)) == cut


@FUZZ
@given(flips=st.lists(st.tuples(st.integers(0, len(DATA) - 1), st.integers(0, 7)), min_size=1))
def test_bit_flips(flips: list[tuple[int, int]]) -> None:
    blob = bytearray(DATA)
    for at, bit in flips:
        blob[at] ^= 1 << bit
    _check(bytes(blob))


@FUZZ
@given(
    cut=st.integers(0, len(DATA)),
    flips=st.lists(st.tuples(st.integers(0, len(DATA) - 1), st.integers(0, 7)), max_size=3),
)
def test_decode_frames_never_returns_wrong_records(cut: int, flips: list[tuple[int, int]]) -> None:
    blob = bytearray(DATA)
    for at, bit in flips:
        blob[at] ^= 1 << bit
    try:
        got, end = decode_frames(bytes(blob[:cut]), path="journal")
    except DataError as exc:
        assert "journal" in str(exc)
        return
    assert got == RECORDS[: len(got)]
    assert end == len(b"".join(encode_frame(r) for r in got))


@FUZZ
@given(flips=st.lists(st.tuples(st.integers(0, len(DATA) - 1), st.integers(0, 7)), min_size=1))
def test_skip_mode_under_a_fresh_index(flips: list[tuple[int, int]]) -> None:
    # Bit rot after indexing (mtime kept): every record comes back intact or as its error.
    with tempfile.TemporaryDirectory(prefix="shmloader-fuzz-") as tmp:
        path = os.path.join(tmp, "fuzz.tfrecord")
        write_records(path, RECORDS)
        st_before = os.stat(path)
        blob = bytearray(DATA)
        for at, bit in flips:
            blob[at] ^= 1 << bit
        with open(path, "r+b") as f:
            f.write(blob)
        os.utime(path, ns=(st_before.st_atime_ns, st_before.st_mtime_ns))
        rf = RecordFile(path)
        try:
            got = list(rf.read_range(0, len(RECORDS), on_error="skip"))
        except DataError as exc:
            assert "fuzz.tfrecord" in str(exc)
            return
    assert [i for i, _, _ in got] == list(range(len(RECORDS)))
    for i, _, value in got:
        assert isinstance(value, CorruptRecordError) or value == RECORDS[i]
