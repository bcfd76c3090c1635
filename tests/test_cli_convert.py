"""``shmloader convert`` end to end: real input files in, TFRecord shards out, read back with
our reader and decoder (using the spec the command prints) and with the tfrecord package."""

from __future__ import annotations

import datetime as dt
import gzip
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tfrecord.reader import example_loader

from shmloader.cli.main import main
from shmloader.formats.example import ExampleDecoder
from shmloader.formats.tfrecord import RecordFile, read_records


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["convert", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _printed_spec(out: str) -> dict[str, Any]:
    """Execute the spec the command printed, exactly as a user would paste it."""
    code = out[out.index("from shmloader.formats.example import") :]
    namespace: dict[str, Any] = {}
    exec(code, namespace)
    spec: dict[str, Any] = namespace["spec"]
    return spec


def _read_all(paths: list[Path], spec: dict[str, Any]) -> list[dict[str, Any]]:
    decode = ExampleDecoder(spec)
    return [decode(p) for path in paths for p in read_records(path)]


def _shards(out_dir: Path) -> list[Path]:
    return sorted(p for p in out_dir.iterdir() if p.name.endswith(".tfrecord"))


def test_parquet_to_shards_and_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    n = 10
    table = pa.table(
        {
            "x": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(3 * n, dtype=np.float64)), 3),
            "label": pa.array(range(n), pa.int32()),
            "flag": pa.array([i % 2 == 0 for i in range(n)]),
            "name": [f"row{i}" for i in range(n)],
            "blob": pa.array([bytes([i, 0]) for i in range(n)], pa.binary()),
            "tokens": [list(range(i)) for i in range(n)],
            "maybe": [None if i % 3 == 0 else i / 2 for i in range(n)],
            "note": [None if i % 4 == 0 else f"n{i}" for i in range(n)],
            "when": pa.array(
                [dt.datetime(2024, 1, 1, 0, 0, i) for i in range(n)], pa.timestamp("ms")
            ),
            "cat": pa.array(["a", "b"] * 5).dictionary_encode(),
            "grid": pa.array(
                [[[i, i], [i, i]] for i in range(n)],
                pa.list_(pa.list_(pa.int64(), 2), 2),
            ),
        }
    )
    src = tmp_path / "in.parquet"
    pq.write_table(table, src, row_group_size=3)
    out_dir = tmp_path / "out"
    code, out, _ = _run(capsys, str(src), "--output-dir", str(out_dir), "--records-per-file", "4")
    assert code == 0, out
    shards = _shards(out_dir)
    assert [p.name for p in shards] == [f"part-0000{i}-of-00003.tfrecord" for i in range(3)]
    assert [RecordFile(p).num_records for p in shards] == [4, 4, 2]  # indexed at write time
    assert not [p for p in out_dir.iterdir() if ".partial" in p.name]
    assert "wrote 10 records to 3 files:" in out
    spec = _printed_spec(out)
    assert '"x": FixedLenFeature((3,), "float32"),' in out
    assert '"grid": FixedLenFeature((2, 2), "int64"),' in out
    assert '"tokens": VarLenFeature("int64"),  # 0 to 9 values per row' in out
    assert '"maybe": VarLenFeature("float32"),  # 4 rows without it' in out
    # The decoders keep no lists of bytes: a nullable string column gets a default instead.
    assert '"note": FixedLenFeature((), "bytes", default=b""),  # 3 rows without it' in out
    rows = _read_all(shards, spec)
    assert len(rows) == n
    for i, row in enumerate(rows):
        np.testing.assert_array_equal(row["x"], np.arange(3 * i, 3 * i + 3, dtype=np.float32))
        assert row["label"] == i and row["flag"] == int(i % 2 == 0)
        assert row["name"] == f"row{i}".encode() and row["blob"] == bytes([i, 0])
        np.testing.assert_array_equal(row["tokens"], np.arange(i))
        assert list(row["maybe"]) == ([] if i % 3 == 0 else [i / 2])
        assert row["note"] == (b"" if i % 4 == 0 else f"n{i}".encode())
        assert row["when"] == (1_704_067_200 + i) * 1000  # the column's unit: milliseconds
        assert row["cat"] == (b"a" if i % 2 == 0 else b"b")
        np.testing.assert_array_equal(row["grid"], np.full((2, 2), i))
    # An independent reader (the tfrecord package) reads the same files.
    theirs = [
        r for p in shards for r in example_loader(str(p), None, {"label": "int", "x": "float"})
    ]
    assert [int(r["label"][0]) for r in theirs] == list(range(n))
    np.testing.assert_array_equal(theirs[4]["x"], [12.0, 13.0, 14.0])


def test_csv_gzip_input_and_compressed_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "rows.csv.gz"
    with gzip.open(src, "wt") as f:
        f.write("id,score,word\n" + "".join(f"{i},{i}.25,w{i}\n" for i in range(7)))
    out_dir = tmp_path / "out"
    code, out, _ = _run(
        capsys, str(src), "--output-dir", str(out_dir), "--compression", "gzip", "--prefix", "t"
    )
    assert code == 0
    (shard,) = _shards(out_dir)
    assert shard.name == "t-00000-of-00001.tfrecord"
    assert shard.read_bytes()[:2] == b"\x1f\x8b"
    assert "wrote 7 records to 1 file (gzip):" in out
    rows = _read_all([shard], _printed_spec(out))
    assert [(int(r["id"]), float(r["score"]), r["word"]) for r in rows] == [
        (i, i + 0.25, f"w{i}".encode()) for i in range(7)
    ]
    theirs = list(example_loader(str(shard), None, ["id"], compression_type="gzip"))
    assert [int(r["id"][0]) for r in theirs] == list(range(7))


