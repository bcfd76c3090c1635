"""Files that shrink after the dataset planned them: a read must fail naming the file, never
return fewer rows than the task's range (records lost from the epoch without a word).

A task's range comes from the plan, which a source keeps (and pickles into its readers); a
file rewritten or truncated later no longer holds it. Parquet and Arrow reads used to return
what was left of the range, and the text and tar sources an ``IndexError`` in a reader started
after the change. Readers also check every task's rows against its range, for sources of the
user's own (``_decoders.DroppingSource``).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
from _dataset_helpers import ids_of, write_dataset
from _decoders import SCHEMA, DroppingSource, decode

import shmloader
from shmloader.errors import DataError
from shmloader.sources import (
    ArrowSource,
    CSVSource,
    JSONLSource,
    ParquetSource,
    RecordFileSource,
    WebDatasetSource,
)


def _id_of(payload: bytes) -> dict[str, int]:
    return {"id": struct.unpack("<q", payload)[0]}


def _jsonl(path: Path, n: int) -> None:
    path.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(n)))


def _csv(path: Path, n: int) -> None:
    path.write_text("id\n" + "".join(f"{i}\n" for i in range(n)))


def _tar(path: Path, n: int) -> None:
    with tarfile.open(path, "w") as tar:
        for i in range(n):
            info = tarfile.TarInfo(f"{i:04d}.id")
            info.size = len(str(i))
            tar.addfile(info, io.BytesIO(str(i).encode()))


def _records(path: Path, n: int) -> None:
    shmloader.write_records(path, (struct.pack("<q", i) for i in range(n)), index=False)


def _parquet(path: Path, n: int) -> None:
    pq.write_table(pa.table({"id": np.arange(n)}), path, row_group_size=5)


def _arrow(path: Path, n: int) -> None:
    feather.write_feather(pa.table({"id": np.arange(n)}), path, chunksize=5)


def _arrow_stream(path: Path, n: int) -> None:
    table = pa.table({"id": np.arange(n)})
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_stream(f, table.schema) as writer:
        writer.write_table(table, max_chunksize=5)


KINDS: dict[str, tuple[Callable[[Path, int], None], Callable[[str], Any]]] = {
    "jsonl": (_jsonl, JSONLSource),
    "csv": (_csv, CSVSource),
    "tar": (_tar, WebDatasetSource),
    "tfrecord": (_records, lambda p: RecordFileSource(p, decode=_id_of)),
    "parquet": (_parquet, ParquetSource),
    "arrow": (_arrow, ArrowSource),
    "arrows": (_arrow_stream, ArrowSource),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("warm", [False, True], ids=["new-reader", "reader-that-read"])
def test_a_file_that_shrank_after_planning_is_an_error_naming_it(
    tmp_path: Path, kind: str, warm: bool
) -> None:
    write, make = KINDS[kind]
    path = tmp_path / f"data.{kind}"
    write(path, 20)
    source = make(str(path))
    (shard,) = source.plan()
    assert shard.num_records == 20
    reader = pickle.loads(pickle.dumps(source))  # what a reader process gets
    if warm:
        reader.read(shard, 10, 20)  # its in-process caches (offsets, batch sizes) filled
    write(path, 12)
    if not warm:
        reader = pickle.loads(pickle.dumps(source))  # a reader started after the change
    with pytest.raises(DataError) as info:
        got = reader.read(shard, 10, 20)
        pytest.fail(f"read {got.num_rows} rows of records [10, 20) of a file of 12")
    assert str(path) in str(info.value)


def test_a_source_that_returns_a_short_task_fails_it_instead_of_losing_records(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "data"
    expected = write_dataset(directory, [400])
    source = DroppingSource(str(directory / "*.tfrecord"), decode=decode, schema=SCHEMA)
    shm = tmp_path / "shm"
    shm.mkdir()
    with shmloader.SharedTaskDataset(
        source,
        num_readers=1,
        records_per_task=100,
        epochs=1,
        max_retries=1,
        shm_budget="16MiB",
        shm_dir=str(shm),
    ) as ds:
        got: list[int] = []
        with pytest.raises(shmloader.DataError) as info:
            for batch in shmloader.DataLoader(ds, batch_size=50):
                got += ids_of(batch)
        message = str(info.value)
        assert "records [200, 300)" in message
        assert "the source gave 99 rows and skipped 0" in message
        assert len(got) == len(set(got)) and set(got) <= set(expected)
        assert not set(got) & set(range(200, 300))
    assert not list(shm.iterdir())


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_error_says_what_the_file_holds_when_it_ends_before_the_range(
    tmp_path: Path, kind: str
) -> None:
    """A file that no longer reaches a task's first record: the error gives the number of
    records it holds now (an Arrow stream said the task's start, 10, for a file of 8)."""
    write, make = KINDS[kind]
    path = tmp_path / f"data.{kind}"
    write(path, 20)
    source = make(str(path))
    (shard,) = source.plan()
    write(path, 8)
    reader = pickle.loads(pickle.dumps(source))
    with pytest.raises(DataError, match=r"records \[10, 20\) were planned, but the file holds 8"):
        reader.read(shard, 10, 20)


def test_an_arrow_file_rewritten_shorter_with_as_many_batches_is_an_error(tmp_path: Path) -> None:
    """A reader that had read an Arrow IPC file kept its batch sizes while the file had as
    many batches: rewritten shorter (20 rows in 4 batches of 5 -> 12 rows in 4 batches), it
    sliced the new batches by the old sizes and returned rows 2..11 for records [10, 20)."""
    path = tmp_path / "data.arrow"
    _arrow(path, 20)
    source = ArrowSource(str(path))
    (shard,) = source.plan()
    reader = pickle.loads(pickle.dumps(source))
    reader.read(shard, 0, 10)  # batch sizes (5, 5, 5, 5) counted and kept
    ids = np.arange(100, 112)
    schema = pa.schema([("id", pa.int64())])
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, schema) as writer:
        for lo, hi in ((0, 1), (1, 2), (2, 3), (3, 12)):
            writer.write_batch(pa.record_batch([pa.array(ids[lo:hi])], schema=schema))
    with pytest.raises(DataError, match="the file holds 12 now") as info:
        got = reader.read(shard, 10, 20)
        pytest.fail(f"read ids {got.column('id').to_pylist()} as records [10, 20) of 12 rows")
    assert str(path) in str(info.value)


