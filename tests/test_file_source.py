"""FileSource over a real folder of class subfolders (``train/<class>/<id>.npy``, one small
image each), read by real reader processes: every file once per epoch, a resumed epoch
exactly once, the plan's shards, the listing's inputs, and the errors that name the file.

The files are ``.npy`` arrays (``numpy.save``) rather than PNG or JPEG: the suite does not
depend on an image library, and what the source does with a file's bytes is the same.
"""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

import shmloader
from shmloader.sources.factory import source_for_paths

CLASSES = ("cat", "dog", "fox")
PER_CLASS = 20
SIZE = 4  # images of SIZE x SIZE x 3


def image_of(file_id: int) -> np.ndarray:
    return np.full((SIZE, SIZE, 3), file_id % 251, dtype=np.uint8)


def write_folder(root: Path, per_class: int = PER_CLASS) -> dict[int, str]:
    """``root/train/<class>/<id>.npy`` with ids unique across classes; id -> class."""
    labels = {}
    for c, name in enumerate(CLASSES):
        folder = root / "train" / name
        folder.mkdir(parents=True, exist_ok=True)
        for n in range(per_class):
            file_id = c * per_class + n
            np.save(folder / f"{file_id:04d}.npy", image_of(file_id))
            labels[file_id] = name
    return labels


def decode(data: bytes, path: str) -> Mapping[str, Any]:
    """The image, its id (the file's name) and its label (the folder's name)."""
    return {
        "image": np.load(io.BytesIO(data)),
        "id": int(os.path.basename(path).split(".")[0]),
        "label": CLASSES.index(os.path.basename(os.path.dirname(path))),
    }


@pytest.fixture
def folder(tmp_path: Path) -> tuple[Path, dict[int, str]]:
    labels = write_folder(tmp_path)
    return tmp_path / "train", labels


def ids_checked(batch: Mapping[str, Any]) -> list[int]:
    """The batch's ids, after checking each row's image and label belong to its id."""
    ids = [int(i) for i in batch["id"]]
    for row, file_id in enumerate(ids):
        assert np.array_equal(batch["image"][row].numpy(), image_of(file_id))
        assert int(batch["label"][row]) == file_id // PER_CLASS
    return ids


def open_dataset(src: shmloader.FileSource, shm: Path, **options: Any) -> Any:
    shm.mkdir(parents=True, exist_ok=True)
    settings: dict[str, Any] = {
        "num_readers": 2,
        "shuffle": True,
        "seed": 7,
        "shm_budget": "16MiB",
        "lease_timeout": 2.0,
        "shm_dir": str(shm),
        **options,
    }
    return shmloader.SharedTaskDataset(src, **settings)


# -- plan -----------------------------------------------------------------------------------


def test_every_file_is_one_record_and_any_run_of_records_spans_the_folders(
    folder: tuple[Path, dict[int, str]],
) -> None:
    root, labels = folder
    src = shmloader.FileSource(str(root / "*" / "*.npy"), decode=decode)
    (shard,) = src.plan()
    assert src.num_files == shard.num_records == len(labels)
    ids = src.read(shard, 0, shard.num_records).column("id").to_pylist()
    assert sorted(ids) == sorted(labels)
    # A task is a run of records: every run of 6 holds all 3 classes (in listing order, the
    # 6 files of a run would be of one class).
    for start in range(len(ids) - 5):
        assert {labels[i] for i in ids[start : start + 6]} == set(CLASSES), (start, ids)
    # The same files the same way: the same plan and records (a saved state's names).
    again = shmloader.FileSource(str(root), decode=decode)
    assert again.plan() == [shard]
    reader = pickle.loads(pickle.dumps(src))  # what a reader process gets
    assert reader.read(shard, 7, 12).equals(src.read(shard, 7, 12))
    assert reader.read(shard, 2, 2).num_rows == 0
    with pytest.raises(shmloader.ConfigError, match="outside the shard"):
        reader.read(shmloader.Shard(shard.path, 99), 0, 99)  # a reader's Shard: the task's


def test_a_folder_a_list_and_raw_records(folder: tuple[Path, dict[int, str]]) -> None:
    root, labels = folder
    (root / "dog" / ".DS_Store").write_bytes(b"not data")  # hidden: left out of a folder
    whole = shmloader.FileSource(root)
    assert whole.num_files == len(labels) and whole.root == str(root)
    shard = whole.plan()[0]
    batch = whole.read(shard, 0, 2)
    assert batch.schema == pa.schema([("path", pa.string()), ("data", pa.binary())])
    path = batch.column("path")[0].as_py()
    assert path == str(root / "cat" / "0000.npy")  # the first file of the sorted listing
    assert batch.column("data")[0].as_py() == Path(path).read_bytes()

    chosen: list[str | os.PathLike[str]] = [
        root / "fox" / "0041.npy",
        str(root / "cat" / "0003.npy"),
        root / "dog",
    ]
    listed = shmloader.FileSource(chosen, decode=decode)
    assert listed.num_files == 2 + PER_CLASS
    ids = [
        i
        for shard in listed.plan()
        for i in listed.read(shard, 0, shard.num_records).column("id").to_pylist()
    ]
    assert sorted(ids) == [3, *range(PER_CLASS, 2 * PER_CLASS), 41]


