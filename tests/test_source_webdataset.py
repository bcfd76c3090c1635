"""WebDatasetSource over tars written by ``tarfile``: grouping, long names, ranges, errors."""

from __future__ import annotations

import io
import os
import pickle
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from shmloader.errors import (
    CorruptRecordError,
    DataError,
    SchemaMismatchError,
    TruncatedRecordError,
)
from shmloader.formats.index import sidecar_path
from shmloader.sources import column_to_numpy
from shmloader.sources.webdataset import WebDatasetSource

N = 40
LONG_DIR = "deep/" + "d" * 110  # member names over 100 characters


def key(i: int) -> str:
    return f"{LONG_DIR if i % 7 == 3 else 'shard'}/{i:06d}"


def npy(i: int) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.full((2, 3), i, dtype=np.float32))
    return buf.getvalue()


def fields(i: int) -> dict[str, bytes]:
    return {"cls": str(i % 10).encode(), "npy": npy(i), "txt": b"t" * (i % 5)}


def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_tar(path: Path, n: int = N, fmt: int = tarfile.PAX_FORMAT) -> None:
    with tarfile.open(path, "w", format=fmt) as tar:
        add(tar, "__meta__", b"not a sample")
        for i in range(n):
            if i == 5:
                d = tarfile.TarInfo("shard/dir")
                d.type = tarfile.DIRTYPE
                tar.addfile(d)
            for field, data in fields(i).items():
                add(tar, f"{key(i)}.{field.upper() if field == 'txt' else field}", data)


def decode(sample: dict[str, Any]) -> Mapping[str, Any]:
    return {
        "x": np.load(io.BytesIO(sample["npy"])),
        "label": int(sample["cls"]),
        "key": sample["__key__"],
    }


