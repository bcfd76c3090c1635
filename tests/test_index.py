"""Sidecar offset indexes: location, freshness, damage, fallback and atomic replacement."""

from __future__ import annotations

import logging
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from shmloader.errors import ConfigError, DataError, IndexMismatchError
from shmloader.formats.checksum import crc32c
from shmloader.formats.index import (
    cached_index,
    cached_offsets,
    default_index_dir,
    fallback_index_path,
    find_index,
    load_offsets,
    read_index,
    save_offsets,
    sidecar_path,
)
from shmloader.formats.tfrecord import RecordFile, read_records, write_records

OFFSETS = np.array([0, 10, 25, 25, 90], dtype=np.uint64)


@pytest.fixture
def data(tmp_path: Path) -> str:
    path = tmp_path / "data.bin"
    path.write_bytes(b"x" * 90)
    return str(path)


def test_a_file_named_for_its_kind_gets_one_suffix_and_older_names_are_still_read(
    tmp_path: Path,
) -> None:
    data = str(tmp_path / "train.tfrecord")
    Path(data).write_bytes(b"x" * 90)
    assert sidecar_path(data, "tfrecord") == data + ".shmidx"
    assert sidecar_path(data, "tfrecord-gzip") == data + ".tfrecord-gzip.shmidx"
    assert save_offsets(data, "tfrecord", OFFSETS) == data + ".shmidx"
    # An index written under the earlier name (train.tfrecord.tfrecord.shmidx) is used as it is.
    os.rename(data + ".shmidx", data + ".tfrecord.shmidx")
    found = read_index(data, "tfrecord")
    assert found is not None and found.where == data + ".tfrecord.shmidx"
    np.testing.assert_array_equal(found.offsets, OFFSETS)


def test_round_trip_and_location(data: str) -> None:
    assert load_offsets(data, "lines") is None
    where = save_offsets(data, "lines", OFFSETS)
    assert where == sidecar_path(data, "lines") == data + ".lines.shmidx"
    got = load_offsets(data, "lines")
    assert got is not None and got.dtype == np.uint64 and not got.flags.writeable
    np.testing.assert_array_equal(got, OFFSETS)
    # Aligned whatever the kind's name length puts the numbers at: numpy copies an unaligned
    # array in every searchsorted (a reader's lookup of each block).
    for kind in ("lines", "tar", "tfrecord", "tfrecord-gzip"):
        save_offsets(data, kind, OFFSETS)
        got = load_offsets(data, kind)
        assert got is not None and got.flags.aligned and not got.flags.writeable, kind
        np.testing.assert_array_equal(got, OFFSETS)
    # Kinds live side by side.
    save_offsets(data, "tar", np.array([512], dtype=np.uint64))
    np.testing.assert_array_equal(load_offsets(data, "tar"), [512])
    np.testing.assert_array_equal(load_offsets(data, "lines"), OFFSETS)
    assert not [n for n in os.listdir(os.path.dirname(data)) if n.endswith(".tmp")]


@pytest.mark.parametrize("data_mode", [0o644, 0o640, 0o600, 0o755])
def test_an_index_is_as_readable_as_its_data(data: str, data_mode: int) -> None:
    """On a shared dataset, another user who may read the data may read its index too (a
    private index would be rebuilt and replaced by each user in turn)."""
    os.chmod(data, data_mode)
    where = save_offsets(data, "lines", OFFSETS)
    assert os.stat(where).st_mode & 0o777 == data_mode & 0o666


@pytest.mark.parametrize("bad", [np.array([], dtype=np.uint64), np.array([5, 4]), np.zeros((2, 2))])
def test_save_rejects_bad_offsets(data: str, bad: np.ndarray) -> None:
    with pytest.raises(ConfigError):
        save_offsets(data, "lines", bad)


@pytest.mark.parametrize("kind", ["", "a/b", "has space", "x" * 65, "dot.ted"])
def test_kind_must_be_a_safe_name(data: str, kind: str) -> None:
    with pytest.raises(ConfigError, match="kind"):
        save_offsets(data, kind, OFFSETS)


def test_missing_data_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        load_offsets(str(tmp_path / "nope"), "lines")


def test_stale_after_append_or_rewrite(data: str) -> None:
    save_offsets(data, "lines", OFFSETS)
    with open(data, "ab") as f:
        f.write(b"more")
    assert load_offsets(data, "lines") is None
    save_offsets(data, "lines", OFFSETS)
    st = os.stat(data)
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # rewritten, same size
    assert load_offsets(data, "lines") is None


