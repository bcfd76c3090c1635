"""Decoded values -> Arrow: type mapping, tensor layout, schema checks and error messages."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmloader.errors import ConfigError, DecodeError, SchemaMismatchError
from shmloader.sources.columns import (
    BatchBuilder,
    as_tensor_column,
    column_to_numpy,
    columns_to_batch,
    infer_schema,
    records_to_batch,
    tensor_type,
)

NUMERIC = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
]


def _values(dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 2 if dtype == "bool" else 100, size=shape).astype(dtype)


@pytest.mark.parametrize("dtype", NUMERIC)
def test_numpy_dtypes_map_to_arrow_types_and_round_trip(dtype: str) -> None:
    records = [
        {
            "t": _values(dtype, (2, 3), i),
            "s": _values(dtype, (), i)[()],
            "v": _values(dtype, (4,), i),
        }
        for i in range(5)
    ]
    batch = records_to_batch(records)
    arrow = pa.from_numpy_dtype(np.dtype(dtype))
    assert batch.schema.field("s").type == arrow
    assert batch.schema.field("t").type == pa.fixed_shape_tensor(arrow, (2, 3))
    assert batch.schema.field("v").type == tensor_type(dtype, (4,))
    t = column_to_numpy(batch.column("t"))
    assert t.dtype == np.dtype(dtype) and t.shape == (5, 2, 3)
    np.testing.assert_array_equal(t, np.stack([r["t"] for r in records]))
    np.testing.assert_array_equal(column_to_numpy(batch.column("s")), [r["s"] for r in records])


def test_a_tensor_column_of_shape_empty_takes_zero_dimensional_arrays() -> None:
    # A schema may give a one-value-per-record column as a tensor type of shape (); decode
    # then returns numpy's zero-dimensional arrays, which numpy does not concatenate.
    schema = pa.schema([("x", pa.fixed_shape_tensor(pa.float32(), ())), ("i", pa.int64())])
    builder = BatchBuilder(schema)
    records = [{"x": np.array(i / 2, dtype=np.float32), "i": i} for i in range(4)]
    fixed = builder.fixed_records(records)
    assert fixed is not None
    for batch in (builder.from_records(records), fixed.to_batch()):
        assert batch.schema == schema
        np.testing.assert_array_equal(column_to_numpy(batch.column("x")).ravel(), [0, 0.5, 1, 1.5])
    records[2]["x"] = np.array([1.0], dtype=np.float32)
    with pytest.raises(SchemaMismatchError, match=r"record 2: column 'x': expected float32 ar"):
        builder.from_records(records)


def test_python_values_infer_64_bit_bytes_and_text() -> None:
    batch = records_to_batch([{"b": True, "i": 7, "f": 0.5, "raw": b"\x00\xff", "txt": "hé"}])
    assert batch.schema.types == [pa.bool_(), pa.int64(), pa.float64(), pa.binary(), pa.string()]
    assert batch.to_pylist() == [{"b": True, "i": 7, "f": 0.5, "raw": b"\x00\xff", "txt": "hé"}]


def test_tensor_column_is_one_contiguous_null_free_buffer_viewed_zero_copy() -> None:
    records = [{"x": np.full((3, 4), i, dtype=np.float32)} for i in range(10)]
    col = records_to_batch(records).column("x")
    storage = col.storage
    assert storage.null_count == 0 and storage.values.null_count == 0
    view = column_to_numpy(col)
    assert view.shape == (10, 3, 4) and view.flags.c_contiguous and not view.flags.writeable
    # Same memory as the Arrow values buffer: no copy was made.
    assert view.ctypes.data == storage.values.buffers()[1].address
    sliced = column_to_numpy(col.slice(4, 3))
    np.testing.assert_array_equal(sliced[:, 0, 0], [4, 5, 6])
    assert np.shares_memory(sliced, view)


def test_batched_output_converts_without_per_record_values() -> None:
    x = np.arange(4 * 2 * 3, dtype=np.float32).reshape(4, 2, 3)
    y = np.arange(4, dtype=np.int64)
    batch = columns_to_batch({"x": x, "y": y, "name": ["a", "b", "c", "d"]}, 4)
    assert batch.schema.field("x").type == tensor_type(np.float32, (2, 3))
    np.testing.assert_array_equal(column_to_numpy(batch.column("x")), x)
    assert batch.column("name").to_pylist() == ["a", "b", "c", "d"]
    # Non-contiguous input (a strided view) is made contiguous.
    wide = np.arange(4 * 8, dtype=np.float32).reshape(4, 8)
    out = columns_to_batch({"x": wide[:, ::2]}, 4)
    np.testing.assert_array_equal(column_to_numpy(out.column("x")), wide[:, ::2])


def test_batched_and_per_record_results_agree() -> None:
    x = np.random.default_rng(1).standard_normal((6, 5)).astype(np.float32)
    per_record = records_to_batch([{"x": row, "y": np.int64(i)} for i, row in enumerate(x)])
    batched = columns_to_batch({"x": x, "y": np.arange(6, dtype=np.int64)}, 6)
    assert per_record.equals(batched)


def test_variable_length_needs_a_list_schema_and_then_round_trips() -> None:
    records = [{"tok": np.arange(n, dtype=np.int32)} for n in (3, 1, 4)]
    with pytest.raises(SchemaMismatchError, match=r"'tok'.*shape \(3,\).*pa\.list_") as info:
        records_to_batch(records)
    assert info.value.index == 1
    schema = pa.schema([("tok", pa.list_(pa.int32()))])
    batch = records_to_batch(records, schema)
    assert batch.column("tok").to_pylist() == [[0, 1, 2], [0], [0, 1, 2, 3]]
    batched = columns_to_batch({"tok": [r["tok"] for r in records]}, 3, schema)
    assert batched.equals(batch)


@pytest.mark.parametrize("other", [[], [1, 2, 3], [[1], [2, 3]]], ids=["empty", "longer", "ragged"])
def test_a_python_list_of_another_length_gets_the_list_schema_hint(other: list) -> None:
    # An empty list is float64 to numpy: the error blamed a cast, without the hint.
    records = [{"tok": [1, 2]}, {"tok": other}]
    with pytest.raises(SchemaMismatchError, match=r"'tok'.*found list of \d+ values.*pa\.list_"):
        records_to_batch(records)


@pytest.mark.parametrize(
    ("value", "target", "ok"),
    [
        (np.int32(5), pa.int64(), True),
        (np.float32(1.5), pa.float64(), True),
        (np.float64(1.5), pa.float32(), False),
        (np.int64(5), pa.int32(), False),
        (np.uint64(5), pa.int64(), False),
        (1.5, pa.float32(), True),
        (7, pa.uint8(), True),
        (300, pa.uint8(), False),
        (-1, pa.uint32(), False),
        ([1, 300], pa.list_(pa.uint8()), False),  # numpy 1 wrapped these around, silently
        (1.5, pa.int64(), False),
        (1, pa.bool_(), False),
        (True, pa.int8(), True),
    ],
)
def test_casts_are_safe_for_numpy_values_and_within_kind_for_python_numbers(
    value: Any, target: pa.DataType, ok: bool
) -> None:
    schema = pa.schema([("v", target)])
    if ok:
        batch = records_to_batch([{"v": value}], schema)
        assert batch.column("v").type == target
        assert batch.column("v")[0].as_py() == value
    else:
        with pytest.raises(SchemaMismatchError, match="column 'v': expected"):
            records_to_batch([{"v": value}], schema)


def test_tensor_dtype_mismatch_names_column_expected_and_found() -> None:
    schema = pa.schema([("x", tensor_type(np.float32, (3,)))])
    good = np.zeros(3, np.float32)
    with pytest.raises(SchemaMismatchError) as info:
        records_to_batch([{"x": good}, {"x": good}, {"x": np.zeros(3, np.float64)}], schema)
    msg = str(info.value)
    assert "record 2" in msg and "'x'" in msg and "float32" in msg and "float64" in msg
    assert info.value.index == 2
    # int16 -> float32 is safe, and so is a plain Python list of numbers.
    out = records_to_batch([{"x": np.ones(3, np.int16)}, {"x": [1.0, 2.0, 3.0]}], schema)
    np.testing.assert_array_equal(column_to_numpy(out.column("x"))[1], [1, 2, 3])


def test_missing_and_extra_columns_are_named() -> None:
    first = {"a": 1, "b": 2.0}
    with pytest.raises(SchemaMismatchError, match=r"record 1: missing column\(s\) 'b'"):
        records_to_batch([first, {"a": 1}])
    with pytest.raises(SchemaMismatchError, match=r"unexpected column\(s\) 'c'"):
        records_to_batch([first, {"a": 1, "b": 2.0, "c": 3}])
    with pytest.raises(SchemaMismatchError, match=r"missing column\(s\) 'b'.*unexpected.*'z'"):
        records_to_batch([first, {"a": 1, "z": 2.0}])


def test_the_first_bad_record_is_reported() -> None:
    schema = pa.schema([("a", pa.int64()), ("b", pa.float64())])
    records: list[Any] = [{"a": 1, "b": 1.0}] * 5
    records = [*records[:2], {"a": 1, "b": "x"}, {"a": "y", "b": 1.0}, {"a": 1}]
    with pytest.raises(DecodeError) as info:
        records_to_batch(records, schema)
    assert info.value.index == 2


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        (None, "None"),
        ({"k": 1}, "dict"),
        (object(), "object"),
        (np.array([1 + 2j]), "complex"),
        (np.array(["a", "b"]), "<U1"),
        (np.zeros((0, 3), np.float32), "empty array"),  # 1-D empty: a list column
    ],
)
def test_unstorable_values_raise_decode_error_naming_the_column(value: Any, needle: str) -> None:
    with pytest.raises(DecodeError, match=f"column 'bad'.*{needle}"):
        infer_schema({"ok": 1, "bad": value})
    schema = pa.schema([("ok", pa.int64()), ("bad", pa.int64())])
    with pytest.raises(DecodeError, match="column 'bad'"):
        records_to_batch([{"ok": 1, "bad": 1}, {"ok": 1, "bad": value}], schema)


def test_a_torch_tensor_is_refused_with_how_to_store_it() -> None:
    import torch

    for value in (torch.zeros(3), torch.zeros(2, dtype=torch.bfloat16), torch.nn.Parameter()):
        with pytest.raises(DecodeError, match=r"torch.Tensor.*tensor\.numpy\(\)"):
            infer_schema({"bad": value})
    schema = pa.schema([("bad", pa.list_(pa.float32(), 3))])
    with pytest.raises(DecodeError, match=r"column 'bad'.*tensor\.numpy\(\)"):
        records_to_batch([{"bad": np.zeros(3, np.float32)}, {"bad": torch.zeros(3)}], schema)


def test_records_that_are_not_mappings_or_have_odd_keys() -> None:
    builder = BatchBuilder(pa.schema([("a", pa.int64())]))
    with pytest.raises(DecodeError, match="mapping of column -> value, got list"):
        builder.from_records([{"a": 1}, [1]])
    with pytest.raises(DecodeError, match="column names must be str"):
        builder.from_records([{"a": 1}, {1: 1}])
    with pytest.raises(DecodeError, match="got int"):
        infer_schema(3)  # type: ignore[arg-type]


def test_skipping_builder_drops_only_bad_records_and_says_why() -> None:
    builder = BatchBuilder(pa.schema([("x", tensor_type(np.int64, (2,))), ("s", pa.string())]))
    records: list[Any] = [{"x": np.array([i, i]), "s": str(i)} for i in range(6)]
    records[1] = {"x": np.array([1, 1, 1]), "s": "1"}
    records[3] = {"x": np.array([3, 3]), "s": b"3"}
    records[4] = {"x": np.array([4, 4])}
    batch, bad = builder.from_records_skipping(records)
    assert sorted(bad) == [1, 3, 4]
    assert "other shape" in bad[1].reason and "expected str" in bad[3].reason
    assert "missing column" in bad[4].reason
    assert batch.column("s").to_pylist() == ["0", "2", "5"]
    np.testing.assert_array_equal(column_to_numpy(batch.column("x"))[:, 0], [0, 2, 5])


def test_a_str_without_utf8_form_is_one_bad_record() -> None:
    """A lone surrogate (json.loads gives one for "\\ud800") cannot be stored as UTF-8: the
    error names the record and column, or only that record is skipped."""
    builder = BatchBuilder(pa.schema([("i", pa.int64()), ("s", pa.string())]))
    records: list[Any] = [{"i": i, "s": f"r{i}"} for i in range(5)]
    records[3] = {"i": 3, "s": "a\ud800"}
    with pytest.raises(DecodeError, match=r"column 's'.*surrogates not allowed") as info:
        builder.from_records(records)
    assert info.value.index == 3
    batch, bad = builder.from_records_skipping(records)
    assert list(bad) == [3] and "column 's'" in bad[3].reason
    assert batch.column("i").to_pylist() == [0, 1, 2, 4]
    with pytest.raises(DecodeError, match="column 's'") as info:
        builder.from_columns({"i": np.arange(5), "s": [r["s"] for r in records]}, 5)
    assert info.value.index == 3


def test_batched_output_errors() -> None:
    builder = BatchBuilder(pa.schema([("x", tensor_type(np.float32, (3,))), ("y", pa.int64())]))
    y = np.arange(4)
    with pytest.raises(SchemaMismatchError, match="'x': decode_batch gave 3 rows for 4"):
        builder.from_columns({"x": np.zeros((3, 3), np.float32), "y": y}, 4)
    with pytest.raises(SchemaMismatchError, match=r"'x'.*shape"):
        builder.from_columns({"x": np.zeros((4, 2), np.float32), "y": y}, 4)
    with pytest.raises(SchemaMismatchError, match=r"'x'.*float64 cannot be cast"):
        builder.from_columns({"x": np.zeros((4, 3)), "y": y}, 4)
    with pytest.raises(SchemaMismatchError, match="missing column"):
        builder.from_columns({"x": np.zeros((4, 3), np.float32)}, 4)
    with pytest.raises(DecodeError, match="one row per record"):
        builder.from_columns({"x": np.zeros((4, 3), np.float32), "y": 5}, 4)
    with pytest.raises(DecodeError, match=r"record 2: column 'y'"):
        builder.from_columns({"x": np.zeros((4, 3), np.float32), "y": [1, 2, None, 3]}, 4)


def test_empty_batches_keep_the_schema() -> None:
    schema = pa.schema([("x", tensor_type(np.float32, (2,))), ("b", pa.binary())])
    builder = BatchBuilder(schema)
    for batch in (builder.from_records([]), builder.empty()):
        assert batch.num_rows == 0 and batch.schema == schema
    assert column_to_numpy(builder.empty().column("x")).shape == (0, 2)


def test_unsupported_schema_types_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"'m'.*not supported"):
        BatchBuilder(pa.schema([("m", pa.map_(pa.string(), pa.int64()))]))


def test_column_to_numpy_on_bool_lists_and_other_types() -> None:
    flags = records_to_batch([{"m": np.array([True, False, True])}] * 2).column("m")
    np.testing.assert_array_equal(column_to_numpy(flags), [[True, False, True]] * 2)
    nested = pa.FixedSizeListArray.from_arrays(
        pa.FixedSizeListArray.from_arrays(pa.array(np.arange(12, dtype=np.int16)), 3), 2
    )
    assert column_to_numpy(nested).shape == (2, 2, 3)
    chunked = pa.chunked_array([pa.array([1, 2]), pa.array([3])])
    np.testing.assert_array_equal(column_to_numpy(chunked), [1, 2, 3])
    with pytest.raises(ConfigError, match="string"):
        column_to_numpy(pa.array(["a"]))
    with pytest.raises(DecodeError, match="nulls"):
        column_to_numpy(pa.array([1, None]))


def test_as_tensor_column_retypes_lists_zero_copy_and_checks_lengths() -> None:
    flat = pa.array([[float(i)] * 6 for i in range(4)], pa.list_(pa.float32()))
    t = as_tensor_column(flat.slice(1), (2, 3), "x")
    assert t.type == tensor_type(np.float32, (2, 3))
    np.testing.assert_array_equal(column_to_numpy(t)[:, 0, 0], [1, 2, 3])
    nested = pa.array([[[1, 2, 3], [4, 5, 6]]] * 2, pa.list_(pa.list_(pa.int64())))
    assert column_to_numpy(as_tensor_column(nested, (2, 3))).shape == (2, 2, 3)
    ragged = pa.array([[[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 5]]], pa.list_(pa.list_(pa.int64())))
    with pytest.raises(SchemaMismatchError, match="record 1: column 'x': a list of 2") as info:
        as_tensor_column(ragged, (2, 3), "x")
    assert info.value.index == 1
    with pytest.raises(SchemaMismatchError, match="record 1: column 'x': null"):
        as_tensor_column(pa.array([[1, 2], None], pa.list_(pa.int64())), (2,), "x")
    with pytest.raises(SchemaMismatchError, match="list column of numbers"):
        as_tensor_column(pa.array([1, 2]), (1,), "x")


@settings(max_examples=40, deadline=None)
@given(
    dtype=st.sampled_from(NUMERIC),
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple),
    n=st.integers(0, 6),
    seed=st.integers(0, 1000),
)
def test_tensor_round_trip_property(dtype: str, shape: tuple[int, ...], n: int, seed: int) -> None:
    data = _values(dtype, (n, *shape), seed)
    schema = pa.schema([("x", tensor_type(dtype, shape))])
    per_record = BatchBuilder(schema).from_records([{"x": row} for row in data])
    batched = BatchBuilder(schema).from_columns({"x": data}, n)
    for batch in (per_record, batched):
        out = column_to_numpy(batch.column("x"))
        assert out.dtype == data.dtype and out.shape == data.shape
        np.testing.assert_array_equal(out, data)
