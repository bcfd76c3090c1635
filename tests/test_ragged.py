"""Variable-length list columns from every source, in each form ``ragged=`` offers.

Each record ``i`` holds the list ``list(range(i, i + LENGTHS[i % 5]))``: empty, short and long
rows side by side. Every record must come once per epoch, and each row's values must come
back whole from the batch's form: the list of tensors, the padded tensor cut at its length
(the padding all ``pad_value``), or the values cut at the offsets.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
import torch

import shmloader

RECORDS = 240
LENGTHS = (0, 1, 3, 300, 2)  # empty, short, long
PAD = -7


def tokens_of(i: int) -> list[int]:
    return list(range(i, i + LENGTHS[i % len(LENGTHS)]))


def _table() -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(RECORDS), pa.int64()),
            "tokens": pa.array([tokens_of(i) for i in range(RECORDS)], pa.list_(pa.int64())),
        }
    )


def _parquet(tmp: Path) -> shmloader.ParquetSource:
    pq.write_table(_table(), tmp / "data.parquet", row_group_size=60)
    return shmloader.ParquetSource(str(tmp / "data.parquet"))


def _arrow(tmp: Path) -> shmloader.ArrowSource:
    feather.write_feather(_table(), str(tmp / "data.arrow"), compression="uncompressed")
    return shmloader.ArrowSource(str(tmp / "data.arrow"))


def _jsonl(tmp: Path) -> shmloader.JSONLSource:
    with open(tmp / "data.jsonl", "w") as f:
        for i in range(RECORDS):
            f.write(json.dumps({"id": i, "tokens": tokens_of(i)}) + "\n")
    return shmloader.JSONLSource(str(tmp / "data.jsonl"))


def _records(tmp: Path, as_lists: bool) -> shmloader.RecordFileSource:
    shmloader.write_records(
        tmp / "data.tfrecord", (i.to_bytes(8, "little") for i in range(RECORDS))
    )
    return shmloader.RecordFileSource(
        str(tmp / "data.tfrecord"), decode=_decode_lists if as_lists else _decode_arrays
    )


def _decode_arrays(payload: bytes) -> dict[str, Any]:
    i = int.from_bytes(payload, "little")
    return {"id": i, "tokens": np.array(tokens_of(i), dtype=np.int64)}


def _decode_lists(payload: bytes) -> dict[str, Any]:
    i = int.from_bytes(payload, "little")
    return {"id": i, "tokens": tokens_of(i)}  # Python lists, the empty one without a dtype


def _hf(tmp: Path) -> Any:
    datasets = pytest.importorskip("datasets")
    return datasets.Dataset.from_dict(
        {"id": list(range(RECORDS)), "tokens": [tokens_of(i) for i in range(RECORDS)]}
    )


SOURCES: dict[str, Callable[[Path], Any]] = {
    "parquet": _parquet,
    "arrow": _arrow,
    "jsonl": _jsonl,
    "decode arrays": lambda tmp: _records(tmp, as_lists=False),
    "decode lists": lambda tmp: _records(tmp, as_lists=True),
    "hf datasets": _hf,
}


def rows_of(batch: dict[str, Any], form: str) -> list[list[int]]:
    """Each row's values back from the batch's form, checking the form's invariants."""
    tokens = batch["tokens"]
    if form == "list":
        assert isinstance(tokens, list) and all(t.dtype == torch.int64 for t in tokens)
        return [t.tolist() for t in tokens]
    if form == "padded":
        lengths = batch["tokens_lengths"]
        assert tokens.dtype == torch.int64 and lengths.dtype == torch.int64
        assert tokens.shape == (len(lengths), int(lengths.max()))  # padded to the longest
        mask = torch.arange(tokens.shape[1]) < lengths[:, None]
        assert bool((tokens[~mask] == PAD).all())
        return [row[:n].tolist() for row, n in zip(tokens, lengths.tolist(), strict=True)]
    offsets = batch["tokens_offsets"].tolist()
    assert tokens.ndim == 1 and offsets[0] == 0 and offsets[-1] == len(tokens)
    return [tokens[a:b].tolist() for a, b in itertools.pairwise(offsets)]


