"""A variable-length list column of numbers whose rows all have one length, in every file, is
read by ArrowSource as one tensor (Hugging Face ``datasets`` writes fixed-size embeddings as
``list<double>``); one whose length varies stays a list, and so does every such column of a
source made ``with_varying_lists()``."""

from __future__ import annotations

import logging
import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest
import torch

import shmloader
from shmloader.sources import ArrowSource, column_to_numpy

WIDTH = 8


def tokens_of(i: int) -> list[int]:
    return list(range(i % 4))  # lengths 0 to 3: a column whose length varies


def _table(n: int, first: int = 0, width: int = WIDTH) -> pa.Table:
    ids = range(first, first + n)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "x": pa.array(
                [[i + k / 10 for k in range(width)] for i in ids], pa.list_(pa.float64())
            ),
            "tokens": pa.array([tokens_of(i) for i in ids], pa.list_(pa.int64())),
        }
    )


def _write(path: Path, table: pa.Table, *, stream: bool, rows_per_batch: int = 7) -> str:
    with pa.OSFile(str(path), "wb") as sink:
        writer = (pa.ipc.new_stream if stream else pa.ipc.new_file)(sink, table.schema)
        for batch in table.to_batches(max_chunksize=rows_per_batch):
            writer.write_batch(batch)
        writer.close()
    return str(path)


def _is_list(column: pa.Array) -> bool:
    return bool(pa.types.is_list(column.type) or pa.types.is_large_list(column.type))


def _check_x(column: pa.Array, ids: list[int]) -> None:
    """``x`` is a tensor column holding each record's own values."""
    values = column_to_numpy(column)
    assert values.shape == (len(ids), WIDTH) and values.dtype == np.float64
    want = np.array(ids, dtype=np.float64)[:, None] + np.arange(WIDTH) / 10
    np.testing.assert_allclose(values, want)


@pytest.mark.parametrize("stream", [False, True], ids=["file", "stream"])
def test_a_list_of_one_length_is_a_tensor_and_one_that_varies_a_list(
    tmp_path: Path, stream: bool
) -> None:
    source = ArrowSource(_write(tmp_path / "d.arrow", _table(31), stream=stream))
    (shard,) = source.plan()
    for start, stop in [(0, 31), (3, 17), (7, 14), (30, 31)]:
        batch = source.read(shard, start, stop)
        _check_x(batch.column("x"), list(range(start, stop)))
        tokens = batch.column("tokens")
        assert _is_list(tokens)
        assert tokens.to_pylist() == [tokens_of(i) for i in range(start, stop)]
    assert source.tensor_shapes() == {"x": (WIDTH,)}


@pytest.mark.parametrize("stream", [False, True], ids=["file", "stream"])
def test_files_not_mapped_are_looked_at_too(tmp_path: Path, stream: bool) -> None:
    """Through a filesystem that is not the local one (as an object store is), the plan finds
    the same: the column's form does not depend on where the files are."""
    _write(tmp_path / "d.arrow", _table(20), stream=stream)
    remote = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    source = ArrowSource("d.arrow", filesystem=remote)
    (shard,) = source.plan()
    assert not shard.path.startswith("/")  # read through the filesystem given, not mapped
    _check_x(source.read(shard, 2, 19).column("x"), list(range(2, 19)))
    assert _is_list(source.read(shard, 2, 19).column("tokens"))


@pytest.mark.parametrize("stream", [False, True], ids=["file", "stream"])
def test_lengths_that_differ_between_files_stay_a_list(tmp_path: Path, stream: bool) -> None:
    _write(tmp_path / "a.arrow", _table(10, 0, width=WIDTH), stream=stream)
    _write(tmp_path / "b.arrow", _table(10, 10, width=WIDTH + 1), stream=stream)
    source = ArrowSource(str(tmp_path / "*.arrow"))
    for shard in source.plan():
        column = source.read(shard, 0, shard.num_records).column("x")
        assert _is_list(column)
    assert source.tensor_shapes() == {}


def test_a_null_row_or_an_empty_row_keeps_a_list(tmp_path: Path) -> None:
    rows: list[list[float] | None] = [[1.0, 2.0]] * 5
    for name, odd in (("null", None), ("empty", [])):
        column = pa.array([*rows, odd], pa.list_(pa.float64()))
        path = _write(tmp_path / f"{name}.arrow", pa.table({"x": column}), stream=False)
        source = ArrowSource(path)
        (shard,) = source.plan()
        assert _is_list(source.read(shard, 0, 6).column("x")), name


def test_with_varying_lists_keeps_a_list_and_tensors_given_still_apply(tmp_path: Path) -> None:
    path = _write(tmp_path / "d.arrow", _table(20), stream=True)
    source = ArrowSource(path)
    (shard,) = source.plan()
    varying = source.with_varying_lists()
    assert _is_list(varying.read(shard, 0, 20).column("x"))
    assert source.tensor_shapes() == {"x": (WIDTH,)}  # the original decides as before
    unplanned = ArrowSource(path).with_varying_lists()
    assert _is_list(unplanned.read(unplanned.plan()[0], 2, 9).column("x"))
    declared = ArrowSource(path, tensors={"x": (2, 4)}).with_varying_lists()
    x = column_to_numpy(declared.read(shard, 0, 20).column("x"))
    assert x.shape == (20, 2, 4)