@pytest.fixture(params=[tarfile.PAX_FORMAT, tarfile.GNU_FORMAT], ids=["pax", "gnu"])
def data(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    p = tmp_path / "s.tar"
    write_tar(p, fmt=request.param)
    return p


def test_default_columns_every_range(data: Path) -> None:
    src = WebDatasetSource(str(data))
    (shard,) = src.plan()
    assert shard.num_records == N
    assert src.schema == pa.schema(
        [("__key__", pa.string()), ("cls", pa.binary()), ("npy", pa.binary()), ("txt", pa.binary())]
    )
    for start, stop in [(0, N), (0, 1), (N - 1, N), (3, 4), (7, 7), (2, 31)]:
        got = src.read(shard, start, stop).to_pylist()
        assert got == [{"__key__": key(i)} | fields(i) for i in range(start, stop)]


def test_decode_to_tensors(data: Path) -> None:
    src = WebDatasetSource(str(data), decode=decode)
    shard = src.plan()[0]
    batch = src.read(shard, 10, 20)
    x = column_to_numpy(batch.column("x"))
    assert x.shape == (10, 2, 3) and x[0, 0, 0] == 10
    assert batch.column("label").to_pylist() == [i % 10 for i in range(10, 20)]
    assert batch.column("key").to_pylist() == [key(i) for i in range(10, 20)]


def test_missing_field_is_named_or_skipped(tmp_path: Path) -> None:
    p = tmp_path / "m.tar"
    with tarfile.open(p, "w") as tar:
        for i in range(6):
            for field, data in fields(i).items():
                if not (i == 2 and field == "npy"):
                    add(tar, f"s/{i}.{field}", data)
    src = WebDatasetSource(str(p))
    shard = src.plan()[0]
    with pytest.raises(SchemaMismatchError) as info:
        src.read(shard, 0, 6)
    err = info.value
    assert err.path == str(p) and err.index == 2 and err.offset is not None
    assert "'npy'" in str(err) and "'s/2'" in str(err)
    result = WebDatasetSource(str(p), on_error="skip").read_result(shard, 0, 6)
    assert [s.index for s in result.skipped] == [2]
    assert result.batch.column("__key__").to_pylist() == ["s/0", "s/1", "s/3", "s/4", "s/5"]


def test_grouping_follows_webdataset(tmp_path: Path) -> None:
    p = tmp_path / "g.tar"
    with tarfile.open(p, "w") as tar:
        for name in [
            "a/1.x.png",
            "a/1.cls",
            "noext",
            "a/1.cls",
            "b.c/2.cls",
            ".hidden",
            "b.c/3.cls",
        ]:
            add(tar, name, name.encode())
    src = WebDatasetSource(str(p), on_error="skip")
    shard = src.plan()[0]
    assert shard.num_records == 4  # a repeated field starts a new sample with the same key
    result = src.read_result(shard, 0, 4)
    assert src.schema.names == ["__key__", "x.png", "cls"]
    assert result.batch.column("__key__").to_pylist() == ["a/1"]
    assert [s.error.split(" (")[0] for s in result.skipped][:1] == ["missing column(s) 'x.png'"]


def test_damaged_and_truncated_archives(tmp_path: Path) -> None:
    p = tmp_path / "s.tar"
    write_tar(p, 6)
    raw = bytearray(p.read_bytes())
    bad = tmp_path / "bad.tar"
    raw_bad = bytearray(raw)
    with tarfile.open(p) as tar:
        header = tar.getmembers()[2].offset
    raw_bad[header + 10] ^= 0x01  # a digit of the name: another valid key, wrong checksum
    bad.write_bytes(bytes(raw_bad))
    with pytest.raises(CorruptRecordError, match="checksum") as info:
        WebDatasetSource(str(bad)).plan()
    assert info.value.offset == header
    # Damage after indexing, with size and mtime kept: the read still checks every header.
    src = WebDatasetSource(str(p))
    shard = src.plan()[0]
    st = p.stat()
    p.write_bytes(bytes(raw_bad))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(CorruptRecordError, match="checksum") as info:
        WebDatasetSource(str(p)).read(shard, 0, 6)
    assert info.value.offset == header
    cut = tmp_path / "cut.tar"
    cut.write_bytes(bytes(raw[: 512 * 9 + 100]))
    with pytest.raises(TruncatedRecordError):
        WebDatasetSource(str(cut)).plan()


@pytest.mark.parametrize(("ending", "name"), [("gz", "gzip"), ("bz2", "bzip2"), ("xz", "xz")])
def test_a_compressed_shard_is_named_as_such(tmp_path: Path, ending: str, name: str) -> None:
    """Read as a tar, a .tar.gz failed with "checksum", as if the archive were damaged."""
    p = tmp_path / f"s.tar.{ending}"
    with tarfile.open(p, f"w:{ending}") as tar:
        add(tar, "shard/000000.cls", b"1")
    with pytest.raises(DataError, match=f"a {name}-compressed stream") as info:
        WebDatasetSource(str(p)).plan()
    assert info.value.path == str(p) and "Decompress it" in str(info.value)


def test_index_reuse_staleness_and_pickling(tmp_path: Path) -> None:
    p = tmp_path / "s.tar"
    write_tar(p, 10)
    src = WebDatasetSource(str(p), decode=decode)
    shard = src.plan()[0]
    index = Path(sidecar_path(str(p), "wds"))
    before = index.stat().st_mtime_ns
    assert WebDatasetSource(str(p)).plan() == [shard]
    assert index.stat().st_mtime_ns == before
    _ = src.schema
    clone = pickle.loads(pickle.dumps(src))
    assert clone.read(shard, 2, 9).equals(src.read(shard, 2, 9))
    write_tar(p, 12)
    os.utime(p, ns=(before + 10**9, before + 10**9))
    fresh = WebDatasetSource(str(p))
    assert fresh.plan()[0].num_records == 12
    assert fresh.read(fresh.plan()[0], 11, 12).column("__key__").to_pylist() == [key(11)]
