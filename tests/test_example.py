"""tf.train.Example decoding/encoding: round trips, byte compatibility with the independent
``tfrecord`` package (its own generated example_pb2, package "tensorflow"), and every error."""

from __future__ import annotations

import multiprocessing
import pickle
import re
import struct
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tfrecord import example_pb2 as tf_pb
from tfrecord.writer import TFRecordWriter

from shmloader._proto import example_pb2 as our_pb
from shmloader.errors import ConfigError, DecodeError
from shmloader.formats.example import (
    ExampleBatchDecoder,
    ExampleDecoder,
    FixedLenFeature,
    VarLenFeature,
    decode_example,
    encode_example,
)

I64 = np.iinfo(np.int64)


def _both(payloads: list[bytes], spec: dict[str, Any]) -> tuple[list[dict[str, Any]], Any]:
    """Decode one by one and as a batch; the two must agree, so every case tests both."""
    singles = [decode_example(p, spec) for p in payloads]
    batch = ExampleBatchDecoder(spec)(payloads)
    for name in spec:
        for i, single in enumerate(singles):
            _assert_same(batch[name][i], single[name])
    return singles, batch


def _assert_same(a: Any, b: Any) -> None:
    if isinstance(b, (np.ndarray, np.generic)):
        assert isinstance(a, (np.ndarray, np.generic))
        assert np.asarray(a).dtype == np.asarray(b).dtype
        np.testing.assert_array_equal(a, b)
    else:
        assert a == b


# --- Varint-level building blocks for encodings no protobuf writer produces by default ---


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _example_with_feature(name: str, feature: bytes) -> bytes:
    return _example_with_features({name: feature})


def _example_with_features(features: dict[str, bytes]) -> bytes:
    entries = (_field(1, _field(1, name.encode()) + _field(2, f)) for name, f in features.items())
    return _field(1, b"".join(entries))


def _unpacked_floats(values: list[float]) -> bytes:
    return b"".join(b"\x0d" + struct.pack("<f", v) for v in values)


def _unpacked_ints(values: list[int]) -> bytes:
    return b"".join(b"\x08" + _varint(v) for v in values)


def _mixed_list(kind: str, segments: list[tuple[bool, list[Any]]]) -> bytes:
    """A list body of packed runs (True) and unpacked values (False), in the given order."""
    parts = []
    for packed, values in segments:
        if kind == "float32":
            run = struct.pack(f"<{len(values)}f", *values)
            parts.append(_field(1, run) if packed else _unpacked_floats(values))
        else:
            run = b"".join(_varint(v) for v in values)
            parts.append(_field(1, run) if packed else _unpacked_ints(values))
    return b"".join(parts)


# --- Round trips ---


@pytest.mark.parametrize(
    ("value", "feature", "expected"),
    [
        (7, FixedLenFeature((), "int64"), np.int64(7)),
        (-3, FixedLenFeature((), np.int64), np.int64(-3)),
        (1.5, FixedLenFeature((), "float32"), np.float32(1.5)),
        (b"abc", FixedLenFeature((), "bytes"), b"abc"),
        ("héllo", FixedLenFeature((), "string"), "héllo".encode()),
        (b"a\x00", FixedLenFeature((), np.bytes_), b"a\x00"),
        ([1, 2, 3], FixedLenFeature(3, "int64"), np.array([1, 2, 3], dtype=np.int64)),
        (
            np.arange(6, dtype=np.float64).reshape(2, 3),
            FixedLenFeature((2, 3), np.dtype("float32")),
            np.arange(6, dtype=np.float32).reshape(2, 3),
        ),
        ([b"x", b"y"], FixedLenFeature((2,), "bytes"), [b"x", b"y"]),
        (["a", "b", "c", "d"], FixedLenFeature((2, 2), "string"), [[b"a", b"b"], [b"c", b"d"]]),
        (np.array([True, False]), FixedLenFeature(2, "int64"), np.array([1, 0], dtype=np.int64)),
        ([5, 6], VarLenFeature("int64"), np.array([5, 6], dtype=np.int64)),
        (np.ones(3, np.float32), VarLenFeature("float32"), np.ones(3, np.float32)),
        ([b"p", "q"], VarLenFeature("bytes"), [b"p", b"q"]),
        ([], VarLenFeature("int64"), np.empty(0, np.int64)),
        ([], VarLenFeature("bytes"), []),
        (np.empty(0, np.float32), VarLenFeature("float32"), np.empty(0, np.float32)),
        ([], FixedLenFeature((0,), "float32"), np.empty(0, np.float32)),
    ],
)
def test_round_trip_every_kind_and_shape(value: Any, feature: Any, expected: Any) -> None:
    payload = encode_example({"f": value})
    singles, _ = _both([payload, payload], {"f": feature})
    _assert_same(singles[0]["f"], expected)


