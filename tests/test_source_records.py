"""RecordFileSource over real TFRecord files: plans, ranges, decode errors, skips, pickling."""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from shmloader.errors import ConfigError, CorruptRecordError, DecodeError, SchemaMismatchError
from shmloader.formats import _framing
from shmloader.formats.tfrecord import RecordFile, write_records
from shmloader.sources import RecordFileSource, Shard, Source, column_to_numpy
from shmloader.sources.columns import FixedColumns
from shmloader.sources.streamed import StreamedColumns

DIM = 8
SIZE = DIM * 4 + 8


def payload(i: int) -> bytes:
    return np.arange(i, i + DIM, dtype=np.float32).tobytes() + np.int64(i).tobytes()


def decode(p: bytes) -> Mapping[str, Any]:
    return {"x": np.frombuffer(p, np.float32, DIM), "y": np.frombuffer(p, np.int64, 1, DIM * 4)[0]}


def decode_batch(ps: list[bytes]) -> Mapping[str, Any]:
    raw = np.frombuffer(b"".join(ps), np.uint8).reshape(len(ps), SIZE)
    return {"x": raw[:, : DIM * 4].view(np.float32), "y": raw[:, DIM * 4 :].view(np.int64)[:, 0]}


def picky_decode(p: bytes) -> Mapping[str, Any]:
    """Fails on labels divisible by 5 (and by 7 returns a record of another shape)."""
    out = decode(p)
    if out["y"] % 5 == 0:
        raise ValueError(f"label {out['y']} is cursed")
    if out["y"] % 7 == 0:
        return {"x": np.zeros((3, 1), np.float32), "y": out["y"]}
    return out


def picky_decode_batch(ps: list[bytes]) -> Mapping[str, Any]:
    out = decode_batch(ps)
    bad = out["y"] % 5 == 0
    if bad.any():
        raise ValueError(f"labels {out['y'][bad].tolist()} are cursed")
    return out


def var_decode(p: bytes) -> Mapping[str, Any]:
    y = int(np.frombuffer(p, np.int64, 1, DIM * 4)[0])
    return {"tok": np.arange(y % 4, dtype=np.int32), "name": f"r{y}", "raw": p[:2]}


def named_decode(p: bytes) -> Mapping[str, Any]:
    """Labels divisible by 7 get a name with a lone surrogate, which has no UTF-8 form."""
    y = int(np.frombuffer(p, np.int64, 1, DIM * 4)[0])
    return {"y": y, "name": f"r{y}\ud800" if y % 7 == 0 else f"r{y}"}


def named_decode_batch(ps: list[bytes]) -> Mapping[str, Any]:
    rows = [named_decode(p) for p in ps]
    return {"y": np.array([r["y"] for r in rows]), "name": [r["name"] for r in rows]}


@pytest.fixture
def files(tmp_path: Path) -> list[tuple[str, list[int]]]:
    """Three files (one empty), listed out of order on purpose; labels are global."""
    spec = {"b.tfrecord": range(0, 37), "a.tfrecord": range(100, 150), "c.tfrecord": range(0)}
    out = []
    for name, labels in spec.items():
        path = tmp_path / name
        write_records(path, [payload(i) for i in labels])
        out.append((str(path), list(labels)))
    return sorted(out)


def _expected(labels: list[int]) -> tuple[np.ndarray, np.ndarray]:
    x = np.stack([np.arange(i, i + DIM, dtype=np.float32) for i in labels]) if labels else None
    return (x if x is not None else np.zeros((0, DIM), np.float32)), np.array(labels, np.int64)


