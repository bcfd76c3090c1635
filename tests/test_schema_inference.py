"""A schema inferred before the first batch, from a sample spread over the data.

JSON Lines whose token lists hold 3 values in the first 500 rows and up to 213 after them:
the sample (the first records and runs spread over the whole plan) sees both, so the column
is a variable-length list from the start, and every record comes once per epoch. Under
``ragged=`` every 1-D column of numbers is a list whatever the sample shows. A record the
sample misses that still misfits is an error naming it and the exact ``schema=`` to give,
which, given, reads the whole data.
"""

from __future__ import annotations

import collections
import json
import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import shmloader
from shmloader.sources import _inferred
from shmloader.sources._decoding import At
from shmloader.sources.base import Shard

RECORDS = 1000
LONG_FROM = 500


def _tokens(i: int) -> list[int]:
    return [i, i + 1, i + 2] if i < LONG_FROM else list(range(i % 213 + 1))


def _write(path: Path, tokens=_tokens) -> str:  # type: ignore[no-untyped-def]
    with open(path, "w") as f:
        for i in range(RECORDS):
            f.write(json.dumps({"id": i, "tokens": tokens(i), "emb": [0.5, 1.5]}) + "\n")
    return str(path)


def _epochs(ds: shmloader.SharedTaskDataset, epochs: int, **loader: int) -> list[dict[int, list]]:
    """Per epoch: id -> the tokens delivered for it, each id's count checked to be one."""
    seen = []
    for _ in range(epochs):
        counts: collections.Counter[int] = collections.Counter()
        tokens: dict[int, list] = {}
        for batch in shmloader.DataLoader(ds, batch_size=32, **loader):
            ids = batch["id"].tolist()
            counts.update(ids)
            if isinstance(batch["tokens"], list):
                rows = [t.tolist() for t in batch["tokens"]]
            else:  # padded: cut at the lengths
                lengths = batch["tokens_lengths"].tolist()
                rows = [row[:n] for row, n in zip(batch["tokens"].tolist(), lengths, strict=True)]
            tokens.update(zip(ids, rows, strict=True))
        assert counts == collections.Counter(range(RECORDS)), "not every id exactly once"
        seen.append(tokens)
    return seen


def test_lists_that_grow_long_after_row_500_are_a_list_column_from_the_start(
    tmp_path: Path,
) -> None:
    src = shmloader.JSONLSource(_write(tmp_path / "data.jsonl"))
    assert src.schema.field("tokens").type == pa.list_(pa.int64())
    # A column of one length in every record sampled stays one tensor per batch.
    assert src.schema.field("emb").type == pa.fixed_shape_tensor(pa.float64(), (2,))
    with shmloader.SharedTaskDataset(src, epochs=2, records_per_task=100) as ds:
        for tokens in _epochs(ds, 2, num_workers=2):
            assert all(tokens[i] == _tokens(i) for i in range(RECORDS))


def test_ragged_given_makes_every_1d_column_a_list(tmp_path: Path) -> None:
    """Lists of 3 in every record: without ragged= a tensor; with it, a list, delivered in
    the chosen form; the user's source object is left as it was."""
    path = _write(tmp_path / "data.jsonl", tokens=lambda i: [i, i, i])
    src = shmloader.JSONLSource(path)
    assert src.schema.field("tokens").type == pa.fixed_shape_tensor(pa.int64(), (3,))
    with shmloader.SharedTaskDataset(src, epochs=3, records_per_task=250, ragged="padded") as ds:
        first, second = _epochs(ds, 2)
        assert first == second == {i: [i, i, i] for i in range(RECORDS)}
        batch = next(iter(shmloader.DataLoader(ds, batch_size=4)))
        assert batch["emb_lengths"].tolist() == [2, 2, 2, 2]  # every 1-D column: a list
    assert src.schema.field("tokens").type == pa.fixed_shape_tensor(pa.int64(), (3,))


def test_ragged_given_reads_lists_that_grow_long_late(tmp_path: Path) -> None:
    src = shmloader.JSONLSource(_write(tmp_path / "data.jsonl"))
    with shmloader.SharedTaskDataset(src, epochs=1, records_per_task=100, ragged="padded") as ds:
        (tokens,) = _epochs(ds, 1)
    assert all(tokens[i] == _tokens(i) for i in range(RECORDS))