@pytest.mark.parametrize("form", ["list", "padded", "offsets"])
@pytest.mark.parametrize("source", list(SOURCES))
def test_every_row_comes_once_and_whole(tmp_path: Path, source: str, form: str) -> None:
    src = SOURCES[source](tmp_path)
    workers = 2 if (source, form) in {("parquet", "padded"), ("jsonl", "offsets")} else 0
    options: dict[str, Any] = {"records_per_task": 50, "epochs": 1, "num_readers": 1}
    with shmloader.SharedTaskDataset(src, ragged=form, pad_value=PAD, **options) as ds:
        seen: dict[int, list[int]] = {}
        ids: list[int] = []
        for batch in shmloader.DataLoader(ds, batch_size=32, num_workers=workers):
            batch_ids = batch["id"].tolist()
            ids += batch_ids
            seen.update(zip(batch_ids, rows_of(batch, form), strict=True))
    assert sorted(ids) == list(range(RECORDS))
    assert all(seen[i] == tokens_of(i) for i in range(RECORDS))


def test_left_to_its_default_the_form_is_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = _parquet(tmp_path)
    for ragged, says in ((None, 1), ("list", 0)):
        caplog.clear()
        options = {} if ragged is None else {"ragged": ragged}
        with (
            caplog.at_level(logging.WARNING, logger="shmloader"),
            shmloader.SharedTaskDataset(src, records_per_task=50, epochs=2, **options) as ds,
        ):
            for _ in range(2):
                assert sum(len(b["id"]) for b in shmloader.DataLoader(ds, batch_size=32)) == 240
        said = [r.getMessage() for r in caplog.records if "ragged='padded'" in r.getMessage()]
        assert len(said) == says, caplog.text
        assert all("'tokens' hold lists whose length varies" in line for line in said)


def test_a_length_that_changes_after_the_first_records_is_named_at_its_record(
    tmp_path: Path,
) -> None:
    """Every record the inference samples has 3 values: a tensor column. Record 300 (between
    two of the sample's runs) has 2: the error names record 300 (its cause used to say "record
    0", the place in the range converted)."""
    with open(tmp_path / "data.jsonl", "w") as f:
        for i in range(1000):
            f.write(json.dumps({"id": i, "tokens": [1, 2] if i == 300 else [1, 2, 3]}) + "\n")
    src = shmloader.JSONLSource(str(tmp_path / "data.jsonl"))
    with (
        shmloader.SharedTaskDataset(src, epochs=1, num_readers=1) as ds,
        pytest.raises(shmloader.SchemaMismatchError) as caught,
    ):
        list(shmloader.DataLoader(ds, batch_size=8))
    error = caught.value
    assert error.index == 300 and "record 300" in str(error), str(error)
    assert "('tokens', pa.list_(pa.int64()))" in str(error)
    cause = error.__cause__
    while cause is not None:
        assert "record 0" not in str(cause), repr(cause)
        cause = cause.__cause__


def test_an_empty_python_list_fits_a_declared_list_column(tmp_path: Path) -> None:
    """``schema=`` with ``pa.list_(pa.int64())`` and a decode that returns ``[]``: numpy takes
    an empty list for float64, which used to fail "float64 cannot be cast to int64"."""
    shmloader.write_records(tmp_path / "r.tfrecord", (i.to_bytes(8, "little") for i in range(20)))
    schema = pa.schema([("id", pa.int64()), ("tokens", pa.list_(pa.int64()))])
    src = shmloader.RecordFileSource(str(tmp_path / "r.tfrecord"), decode=_empty, schema=schema)
    with shmloader.SharedTaskDataset(src, epochs=1, num_readers=1, ragged="offsets") as ds:
        batches = list(shmloader.DataLoader(ds, batch_size=20))
    assert batches[0]["tokens"].dtype == torch.int64 and len(batches[0]["tokens"]) == 0
    assert batches[0]["tokens_offsets"].tolist() == [0] * 21