@pytest.mark.parametrize("mode", ["decode", "decode_batch"])
def test_plan_counts_and_every_range_round_trips(
    tmp_path: Path, files: list[tuple[str, list[int]]], mode: str
) -> None:
    kwargs: dict[str, Any] = {mode: decode if mode == "decode" else decode_batch}
    source = RecordFileSource(str(tmp_path / "*"), **kwargs)
    assert isinstance(source, Source)
    plan = source.plan()
    assert plan == [Shard(p, len(labels)) for p, labels in files]
    for shard, (_, labels) in zip(plan, files, strict=True):
        n = shard.num_records
        bounds = sorted({0, 1, n // 3, n // 2, n - 1, n} & set(range(n + 1)))
        for start in bounds:
            for stop in [b for b in bounds if b >= start]:
                batch = source.read(shard, start, stop)
                x, y = _expected(labels[start:stop])
                assert batch.num_rows == stop - start
                assert batch.schema.field("x").type == pa.fixed_shape_tensor(pa.float32(), [DIM])
                np.testing.assert_array_equal(column_to_numpy(batch.column("x")), x)
                np.testing.assert_array_equal(column_to_numpy(batch.column("y")), y)
    with pytest.raises(ConfigError, match="outside"):
        source.read(plan[0], 0, plan[0].num_records + 1)


def test_decode_and_decode_batch_give_identical_batches(files: list[tuple[str, list[int]]]) -> None:
    path = files[0][0]
    a, b = RecordFileSource(path, decode=decode), RecordFileSource(path, decode_batch=decode_batch)
    shard = a.plan()[0]
    assert a.read(shard, 3, 40).equals(b.read(shard, 3, 40))
    assert a.schema == b.schema


def test_decode_batch_columns_are_handed_over_unconverted(
    files: list[tuple[str, list[int]]],
) -> None:
    # A reader writes them into shared memory itself (shm/template.py): no batch is built.
    path = files[0][0]
    source = RecordFileSource(path, decode_batch=decode_batch)
    shard = source.plan()[0]
    result = source.read_result(shard, 3, 40)
    stream = result.content
    assert isinstance(stream, StreamedColumns) and stream.num_rows == 37
    chunks = list(stream)  # decoded now, as a writer takes them
    assert [type(c) for c in chunks] == [FixedColumns]  # 37 small records: one block
    assert not chunks[0].arrays[0].flags.c_contiguous  # views of the joined payloads, as given
    with pytest.raises(RuntimeError, match="taken already"):
        list(stream)
    assert result.skipped == ()
    with pytest.raises(RuntimeError, match="taken already"):
        result.batch  # noqa: B018 - the records went to whoever took them
    again = source.read_result(shard, 3, 40)
    assert again.batch.equals(RecordFileSource(path, decode=decode).read(shard, 3, 40))
    assert again.content is again.batch  # built once, on first use
    assert again == source.read_result(shard, 3, 40)
    # Per-record decode of fixed-width columns hands them over too, tensors as their rows.
    per_record = RecordFileSource(path, decode=decode).read_result(shard, 3, 40).content
    assert isinstance(per_record, StreamedColumns)
    chunks = list(per_record)
    assert [type(c) for c in chunks] == [FixedColumns]
    assert chunks[0].to_batch().equals(again.batch)


def _blocks_of_ten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, list[int]]:
    """A file of records labelled 200..299, read in blocks of 10 records."""
    monkeypatch.setattr(_framing, "BLOCK", 10 * (SIZE + 16))
    path = tmp_path / "blocks.tfrecord"
    labels = list(range(200, 300))
    write_records(path, [payload(i) for i in labels])
    return str(path), labels


def _labels_of(chunks: list[Any]) -> list[int]:
    batches = [c if isinstance(c, pa.RecordBatch) else c.to_batch() for c in chunks]
    return [y for b in batches for y in b.column("y").to_pylist()]


@pytest.mark.parametrize("views", [False, True])
def test_decode_is_called_a_block_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, views: bool
) -> None:
    # As decode_batch: a block's records are decoded when the writer takes the block (while
    # it is in the CPU's cache), and skips are found across blocks.
    path, labels = _blocks_of_ten(tmp_path, monkeypatch)
    calls: list[int] = []

    def counting(p: Any) -> Mapping[str, Any]:
        calls.append(1)
        return picky_decode(p)

    source = RecordFileSource(path, decode=counting, on_error="skip", views=views)
    shard = source.plan()[0]
    assert source.schema is not None
    calls.clear()
    result = source.read_result(shard, 3, 98)
    assert calls == []  # nothing is decoded before it is taken
    stream = result.content
    assert isinstance(stream, StreamedColumns)
    taken = iter(stream)
    first = next(taken)
    decoded_first = len(calls)
    window = labels[3:98]
    good = [y for y in window if y % 5 and y % 7]  # picky_decode: fails, or another shape
    assert 10 <= decoded_first <= 20  # one block: once, then once more one by one
    assert first.num_rows == len([y for y in window[:10] if y in good])
    rest = list(taken)
    assert len(rest) == 9 and len(calls) > decoded_first
    assert [s.index for s in result.skipped] == [
        3 + i for i, y in enumerate(window) if y not in good
    ]
    assert _labels_of([first, *rest]) == good
    whole = RecordFileSource(path, decode=picky_decode, on_error="skip")
    assert whole.read(shard, 3, 98).equals(source.read(shard, 3, 98))