def test_tasks_are_sized_by_the_bytes_of_the_files(tmp_path: Path) -> None:
    """Files of 8 MiB (sparse: nothing written) make tasks of 4 of them, the 32 MiB a task
    aims at; files of a few bytes, tasks of an eighth of the folder (at least 8 tasks an epoch
    to spread over the readers); a small shm_budget, smaller tasks."""
    big = tmp_path / "big"
    big.mkdir()
    for i in range(40):
        with open(big / f"{i:02d}.bin", "wb") as f:
            f.truncate(8 << 20)
    src = shmloader.FileSource(big)
    assert src.shard_bytes() == {src.plan()[0].path: 40 * (8 << 20)}
    small = tmp_path / "small"
    small.mkdir()
    for i in range(100):
        (small / f"{i:03d}.txt").write_text(str(i))
    sized = {}
    (tmp_path / "shm").mkdir()
    for name, source, budget in [
        ("big", src, "4GiB"),
        ("small", shmloader.FileSource(small), "4GiB"),
        ("big, small budget", src, "64MiB"),
    ]:
        with shmloader.SharedTaskDataset(
            source, shm_dir=str(tmp_path / "shm"), shm_budget=budget, shuffle_window=2
        ) as ds:
            sized[name] = ds.job.records_per_task
    # 64 MiB holds 4 shuffle windows of 2 tasks of 8 MiB: one file a task.
    assert sized == {"big": 4, "small": -(-100 // 8), "big, small budget": 1}


# -- every file once per epoch, resumed exactly once -----------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_file_once_per_epoch_over_three_epochs(
    folder: tuple[Path, dict[int, str]], tmp_path: Path, num_workers: int
) -> None:
    root, labels = folder
    src = shmloader.FileSource(str(root / "*" / "*.npy"), decode=decode)
    shm = tmp_path / "shm"
    with open_dataset(src, shm, epochs=3) as ds:
        loader = shmloader.DataLoader(ds, batch_size=8, num_workers=num_workers)
        for _ in range(3):
            got = [i for batch in loader for i in ids_checked(batch)]
            assert Counter(got) == Counter(list(labels))
    assert not list(shm.iterdir())


def test_a_break_and_its_state_resume_the_epoch_exactly_once(
    folder: tuple[Path, dict[int, str]], tmp_path: Path
) -> None:
    root, labels = folder
    shm = tmp_path / "shm"
    with open_dataset(shmloader.FileSource(root, decode=decode), shm, epochs=2) as ds:
        loader = shmloader.DataLoader(ds, batch_size=8, num_workers=2)
        before: list[int] = []
        for batch in loader:
            before += ids_checked(batch)
            if len(before) == 24:
                break
        state = json.loads(json.dumps(loader.state_dict()))
    with open_dataset(shmloader.FileSource(root, decode=decode), shm, epochs=2) as ds:
        loader = shmloader.DataLoader(ds, batch_size=8, num_workers=2)
        loader.load_state_dict(state)
        rest = [i for batch in loader for i in ids_checked(batch)]
        following = [i for batch in loader for i in ids_checked(batch)]
    assert not set(before) & set(rest)
    assert Counter(before + rest) == Counter(list(labels))
    assert Counter(following) == Counter(list(labels))
    assert not list(shm.iterdir())

    # A file added since: the shards name other files, and the state is refused for them.
    np.save(root / "cat" / "0999.npy", image_of(999))
    changed = open_dataset(shmloader.FileSource(root, decode=decode), shm, epochs=2)
    with changed, pytest.raises(shmloader.ConfigError, match=r"differing: \['plan'\]"):
        shmloader.DataLoader(changed, batch_size=8).load_state_dict(state)
    assert not list(shm.iterdir())


# -- errors -----------------------------------------------------------------------------------


def test_a_pattern_that_matches_nothing_is_an_error_naming_it(tmp_path: Path) -> None:
    pattern = str(tmp_path / "train" / "*" / "*.jpg")
    with pytest.raises(shmloader.ConfigError, match="matches no file") as info:
        shmloader.FileSource(pattern)
    assert pattern in str(info.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(shmloader.ConfigError, match="no data files"):
        shmloader.FileSource(empty)
    with pytest.raises(shmloader.ConfigError, match="schema= needs decode"):
        shmloader.FileSource(pattern, schema=pa.schema([("x", pa.int64())]))
    with pytest.raises(shmloader.ConfigError, match="no paths given"):
        shmloader.FileSource([])


def test_a_file_deleted_after_listing_is_an_error_naming_it(
    folder: tuple[Path, dict[int, str]], tmp_path: Path
) -> None:
    root, _ = folder
    src = shmloader.FileSource(root, decode=decode)
    gone = root / "dog" / "0025.npy"
    gone.unlink()
    shm = tmp_path / "shm"
    with open_dataset(src, shm, epochs=1) as ds:
        got: list[int] = []
        with pytest.raises(shmloader.DataError, match="the file is gone") as info:
            for batch in shmloader.DataLoader(ds, batch_size=8):
                got += ids_checked(batch)
        assert info.value.path == str(gone)
        assert "make the source again" in str(info.value)
    assert 25 not in got and len(got) == len(set(got))
    assert not list(shm.iterdir())


def test_a_file_that_does_not_decode_is_named_or_skipped(
    folder: tuple[Path, dict[int, str]],
) -> None:
    root, _ = folder
    bad = root / "fox" / "0047.npy"
    bad.write_bytes(b"not an array")
    src = shmloader.FileSource(root, decode=decode)
    shard = shard_holding(src, str(bad))
    with pytest.raises(shmloader.DecodeError, match="decode failed: ValueError") as info:
        src.read(shard, 0, shard.num_records)
    assert info.value.path == str(bad)
    assert str(info.value).startswith(f"{bad}: decode failed")

    skipping = shmloader.FileSource(root, decode=decode, on_error="skip")
    result = skipping.read_result(shard, 0, shard.num_records)
    (skipped,) = result.skipped
    assert skipped.path == str(bad) and "decode failed" in skipped.error
    assert result.batch.num_rows == shard.num_records - 1
    assert 47 not in result.batch.column("id").to_pylist()


def test_a_given_schema_fixes_the_columns(folder: tuple[Path, dict[int, str]]) -> None:
    root, _ = folder
    schema = pa.schema(
        [
            ("image", pa.fixed_shape_tensor(pa.uint8(), (SIZE, SIZE, 3))),
            ("id", pa.int32()),
            ("label", pa.int8()),
        ]
    )
    src = shmloader.FileSource(root, decode=decode, schema=schema)
    assert src.read(src.plan()[0], 0, 2).schema == schema


def shard_holding(src: shmloader.FileSource, path: str) -> shmloader.Shard:
    """The shard of ``src`` that holds ``path``, found by a source of raw records (``path``,
    ``data``) over the same files, whose plan is the same."""
    raw = shmloader.FileSource(src.root, filesystem=src.filesystem)
    assert raw.plan() == src.plan()
    return next(
        s for s in raw.plan() if path in raw.read(s, 0, s.num_records).column("path").to_pylist()
    )


# -- the factory: a folder of images --------------------------------------------------------


def test_the_factory_reads_a_folder_of_images_as_files(tmp_path: Path) -> None:
    for name in ("a/1.jpg", "a/2.JPEG", "b/3.png"):
        (tmp_path / "images" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "images" / name).write_bytes(b"image bytes")
    found = source_for_paths(str(tmp_path / "images"))
    assert isinstance(found, shmloader.FileSource) and found.num_files == 3
    globbed = source_for_paths(str(tmp_path / "images" / "*" / "*.jpg"), decode=decode)
    assert isinstance(globbed, shmloader.FileSource) and globbed.num_files == 1


# -- an object store ----------------------------------------------------------------------------


@pytest.fixture
def bucket(monkeypatch: pytest.MonkeyPatch) -> Iterator[pafs.S3FileSystem]:
    """A bucket on a moto S3 server on 127.0.0.1, given to sources as ``filesystem=``. Its
    own name: a filesystem given for a path serves that path's folder for the rest of the
    process (here the bucket), and tests/test_object_store.py's bucket is ``data``."""
    moto_server = pytest.importorskip("moto.server")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.delenv(name, raising=False)
        s3 = pafs.S3FileSystem(
            endpoint_override=f"http://{host}:{port}",
            access_key="testing",
            secret_key="testing",
            region="us-east-1",
            allow_bucket_creation=True,
        )
        s3.create_dir("images")
        yield s3
    finally:
        server.stop()


def test_a_folder_on_an_object_store(
    bucket: pafs.S3FileSystem, folder: tuple[Path, dict[int, str]], tmp_path: Path
) -> None:
    root, labels = folder
    for path in sorted(root.rglob("*.npy")):
        with bucket.open_output_stream(f"images/train/{path.relative_to(root)}") as f:
            f.write(path.read_bytes())
    src = shmloader.FileSource("images/train", decode=decode, filesystem=bucket)
    assert src.root == "s3://images/train" and src.num_files == len(labels)
    shm = tmp_path / "shm"
    with open_dataset(src, shm, epochs=1) as ds:
        got = [i for batch in shmloader.DataLoader(ds, batch_size=8) for i in ids_checked(batch)]
    assert Counter(got) == Counter(list(labels))
    assert not list(shm.iterdir())

    shard = shard_holding(src, "s3://images/train/dog/0025.npy")
    bucket.delete_file("images/train/dog/0025.npy")
    with pytest.raises(shmloader.DataError, match="the file is gone") as info:
        pickle.loads(pickle.dumps(src)).read(shard, 0, shard.num_records)
    assert info.value.path == "s3://images/train/dog/0025.npy"
