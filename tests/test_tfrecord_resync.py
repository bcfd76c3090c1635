"""Damaged framing under on_error="skip": the index steps over it (RecordFile(resync=True)),
the damage keeps one record number, every good record after it is still read, and the loss is
named (file, record, byte range, records lost). Without skip nothing changes: it raises."""

from __future__ import annotations

import gzip
import logging
import os
from pathlib import Path

import numpy as np
import pytest
from test_tfrecord_errors import RECORDS, assert_names, flip

from shmloader.errors import CorruptRecordError, TruncatedRecordError
from shmloader.formats.index import read_index, sidecar_path
from shmloader.formats.tfrecord import (
    RecordFile,
    encode_frame,
    scan_offsets,
    scan_resync,
    write_records,
)


def written(tmp_path: Path, records: list[bytes] = RECORDS) -> tuple[str, list[int]]:
    """A file of ``records`` with no index (as after copying data without its sidecars)."""
    path = str(tmp_path / "data.tfrecord")
    write_records(path, records, index=False)
    return path, [int(o) for o in scan_offsets(path)]


def overwrite(path: str, at: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data)


def read_all(rf: RecordFile) -> list[bytes | CorruptRecordError]:
    return [p for _, _, p in rf.read_range(0, rf.num_records, on_error="skip")]


def test_a_damaged_length_field_loses_one_record_and_keeps_the_rest(tmp_path: Path) -> None:
    path, offsets = written(tmp_path)
    flip(path, offsets[7] + 2)
    rf = RecordFile(path, resync=True)
    assert rf.num_records == 20 and rf.lost.tolist() == [7]
    got = read_all(rf)
    assert got[:7] == RECORDS[:7] and got[8:] == RECORDS[8:]
    error = got[7]
    assert isinstance(error, CorruptRecordError) and not isinstance(error, TruncatedRecordError)
    assert_names(error, path, offsets[7], 7)
    text = str(error)
    assert "length CRC mismatch" in text
    assert f"bytes {offsets[7]}..{offsets[8]} ({offsets[8] - offsets[7]} bytes)" in text
    assert "its payload CRC intact: 1 record lost" in text
    assert f"resumes at byte {offsets[8]}" in text
    # Offsets of the good records are where they are in the file.
    assert [o for i, o, _ in rf.read_range(8, 20)] == offsets[8:20]
    # The saved index lists the lost record; a new reader numbers records alike, no scan.
    entry = read_index(path, "tfrecord")
    assert entry is not None and entry.where == sidecar_path(path, "tfrecord")
    assert entry.lost.tolist() == [7]
    np.testing.assert_array_equal(entry.offsets, offsets)
    again = RecordFile(path, resync=True)
    assert again.lost.tolist() == [7] and read_all(again)[8:] == RECORDS[8:]
    # Reading the lost record without skip raises its error.
    with pytest.raises(CorruptRecordError) as info:
        list(again.read_range(5, 10))
    assert_names(info.value, path, offsets[7], 7)


def test_without_skip_nothing_changes_even_after_a_skipping_build(tmp_path: Path) -> None:
    path, offsets = written(tmp_path)
    flip(path, offsets[7] + 2)
    with pytest.raises(CorruptRecordError, match="length CRC") as before:
        _ = RecordFile(path).num_records
    assert_names(before.value, path, offsets[7], 7)
    assert read_index(path, "tfrecord") is None  # a failed build saves nothing
    assert RecordFile(path, resync=True).num_records == 20  # saves an index with a lost record
    with pytest.raises(CorruptRecordError, match="length CRC") as after:
        _ = RecordFile(path).num_records
    assert str(after.value) == str(before.value)


