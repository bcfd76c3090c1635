"""``s3://`` paths against a real S3-compatible server on loopback (moto's), found through
``AWS_ENDPOINT_URL`` as every process of the job sees it: Parquet (a directory, as
``pyarrow.dataset`` reads one) and record files, every record once per epoch, and nothing
written into the bucket."""

from __future__ import annotations

import logging
import os
import re
import struct
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

import shmloader

moto_server = pytest.importorskip("moto.server")


@pytest.fixture
def bucket(monkeypatch: pytest.MonkeyPatch) -> Iterator[pafs.S3FileSystem]:
    """A bucket on a moto server on 127.0.0.1; the environment points S3 at it (the readers,
    started by the trainer, inherit it)."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        for name, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint,
        }.items():
            monkeypatch.setenv(name, value)
        s3 = pafs.S3FileSystem(endpoint_override=endpoint, allow_bucket_creation=True)
        s3.create_dir("data")
        yield s3
    finally:
        server.stop()


def keys(s3: pafs.S3FileSystem) -> list[str]:
    infos = s3.get_file_info(pafs.FileSelector("data", recursive=True))
    return sorted(i.path for i in infos if i.type == pafs.FileType.File)


def read_epoch(src: shmloader.Source, shm: Path) -> Counter[int]:
    shm.mkdir(exist_ok=True)
    with shmloader.SharedTaskDataset(
        src, num_readers=2, records_per_task=100, epochs=1, shm_dir=str(shm)
    ) as ds:
        return Counter(i for b in shmloader.DataLoader(ds, batch_size=64) for i in b["id"].tolist())


def test_a_parquet_directory_on_s3_is_a_dataset(bucket: pafs.S3FileSystem, tmp_path: Path) -> None:
    for part, first in enumerate(range(0, 900, 300)):
        ids = np.arange(first, first + 300, dtype=np.int64)
        table = pa.table({"id": ids, "x": ids.astype(np.float32) * 2})
        pq.write_table(table, f"data/parquet/year={2024 + part}/part-0.parquet", filesystem=bucket)
    with bucket.open_output_stream("data/parquet/_SUCCESS") as f:  # what Spark leaves
        f.write(b"")
    before = keys(bucket)
    source = shmloader.ParquetSource("s3://data/parquet/")
    assert [s.num_records for s in source.plan()] == [300, 300, 300]
    assert read_epoch(source, tmp_path / "shm") == Counter(range(900))
    found = shmloader.source_for_paths("s3://data/parquet")
    assert isinstance(found, shmloader.ParquetSource) and len(found.plan()) == 3
    assert keys(bucket) == before  # nothing written into the bucket


def test_record_files_on_s3_keep_their_index_in_a_local_cache(
    bucket: pafs.S3FileSystem, tmp_path: Path
) -> None:
    for part in range(2):
        local = tmp_path / f"part-{part}.tfrecord"
        ids = range(part * 500, (part + 1) * 500)
        shmloader.write_records(local, (struct.pack("<q", i) for i in ids))
        with bucket.open_output_stream(f"data/records/part-{part}.tfrecord") as f:
            f.write(local.read_bytes())
    before = keys(bucket)
    cache = tmp_path / "index-cache"
    source = shmloader.RecordFileSource(
        "s3://data/records/*.tfrecord",
        decode=lambda payload: {"id": struct.unpack("<q", payload)[0]},
        index_dir=str(cache),
    )
    assert read_epoch(source, tmp_path / "shm") == Counter(range(1000))
    assert len(list(cache.iterdir())) == 2  # one index per file, here
    assert keys(bucket) == before


def test_a_missing_bucket_key_names_the_uri(bucket: pafs.S3FileSystem) -> None:
    with pytest.raises(
        shmloader.ConfigError, match=re.escape("s3://data/nothing/x.parquet: no such file")
    ):
        shmloader.ParquetSource("s3://data/nothing/x.parquet")


def test_an_explicit_filesystem_travels_to_the_readers_without_the_environment(
    bucket: pafs.S3FileSystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``filesystem=`` with its own endpoint and credentials: the trainer and its readers read
    through it, with no AWS variable set in any process."""
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    s3 = pafs.S3FileSystem(
        endpoint_override=endpoint, access_key="testing", secret_key="testing", region="us-east-1"
    )
    ids = np.arange(500, dtype=np.int64)
    pq.write_table(pa.table({"id": ids}), "data/explicit/part-0.parquet", filesystem=s3)
    source = shmloader.ParquetSource("data/explicit/", filesystem=s3)
    assert source.paths == ["s3://data/explicit/part-0.parquet"]
    assert read_epoch(source, tmp_path / "shm") == Counter(range(500))
    found = shmloader.source_for_paths("data/explicit", filesystem=s3)
    assert isinstance(found, shmloader.ParquetSource) and found.plan()[0].num_records == 500
    with pytest.raises(shmloader.ConfigError, match=r"must be a pyarrow\.fs\.FileSystem"):
        shmloader.ParquetSource("data/explicit/", filesystem="s3")  # type: ignore[arg-type]