@pytest.mark.parametrize("views", [False, True])
def test_decode_batch_is_called_a_block_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, views: bool
) -> None:
    # Blocks of 10 records: a range of 95 is decoded in 10 calls, in order, each when it is
    # taken, and skips are found across blocks.
    path, labels = _blocks_of_ten(tmp_path, monkeypatch)
    calls: list[int] = []

    def counting(ps: list[Any]) -> Mapping[str, Any]:
        calls.append(len(ps))
        return picky_decode_batch(ps)

    source = RecordFileSource(path, decode_batch=counting, on_error="skip", views=views)
    shard = source.plan()[0]
    assert source.schema is not None  # inferred from the first records that decode
    calls.clear()
    result = source.read_result(shard, 3, 98)
    assert calls == []  # nothing is decoded before it is taken
    stream = result.content
    assert isinstance(stream, StreamedColumns)
    taken = iter(stream)
    first = next(taken)
    # Each block holds a bad record, so it is retried a record at a time, which isolates it.
    assert calls == [10] + [1] * 10 and first.num_rows == 8
    rest = list(taken)
    assert [n for n in calls if n > 1] == [10] * 9 + [5]
    assert calls.count(1) == 95
    window = labels[3:98]
    assert [s.index for s in result.skipped] == [3 + i for i, y in enumerate(window) if y % 5 == 0]
    assert _labels_of([first, *rest]) == [y for y in window if y % 5]
    whole = RecordFileSource(path, decode_batch=picky_decode_batch, on_error="skip")
    assert whole.read(shard, 3, 98).equals(source.read(shard, 3, 98))


def test_without_decode_batches_hold_raw_payloads(files: list[tuple[str, list[int]]]) -> None:
    source = RecordFileSource([p for p, _ in files])
    shard = source.plan()[0]
    batch = source.read(shard, 5, 9)
    assert batch.schema == pa.schema([("record", pa.binary())])
    assert batch.column("record").to_pylist() == [payload(i) for i in files[0][1][5:9]]
    assert source.read(shard, 9, 9).schema == batch.schema


def test_a_failing_decode_names_file_record_and_offset(files: list[tuple[str, list[int]]]) -> None:
    path, _ = files[0]  # labels 100..149: record 5 has label 105
    offsets = RecordFile(path).offsets
    for kwargs in ({"decode": picky_decode}, {"decode_batch": picky_decode_batch}):
        source = RecordFileSource(path, **kwargs)
        shard = source.plan()[0]
        with pytest.raises(DecodeError) as info:
            source.read(shard, 1, 20)
        err = info.value
        assert (err.path, err.index, err.offset) == (path, 5, int(offsets[5]))
        assert f"{path}, record 5, byte offset {int(offsets[5])}" in str(err)
        assert isinstance(err.__cause__, ValueError) and "cursed" in str(err)


def test_a_record_that_does_not_fit_the_schema_is_named(files: list[tuple[str, list[int]]]) -> None:
    path, _ = files[0]  # labels 111..113: 112 (record 12) decodes to another shape
    source = RecordFileSource(path, decode=picky_decode)
    with pytest.raises(SchemaMismatchError) as info:
        source.read(source.plan()[0], 11, 14)
    offset = int(RecordFile(path).offsets[12])
    assert (info.value.path, info.value.index, info.value.offset) == (path, 12, offset)
    assert "column 'x': expected float32 array of shape (8,)" in str(info.value)