def test_damage_over_several_records_is_one_range_of_unknown_count(tmp_path: Path) -> None:
    path, offsets = written(tmp_path)
    # From inside record 5's payload to inside record 8's payload: 5 keeps a sound header
    # (its payload CRC fails when read), 6..8 lose theirs; the next sound frame is 9.
    overwrite(path, offsets[5] + 14, b"\xa5" * (offsets[8] + 14 - offsets[5] - 14))
    rf = RecordFile(path, resync=True)
    assert rf.num_records == 20 - 3 + 1 and rf.lost.tolist() == [6]
    got = read_all(rf)
    assert got[:5] == RECORDS[:5] and got[7:] == RECORDS[9:]
    assert isinstance(got[5], CorruptRecordError) and "payload CRC" in str(got[5])
    lost = got[6]
    assert isinstance(lost, CorruptRecordError)
    assert_names(lost, path, offsets[6], 6)
    assert f"bytes {offsets[6]}..{offsets[9]}" in str(lost)
    assert "how many records they held cannot be known" in str(lost)
    found = scan_resync(path, verify=True)
    assert [g.record for g in found.lost] == [6]
    assert [(g.start, g.stop) for g in found.lost] == [(offsets[6], offsets[9])]
    assert [e.index for e in found.bad] == [5]


@pytest.mark.parametrize(("cut", "held"), [(5, "part of one record header"), (20, "cut short")])
def test_a_file_cut_inside_its_last_record_keeps_the_others(
    tmp_path: Path, cut: int, held: str
) -> None:
    path, offsets = written(tmp_path)
    os.truncate(path, offsets[19] + cut)
    with pytest.raises(TruncatedRecordError):
        _ = RecordFile(path).num_records
    rf = RecordFile(path, resync=True)
    assert rf.num_records == 20 and rf.lost.tolist() == [19]
    got = read_all(rf)
    assert got[:19] == RECORDS[:19]
    assert isinstance(got[19], TruncatedRecordError)
    assert_names(got[19], path, offsets[19], 19)
    assert held in str(got[19]) and "1 record lost" in str(got[19])
    assert "resumes at the end of the data" in str(got[19])


def test_damage_with_nothing_sound_after_it_runs_to_the_end(tmp_path: Path) -> None:
    path, offsets = written(tmp_path)
    flip(path, offsets[18] + 1)
    flip(path, offsets[19] + 1)
    rf = RecordFile(path, resync=True)
    assert rf.num_records == 19 and rf.lost.tolist() == [18]
    got = read_all(rf)
    assert got[:18] == RECORDS[:18]
    assert f"bytes {offsets[18]}..{offsets[20]}" in str(got[18])
    assert "resumes at the end of the data" in str(got[18])


def test_a_sound_file_gets_the_same_version_1_index_either_way(tmp_path: Path) -> None:
    path, offsets = written(tmp_path)
    assert RecordFile(path, resync=True).lost.size == 0
    with_skip = Path(sidecar_path(path, "tfrecord")).read_bytes()
    os.unlink(sidecar_path(path, "tfrecord"))
    assert RecordFile(path).num_records == 20
    assert Path(sidecar_path(path, "tfrecord")).read_bytes() == with_skip
    found = scan_resync(path)
    np.testing.assert_array_equal(found.offsets, offsets)
    assert found.lost == () and found.bad == ()


def test_resync_across_reads_large_damage_and_a_large_record(tmp_path: Path) -> None:
    """Garbage longer than one scan read (4 MiB), zero fill, then a record longer than one
    read: the search for the next frame continues across reads and waits for whole frames."""
    rng = np.random.default_rng(5)
    big = rng.bytes(5 << 20)
    records = [b"a" * 100, b"b" * 200, b"c" * 300, big, b"d" * 50]
    path, offsets = written(tmp_path, records)
    garbage = rng.bytes(9 << 19) + bytes(1 << 18)
    with open(path, "rb") as f:
        data = f.read()
    Path(path).write_bytes(data[: offsets[2]] + garbage + data[offsets[2] + 5 :])
    shift = len(garbage) - 5
    rf = RecordFile(path, resync=True)
    assert rf.lost.tolist() == [2]
    assert rf.offset(3) == offsets[3] + shift
    got = read_all(rf)
    assert got[:2] == records[:2] and got[3:] == records[3:]
    assert f"bytes {offsets[2]}..{offsets[3] + shift}" in str(got[2])