def test_int64_extremes_and_multibyte_varints_round_trip() -> None:
    values = np.array([0, 1, 127, 128, 300, 2**31, -1, -(2**40), I64.max, I64.min], np.int64)
    payloads = [encode_example({"v": values}), encode_example({"v": values[::-1].copy()})]
    singles, batch = _both(payloads, {"v": FixedLenFeature(10, "int64")})
    np.testing.assert_array_equal(singles[0]["v"], values)
    np.testing.assert_array_equal(batch["v"][1], values[::-1])
    # Long lists take the vectorised varint path rather than the few-bytes one.
    long = np.arange(-500, 500, dtype=np.int64) * 1_000_003
    (single,), _ = _both([encode_example({"v": long})], {"v": VarLenFeature("int64")})
    np.testing.assert_array_equal(single["v"], long)


def test_batch_decoder_shapes_defaults_and_varlen() -> None:
    spec = {
        "x": FixedLenFeature((2, 2), "float32"),
        "y": FixedLenFeature((), "int64", default=-1),
        "s": FixedLenFeature((), "bytes", default=b"none"),
        "ids": VarLenFeature("int64"),
    }
    payloads = [
        encode_example({"x": np.full((2, 2), i, np.float32), "y": i, "s": f"r{i}", "ids": [i] * i})
        for i in range(3)
    ]
    payloads.append(encode_example({"x": [9.0] * 4}))
    _, batch = _both(payloads, spec)
    assert batch["x"].shape == (4, 2, 2) and batch["x"].dtype == np.float32
    np.testing.assert_array_equal(batch["y"], [0, 1, 2, -1])
    assert batch["s"] == [b"r0", b"r1", b"r2", b"none"]
    assert [list(a) for a in batch["ids"]] == [[], [1], [2, 2], []]
    assert ExampleBatchDecoder(spec)([])["x"].shape == (0, 2, 2)


def test_defaults_broadcast_and_are_not_shared_between_records() -> None:
    spec = {"v": FixedLenFeature(3, "float32", default=0.5), "b": FixedLenFeature(2, "bytes", "z")}
    decoder = ExampleDecoder(spec)
    first = decoder(encode_example({"other": 1}))
    np.testing.assert_array_equal(first["v"], [0.5, 0.5, 0.5])
    assert first["b"] == [b"z", b"z"]
    first["v"][0] = 9  # the caller owns the result; the next record must not see this
    assert decoder(encode_example({"other": 1}))["v"][0] == 0.5


def test_unpacked_encodings_decode_exactly() -> None:
    """Unpacked repeated numbers are legal protobuf; the fast path must notice them."""
    floats = _example_with_feature("f", _field(2, _unpacked_floats([1.5, 2.5])))
    ints = _example_with_feature("i", _field(3, _unpacked_ints([3, -4, 300])))
    (a,), _ = _both([floats], {"f": VarLenFeature("float32")})
    np.testing.assert_array_equal(a["f"], [1.5, 2.5])
    (b,), _ = _both([ints], {"i": FixedLenFeature(3, "int64")})
    np.testing.assert_array_equal(b["i"], [3, -4, 300])


