"""A tensor column of shape () (``pa.fixed_shape_tensor(type, ())``: one value per record)
through real readers, from a per-record ``decode`` that returns zero-dimensional arrays and
from a ``decode_batch``: every record arrives once and the column is a 1-D tensor per batch.
Per-record results of this shape used to fail every task (``ValueError`` from stacking
zero-dimensional arrays)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from _dataset_helpers import dataset, ids_of, write_dataset
from _decoders import SCALAR_TENSOR_SCHEMA, decode_batch_scalar_tensor, decode_scalar_tensor

import shmloader

SIZES = [70, 50]


@pytest.mark.parametrize("how", ["decode", "decode_batch"])
def test_a_tensor_column_of_shape_empty_arrives_as_one_value_per_row(
    tmp_path: Path, how: str
) -> None:
    write_dataset(tmp_path / "data", SIZES)
    fn = decode_scalar_tensor if how == "decode" else decode_batch_scalar_tensor
    source = shmloader.RecordFileSource(
        str(tmp_path / "data" / "*.tfrecord"), schema=SCALAR_TENSOR_SCHEMA, **{how: fn}
    )
    options = {"num_readers": 1, "records_per_task": 32, "shm_budget": "8MiB", "seed": 2}
    with dataset(tmp_path / "data", tmp_path / "shm", src=source, **options) as ds:
        got: Counter[int] = Counter()
        for batch in shmloader.DataLoader(ds, batch_size=16):
            assert batch["x"].ndim == 1 and batch["x"].shape == batch["id"].shape
            got.update(ids_of(batch))  # checks x == 2 * id row by row
    assert sorted(got) == list(range(sum(SIZES))) and set(got.values()) == {1}