def test_skip_reports_every_skipped_record(files: list[tuple[str, list[int]]]) -> None:
    path, labels = files[0]
    offsets = RecordFile(path).offsets
    source = RecordFileSource(path, decode=picky_decode, on_error="skip")
    shard = source.plan()[0]
    result = source.read_result(shard, 0, shard.num_records)
    bad_decode = [i for i, y in enumerate(labels) if y % 5 == 0]
    bad_shape = [i for i, y in enumerate(labels) if y % 7 == 0 and y % 5 != 0]
    assert [s.index for s in result.skipped] == sorted(bad_decode + bad_shape)
    for s in result.skipped:
        assert s.path == path and s.offset == int(offsets[s.index])
        assert ("cursed" in s.error) if s.index in bad_decode else ("other shape" in s.error)
    kept = [y for y in labels if y % 5 and y % 7]
    assert result.batch.column("y").to_pylist() == kept
    assert result.batch.num_rows + len(result.skipped) == shard.num_records
    assert source.read(shard, 0, shard.num_records).equals(result.batch)


def test_skip_with_decode_batch_isolates_bad_records(files: list[tuple[str, list[int]]]) -> None:
    path, labels = files[0]
    source = RecordFileSource(path, decode_batch=picky_decode_batch, on_error="skip")
    shard = source.plan()[0]
    result = source.read_result(shard, 2, 30)
    window = labels[2:30]
    assert [s.index for s in result.skipped] == [2 + i for i, y in enumerate(window) if y % 5 == 0]
    assert result.batch.column("y").to_pylist() == [y for y in window if y % 5]
    clean = source.read_result(shard, 1, 5)  # labels 101..104: nothing to skip
    assert clean.skipped == () and clean.batch.num_rows == 4


@pytest.mark.parametrize("mode", ["decode", "decode_batch"])
def test_a_str_without_utf8_form_is_named_or_skipped_alone(
    files: list[tuple[str, list[int]]], mode: str
) -> None:
    path, labels = files[0]  # labels 100..149: 105, 112, ... (records 5, 12, ...) are bad
    offsets = RecordFile(path).offsets
    fn = {"decode": named_decode, "decode_batch": named_decode_batch}[mode]
    source = RecordFileSource(path, **{mode: fn})
    shard = source.plan()[0]
    with pytest.raises(DecodeError) as info:
        source.read(shard, 1, 20)
    err = info.value
    assert (err.path, err.index, err.offset) == (path, 5, int(offsets[5]))
    assert "column 'name'" in err.reason and "surrogates not allowed" in err.reason
    result = RecordFileSource(path, on_error="skip", **{mode: fn}).read_result(shard, 0, 50)
    bad = [i for i, y in enumerate(labels) if y % 7 == 0]
    assert [(s.index, s.offset) for s in result.skipped] == [(i, int(offsets[i])) for i in bad]
    assert all("column 'name'" in s.error for s in result.skipped)
    assert result.batch.column("y").to_pylist() == [y for y in labels if y % 7]


def test_corrupt_framing_is_raised_or_skipped(tmp_path: Path) -> None:
    path = tmp_path / "bad.tfrecord"
    write_records(path, [payload(i) for i in range(6)])
    offsets = RecordFile(str(path)).offsets
    raw = bytearray(path.read_bytes())
    raw[int(offsets[3]) + 12 + 5] ^= 0xFF  # a payload byte of record 3: its CRC fails
    path.write_bytes(bytes(raw))
    strict = RecordFileSource(str(path), decode=decode)
    with pytest.raises(CorruptRecordError, match="record 3"):
        strict.read(strict.plan()[0], 0, 6)
    lenient = RecordFileSource(str(path), decode=decode, on_error="skip")
    result = lenient.read_result(lenient.plan()[0], 0, 6)
    assert [(s.index, s.offset) for s in result.skipped] == [(3, int(offsets[3]))]
    assert "CRC" in result.skipped[0].error
    assert result.batch.column("y").to_pylist() == [0, 1, 2, 4, 5]