def _check_against_protobuf(payloads: list[bytes], spec: dict[str, Any]) -> None:
    """Both decoders give exactly the values of protobuf's own full parse, in its order."""
    singles, _ = _both(payloads, spec)
    for payload, single in zip(payloads, singles, strict=True):
        parsed = our_pb.Example.FromString(payload).features.feature
        for name, feature in spec.items():
            kind = "float_list" if feature.dtype == "float32" else "int64_list"
            expected = np.array(getattr(parsed[name], kind).value, feature.dtype)
            np.testing.assert_array_equal(np.reshape(single[name], -1), expected)


def test_packed_and_unpacked_values_keep_wire_order() -> None:
    """Protobuf concatenates packed runs and unpacked values in wire order; so must we."""
    ints = _mixed_list("int64", [(True, [1, 2]), (False, [3]), (True, [4]), (False, [-5, 6])])
    floats = _mixed_list("float32", [(True, [0.5]), (False, [2.0]), (True, [3.0, 4.0])])
    unknown = _varint(2 << 3) + _varint(9)  # an unknown varint field 2 inside the list
    late = _mixed_list("int64", [(False, [7]), (True, [8, 9])]) + unknown
    payload = _example_with_features(
        {"i": _field(3, ints), "f": _field(2, floats), "l": _field(3, late), "s": _field(1, b"")}
    )
    spec = {"i": VarLenFeature("int64"), "f": FixedLenFeature(4, "float32")}
    spec["l"] = VarLenFeature("int64")
    plain = encode_example({"i": [0], "f": [0.0] * 4, "l": [1, 2]})
    (_, single, _), _ = _both([plain, payload, plain], {**spec, "s": VarLenFeature("bytes")})
    np.testing.assert_array_equal(single["i"], [1, 2, 3, 4, -5, 6])
    np.testing.assert_array_equal(single["f"], [0.5, 2.0, 3.0, 4.0])
    np.testing.assert_array_equal(single["l"], [7, 8, 9])
    _check_against_protobuf([payload], spec)
    with pytest.raises(DecodeError, match=r"expected 3 float32 values .*found 4"):
        ExampleBatchDecoder({"f": FixedLenFeature(3, "float32")})([payload])


def _segments(values: Any) -> Any:
    return st.lists(st.tuples(st.booleans(), st.lists(values, max_size=4)), max_size=6)


_INT_SEGMENTS = _segments(st.integers(int(I64.min), int(I64.max)))
_FLOAT_SEGMENTS = _segments(st.floats(width=32, allow_nan=False))


@pytest.mark.long
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(_INT_SEGMENTS, _FLOAT_SEGMENTS), min_size=1, max_size=4))
def test_property_any_mix_of_encodings_matches_protobuf(rows: Any) -> None:
    payloads = [
        _example_with_features(
            {"i": _field(3, _mixed_list("int64", i)), "f": _field(2, _mixed_list("float32", f))}
        )
        for i, f in rows
    ]
    _check_against_protobuf(payloads, {"i": VarLenFeature("int64"), "f": VarLenFeature("float32")})


def test_unpacked_record_that_is_no_valid_example_is_a_decode_error() -> None:
    # The unpacked value sends the record to the full parse, which rejects the cut varint.
    payload = _example_with_feature("i", _field(3, _field(1, b"\x81") + _unpacked_ints([1])))
    message = r"not a tf.train.Example \(parsed in full: 'i' is not plain packed\): Error parsing"
    with pytest.raises(DecodeError, match=message) as info:
        ExampleBatchDecoder({"i": VarLenFeature("int64")})([encode_example({"i": [1]}), payload])
    assert info.value.index == 1
    with pytest.raises(DecodeError, match=message):
        decode_example(payload, {"i": VarLenFeature("int64")})


