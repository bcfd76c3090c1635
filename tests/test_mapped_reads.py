"""Range reads of uncompressed local record files go through a memory mapping (``_mapped.py``):
payloads are views of the page cache (``views=True``) or ``bytes`` copied straight out of it,
the mapping lives exactly as long as a view of it, and what cannot be mapped is read as before.
"""

from __future__ import annotations

import gc
import mmap
import os
import random
import sys
from pathlib import Path
from typing import Any

import pytest

import shmloader
from shmloader.errors import IndexMismatchError
from shmloader.formats._framing import Run
from shmloader.formats._mapped import MappedSource
from shmloader.formats.tfrecord import RecordFile, write_records


def _records(n: int, seed: int, sizes: tuple[int, int] = (0, 3000)) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.randint(*sizes)) for _ in range(n)]


def _runs_payloads(
    rf: RecordFile, start: int, stop: int, views: bool, verify: bool = True
) -> list[Any]:
    runs = rf.read_runs(start, stop, views=views, mapped=True, verify=verify)
    return [p for run in runs if isinstance(run, Run) for p in run.payloads]


def _mapped_here(path: str) -> bool:
    with open("/proc/self/maps") as f:
        return any(line.rstrip().endswith(path) for line in f)


@pytest.mark.long
@pytest.mark.parametrize("sizes", [(0, 3000), (500, 500)], ids=["mixed", "one-length"])
def test_views_are_slices_of_a_mapping_and_copies_are_bytes(
    tmp_path: Path, sizes: tuple[int, int]
) -> None:
    records = _records(3000, seed=1, sizes=sizes)  # several 2-MiB blocks
    path = str(tmp_path / "data.tfrecord")
    write_records(path, records)
    rf = RecordFile(path)
    for start, stop in [(0, 3000), (1, 2999), (1234, 1235), (2999, 3000)]:
        views = _runs_payloads(rf, start, stop, views=True)
        assert all(isinstance(v, memoryview) and isinstance(v.obj, mmap.mmap) for v in views)
        assert all(v.readonly for v in views)
        assert [bytes(v) for v in views] == records[start:stop]
        copies = _runs_payloads(rf, start, stop, views=False)
        assert all(type(c) is bytes for c in copies)
        assert copies == records[start:stop]
        # Unverified, a wrong slice would not be caught by a CRC and read again frame by frame.
        assert _runs_payloads(rf, start, stop, views=False, verify=False) == records[start:stop]


def test_compressed_files_are_read_not_mapped(tmp_path: Path) -> None:
    records = _records(500, seed=2)
    path = str(tmp_path / "data.tfrecord.gz")
    write_records(path, records, compression="gzip")
    views = _runs_payloads(RecordFile(path), 10, 490, views=True)
    assert all(isinstance(v, memoryview) and isinstance(v.obj, bytes) for v in views)
    assert [bytes(v) for v in views] == records[10:490]


@pytest.mark.long
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_the_mapping_lives_as_long_as_a_view_of_it(tmp_path: Path) -> None:
    records = _records(2000, seed=3)
    path = str(tmp_path / "data.tfrecord")
    write_records(path, records)
    rf = RecordFile(path)
    views = _runs_payloads(rf, 100, 1900, views=True)
    kept = views[-1]
    del views, rf
    gc.collect()
    assert _mapped_here(path)  # the read and its file object are gone, the view is not
    assert bytes(kept) == records[1899]
    del kept
    gc.collect()
    assert not _mapped_here(path)
    # Copies keep nothing mapped once the read is over.
    copies = _runs_payloads(RecordFile(path), 0, 2000, views=False)
    gc.collect()
    assert copies == records and not _mapped_here(path)