def test_tensors_given_win_over_the_length_found(tmp_path: Path) -> None:
    source = ArrowSource(
        _write(tmp_path / "d.arrow", _table(12), stream=False), tensors={"x": (2, 4)}
    )
    (shard,) = source.plan()
    x = column_to_numpy(source.read(shard, 0, 12).column("x"))
    assert x.shape == (12, 2, 4)
    np.testing.assert_allclose(x[5].ravel(), 5 + np.arange(WIDTH) / 10)


def test_a_pickled_source_keeps_what_the_plan_found(tmp_path: Path) -> None:
    path = _write(tmp_path / "d.arrow", _table(30), stream=True)  # batches of 7 rows
    source = ArrowSource(path)
    (shard,) = source.plan()
    sent = pickle.dumps(source)
    unplanned = pickle.dumps(ArrowSource(path))
    # The stream, cut short inside its last batch (rows 28-29): rows 4-22 still read, but a
    # plan, which walks every batch, fails. What the plan found travels with the source.
    whole = Path(path).read_bytes()
    Path(path).write_bytes(whole[:-100])
    with pytest.raises(shmloader.DataError, match="cannot read record batch 4"):
        ArrowSource(path).plan()
    clone = pickle.loads(sent)
    assert clone.tensor_shapes() == {"x": (WIDTH,)}  # a reader does not plan again
    a, b = source.read(shard, 4, 22), clone.read(shard, 4, 22)
    assert a.equals(b)
    Path(path).write_bytes(whole)
    _check_x(b.column("x"), list(range(4, 22)))
    # Pickled before it planned: it plans when it first reads, and finds the same.
    fresh = pickle.loads(unplanned)
    _check_x(fresh.read(shard, 4, 22).column("x"), list(range(4, 22)))


def test_a_hugging_face_dataset_gives_a_fixed_list_as_one_tensor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A ``datasets.Dataset`` with a ``List(Value("float64"))`` column of 8 values in every
    row: each batch gives it as one (batch, 8) tensor, every id once per epoch, and no word
    that its length varies; the column whose length does vary stays a list of tensors."""
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    monkeypatch.setenv("SHMLOADER_DATASETS_DIR", str(tmp_path / "cache"))
    n = 300
    table = _table(n)
    dataset = datasets.Dataset.from_dict(table.to_pydict())
    assert pa.types.is_list(dataset.data.schema.field("x").type)  # as datasets writes it
    shm = tmp_path / "shm"
    shm.mkdir()
    epochs = 2
    seen: list[Counter[int]] = [Counter() for _ in range(epochs)]
    with (
        caplog.at_level(logging.WARNING, logger="shmloader"),
        shmloader.SharedTaskDataset(
            dataset, records_per_task=40, epochs=epochs, num_readers=2, shm_dir=str(shm)
        ) as ds,
    ):
        for epoch in range(epochs):
            for batch in shmloader.DataLoader(ds, batch_size=32):
                ids = batch["id"].tolist()
                x = batch["x"]
                assert isinstance(x, torch.Tensor) and x.shape == (len(ids), WIDTH)
                want = torch.tensor(ids, dtype=torch.float64)[:, None] + torch.arange(WIDTH) / 10
                torch.testing.assert_close(x, want)
                tokens = batch["tokens"]
                assert isinstance(tokens, list)
                assert [t.tolist() for t in tokens] == [tokens_of(i) for i in ids]
                seen[epoch].update(ids)
    assert seen == [Counter(range(n))] * epochs
    said = [r.getMessage() for r in caplog.records if "varies" in r.getMessage()]
    assert said and all("'x'" not in line and "'tokens'" in line for line in said), said


def test_ragged_given_to_the_dataset_keeps_the_list(tmp_path: Path) -> None:
    """``ragged=`` says how lists are batched, so the user expects lists: ``x`` comes padded
    with its lengths, as a column whose length varies does."""
    source = ArrowSource(_write(tmp_path / "d.arrow", _table(60), stream=False))
    shm = tmp_path / "shm"
    shm.mkdir()
    ids: list[int] = []
    with shmloader.SharedTaskDataset(
        source, ragged="padded", records_per_task=20, epochs=1, num_readers=1, shm_dir=str(shm)
    ) as ds:
        for batch in shmloader.DataLoader(ds, batch_size=16):
            assert batch["x_lengths"].tolist() == [WIDTH] * len(batch["id"])
            assert batch["x"].shape == (len(batch["id"]), WIDTH)
            ids += batch["id"].tolist()
    assert sorted(ids) == list(range(60))
    assert source.tensor_shapes() == {"x": (WIDTH,)}  # the source given is left as it was