def test_feature_with_no_list_set_reads_as_empty() -> None:
    payload = _example_with_feature("e", b"")
    assert decode_example(payload, {"e": VarLenFeature("float32")})["e"].size == 0
    with pytest.raises(DecodeError, match=r"'e': expected one int64 value .*found 0 int64"):
        decode_example(payload, {"e": FixedLenFeature((), "int64")})


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.floats(width=32, allow_nan=False), min_size=3, max_size=3),
            st.lists(st.integers(int(I64.min), int(I64.max)), max_size=6),
            st.binary(max_size=20),
        ),
        max_size=8,
    )
)
def test_property_batch_matches_input(rows: list[tuple[list[float], list[int], bytes]]) -> None:
    payloads = [encode_example({"f": f, "i": np.array(i, np.int64), "b": b}) for f, i, b in rows]
    spec = {
        "f": FixedLenFeature(3, "float32"),
        "i": VarLenFeature("int64"),
        "b": FixedLenFeature((), "bytes"),
    }
    _, batch = _both(payloads, spec)
    for k, (f, i, b) in enumerate(rows):
        np.testing.assert_array_equal(batch["f"][k], np.array(f, np.float32))
        np.testing.assert_array_equal(batch["i"][k], np.array(i, np.int64))
        assert batch["b"][k] == b


# --- Byte compatibility with the independent tfrecord package ---


def test_payloads_from_tfrecord_package_decode_with_ours() -> None:
    datum = {
        "image": (np.arange(12, dtype=np.float32), "float"),
        "label": (3, "int"),
        "ids": ([1, -2, 2**40], "int"),
        "name": (b"cat", "byte"),
        "tags": ([b"a", b"bb"], "byte"),
    }
    payload = TFRecordWriter.serialize_tf_example(datum)
    spec = {
        "image": FixedLenFeature((3, 4), "float32"),
        "label": FixedLenFeature((), "int64"),
        "ids": VarLenFeature("int64"),
        "name": FixedLenFeature((), "bytes"),
        "tags": VarLenFeature("string"),
    }
    (out,), _ = _both([payload], spec)
    np.testing.assert_array_equal(out["image"], np.arange(12, dtype=np.float32).reshape(3, 4))
    assert out["label"] == 3 and out["name"] == b"cat" and out["tags"] == [b"a", b"bb"]
    np.testing.assert_array_equal(out["ids"], [1, -2, 2**40])


def test_our_payloads_parse_with_tfrecord_package_and_match_its_bytes() -> None:
    values = {"x": np.linspace(0, 1, 5, dtype=np.float32), "y": [4, -5], "z": [b"q", b""]}
    parsed = tf_pb.Example.FromString(encode_example(values)).features.feature
    np.testing.assert_array_equal(np.array(parsed["x"].float_list.value, np.float32), values["x"])
    assert list(parsed["y"].int64_list.value) == [4, -5]
    assert list(parsed["z"].bytes_list.value) == [b"q", b""]
    for name, kind in (("x", "float"), ("y", "int"), ("z", "byte")):
        theirs = TFRecordWriter.serialize_tf_example({name: (values[name], kind)})
        assert encode_example({name: values[name]}) == theirs


def test_descriptors_do_not_collide_with_tensorflow_package_names() -> None:
    assert our_pb.Example.DESCRIPTOR.full_name == "shmloader.tfexample.Example"
    assert tf_pb.Example.DESCRIPTOR.full_name == "tensorflow.Example"
    sequence = our_pb.SequenceExample()
    sequence.feature_lists.feature_list["t"].feature.add().int64_list.value.append(1)
    theirs = tf_pb.SequenceExample.FromString(sequence.SerializeToString())
    assert theirs.feature_lists.feature_list["t"].feature[0].int64_list.value[0] == 1


# --- Errors ---


def test_missing_feature_without_default() -> None:
    with pytest.raises(DecodeError) as info:
        decode_example(encode_example({"a": 1}), {"b": FixedLenFeature(2, "float32")})
    assert info.value.reason == (
        "feature 'b': expected 2 float32 values (shape (2,)), found no such feature "
        "(and the spec gives no default)"
    )
    assert str(info.value) == f"{info.value.reason}. {DecodeError.fix}"