def test_cached_offsets_builds_once_and_rebuilds_when_stale(data: str) -> None:
    calls: list[int] = []

    def build() -> np.ndarray:
        calls.append(1)
        return OFFSETS

    np.testing.assert_array_equal(cached_offsets(data, "lines", build), OFFSETS)
    np.testing.assert_array_equal(cached_offsets(data, "lines", build), OFFSETS)
    assert len(calls) == 1
    with open(data, "ab") as f:
        f.write(b"more")
    cached_offsets(data, "lines", build)
    assert len(calls) == 2
    assert load_offsets(data, "lines") is not None


def _damage(index: str, how: str) -> None:
    raw = bytearray(Path(index).read_bytes())
    if how == "truncated":
        raw = raw[:-9]
    elif how == "flipped":
        raw[-10] ^= 0x01
    elif how == "magic":
        raw[0:8] = b"NOTANIDX"
    elif how == "empty":
        raw = bytearray()
    Path(index).write_bytes(bytes(raw))


@pytest.mark.parametrize("how", ["truncated", "flipped", "magic", "empty"])
def test_damaged_index_is_detected_and_replaced(
    data: str, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    index = save_offsets(data, "lines", OFFSETS)
    _damage(index, how)
    with pytest.raises(IndexMismatchError, match="damaged index") as info:
        load_offsets(data, "lines")
    assert index in str(info.value)
    with caplog.at_level(logging.WARNING, logger="shmloader.formats.index"):
        got = cached_offsets(data, "lines", lambda: OFFSETS)
    np.testing.assert_array_equal(got, OFFSETS)
    assert "rebuilding" in caplog.text
    np.testing.assert_array_equal(load_offsets(data, "lines"), OFFSETS)


def test_lost_records_round_trip_as_version_2(data: str) -> None:
    plain = Path(save_offsets(data, "lines", OFFSETS)).read_bytes()
    assert plain[8:12] == (1).to_bytes(4, "little")  # no lost records: version 1, as before
    where = save_offsets(data, "lines", OFFSETS, lost=np.array([1, 3]))
    raw = Path(where).read_bytes()
    assert raw[8:12] == (2).to_bytes(4, "little") and len(raw) == len(plain) + 8 + 16
    entry = read_index(data, "lines")
    assert entry is not None and entry.where == where
    np.testing.assert_array_equal(entry.offsets, OFFSETS)
    assert entry.lost.tolist() == [1, 3] and not entry.lost.flags.writeable
    np.testing.assert_array_equal(load_offsets(data, "lines"), OFFSETS)  # numbered alike
    for bad in (np.array([3, 1]), np.array([4]), np.array([2, 2])):
        with pytest.raises(ConfigError, match="lost records"):
            save_offsets(data, "lines", OFFSETS, lost=bad)
    # A damaged lost list is a damaged index, rebuilt by cached_index.
    tampered = bytearray(raw)
    tampered[-12] ^= 0x40  # the last lost number, then a checksum that matches again
    tampered[-4:] = crc32c(bytes(tampered[:-4])).to_bytes(4, "little")
    Path(where).write_bytes(bytes(tampered))
    with pytest.raises(IndexMismatchError, match="lost record numbers"):
        read_index(data, "lines")
    rebuilt = cached_index(data, "lines", lambda: (OFFSETS, np.array([2], dtype=np.uint64)))
    assert rebuilt.where == "" and rebuilt.lost.tolist() == [2]
    again = read_index(data, "lines")
    assert again is not None and again.lost.tolist() == [2]


def test_index_of_another_kind_is_foreign(data: str) -> None:
    index = save_offsets(data, "lines", OFFSETS)
    shutil.copy(index, sidecar_path(data, "tar"))
    with pytest.raises(IndexMismatchError, match="kind 'lines'"):
        load_offsets(data, "tar")


def test_blocked_sidecar_falls_back_to_index_dir(data: str, tmp_path: Path) -> None:
    # Something that cannot be replaced sits where the sidecar would go.
    os.mkdir(sidecar_path(data, "lines"))
    cache = str(tmp_path / "cache")
    where = save_offsets(data, "lines", OFFSETS, index_dir=cache)
    assert where == fallback_index_path(data, "lines", index_dir=cache)
    assert where.startswith(cache) and where.endswith(".lines.shmidx")
    np.testing.assert_array_equal(load_offsets(data, "lines", index_dir=cache), OFFSETS)
    assert load_offsets(data, "lines", index_dir=str(tmp_path / "elsewhere")) is None


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX permissions")
def test_read_only_directory_falls_back_to_index_dir(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    path = str(ro / "data.tfrecord")
    write_records(path, [b"a", b"bc"], index=False)
    ro.chmod(0o555)
    try:
        try:
            (ro / "probe").write_bytes(b"")
        except PermissionError:
            pass
        else:
            pytest.skip("this user can write into read-only directories (root)")
        cache = str(tmp_path / "cache")
        rf = RecordFile(path, index_dir=cache)
        assert rf.num_records == 2
        found = find_index(path, "tfrecord", index_dir=cache)
        assert found is not None and found[0].startswith(cache)
        assert os.listdir(ro) == ["data.tfrecord"]
    finally:
        ro.chmod(0o755)


def test_index_dir_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SHMLOADER_INDEX_DIR", str(tmp_path / "env"))
    assert default_index_dir() == str(tmp_path / "env")
    assert default_index_dir(str(tmp_path / "arg")) == str(tmp_path / "arg")
    monkeypatch.delenv("SHMLOADER_INDEX_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_index_dir() == str(tmp_path / "xdg" / "shmloader" / "index")
    # Equal file names in different directories get different cache entries.
    a = fallback_index_path("/x/one/data.tfrecord", "tfrecord")
    b = fallback_index_path("/x/two/data.tfrecord", "tfrecord")
    assert a != b and os.path.basename(a).startswith("data.tfrecord-")


def test_record_file_rebuilds_stale_index(tmp_path: Path) -> None:
    path = str(tmp_path / "data.tfrecord")
    write_records(path, [b"a"] * 10)
    assert RecordFile(path).num_records == 10
    with open(path, "ab") as f:  # appended by another writer
        f.write(Path(path).read_bytes())
    assert RecordFile(path).num_records == 20
    assert list(read_records(path, 15, 20)) == [b"a"] * 5
    write_records(path, [b"bb"] * 3, index=False)  # rewritten, index left behind
    assert RecordFile(path).num_records == 3


def test_concurrent_readers_never_see_half_an_index(data: str) -> None:
    big = np.arange(0, 50_001, dtype=np.uint64)
    save_offsets(data, "lines", big)
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        try:
            while not stop.is_set():
                got = load_offsets(data, "lines")
                assert got is not None and len(got) == len(big)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for _ in range(100):
            save_offsets(data, "lines", big)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[0]


@pytest.mark.parametrize("suffix", [".tmp", ".part", ".partial", ".TMP", "~"])
def test_a_file_written_under_a_temporary_name_and_renamed_leaves_no_stray_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    """The atomic write (write ``x.tfrecord.tmp``, rename it to ``x.tfrecord``) leaves the
    folder holding the data and, once it is read, its index under the final name; nothing
    named after the temporary path, there or in the index cache."""
    from shmloader import RecordFileSource

    cache = tmp_path / "cache"
    monkeypatch.setenv("SHMLOADER_INDEX_DIR", str(cache))
    folder = tmp_path / "data"
    folder.mkdir()
    final = folder / "x.tfrecord"
    temporary = folder / f"x.tfrecord{suffix}"
    payloads = [i.to_bytes(8, "little") for i in range(25)]
    assert write_records(temporary, payloads) == 25
    assert sorted(os.listdir(folder)) == [temporary.name]
    os.rename(temporary, final)

    source = RecordFileSource(str(folder / "*.tfrecord"), decode=lambda b: {"i": b[0]})
    (shard,) = source.plan()
    assert shard.num_records == 25
    assert source.read(shard, 20, 25).column("i").to_pylist() == [20, 21, 22, 23, 24]
    assert list(read_records(final, 3, 6)) == payloads[3:6]
    assert sorted(os.listdir(folder)) == ["x.tfrecord", "x.tfrecord.shmidx"]
    assert not cache.exists() or os.listdir(cache) == []
    assert read_index(str(final), "tfrecord") is not None


def test_a_temporary_name_gets_its_index_when_asked_and_other_names_by_default(
    tmp_path: Path,
) -> None:
    kept = tmp_path / "x.tfrecord.tmp"
    write_records(kept, [b"a", b"b"], index=True)
    assert (tmp_path / "x.tfrecord.tmp.tfrecord.shmidx").exists()
    plain = tmp_path / "y.tfrecord"
    write_records(plain, [b"a", b"b"])
    assert (tmp_path / "y.tfrecord.shmidx").exists()
    # "tmp" inside a name is not a temporary name.
    inside = tmp_path / "tmp.data.tfrecord"
    write_records(inside, [b"a"])
    assert (tmp_path / "tmp.data.tfrecord.shmidx").exists()