def test_gzip_framing_damage_is_stepped_over_but_broken_deflate_still_raises(
    tmp_path: Path,
) -> None:
    frames = [encode_frame(r) for r in RECORDS]
    damaged = bytearray(b"".join(frames))
    at = sum(map(len, frames[:7]))
    damaged[at + 3] ^= 0x10
    path = tmp_path / "data.tfrecord.gz"
    path.write_bytes(gzip.compress(bytes(damaged)))
    with pytest.raises(CorruptRecordError, match="length CRC"):
        _ = RecordFile(str(path)).num_records
    rf = RecordFile(str(path), resync=True)
    assert rf.compression == "gzip" and rf.lost.tolist() == [7]
    got = read_all(rf)
    assert got[:7] == RECORDS[:7] and got[8:] == RECORDS[8:]
    assert_names(got[7], str(path), at, 7)  # an offset in the uncompressed stream
    broken = bytearray(gzip.compress(b"".join(frames)))
    broken[len(broken) // 2] ^= 0xFF
    path.write_bytes(bytes(broken))
    with pytest.raises(CorruptRecordError, match="cannot inflate"):
        _ = RecordFile(str(path), resync=True).num_records


def test_the_build_logs_each_lost_range_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, offsets = written(tmp_path)
    flip(path, offsets[3] + 9)  # the length CRC itself
    with caplog.at_level(logging.WARNING, logger="shmloader.formats.tfrecord"):
        assert RecordFile(path, resync=True).lost.tolist() == [3]
        assert RecordFile(path, resync=True).lost.tolist() == [3]  # from the index: no log
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert f"record 3, byte offset {offsets[3]}" in warnings[0] and path in warnings[0]


@pytest.mark.parametrize("stray", [1, 5, 11])
def test_a_damaged_range_shorter_than_a_header_is_read_as_skipped(
    tmp_path: Path, stray: int
) -> None:
    """Stray bytes between two frames (a few inserted, or the first bytes of a header cut
    short and followed by more data, as when a truncated file was concatenated with another):
    the range stepped over is shorter than a header. Reading it must yield its error like any
    lost record, and say the same as the build did, not claim that the file changed."""
    path, offsets = written(tmp_path)
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: offsets[5]] + b"\x01" * stray + data[offsets[5] :])
    found = scan_resync(path)
    assert [(g.record, g.start, g.stop) for g in found.lost] == [
        (5, offsets[5], offsets[5] + stray)
    ]
    rf = RecordFile(path, resync=True)
    assert rf.num_records == 21 and rf.lost.tolist() == [5]
    got = read_all(rf)
    assert got[:5] == RECORDS[:5] and got[6:] == RECORDS[5:]
    error = got[5]
    assert isinstance(error, CorruptRecordError) and not isinstance(error, TruncatedRecordError)
    assert_names(error, path, offsets[5], 5)
    assert str(error) == str(found.lost[0].error)
    assert f"bytes {offsets[5]}..{offsets[5] + stray} ({stray} bytes)" in str(error)
    assert f"resumes at byte {offsets[5] + stray}" in str(error)


def test_zero_fill_is_stepped_over_without_a_check_per_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Zero fill (a crash after the file grew, before the data landed) is the common damage;
    every offset in it has zero top length bytes, so the numpy prefilter alone would leave a
    header check in Python per byte (0.2 s per MiB here). Counted, not timed."""
    from shmloader.formats import _resync

    path, offsets = written(tmp_path)
    data = Path(path).read_bytes()
    hole = 1 << 20
    Path(path).write_bytes(data[: offsets[5]] + bytes(hole) + data[offsets[6] :])
    checked = 0

    def counting(length: int) -> int:
        nonlocal checked
        checked += 1
        return real(length)

    real = _resync.length_crc
    monkeypatch.setattr(_resync, "length_crc", counting)
    found = scan_resync(path)
    assert [(g.record, g.start, g.stop) for g in found.lost] == [(5, offsets[5], offsets[5] + hole)]
    assert len(found.offsets) - 1 == 20
    assert checked < 1000
