"""``shmloader convert`` on CSV/JSON Lines whose column types change after pyarrow's first block.

pyarrow's streaming readers fix a column's type from the first block (1 MiB by default); these
files put more than that before the value that needs a wider type, so they fail without the
widening. A ~250-byte padding column keeps the row count (and the test's time) small.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pytest
from test_cli_convert import _assert_fails, _printed_spec, _read_all, _run, _shards

_PAD = "p" * 250
_ROWS = 5000  # 5000 rows of ~260 bytes: past the 1 MiB first block


def _csv(path: Path, early: str, late: list[str]) -> Path:
    assert pa_csv.ReadOptions().block_size == 1 << 20  # what the row count is sized for
    path.write_text(
        "v,pad\n" + f"{early},{_PAD}\n" * _ROWS + "".join(f"{v},{_PAD}\n" for v in late)
    )
    return path


def _jsonl(path: Path, early: object, late: list[object]) -> Path:
    assert pa_json.ReadOptions().block_size == 1 << 20
    rows = [early] * _ROWS + late
    path.write_text("".join(json.dumps({"v": v, "pad": _PAD}) + "\n" for v in rows))
    return path


def _convert(capsys: pytest.CaptureFixture[str], out_dir: Path, *argv: str) -> tuple[str, str]:
    code, out, err = _run(capsys, *argv, "--output-dir", str(out_dir))
    assert code == 0, err
    return out, err


def _values(out: str, out_dir: Path) -> list[object]:
    return [row["v"] for row in _read_all(_shards(out_dir), _printed_spec(out))]


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_int_then_float_is_read_as_float(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    src = tmp_path / f"late.{kind}"
    _csv(src, "1", ["1.5", "2"]) if kind == "csv" else _jsonl(src, 1, [1.5, 2])
    out, err = _convert(capsys, tmp_path / "out", str(src))
    assert (
        f"{src}: column 'v' is int64 in the file's first block, but later rows need double" in err
    )
    assert '"v": FixedLenFeature((), "float32"),' in out
    values = _values(out, tmp_path / "out")
    assert len(values) == _ROWS + 2
    assert values[0] == 1.0 and values[-2:] == [1.5, 2.0]


def test_csv_number_then_text_is_read_as_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _csv(tmp_path / "ids.csv", "7", ["A12"])
    out, err = _convert(capsys, tmp_path / "out", str(src))
    assert "column 'v' is int64 in the file's first block, but later rows need string" in err
    values = _values(out, tmp_path / "out")
    assert values[0] == b"7" and values[-1] == b"A12"  # the digits as written


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_empty_or_missing_first_then_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    src = tmp_path / f"sparse.{kind}"
    if kind == "csv":
        _csv(src, "", ["3"])
    else:  # the key does not appear in the first block at all
        src.write_text(f'{{"pad": "{_PAD}"}}\n' * _ROWS + f'{{"pad": "{_PAD}", "v": 3}}\n')
    out, err = _convert(capsys, tmp_path / "out", str(src))
    assert "later rows need int64" in err
    assert f'"v": VarLenFeature("int64"),  # {_ROWS} rows without it' in out
    values = _values(out, tmp_path / "out")
    assert len(values) == _ROWS + 1 and list(values[-1]) == [3] and list(values[0]) == []


def test_widening_applies_to_every_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A column widened in one file is read wide in the others too: one type per feature."""
    ints = tmp_path / "a.csv"
    ints.write_text("v,pad\n4,x\n")
    late = _csv(tmp_path / "b.csv", "1", ["0.25"])
    out, _ = _convert(capsys, tmp_path / "out", str(ints), str(late), "--records-per-file", "999")
    values = _values(out, tmp_path / "out")
    assert values[0] == 4.0 and values[-1] == 0.25 and len(_shards(tmp_path / "out")) == 6


def test_json_number_then_string_names_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _jsonl(tmp_path / "mixed.jsonl", 1, ["x"])
    _assert_fails(
        capsys, 1, f"{src}: column 'v' holds number values and then a string at line {_ROWS + 1}",
        tmp_path / "out", str(src),
    )  # fmt: skip


def test_integers_beyond_int64_are_not_rounded_unasked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big = "18446744073709551615"  # a uint64 id: as a float it would be another number
    src = _csv(tmp_path / "ids.csv", "1", [big])
    _assert_fails(
        capsys, 1, f"column 'v' holds integers beyond int64 from line {_ROWS + 2}",
        tmp_path / "out", str(src),
    )  # fmt: skip
    out, err = _convert(capsys, tmp_path / "out", str(src), "--column-type", "v=string")
    assert "note" not in err  # pinned by the user: nothing was widened
    assert _values(out, tmp_path / "out")[-1] == big.encode()


def test_column_type_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    small = tmp_path / "small.jsonl"
    small.write_text('{"v": 1, "w": 2}\n{"v": 2, "w": 3}\n')
    out, _ = _convert(capsys, tmp_path / "out", str(small), "--column-type", "v=float64")
    assert '"v": FixedLenFeature((), "float32"),' in out
    assert '"w": FixedLenFeature((), "int64"),' in out
    late = _csv(tmp_path / "late.csv", "1", ["1.5"])
    _assert_fails(
        capsys, 1, "column 'v' is --column-type int64 but holds double values",
        tmp_path / "out2", str(late), "--column-type", "v=int64",
    )  # fmt: skip
    _assert_fails(
        capsys, 2, "TYPE must be one of int64, float64, string",
        tmp_path / "out2", str(small), "--column-type", "v=float16",
    )  # fmt: skip
    _assert_fails(
        capsys, 2, "--column-type names ['vv'], which no CSV or JSON Lines row has a value",
        tmp_path / "out2", str(small), "--column-type", "vv=int64",
    )  # fmt: skip