@pytest.mark.timeout(120)
def test_a_file_replaced_by_rename_mid_epoch_is_refused_naming_it(tmp_path: Path) -> None:
    """Another valid file of the same size and record count renamed over one of the dataset's
    while it runs: its tasks read after that would have mixed both files' ids into one epoch
    without a word. Now the reader of such a task refuses it, and the loop says which file."""
    directory = tmp_path / "data"
    write_dataset(directory, [500])
    target = directory / "part-00000.tfrecord"
    write_dataset(tmp_path / "other", [500], first_id=10_000)  # same sizes, other ids
    replacement = tmp_path / "other" / "part-00000.tfrecord"
    assert replacement.stat().st_size == target.stat().st_size
    replaced = tmp_path / "replaced"

    def decode_after_task_0(payload: bytes) -> dict[str, Any]:
        # Records past the first task wait until the file was replaced: the reader is then
        # inside task 1 (read from the file it opened), and every later task starts after.
        record = decode(payload)
        while record["id"] >= 100 and not os.path.exists(replaced):
            time.sleep(0.005)
        return record

    shm = tmp_path / "shm"
    shm.mkdir()
    source = shmloader.RecordFileSource(
        str(directory / "*.tfrecord"), decode=decode_after_task_0, schema=SCHEMA
    )
    got: list[int] = []
    with shmloader.SharedTaskDataset(
        source,
        num_readers=1,
        records_per_task=100,
        shuffle=False,
        epochs=1,
        shm_budget="16MiB",
        shm_dir=str(shm),
    ) as ds:
        with pytest.raises(shmloader.DataError, match="changed while the dataset ran") as info:
            for batch in shmloader.DataLoader(ds, batch_size=50):
                got += ids_of(batch)
                if len(got) == 100:
                    os.replace(replacement, target)  # atomically, as a writer would
                    replaced.touch()
        assert info.value.path == str(target)
        assert "inode" in str(info.value)
    # Task 0, and task 1 if the loop took it before the error came: the file as planned.
    assert sorted(got) in (list(range(100)), list(range(200)))
    assert not list(shm.iterdir())