def _empty(payload: bytes) -> dict[str, Any]:
    return {"id": int.from_bytes(payload, "little"), "tokens": []}


def test_lists_empty_in_every_first_record_ask_for_a_schema(tmp_path: Path) -> None:
    shmloader.write_records(tmp_path / "r.tfrecord", (i.to_bytes(8, "little") for i in range(20)))
    src = shmloader.RecordFileSource(str(tmp_path / "r.tfrecord"), decode=_empty)
    with pytest.raises(shmloader.DecodeError, match=r"'tokens' holds an empty list .* pa\.list_"):
        _ = src.schema


def test_a_column_the_form_would_add_is_refused(tmp_path: Path) -> None:
    table = _table().append_column("tokens_lengths", pa.array(range(RECORDS), pa.int64()))
    pq.write_table(table, tmp_path / "data.parquet")
    src = shmloader.ParquetSource(str(tmp_path / "data.parquet"))
    with (
        shmloader.SharedTaskDataset(src, epochs=1, ragged="padded") as ds,
        pytest.raises(shmloader.ConfigError, match="adds a column 'tokens_lengths'"),
    ):
        list(shmloader.DataLoader(ds, batch_size=16))


def test_a_null_row_is_none_as_a_list_and_an_error_padded(tmp_path: Path) -> None:
    tokens = pa.array([[1, 2], None, []] * 10, pa.list_(pa.int64()))
    pq.write_table(pa.table({"id": range(30), "tokens": tokens}), tmp_path / "n.parquet")
    src = shmloader.ParquetSource(str(tmp_path / "n.parquet"))
    with shmloader.SharedTaskDataset(src, epochs=1, ragged="list", shuffle=False) as ds:
        batch = next(iter(shmloader.DataLoader(ds, batch_size=3)))
        assert batch["tokens"][1] is None and batch["tokens"][2].tolist() == []
    with (
        shmloader.SharedTaskDataset(src, epochs=1, ragged="padded") as ds,
        pytest.raises(shmloader.DataError, match="null row, which ragged='padded' cannot hold"),
    ):
        list(shmloader.DataLoader(ds, batch_size=3))


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"ragged": "pad"}, r"ragged must be one of 'list', 'padded', 'offsets', got 'pad'"),
        ({"ragged": "padded", "pad_value": "0"}, "pad_value must be a number"),
    ],
)
def test_a_form_that_does_not_exist_is_a_config_error(
    tmp_path: Path, options: dict[str, Any], says: str
) -> None:
    src = _parquet(tmp_path)
    with pytest.raises(shmloader.ConfigError, match=says):
        shmloader.SharedTaskDataset(src, **options)


def test_a_fractional_pad_for_integers_is_refused(tmp_path: Path) -> None:
    src = _parquet(tmp_path)
    with (
        shmloader.SharedTaskDataset(src, epochs=1, ragged="padded", pad_value=0.5) as ds,
        pytest.raises(shmloader.ConfigError, match=r"pad_value 0\.5 is not a value of column"),
    ):
        list(shmloader.DataLoader(ds, batch_size=16))


def test_inference_merges_the_first_records() -> None:
    """A length that varies (or an empty list) makes a list column; ints and floats of one
    length make a float tensor; ints and floats as scalars float64."""
    from shmloader.sources.columns import infer_schema, merge_inferred

    records = [
        {"fixed": [1, 2, 3], "number": 1, "varies": [1, 2], "empty_first": []},
        {"fixed": [1.5, 2, 3], "number": 2.5, "varies": [], "empty_first": [7]},
        {"fixed": [1, 2, 3], "number": 3, "varies": [4], "empty_first": [8, 9]},
    ]
    schema = merge_inferred([infer_schema(r) for r in records])
    assert schema.field("fixed").type == pa.fixed_shape_tensor(pa.float64(), (3,))
    assert schema.field("number").type == pa.float64()
    assert schema.field("varies").type == pa.list_(pa.int64())
    assert schema.field("empty_first").type == pa.list_(pa.int64())