def _resident_kib(path: str) -> int:
    """Resident KiB of this process's mappings of ``path`` (``/proc/self/smaps``)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            first = line.split(maxsplit=1)[0]
            if "-" in first and ":" not in first:  # a mapping's header line
                inside = line.rstrip().endswith(path)
            elif inside and first == "Rss:":
                total += int(line.split()[1])
    return total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_a_long_range_read_lets_go_of_the_pages_it_read(tmp_path: Path) -> None:
    # 24 MiB of records read as views: the mapping holds only the last blocks' pages, and
    # every view kept still reads its record (its pages come back from the page cache).
    records = _records(1600, seed=9, sizes=(16000, 16000))
    path = str(tmp_path / "data.tfrecord")
    write_records(path, records)
    views = _runs_payloads(RecordFile(path), 0, 1600, views=True)
    assert _resident_kib(path) < 12 * 1024
    assert [bytes(v) for v in views] == records


def test_a_source_reads_views_and_copies_in_order_and_stops_at_the_range(
    tmp_path: Path,
) -> None:
    path = tmp_path / "plain.bin"
    data = bytes(range(256)) * 300  # 76,800 bytes: more than one allocation granule
    path.write_bytes(data)
    seen: list[int] = []
    source = MappedSource.open(str(path), 70_001, 76_000, seen.append)
    assert source is not None
    with source:
        assert source.position == 70_001
        at = source.mapped_at()  # where the next view starts, in the mapping itself
        assert at is not None and at[0][at[1] : at[1] + 10] == data[70_001:70_011]
        assert bytes(source.view(10)) == data[70_001:70_011]
        assert source.read(5) == data[70_011:70_016]
        rest = source.view(1 << 20)  # asks past the range: gets what is left of it
        assert bytes(rest) == data[70_016:76_000] and source.position == 76_000
        assert bytes(source.view(1)) == b"" and source.read(1) == b""
    assert sum(seen) == 76_000 - 70_001
    with pytest.raises(ValueError, match="closed"):
        source.view(1)
    assert source.mapped_at() is None
    assert bytes(rest[:3]) == data[70_016:70_019]  # still readable after close


@pytest.mark.parametrize("sizes", [(0, 3000), (500, 500)], ids=["mixed", "one-length"])
def test_a_corrupt_payload_read_through_the_mapping_is_named(
    tmp_path: Path, sizes: tuple[int, int]
) -> None:
    """``bytes`` copies are sliced out of the mapping itself: their CRCs are still checked,
    and a damaged record is named (or skipped) as with ``read(2)``."""
    records = _records(3000, seed=5, sizes=sizes)
    path = str(tmp_path / "data.tfrecord")
    write_records(path, records)
    rf = RecordFile(path)
    bad = next(i for i in range(1500, 3000) if len(records[i]))
    at = int(rf.offsets[bad]) + 12  # the payload's first byte
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))
    for views in (False, True):
        with pytest.raises(shmloader.CorruptRecordError) as info:
            _runs_payloads(rf, 1000, 3000, views=views)
        assert path in str(info.value) and f"record {bad}" in str(info.value)
        runs = list(rf.read_runs(1000, 3000, on_error="skip", views=views, mapped=True))
        got = [bytes(p) for run in runs if isinstance(run, Run) for p in run.payloads]
        assert got == records[1000:bad] + records[bad + 1 : 3000]


def test_what_cannot_be_mapped_is_left_to_read(tmp_path: Path) -> None:
    path = tmp_path / "plain.bin"
    path.write_bytes(b"x" * 100)
    assert MappedSource.open(str(path), 50, 50) is None  # an empty range
    assert MappedSource.open(str(path), 100, 200) is None  # past the end of the file
    assert MappedSource.open(str(tmp_path), 0, 10) is None  # a directory
    assert MappedSource.open(str(tmp_path / "missing"), 0, 10) is None  # opening names it
    short = MappedSource.open(str(path), 90, 200)  # cut to the file's size at open
    assert short is not None and short.read(1000) == b"x" * 10


def test_a_file_shorter_than_its_index_is_named_not_a_crash(tmp_path: Path) -> None:
    records = _records(400, seed=4)
    path = str(tmp_path / "data.tfrecord")
    write_records(path, records)
    rf = RecordFile(path)
    cut = int(rf.offsets[300]) + 7
    os.truncate(path, cut)
    for views in (True, False):
        with pytest.raises(IndexMismatchError, match="changed after it was indexed") as info:
            _runs_payloads(rf, 250, 400, views=views)
        assert path in str(info.value)
    assert _runs_payloads(rf, 0, 300, views=False) == records[:300]


def test_a_record_file_source_maps_and_plain_range_reads_do_not(tmp_path: Path) -> None:
    records = [bytes([i % 256]) * 64 for i in range(300)]
    path = str(tmp_path / "data.tfrecord")
    write_records(path, records)
    owners: list[type] = []

    def decode(payload: Any) -> dict[str, Any]:
        owners.append(type(payload.obj))
        return {"first": payload[0]}

    source = shmloader.RecordFileSource(path, decode=decode, views=True)
    shard = source.plan()[0]
    assert source.read(shard, 0, 300).column("first").to_pylist() == [r[0] for r in records]
    assert set(owners[-300:]) == {mmap.mmap}
    # A caller's own range reads keep read(2): a file cut short under them raises, no SIGBUS.
    runs = RecordFile(path).read_runs(0, 300, views=True)
    assert {type(p.obj) for run in runs if isinstance(run, Run) for p in run.payloads} == {bytes}