def _one_short(i: int) -> list[int]:
    return [1, 2] if i == 300 else [1, 2, 3]


def test_a_record_the_sample_misses_names_the_schema_to_give(tmp_path: Path) -> None:
    """Record 300 lies between two of the sample's runs: the error names it, says the fix
    once, and the schema it names, given to the source, reads every record."""
    path = _write(tmp_path / "data.jsonl", tokens=_one_short)
    src = shmloader.JSONLSource(path)
    with (
        shmloader.SharedTaskDataset(src, epochs=1, num_readers=1) as ds,
        pytest.raises(shmloader.SchemaMismatchError) as caught,
    ):
        _epochs(ds, 1)
    text = str(caught.value)
    assert caught.value.index == 300 and text.startswith(f"{path}, record 300, byte offset "), text
    assert "column 'tokens': expected int64 array of shape (3,), found list of 2 values" in text
    schema_text = (
        "schema=pa.schema([('id', pa.int64()), ('tokens', pa.list_(pa.int64())), "
        "('emb', pa.fixed_shape_tensor(pa.float64(), (2,)))])"
    )
    assert text.count(schema_text) == 1, text
    assert text.count('on_error="skip"') == 1, text
    schema = eval(schema_text.removeprefix("schema="), {"pa": pa})  # the code it says
    fixed = shmloader.JSONLSource(path, schema=schema)
    with shmloader.SharedTaskDataset(fixed, epochs=1, records_per_task=250) as ds:
        (tokens,) = _epochs(ds, 1)
    assert tokens == {i: _one_short(i) for i in range(RECORDS)}


def test_the_error_keeps_its_fix_through_pickling() -> None:
    """Errors travel from reader processes pickled: the fix comes with them, once."""
    error = shmloader.SchemaMismatchError("column 'x': other", path="f", index=3, fix="do this")
    again = pickle.loads(pickle.dumps(error))
    assert str(again) == str(error) == "f, record 3: column 'x': other. do this"


def test_the_sample_is_spread_over_every_shard_and_the_same_each_time() -> None:
    plan = [Shard("a", 10), Shard("b", 0), Shard("c", 990)]
    runs = _inferred.spread_runs(plan)
    assert runs == _inferred.spread_runs(list(plan))
    assert len(runs) == _inferred.INFER_POINTS
    assert runs[0] == ("c", 52, 56)  # record 62 of all 1000: the middle of the first eighth
    assert all(path == "c" and stop - start == _inferred.INFER_RUN for path, start, stop in runs)
    assert _inferred.spread_runs([Shard("a", 3)]) == [("a", 0, 3)]  # overlapping runs: one
    assert _inferred.spread_runs([Shard("a", 0)]) == []


def test_records_that_no_more_could_change_are_not_read_again(tmp_path: Path) -> None:
    """Images (arrays of 2 dimensions or more) and floats: the first records decide, and the
    spread runs are not decoded; a column of Python ints is worth the spread runs."""
    from shmloader.sources.columns import infer_schema

    def schema_of(path: str, item: dict) -> pa.Schema:
        decoded.append(item["n"])
        return infer_schema(item["record"])

    image = {"image": np.zeros((4, 4, 3), np.uint8), "score": 0.5}
    first = [("f", At(i, 0), {"n": i, "record": image}) for i in range(20)]
    spread = [("f", At(i, 0), {"n": i, "record": image}) for i in range(100, 132)]
    decoded: list[int] = []
    _inferred.infer_schema_from(first, schema_of, spread=spread)
    assert decoded == list(range(16))
    labelled = {**image, "label": 3}
    first = [("f", At(i, 0), {"n": i, "record": labelled}) for i in range(20)]
    spread = [
        ("f", At(i, 0), {"n": i, "record": {**labelled, "label": 0.5}}) for i in range(100, 104)
    ]
    decoded.clear()
    schema = _inferred.infer_schema_from(first, schema_of, spread=spread)
    assert decoded == [*range(16), *range(100, 104)]
    assert schema.field("label").type == pa.float64()  # a float further on: float64 from the start
