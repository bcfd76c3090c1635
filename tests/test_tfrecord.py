"""TFRecord round trips, range reads, compression, and byte compatibility with `tfrecord`."""

from __future__ import annotations

import gzip
import os
import random
import zlib
from pathlib import Path

import numpy as np
import pytest

from shmloader.errors import ConfigError
from shmloader.formats._compression import sniff_compression
from shmloader.formats.index import load_offsets, sidecar_path
from shmloader.formats.tfrecord import (
    RecordFile,
    RecordWriter,
    encode_frame,
    index_kind,
    read_records,
    scan_offsets,
    write_records,
)

MiB = 1 << 20


def payloads(n: int, seed: int = 0, max_size: int = 300) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.randint(0, max_size)) for _ in range(n)]


CASES = {
    "empty-file": [],
    "one-record": [b"hello"],
    "one-empty-payload": [b""],
    "empty-payloads": [b"", b"", b"x", b""],
    "large-payloads": [os.urandom(5 * MiB), b"", os.urandom(9 * MiB + 3)],
    "many-records": payloads(20_000, seed=1),
}


@pytest.mark.parametrize("name", list(CASES))
def test_round_trip(tmp_path: Path, name: str) -> None:
    records = CASES[name]
    path = str(tmp_path / "data.tfrecord")
    assert write_records(path, records) == len(records)
    assert list(read_records(path)) == records

    rf = RecordFile(path)
    assert rf.compression is None
    assert rf.num_records == len(records)
    got = list(rf.read_range(0, len(records)))
    assert [p for _, _, p in got] == records
    assert [i for i, _, _ in got] == list(range(len(records)))
    assert [o for _, o, _ in got] == [rf.offset(i) for i in range(len(records))]
    assert rf.offset(len(records)) == os.path.getsize(path)


@pytest.mark.parametrize("name", ["empty-file", "one-record", "empty-payloads", "many-records"])
def test_writer_index_equals_scanned_index(tmp_path: Path, name: str) -> None:
    path = str(tmp_path / "data.tfrecord")
    write_records(path, CASES[name])
    written = load_offsets(path, "tfrecord")
    assert written is not None
    scanned = scan_offsets(path)
    assert scanned.dtype == np.uint64
    np.testing.assert_array_equal(written, scanned)
    assert len(written) == len(CASES[name]) + 1


def test_file_bytes_are_concatenated_frames(tmp_path: Path) -> None:
    records = [b"", b"a", os.urandom(1000)]
    path = tmp_path / "data.tfrecord"
    write_records(path, records, index=False)
    assert path.read_bytes() == b"".join(encode_frame(r) for r in records)
    assert not os.path.exists(sidecar_path(str(path), "tfrecord"))


def test_range_reads_at_boundaries(tmp_path: Path) -> None:
    records = payloads(1000, seed=2)
    path = str(tmp_path / "data.tfrecord")
    write_records(path, records)
    rf = RecordFile(path)
    for start, stop in [(0, 0), (0, 1), (999, 1000), (1000, 1000), (0, 1000), (17, 555)]:
        got = [p for _, _, p in rf.read_range(start, stop)]
        assert got == records[start:stop], (start, stop)
        assert list(read_records(path, start, stop)) == records[start:stop]
    assert list(read_records(path, 990)) == records[990:]


def test_range_reads_across_read_blocks(tmp_path: Path) -> None:
    # Sizes around the 16 MiB block: a record larger than a block is read on its own.
    sizes = [7 * MiB, 100, 7 * MiB, 7 * MiB, 20 * MiB, 5, 0, 3 * MiB]
    records = [os.urandom(s) for s in sizes]
    path = str(tmp_path / "big.tfrecord")
    write_records(path, records)
    rf = RecordFile(path)
    for start in range(len(sizes)):
        for stop in range(start, len(sizes) + 1):
            assert [p for _, _, p in rf.read_range(start, stop)] == records[start:stop]


@pytest.mark.parametrize(("start", "stop"), [(-1, 3), (5, 4), (0, 11), (11, 11), (3, None)])
def test_out_of_range_is_config_error(tmp_path: Path, start: int, stop: int | None) -> None:
    path = str(tmp_path / "data.tfrecord")
    write_records(path, payloads(10))
    rf = RecordFile(path)
    with pytest.raises(ConfigError):
        rf.read_range(start, stop)  # type: ignore[arg-type]
    if stop is not None:
        with pytest.raises(ConfigError):
            list(read_records(path, start, stop))


def test_offset_and_on_error_arguments(tmp_path: Path) -> None:
    path = str(tmp_path / "data.tfrecord")
    write_records(path, payloads(10))
    rf = RecordFile(path)
    with pytest.raises(ConfigError, match="record 11"):
        rf.offset(11)
    with pytest.raises(ConfigError, match="on_error"):
        rf.read_range(0, 1, on_error="ignore")


def test_writer_context_manager_and_buffers(tmp_path: Path) -> None:
    path = str(tmp_path / "data.tfrecord")
    with RecordWriter(path) as writer:
        writer.write(b"abc")
        writer.write(bytearray(b"def"))
        writer.write(memoryview(np.arange(4, dtype=np.int32)))
        assert writer.count == 3
    with pytest.raises(ConfigError, match="closed"):
        writer.write(b"late")
    writer.close()  # closing twice is harmless
    assert list(read_records(path)) == [b"abc", b"def", np.arange(4, dtype=np.int32).tobytes()]