def test_given_schema_with_variable_length_text_and_bytes(
    files: list[tuple[str, list[int]]],
) -> None:
    path, labels = files[0]
    schema = pa.schema([("tok", pa.list_(pa.int32())), ("name", pa.string()), ("raw", pa.binary())])
    source = RecordFileSource(path, decode=var_decode, schema=schema)
    batch = source.read(source.plan()[0], 0, 8)
    assert batch.schema == schema
    assert batch.column("tok").to_pylist() == [list(range(y % 4)) for y in labels[:8]]
    assert batch.column("name").to_pylist() == [f"r{y}" for y in labels[:8]]
    # Inference merges the first records: their lengths of 'tok' differ (record 0's is empty),
    # so it is the same list column as the schema given.
    inferred = RecordFileSource(path, decode=var_decode)
    assert inferred.schema == schema
    assert inferred.read(inferred.plan()[0], 0, 8).equals(batch)
    # Should every one of the first records have one length, a later other one is refused.
    fixed_first = RecordFileSource(path, decode=_fixed_then_varying)
    with pytest.raises(SchemaMismatchError, match=rf"{path}, record 20.*'tok'.*\(2,\).*pa\.list_"):
        fixed_first.read(fixed_first.plan()[0], 0, 30)


def _fixed_then_varying(p: bytes) -> Mapping[str, Any]:
    record = dict(var_decode(p))
    y = int(np.frombuffer(p, np.int64, 1, DIM * 4)[0])
    record["tok"] = np.arange(3 if y - 100 == 20 else 2, dtype=np.int32)
    return record


def test_schema_is_inferred_from_the_first_decodable_record(
    files: list[tuple[str, list[int]]],
) -> None:
    path, _ = files[0]  # label 100 (record 0) fails to decode
    source = RecordFileSource(path, decode=picky_decode, on_error="skip")
    assert source.schema.names == ["x", "y"]
    strict = RecordFileSource(path, decode=picky_decode)
    assert strict.schema == source.schema  # a bad record is reported by its own read
    with pytest.raises(DecodeError, match="record 0"):
        strict.read(strict.plan()[0], 0, 1)
    hopeless = RecordFileSource(path, decode=_always_fails)
    with pytest.raises(DecodeError, match=rf"all failed.*{path}, record 0, byte offset 0.*nope"):
        _ = hopeless.schema


def _always_fails(p: bytes) -> Mapping[str, Any]:
    raise RuntimeError("nope")


def test_pickled_source_reads_the_same_in_this_and_a_spawned_process(
    files: list[tuple[str, list[int]]],
) -> None:
    source = RecordFileSource([p for p, _ in files], decode=decode)
    shard = source.plan()[1]
    expected = source.read(shard, 10, 30)
    blob = pickle.dumps(source)
    assert len(blob) < 2000  # paths, settings and the plan: no data, no open files
    clone = pickle.loads(blob)
    assert clone.plan() == source.plan()
    assert clone.read(shard, 10, 30).equals(expected)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=ctx) as pool:
        got = pool.submit(_read_in_child, blob, shard).result(timeout=120)
    assert got.equals(expected)


def _read_in_child(blob: bytes, shard: Shard) -> pa.RecordBatch:
    return pickle.loads(blob).read(shard, 10, 30)


def test_compressed_files_and_index_files_matched_by_globs(tmp_path: Path) -> None:
    write_records(tmp_path / "z.tfrecord.gz", [payload(i) for i in range(9)], compression="gzip")
    source = RecordFileSource(str(tmp_path / "*"), decode=decode)  # also matches *.shmidx
    assert [s.num_records for s in source.plan()] == [9]
    assert source.read(source.plan()[0], 4, 9).column("y").to_pylist() == [4, 5, 6, 7, 8]


def test_configuration_errors(files: list[tuple[str, list[int]]], tmp_path: Path) -> None:
    path = files[0][0]
    with pytest.raises(ConfigError, match="not both"):
        RecordFileSource(path, decode=decode, decode_batch=decode_batch)
    with pytest.raises(ConfigError, match="needs decode"):
        RecordFileSource(path, schema=pa.schema([("a", pa.int64())]))
    with pytest.raises(ConfigError, match="on_error"):
        RecordFileSource(path, on_error="ignore")
    with pytest.raises(ConfigError, match="matches no file"):
        RecordFileSource(str(tmp_path / "nothing*"))
    source = RecordFileSource(path)
    with pytest.raises(ConfigError, match="not one of this source's files"):
        source.read(Shard(files[1][0], 37), 0, 1)


