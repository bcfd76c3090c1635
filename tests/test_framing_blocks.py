"""The whole-block check of indexed range reads (``split_indexed``) against the frame walk."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from shmloader.errors import CorruptRecordError, IndexMismatchError
from shmloader.formats._framing import Bad, Run, encode_frame, split_indexed
from shmloader.formats.tfrecord import RecordFile, write_records


def _block(payloads: list[bytes]) -> tuple[bytes, np.ndarray]:
    frames = [encode_frame(p) for p in payloads]
    rel = np.cumsum([0, *map(len, frames)]).astype(np.int64)
    return b"".join(frames), rel


@pytest.mark.parametrize("sizes", [[8] * 5, [0, 1, 300, 7, 7, 4096], [12]])
def test_valid_block_gives_its_payloads(sizes: list[int]) -> None:
    payloads = [os.urandom(n) for n in sizes]
    buf, rel = _block(payloads)
    assert split_indexed(buf, rel, verify=True) == payloads
    assert split_indexed(buf, rel, verify=False) == payloads


def test_any_damage_or_wrong_offsets_sends_the_block_to_the_walk() -> None:
    payloads = [bytes([i]) * 20 for i in range(6)]
    buf, rel = _block(payloads)
    frame = 20 + 16
    for at in (0, 8, 12, 12 + 19, frame - 1, 3 * frame + 5):  # length, its CRC, payload, CRC
        bad = bytearray(buf)
        bad[at] ^= 0x40
        assert split_indexed(bytes(bad), rel, verify=True) is None, at
    # A flipped payload byte passes without verify (only the payload CRC covers it) ...
    bad = bytearray(buf)
    bad[12] ^= 1
    assert split_indexed(bytes(bad), rel, verify=False) is not None
    # ... but wrong boundaries never do.
    shifted = rel.copy()
    shifted[2] += 4
    assert split_indexed(buf, shifted, verify=False) is None
    assert split_indexed(buf + b"x", rel, verify=False) is None


def test_read_runs_is_one_run_per_clean_block_and_names_bad_records(tmp_path: Path) -> None:
    path = str(tmp_path / "r.tfrecord")
    payloads = [f"record {i}".encode() * (1 + i % 5) for i in range(50)]
    write_records(path, payloads)
    rf = RecordFile(path)
    runs = list(rf.read_runs(3, 40))
    assert len(runs) == 1 and isinstance(runs[0], Run)
    assert runs[0].first == 3 and runs[0].payloads == payloads[3:40]
    assert runs[0].offsets == [int(o) for o in rf.offsets[3:40]]
    # Corrupt record 10's payload: the block is walked, the bad record named.
    data = bytearray(Path(path).read_bytes())
    data[int(rf.offsets[10]) + 13] ^= 0xFF
    Path(path).write_bytes(bytes(data))
    rf = RecordFile(path)
    items = list(rf.read_runs(3, 40, on_error="skip"))
    bad = [x for x in items if isinstance(x, Bad)]
    assert [(b.record, b.offset) for b in bad] == [(10, int(rf.offsets[10]))]
    good = [p for x in items if isinstance(x, Run) for p in x.payloads]
    assert good == payloads[3:10] + payloads[11:40]
    with pytest.raises(CorruptRecordError, match="payload CRC mismatch") as info:
        list(rf.read_runs(3, 40))
    assert info.value.index == 10


def test_read_runs_detects_a_file_that_changed_under_its_index(tmp_path: Path) -> None:
    path = str(tmp_path / "r.tfrecord")
    write_records(path, [b"a" * 10] * 20)
    rf = RecordFile(path)
    rf.offsets  # noqa: B018 - the index is loaded now, before the file changes
    write_records(path, [b"b" * 11] * 20, index=False)
    with pytest.raises(IndexMismatchError):
        list(rf.read_runs(0, 20))


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_read_runs_with_views_hands_out_memoryviews_of_the_same_payloads(
    tmp_path: Path, compression: str | None
) -> None:
    path = str(tmp_path / "v.tfrecord")
    payloads = [bytes([i % 251]) * (100 + i) for i in range(60)]
    write_records(path, payloads, compression=compression)
    runs = list(RecordFile(path).read_runs(5, 55, views=True))
    got = [p for run in runs if isinstance(run, Run) for p in run.payloads]
    assert all(type(p) is memoryview for p in got)
    assert [bytes(p) for p in got] == payloads[5:55]


def test_the_walk_that_names_a_corrupt_record_hands_out_views_too(tmp_path: Path) -> None:
    path = str(tmp_path / "v.tfrecord")
    payloads = [bytes([i % 251]) * (100 + i) for i in range(60)]
    write_records(path, payloads)
    data = bytearray(Path(path).read_bytes())
    data[int(RecordFile(path).offsets[20]) + 13] ^= 0xFF
    Path(path).write_bytes(bytes(data))
    items = list(RecordFile(path).read_runs(5, 55, on_error="skip", views=True))
    good = [p for x in items if isinstance(x, Run) for p in x.payloads]
    assert all(type(p) is memoryview for p in good)
    assert [bytes(p) for p in good] == payloads[5:20] + payloads[21:55]
    assert [x.record for x in items if isinstance(x, Bad)] == [20]