def test_jsonl_and_npz_inputs_together(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text('{"v": [1.5, 2.5], "s": "p"}\n{"v": [3.5, 4.5], "s": "q"}\n')
    npz = tmp_path / "b.npz"
    np.savez(npz, v=np.array([[5.5, 6.5]]), s=np.array(["r"]))
    out_dir = tmp_path / "out"
    code, out, _ = _run(capsys, str(jsonl), str(npz), "--output-dir", str(out_dir))
    assert code == 0, out
    spec = _printed_spec(out)
    assert set(spec) == {"v", "s"}
    rows = _read_all(_shards(out_dir), spec)
    assert [r["s"] for r in rows] == [b"p", b"q", b"r"]
    np.testing.assert_array_equal(
        np.stack([r["v"] for r in rows]), [[1.5, 2.5], [3.5, 4.5], [5.5, 6.5]]
    )


def test_npz_multi_dim_arrays(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "d.npz"
    images = np.arange(5 * 2 * 3, dtype=np.uint8).reshape(5, 2, 3)
    np.savez(src, image=images, y=np.arange(5) - 2, w=np.linspace(0, 1, 5, dtype=np.float32))
    out_dir = tmp_path / "out"
    code, out, _ = _run(capsys, str(src), "--output-dir", str(out_dir), "--records-per-file", "2")
    assert code == 0
    assert '"image": FixedLenFeature((2, 3), "int64"),' in out
    rows = _read_all(_shards(out_dir), _printed_spec(out))
    np.testing.assert_array_equal(np.stack([r["image"] for r in rows]), images)
    assert [int(r["y"]) for r in rows] == [-2, -1, 0, 1, 2]
    np.testing.assert_array_equal([r["w"] for r in rows], np.linspace(0, 1, 5, dtype=np.float32))


def _assert_fails(
    capsys: pytest.CaptureFixture[str], code: int, message: str, out_dir: Path, *argv: str
) -> None:
    got, _, err = _run(capsys, *argv, "--output-dir", str(out_dir))
    assert got == code, err
    assert message in err, err
    leftovers = [p.name for p in out_dir.iterdir()] if out_dir.exists() else []
    assert not [p for p in leftovers if ".partial" in p or p.startswith("part-")], leftovers


def test_argument_and_column_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "out"
    odd = tmp_path / "data.txt"
    odd.write_text("1\n")
    _assert_fails(
        capsys, 2, "data.txt: cannot tell the format from the extension", out_dir, str(odd)
    )
    good = tmp_path / "ok.csv"
    good.write_text("a\n1\n")
    _assert_fails(
        capsys, 2, "--records-per-file must be at least 1, got 0", out_dir, str(good),
        "--records-per-file", "0",
    )  # fmt: skip
    nested = tmp_path / "nested.parquet"
    pq.write_table(pa.table({"ok": [1, 2], "st": [{"a": 1}, {"a": 2}]}), nested)
    _assert_fails(capsys, 2, "column 'st' has type struct<a: int64>", out_dir, str(nested))
    holes = tmp_path / "holes.parquet"
    pq.write_table(pa.table({"l": [[1.0, None]]}), holes)
    _assert_fails(capsys, 2, "column 'l' has null values inside its lists", out_dir, str(holes))
    ragged = tmp_path / "ragged.npz"
    np.savez(ragged, a=np.zeros(3), b=np.zeros(4))
    _assert_fails(capsys, 2, "every array must share its first dimension", out_dir, str(ragged))
    empty = tmp_path / "empty.csv"
    empty.write_text("a,b\n")
    _assert_fails(capsys, 2, "hold no rows", out_dir, str(empty))


def test_type_change_between_inputs_removes_partial_shards(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = tmp_path / "1.csv", tmp_path / "2.csv"
    first.write_text("a\n1\n2\n3\n")
    second.write_text("a\nx\n")
    out_dir = tmp_path / "out"
    _assert_fails(
        capsys, 2, "column 'a' changes type between inputs", out_dir, str(first), str(second),
        "--records-per-file", "2",
    )  # fmt: skip


def test_unreadable_input_is_a_data_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"this is not parquet at all")
    _assert_fails(capsys, 1, f"{bad}: cannot read as parquet", tmp_path / "out", str(bad))
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"a": 1}\n{"a": \n')
    _assert_fails(capsys, 1, f"{broken}: cannot read as jsonl", tmp_path / "out", str(broken))
    _assert_fails(capsys, 2, "no such file", tmp_path / "out", str(tmp_path / "missing.csv"))


def test_refuses_to_mix_with_existing_shards(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "a.csv"
    src.write_text("a\n1\n")
    out_dir = tmp_path / "out"
    assert _run(capsys, str(src), "--output-dir", str(out_dir))[0] == 0
    before = sorted(os.listdir(out_dir))
    code, _, err = _run(capsys, str(src), "--output-dir", str(out_dir))
    assert code == 2
    assert "already holds shards named part-* (part-00000-of-00001.tfrecord" in err
    assert sorted(os.listdir(out_dir)) == before
    assert _run(capsys, str(src), "--output-dir", str(out_dir), "--prefix", "other")[0] == 0