def test_wrong_kind_names_feature_expected_and_found() -> None:
    payload = encode_example({"label": [1.0, 2.0]})
    with pytest.raises(DecodeError, match=re.escape("feature 'label': expected one int64 value")):
        decode_example(payload, {"label": FixedLenFeature((), "int64")})
    with pytest.raises(DecodeError, match=r"found a float32 list of 2 values") as info:
        ExampleBatchDecoder({"label": VarLenFeature("int64")})([encode_example({}), payload])
    assert info.value.index == 1


def test_wrong_length_fixed_feature() -> None:
    payloads = [encode_example({"v": [1, 2, 3]}), encode_example({"v": [1, 2]})]
    spec = {"v": FixedLenFeature(3, "int64")}
    with pytest.raises(
        DecodeError, match=r"'v': expected 3 int64 values \(shape \(3,\)\), found 2"
    ):
        decode_example(payloads[1], spec)
    with pytest.raises(DecodeError, match=r"found 2 int64 values") as info:
        ExampleBatchDecoder(spec)(payloads)
    assert info.value.index == 1
    float_spec = {"v": FixedLenFeature(2, "float32")}
    with pytest.raises(DecodeError, match=r"found 3 float32 values") as info:
        ExampleBatchDecoder(float_spec)([encode_example({"v": [1.0, 2.0, 3.0]})])
    assert info.value.index == 0


def test_payload_that_is_not_an_example() -> None:
    with pytest.raises(DecodeError, match=r"payload of 3 bytes is not a tf.train.Example") as info:
        ExampleBatchDecoder({"a": VarLenFeature("int64")})([encode_example({}), b"\xff\xff\xff"])
    assert info.value.index == 1
    assert info.value.__cause__ is not None


def test_malformed_packed_lists_are_decode_errors() -> None:
    cut_varint = _example_with_feature("i", _field(3, _field(1, b"\x81")))
    odd_floats = _example_with_feature("f", _field(2, _field(1, b"\x00\x00\x80")))
    with pytest.raises(DecodeError, match=r"feature 'i': malformed int64 list") as info:
        ExampleBatchDecoder({"i": VarLenFeature("int64")})([encode_example({"i": [1]}), cut_varint])
    assert info.value.index == 1
    with pytest.raises(DecodeError, match=r"feature 'i': malformed int64 list"):
        decode_example(cut_varint, {"i": VarLenFeature("int64")})
    with pytest.raises(DecodeError, match=r"feature 'f': malformed float32 list"):
        ExampleBatchDecoder({"f": VarLenFeature("float32")})([odd_floats])


def test_strict_rejects_unknown_features() -> None:
    payload = encode_example({"a": 1, "extra": 2, "more": b"x"})
    assert decode_example(payload, {"a": FixedLenFeature((), "int64")})["a"] == 1
    with pytest.raises(DecodeError, match=r"features \['extra', 'more'\] are not in the spec"):
        decode_example(payload, {"a": FixedLenFeature((), "int64")}, strict=True)
    with pytest.raises(DecodeError, match=r"not in the spec") as info:
        ExampleBatchDecoder({"a": FixedLenFeature((), "int64")}, strict=True)([payload])
    assert info.value.index == 0


