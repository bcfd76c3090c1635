"""``payload_rows``: a strided view of a block of equal-length records, a join otherwise.

The view must hold exactly the bytes the join would, for every block a range is split into
(blocks start anywhere in a file), and the reader's write must copy the columns a
``decode_batch`` slices from it into batches that hold the right records.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import shmloader
from shmloader.formats._framing import BLOCK
from shmloader.formats.payloads import Payloads
from shmloader.formats.tfrecord import RecordFile, write_records

VALUE = 300  # bytes of each record before its int64 label


def _records(first: int, count: int) -> list[bytes]:
    rng = np.random.default_rng(first)
    values = rng.integers(0, 256, (count, VALUE), dtype=np.uint8)
    labels = np.arange(first, first + count, dtype="<i8").reshape(count, 1)
    return [row.tobytes() for row in np.concatenate([values, labels.view(np.uint8)], axis=1)]


def decode_rows(payloads: list[bytes]) -> dict[str, np.ndarray]:
    rows = shmloader.payload_rows(payloads)
    return {"value": rows[:, :VALUE], "label": rows[:, VALUE:].view("<i8")[:, 0]}


@pytest.fixture
def record_file(tmp_path):
    path = str(tmp_path / "a.tfrecord")
    # Over three blocks, so that ranges start and end inside blocks.
    count = 3 * BLOCK // (VALUE + 8 + 16) + 17
    records = _records(0, count)
    write_records(path, records)
    return path, records


@pytest.mark.parametrize("views", [False, True])
@pytest.mark.parametrize(("start", "stop"), [(0, None), (5, 4000), (3999, 4001), (7, 8)])
def test_every_run_of_equal_length_records_is_viewed_in_its_block(record_file, views, start, stop):
    path, records = record_file
    stop = len(records) if stop is None else stop
    got = []
    for run in RecordFile(path).read_runs(start, stop, views=views):
        assert isinstance(run.payloads, Payloads)
        rows = shmloader.payload_rows(run.payloads)
        assert rows is run.payloads.rows  # the view, not a join
        assert not rows.flags.writeable and not rows.flags.owndata
        assert rows.shape == (len(run.payloads), VALUE + 8)
        got.extend(bytes(row) for row in rows)
    assert got == records[start:stop]


def test_records_of_mixed_lengths_are_listed_without_rows(tmp_path):
    path = str(tmp_path / "mixed.tfrecord")
    write_records(path, [b"a" * 10, b"b" * 11, b"c" * 10])
    (run,) = RecordFile(path).read_runs(0, 3)
    assert run.payloads == [b"a" * 10, b"b" * 11, b"c" * 10]
    assert not isinstance(run.payloads, Payloads)
    with pytest.raises(ValueError, match="one length, got 3 of lengths 10 to 11 bytes"):
        shmloader.payload_rows(run.payloads)


def test_a_plain_list_is_joined():
    rows = shmloader.payload_rows([b"ab", memoryview(b"cd"), bytearray(b"ef")])
    assert rows.tolist() == [[97, 98], [99, 100], [101, 102]]
    assert shmloader.payload_rows([]).shape == (0, 0)
    assert shmloader.payload_rows([b"", b""]).shape == (2, 0)


def test_strided_memoryviews_are_joined_in_order_and_non_buffers_named():
    grid = np.arange(12, dtype=np.uint8).reshape(3, 4)
    columns = [memoryview(grid[:, 1]), memoryview(grid[:, 3])]  # strided: join refuses them
    assert shmloader.payload_rows(columns).tolist() == [[1, 5, 9], [3, 7, 11]]
    with pytest.raises(TypeError, match="payload 1 is a str"):
        shmloader.payload_rows([b"ab", "cd"])


def test_payloads_of_wider_items_are_refused_not_misread():
    wide = memoryview(np.arange(3, dtype=np.int32))  # len() counts 3 items of 4 bytes
    with pytest.raises(ValueError, match="memoryview of format 'B'"):
        shmloader.payload_rows([wide, wide])


@pytest.mark.parametrize("views", [False, True])
def test_a_source_reads_the_viewed_rows_into_the_right_batch(record_file, views):
    path, records = record_file
    source = shmloader.RecordFileSource(path, decode_batch=decode_rows, views=views)
    (shard,) = source.plan()
    batch = source.read(shard, 11, 3900)
    labels = batch.column("label").to_numpy()
    assert labels.tolist() == list(range(11, 3900))
    values = np.stack(batch.column("value").to_numpy(zero_copy_only=False))
    expected = np.frombuffer(b"".join(records[11:3900]), np.uint8).reshape(-1, VALUE + 8)
    assert np.array_equal(values, expected[:, :VALUE])


def test_a_block_with_a_damaged_record_is_joined_and_the_rest_kept(record_file):
    path, _ = record_file
    with open(path, "r+b") as f:  # flip a payload byte of record 2: its CRC fails
        f.seek(2 * (VALUE + 8 + 16) + 12 + 5)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    source = shmloader.RecordFileSource(path, decode_batch=decode_rows, on_error="skip")
    (shard,) = source.plan()
    result = source.read_result(shard, 0, 40)
    labels = result.batch.column("label").to_numpy().tolist()
    assert labels == [i for i in range(40) if i != 2]
    assert [s.index for s in result.skipped] == [2]


@pytest.mark.parametrize(
    "change",
    [
        lambda p: p.reverse(),
        lambda p: p.sort(),
        lambda p: p.pop(),
        lambda p: p.__delitem__(0),
        lambda p: p.__setitem__(0, b"x" * len(p[0])),
        lambda p: p.append(p[0]),
        lambda p: p.extend(p[:1]),
        lambda p: p.insert(0, p[-1]),
        lambda p: p.remove(p[0]),
        lambda p: p.__iadd__(p[:1]),
    ],
)
def test_payloads_changed_in_place_are_joined_not_viewed(record_file, change):
    path, _ = record_file
    run = next(iter(RecordFile(path).read_runs(0, 50)))
    payloads = run.payloads
    change(payloads)
    rows = shmloader.payload_rows(payloads)
    assert [bytes(row) for row in rows] == [bytes(p) for p in payloads]


def _payloads(path: str) -> Payloads:
    run = next(iter(RecordFile(path).read_runs(0, 6)))
    assert isinstance(run.payloads, Payloads) and run.payloads.rows is not None
    return run.payloads


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_a_payloads_pickles_like_the_list_it_is(record_file, protocol):
    path, records = record_file
    payloads = _payloads(path)
    back = pickle.loads(pickle.dumps(payloads, protocol=protocol))
    assert back == records[:6] and isinstance(back, Payloads)
    assert np.array_equal(shmloader.payload_rows(back), payloads.rows)


def decode_labels(payloads: list[bytes]) -> dict[str, np.ndarray]:
    """Reads only each record's last 8 bytes: any length decodes alone."""
    return {"label": shmloader.payload_rows(payloads)[:, -8:].copy().view("<i8")[:, 0]}


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_block_of_mixed_lengths_fails_under_raise_and_is_kept_under_skip(tmp_path, on_error):
    # What docs/sources.md says: the one-record retry succeeds for each record, which keeps
    # them all with "skip", but "raise" reports the block (the lengths, not a bare failure).
    path = str(tmp_path / "mixed.tfrecord")
    write_records(path, [b"x" * (10 + (i == 3)) + np.int64(i).tobytes() for i in range(6)])
    source = shmloader.RecordFileSource(path, decode_batch=decode_labels, on_error=on_error)
    (shard,) = source.plan()
    if on_error == "raise":
        with pytest.raises(shmloader.DecodeError, match=r"none of them alone.*lengths 18 to 19"):
            source.read(shard, 0, 6)
    else:
        result = source.read_result(shard, 0, 6)
        assert result.batch.column("label").to_pylist() == list(range(6))
        assert not result.skipped