def test_decoder_schema_is_used_without_guessing(tmp_path):
    """Variable-length features differ per record: the decoder's declared schema must win."""
    from shmloader.formats.example import ExampleDecoder, VarLenFeature, encode_example

    path = str(tmp_path / "v.tfrecord")
    lengths = [1, 3, 0, 2]
    write_records(path, [encode_example({"v": np.arange(n, dtype=np.int64)}) for n in lengths])
    decoder = ExampleDecoder({"v": VarLenFeature("int64")})
    source = RecordFileSource(path, decode=decoder)
    assert source.schema == decoder.schema
    batch = source.read(source.plan()[0], 0, 4)
    assert [len(v) for v in batch.column("v").to_pylist()] == lengths


seen_types: set[type] = set()


def typed_decode(p: Any) -> Mapping[str, Any]:
    seen_types.add(type(p))
    return decode(p)


def typed_decode_batch(ps: list[Any]) -> Mapping[str, Any]:
    seen_types.update(map(type, ps))
    return decode_batch(ps)


@pytest.mark.parametrize("mode", ["decode", "decode_batch"])
def test_views_hand_memoryviews_and_read_the_same_batches(
    files: list[tuple[str, list[int]]], mode: str
) -> None:
    path = files[0][0]
    kwargs: dict[str, Any] = {mode: typed_decode if mode == "decode" else typed_decode_batch}
    plain = RecordFileSource(path, **kwargs)
    viewed = RecordFileSource(path, **kwargs, views=True)
    shard = plain.plan()[0]
    seen_types.clear()
    expected = plain.read(shard, 2, 45)
    assert seen_types == {bytes}
    seen_types.clear()
    assert viewed.schema == plain.schema  # inferred from a memoryview as well
    assert viewed.read(shard, 2, 45).equals(expected)
    assert seen_types == {memoryview}
    # Travels to readers: the option is part of the pickled source.
    assert pickle.loads(pickle.dumps(viewed)).views is True


def test_views_keep_errors_and_skips_exact(files: list[tuple[str, list[int]]]) -> None:
    path, labels = files[0]
    offsets = RecordFile(path).offsets
    strict = RecordFileSource(path, decode=picky_decode, views=True)
    with pytest.raises(DecodeError) as info:
        strict.read(strict.plan()[0], 1, 20)
    assert (info.value.index, info.value.offset) == (5, int(offsets[5]))
    lenient = RecordFileSource(path, decode_batch=picky_decode_batch, on_error="skip", views=True)
    result = lenient.read_result(lenient.plan()[0], 0, len(labels))
    assert [s.index for s in result.skipped] == [i for i, y in enumerate(labels) if y % 5 == 0]
    assert result.batch.column("y").to_pylist() == [y for y in labels if y % 5]
    with pytest.raises(ConfigError, match="views=True needs decode"):
        RecordFileSource(path, views=True)


def test_one_file_named_several_ways_is_planned_once(tmp_path, monkeypatch):
    """Relative, ``./``-prefixed, absolute and globbed names of one file are one shard: as
    two, every record would be delivered twice per epoch."""
    write_records(str(tmp_path / "a.tfrecord"), [b"x"] * 5)
    monkeypatch.chdir(tmp_path)
    names = ["a.tfrecord", "./a.tfrecord", str(tmp_path / "a.tfrecord"), "*.tfrecord"]
    shards = RecordFileSource(names).plan()
    assert [(s.path, s.num_records) for s in shards] == [(str(tmp_path / "a.tfrecord"), 5)]


def test_a_file_and_a_link_to_it_are_planned_once(tmp_path, caplog):
    """A glob that matches a file and a symlink (or hard link) to it plans the file once,
    under its first name in sorted order, and says so."""
    write_records(str(tmp_path / "b.tfrecord"), [b"x"] * 5)
    write_records(str(tmp_path / "c.tfrecord"), [b"y"] * 3)
    os.symlink(tmp_path / "b.tfrecord", tmp_path / "a-latest.tfrecord")
    os.link(tmp_path / "c.tfrecord", tmp_path / "d.tfrecord")
    with caplog.at_level(logging.WARNING, logger="shmloader._fs"):
        shards = RecordFileSource(str(tmp_path / "*.tfrecord")).plan()
    # The file's own name, not the link's ("latest" links move); hard links: the first.
    assert [(os.path.basename(s.path), s.num_records) for s in shards] == [
        ("b.tfrecord", 5),
        ("c.tfrecord", 3),
    ]
    said = caplog.text
    assert "a-latest.tfrecord is the same file as" in said
    assert "d.tfrecord is the same file as" in said