def test_writer_failing_block_leaves_valid_file_without_index(tmp_path: Path) -> None:
    path = str(tmp_path / "data.tfrecord")
    with pytest.raises(RuntimeError), RecordWriter(path) as writer:
        writer.write(b"kept")
        raise RuntimeError("caller failed")
    assert load_offsets(path, "tfrecord") is None
    assert list(read_records(path)) == [b"kept"]


def test_bad_compression_argument(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="compression"):
        RecordWriter(str(tmp_path / "x"), compression="auto")
    with pytest.raises(ConfigError, match="compression"):
        RecordWriter(str(tmp_path / "x"), compression="bz2")


# --- compression -----------------------------------------------------------------------


@pytest.mark.parametrize("compression", ["gzip", "zlib"])
def test_compressed_round_trip_and_ranges(tmp_path: Path, compression: str) -> None:
    records = payloads(3000, seed=3)
    path = str(tmp_path / "data.tfrecord")  # no telling extension: detected by content
    write_records(path, records, compression=compression)
    raw = Path(path).read_bytes()
    plain = gzip.decompress(raw) if compression == "gzip" else zlib.decompress(raw)
    assert plain == b"".join(encode_frame(r) for r in records)

    assert list(read_records(path)) == records
    rf = RecordFile(path)
    assert rf.compression == compression
    assert rf.kind == index_kind(compression) == f"tfrecord-{compression}"
    assert rf.num_records == 3000
    assert rf.offset(3000) == len(plain)  # offsets are in the uncompressed stream
    got = list(rf.read_range(1500, 1510))
    assert [p for _, _, p in got] == records[1500:1510]
    assert got[0][1] == len(b"".join(encode_frame(r) for r in records[:1500]))


def test_whole_file_gzip_and_zlib_written_by_other_tools(tmp_path: Path) -> None:
    records = payloads(500, seed=4)
    plain = b"".join(encode_frame(r) for r in records)
    gz = tmp_path / "a.tfrecord.gz"
    gz.write_bytes(gzip.compress(plain))
    zz = tmp_path / "b.tfrecord"
    zz.write_bytes(zlib.compress(plain, 9))
    members = tmp_path / "c.tfrecord.gz"  # gzip allows concatenated members
    members.write_bytes(gzip.compress(plain[:12345]) + gzip.compress(plain[12345:]))
    for path in (gz, zz, members):
        assert list(read_records(path)) == records, path
        assert RecordFile(path).num_records == 500


@pytest.mark.parametrize("length", [0x8B1F, 0x1D08, 0x8B1F + 65536])
def test_detection_is_not_fooled_by_record_lengths(tmp_path: Path, length: int) -> None:
    # These lengths make the first two bytes look like gzip magic / a zlib header.
    records = [os.urandom(length), b"next"]
    path = str(tmp_path / "data.tfrecord.gz")  # even a misleading extension loses to content
    write_records(path, records)
    assert RecordFile(path).compression is None
    assert list(read_records(path)) == records


def test_sniff_rule() -> None:
    assert sniff_compression(b"") is None
    assert sniff_compression(b"\x1f") is None
    assert sniff_compression(gzip.compress(b"x")[:12]) == "gzip"
    assert sniff_compression(zlib.compress(b"x")[:12]) == "zlib"
    assert sniff_compression(encode_frame(b"x")[:12]) is None
    assert sniff_compression(b"\x00\x00garbage!!!!", "f.gz") == "gzip"
    assert sniff_compression(b"\x00\x00garbage!!!!", "f.zz") == "zlib"
    assert sniff_compression(b"\x00\x00garbage!!!!", "f.tfrecord") is None


# --- compatibility with the independent `tfrecord` package ------------------------------


def test_we_read_files_written_by_tfrecord_package(tmp_path: Path) -> None:
    from tfrecord.writer import TFRecordWriter

    path = str(tmp_path / "theirs.tfrecord")
    data = [{"label": (i, "int"), "name": (f"n{i}".encode(), "byte")} for i in range(300)]
    writer = TFRecordWriter(path)
    for datum in data:
        writer.write(datum)
    writer.close()
    expected = [TFRecordWriter.serialize_tf_example(d) for d in data]
    assert list(read_records(path)) == expected
    assert [p for _, _, p in RecordFile(path).read_range(100, 200)] == expected[100:200]


def test_tfrecord_package_reads_our_files(tmp_path: Path) -> None:
    from tfrecord.reader import tfrecord_iterator
    from tfrecord.tools.tfrecord2idx import create_index

    records = [*payloads(1000, seed=5), os.urandom(2 * MiB)]
    path = str(tmp_path / "ours.tfrecord")
    write_records(path, records)
    # The iterator reuses one buffer, so copy each view before the next step.
    assert [bytes(v) for v in tfrecord_iterator(path)] == records
    index_file = str(tmp_path / "ours.tfindex")
    create_index(path, index_file)
    theirs = np.loadtxt(index_file, dtype=np.int64)[:, 0]
    np.testing.assert_array_equal(theirs, RecordFile(path).offsets[:-1].astype(np.int64))

    gz_path = str(tmp_path / "ours.tfrecord.gz")
    write_records(gz_path, records[:50], compression="gzip")
    got = [bytes(v) for v in tfrecord_iterator(gz_path, compression_type="gzip")]
    assert got == records[:50]