@pytest.mark.parametrize(
    ("feature", "message"),
    [
        (FixedLenFeature((), "float64"), r"feature 'bad': dtype float64 is not supported"),
        (VarLenFeature(np.int32), r"feature 'bad': dtype int32 is not supported"),
        (VarLenFeature("nonsense"), r"feature 'bad': dtype 'nonsense' is not supported"),
        (VarLenFeature(object()), r"feature 'bad': dtype <object object at .*> is not supported"),
        (FixedLenFeature((-1,), "int64"), r"feature 'bad': shape \(-1,\) has a negative dimension"),
        (FixedLenFeature("3", "int64"), r"feature 'bad': shape must be an int or a tuple"),
        (FixedLenFeature(3, "int64", default=[1, 2]), r"'bad': default has 2 values, shape"),
        (FixedLenFeature(2, "bytes", default=[1, 2]), r"'bad': a bytes default must hold bytes"),
        (FixedLenFeature(2, "float32", default="x"), r"'bad': default 'x' is not float32"),
        ("int64", r"feature 'bad': expected FixedLenFeature or VarLenFeature, got str"),
    ],
)
def test_invalid_spec_names_the_feature(feature: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ExampleDecoder({"bad": feature})


def test_invalid_spec_container() -> None:
    with pytest.raises(ConfigError, match="the feature spec is empty"):
        ExampleBatchDecoder({})
    with pytest.raises(ConfigError, match="a feature spec is a mapping"):
        ExampleDecoder([FixedLenFeature((), "int64")])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"k": 1}, r"feature 'f': cannot encode dict"),
        ([[1, 2], [3]], r"feature 'f': cannot encode list"),
        (
            np.array([2**64 - 1], dtype=np.uint64),
            r"feature 'f': value 18446744073709551615 exceeds",
        ),
        (np.array([1 + 2j]), r"feature 'f': cannot encode ndarray of dtype complex128"),
    ],
)
def test_encode_errors(value: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        encode_example({"f": value})


# --- Pickling into reader processes ---


def _decode_in_child(decoder: ExampleDecoder, payload: bytes) -> dict[str, Any]:
    return decoder(payload)


def test_decoders_pickle_and_work_in_a_spawned_process() -> None:
    spec = {"x": FixedLenFeature(2, "float32", default=[0.0, 1.0]), "y": VarLenFeature("int64")}
    decoder = ExampleDecoder(spec, strict=True)
    clone = pickle.loads(pickle.dumps(decoder))
    assert clone.spec == decoder.spec and clone.strict
    batch = pickle.loads(pickle.dumps(ExampleBatchDecoder(spec)))
    assert batch([encode_example({"y": [1]})])["x"].tolist() == [[0.0, 1.0]]
    payload = encode_example({"x": [3.0, 4.0], "y": [7]})
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        out = pool.apply(_decode_in_child, (decoder, payload))
    np.testing.assert_array_equal(out["x"], [3.0, 4.0])
    np.testing.assert_array_equal(out["y"], [7])


# --- As the decode function of a record source ---


def test_schema_and_use_in_record_file_source(tmp_path: Any) -> None:
    from shmloader.formats.tfrecord import write_records
    from shmloader.sources.records import RecordFileSource

    spec = {
        "x": FixedLenFeature((2, 2), "float32"),
        "y": FixedLenFeature((), "int64"),
        "s": FixedLenFeature((), "bytes"),
        "ids": VarLenFeature("int64"),
    }
    assert ExampleDecoder(spec).schema == pa.schema(
        [
            pa.field("x", pa.fixed_shape_tensor(pa.float32(), (2, 2)), nullable=False),
            pa.field("y", pa.int64(), nullable=False),
            pa.field("s", pa.binary(), nullable=False),
            pa.field("ids", pa.list_(pa.int64()), nullable=False),
        ]
    )
    bytes_schema = ExampleDecoder({"a": FixedLenFeature(2, "bytes"), "b": VarLenFeature("bytes")})
    assert bytes_schema.schema.types == [pa.list_(pa.binary()), pa.list_(pa.binary())]
    path = tmp_path / "data.tfrecord"
    write_records(
        path,
        (
            encode_example(
                {"x": np.full((2, 2), i, np.float32), "y": i, "s": f"s{i}", "ids": list(range(i))}
            )
            for i in range(5)
        ),
    )
    for decoder in (ExampleDecoder(spec), ExampleBatchDecoder(spec)):
        key = "decode" if isinstance(decoder, ExampleDecoder) else "decode_batch"
        source = RecordFileSource(str(path), schema=decoder.schema, **{key: decoder})
        (shard,) = source.plan()
        batch = source.read(shard, 1, 4).to_pydict()
        assert batch["y"] == [1, 2, 3] and batch["s"] == [b"s1", b"s2", b"s3"]
        assert batch["ids"] == [[0], [0, 1], [0, 1, 2]]
        assert batch["x"][0] == [1.0] * 4
