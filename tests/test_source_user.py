"""Sources of the user's own, as docs/sources.md describes them, under real readers.

Two ways such a source used to go wrong without a word or with a confusing one:

* a task whose columns have another dtype, row shape or set of columns than the others
  (float32 in one task, float64 in the next): batches drawn from one segment came out with
  another dtype or shape than the batch before, and a batch mixing segments raised "column 'x'
  changes type or shape between segments", naming no task. Now the trainer refuses the task
  when it arrives, naming it, the first task, the column and both forms.
* a source class of a module that a reader cannot import: every reader died on unpickling
  and was restarted until the pool gave up ("reader 0 died 11 times in a row"), with two
  tracebacks per death. Now a reader that cannot load it says why, and when the one started
  in its place cannot either, the loop raises ``ConfigError`` (tests/test_user_code.py; a
  class or function of the script itself goes by value and loads everywhere).
* read_result() returning a RecordBatch instead of a ReadResult, or a ReadResult of a Table:
  "AttributeError: 'pyarrow.lib.RecordBatch' object has no attribute 'content'" (or
  'builder'), about shmloader's internals. Now each says what was returned and what to return.
* a read() or decode of the user's own that raises: the loop's error gave the exception's type
  and text only (its traceback stays in the reader), so ``IndexError: list index out of
  range`` said nothing of where. Now it says where it was raised in the user's code.
"""

from __future__ import annotations

import datetime
import os
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _dataset_helpers import shm_entries, write_dataset
from _decoders import SCHEMA, RetypingSource, decode

import shmloader
from shmloader.errors import ConfigError, DataError, DecodeError
from shmloader.reader.failure import describe_error
from shmloader.sources._tensor_types import forms_agree, gather_form


def _run(tmp_path: Path, change: str, num_workers: int, **kwargs: object) -> list[int]:
    """Every id the loop received from a RetypingSource over 2 files of 300 records, with one
    segment per batch (shuffle off, batch size = task size): nothing mixes segments. One
    reader, so tasks arrive in plan order and task 0 is the one the others are held to."""
    write_dataset(tmp_path / "data", [300, 300])
    (tmp_path / "shm").mkdir()
    src = RetypingSource(
        str(tmp_path / "data" / "*.tfrecord"), decode=decode, schema=SCHEMA, change=change
    )
    ids: list[int] = []
    with shmloader.SharedTaskDataset(
        src,
        num_readers=1,
        records_per_task=100,
        shuffle=False,
        epochs=1,
        shm_dir=str(tmp_path / "shm"),
        **kwargs,  # type: ignore[arg-type]
    ) as ds:
        for batch in shmloader.DataLoader(ds, batch_size=100, num_workers=num_workers):
            assert batch["x"].dtype == batch["id"].new_zeros(0).float().dtype
            assert batch["x"].shape == (100,)
            ids.extend(batch["id"].tolist())
    return ids


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("change", "num_workers", "found"),
    [
        ("dtype", 0, "gives column 'x' as float64 scalar, but task 0 .* as float32 scalar"),
        ("shape", 2, r"column 'x' as float32 tensor of row shape \(2,\), but .* float32 scalar"),
        ("columns", 0, "has the columns id, x, extra, but task 0 .* has id, x"),
    ],
)
def test_a_task_whose_columns_differ_is_refused_naming_it(
    tmp_path: Path, change: str, num_workers: int, found: str
) -> None:
    with pytest.raises(DataError, match=found) as info:
        _run(tmp_path, change, num_workers)
    message = str(info.value)
    assert "part-00000.tfrecord: task 2 (epoch 0, records [200, 300))" in message
    assert "part-00000.tfrecord, records [0, 100))" in message  # the task that set the form
    assert shm_entries(tmp_path / "shm") == []  # the refused task's segment went with the store


@pytest.mark.long
@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["read", "decode"])
def test_a_failing_read_or_decode_says_where_it_raised(tmp_path: Path, where: str) -> None:
    """The loop raises a DataError naming the records (a read() of a source of the user's
    own: its ValueError chained) or the DecodeError (decode's exception chained), and says
    on which line of the user's code the error was raised, in the message or its note."""
    helpers = str(Path(__file__).with_name("_decoders.py"))
    if where == "read":
        with pytest.raises(DataError, match=r"records \[200, 300\) raised ValueError") as info:
            _run(tmp_path, "fails", 0, max_retries=1)
        assert f"this task cannot be read (raised at {helpers}:" in str(info.value)
        assert ", in _read)" in str(info.value)
        assert isinstance(info.value.__cause__, ValueError)
    else:
        write_dataset(tmp_path / "data", [300], poison=[120])
        (tmp_path / "shm").mkdir()
        src = shmloader.RecordFileSource(
            str(tmp_path / "data" / "*.tfrecord"), decode=decode, schema=SCHEMA
        )
        with (
            pytest.raises(DecodeError, match=r"record 120, .*poison record 120") as info,
            shmloader.SharedTaskDataset(
                src,
                num_readers=1,
                records_per_task=100,
                epochs=1,
                max_retries=1,
                shm_dir=str(tmp_path / "shm"),
            ) as ds,
        ):
            for _batch in shmloader.DataLoader(ds, batch_size=50):
                pass
        notes = "".join(info.value.__notes__)
        assert f"from {helpers}:" in notes and ", in decode" in notes, notes
        assert isinstance(info.value.__cause__, ValueError)


def test_a_decode_installed_as_a_package_is_named_where_it_was_called(tmp_path: Path) -> None:
    """A decode function of the user's own that lies in site-packages (their package, pip
    installed) and fails inside json: no frame is the user's by path, and the error named
    json/decoder.py's line ('raised at .../json/decoder.py:353, in raw_decode'). It now names
    the function shmloader called. The function is compiled under a site-packages file name,
    and the read runs in this process: describe_error is what a reader sends."""
    site = sysconfig.get_paths()["purelib"]
    code = "import json\n\ndef decode(payload):\n    return json.loads(payload)\n"
    namespace: dict[str, Any] = {}
    exec(compile(code, f"{site}/users_package/decoders.py", "exec"), namespace)
    write_dataset(tmp_path / "data", [3])
    src = shmloader.RecordFileSource(
        str(tmp_path / "data" / "*.tfrecord"), decode=namespace["decode"], schema=SCHEMA
    )
    shard = src.plan()[0]
    with pytest.raises(DecodeError) as info:
        src.read(shard, 0, 3)
    described = describe_error(info.value)
    assert described.endswith(f"(raised at {site}/users_package/decoders.py:4, in decode)")


@pytest.mark.timeout(120)
def test_columns_left_out_of_batches_may_differ(tmp_path: Path) -> None:
    """Only the columns batches hold must agree: columns= leaves the extra one out."""
    assert sorted(_run(tmp_path, "columns", 0, columns=["id", "x"])) == list(range(600))


FLAKY_MODULE = """
import os
from _decoders import decode as _decode

# Every reader process that imports this module leaves its pid here; the first one's imports
# fail, as an import on a busy shared file system can (the trainer's own import succeeds).
if os.getpid() != {trainer}:
    with open({marks!r}, "a") as f:
        f.write(f"{{os.getpid()}}\\n")
    with open({marks!r}) as f:
        if len(set(f.read().split())) == 1:
            raise ImportError("cannot read the module's file (a passing failure)")


def decode(payload):
    return _decode(payload)
"""


@pytest.mark.timeout(120)
def test_a_reader_that_once_cannot_import_the_source_is_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first reader cannot import the decode function's module, the next one can: the
    loop gets every record. ae96cfc made any reader's failure to unpickle the source a
    ConfigError of the whole loop at once, with no restart ('cannot load the source:
    ImportError: cannot read the module's file ...'); a second failure in a row still is."""
    (tmp_path / "mods").mkdir()
    module = tmp_path / "mods" / "flaky_decoders.py"
    module.write_text(FLAKY_MODULE.format(trainer=os.getpid(), marks=str(tmp_path / "marks")))
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    monkeypatch.delitem(sys.modules, "flaky_decoders", raising=False)
    import flaky_decoders  # type: ignore[import-not-found]

    write_dataset(tmp_path / "data", [50])
    (tmp_path / "shm").mkdir()
    src = shmloader.RecordFileSource(
        str(tmp_path / "data" / "*.tfrecord"), decode=flaky_decoders.decode, schema=SCHEMA
    )
    ids: list[int] = []
    with shmloader.SharedTaskDataset(
        src, num_readers=1, records_per_task=10, epochs=1, shm_dir=str(tmp_path / "shm")
    ) as ds:
        for batch in shmloader.DataLoader(ds, batch_size=8):
            ids += batch["id"].tolist()
        assert ds.runtime.pool.readers[0].restarts == 1
    assert sorted(ids) == list(range(50))
    assert len(set((tmp_path / "marks").read_text().split())) == 2
    sys.modules.pop("flaky_decoders", None)


class _ReadOnly:
    """plan() and read() but no read_result(): not the whole protocol."""

    def plan(self) -> list[object]:
        return []

    def read(self, shard: object, start: int, stop: int) -> None:
        return None


def test_a_source_lacking_a_method_is_told_which(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"got _ReadOnly, which has no read_result\(\)"):
        shmloader.SharedTaskDataset(_ReadOnly(), shm_dir=str(tmp_path))  # type: ignore[arg-type]


@pytest.mark.timeout(120)
def test_forms_that_gather_alike_agree(tmp_path: Path) -> None:
    """Parquet files whose string column is plain in one, all nulls (type null) in another
    and dictionary-encoded in a third gather alike (lists of str and None): no task is
    refused. A null column against a tensor column does not agree."""
    data = tmp_path / "data"
    data.mkdir()
    (tmp_path / "shm").mkdir()
    strings = pa.array([f"s{i}" for i in range(40, 60)])
    pq.write_table(
        pa.table({"id": np.arange(20), "s": [f"s{i}" for i in range(20)]}), data / "a.parquet"
    )
    pq.write_table(pa.table({"id": np.arange(20, 40), "s": pa.nulls(20)}), data / "b.parquet")
    pq.write_table(
        pa.table({"id": np.arange(40, 60), "s": strings.dictionary_encode()}), data / "c.parquet"
    )
    got: dict[int, object] = {}
    for batch in _parquet_batches(data, tmp_path / "shm"):
        got.update(zip(batch["id"].tolist(), batch["s"], strict=True))
    assert got == {i: None if 20 <= i < 40 else f"s{i}" for i in range(60)}
    assert gather_form(pa.dictionary(pa.int32(), pa.string())) == gather_form(pa.large_string())
    assert not forms_agree(gather_form(pa.null()), gather_form(pa.float32()))
    assert forms_agree(gather_form(pa.null()), gather_form(pa.list_(pa.float32())))
    # Lists in a batch, whatever the Arrow types (they gathered so before the check).
    assert forms_agree(gather_form(pa.string()), gather_form(pa.binary()))
    assert forms_agree(gather_form(pa.list_(pa.float32())), gather_form(pa.list_(pa.float64())))
    assert not forms_agree(gather_form(pa.float32()), gather_form(pa.float64()))


@pytest.mark.timeout(120)
def test_python_value_columns_of_two_arrow_types_agree(tmp_path: Path) -> None:
    """Two Parquet files of one dataset written differently: timestamps in ms and in us (with
    a time zone), lists whose items may or may not be null, structs likewise. The plan check
    accepts them and each such column is a list of Python values in a batch; the form check
    refused the second file's first task mid-epoch ('gives column 't' as list of Python values
    of timestamp[us, tz=UTC], but ...'). All 40 rows now come, with their values."""
    data = tmp_path / "data"
    data.mkdir()
    (tmp_path / "shm").mkdir()
    field_a = pa.field("a", pa.int64())
    for name, first, unit, tz, item in (("a", 0, "ms", None, True), ("b", 20, "us", "UTC", False)):
        ids = np.arange(first, first + 20)
        pq.write_table(
            pa.table(
                {
                    "id": ids,
                    "t": pa.array(ids * 1000, pa.timestamp("ms")).cast(pa.timestamp(unit, tz)),
                    "tags": pa.array(
                        [[f"t{i}"] for i in ids], pa.list_(pa.field("item", pa.string(), item))
                    ),
                    "s": pa.array(
                        [{"a": i} for i in ids], pa.struct([field_a.with_nullable(item)])
                    ),
                }
            ),
            data / f"{name}.parquet",
        )
    got: dict[int, tuple[object, ...]] = {}
    for batch in _parquet_batches(data, tmp_path / "shm"):
        rows = zip(batch["t"], batch["tags"], batch["s"], strict=True)
        got.update(zip(batch["id"].tolist(), rows, strict=True))
    assert sorted(got) == list(range(40))
    assert all(tags == [f"t{i}"] and s == {"a": i} for i, (_t, tags, s) in got.items())
    epoch = datetime.datetime(1970, 1, 1)
    assert all(
        t.replace(tzinfo=None) == epoch + datetime.timedelta(seconds=i)
        for i, (t, _tags, _s) in got.items()
    )
    assert shm_entries(tmp_path / "shm") == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("change", "found"),
    [
        (
            "unwrapped",
            "RetypingSource.read_result returned RecordBatch, not a shmloader.sources."
            r"ReadResult: return ReadResult\(batch, skipped\)\nRaised in reader 0",
        ),
        (
            "table",
            "ReadResult takes one pyarrow.RecordBatch, got pyarrow.lib.Table: make one "
            r"RecordBatch of the rows .*_decoders.py:\d+, in _read\)\nRaised in reader 0",
        ),
    ],
)
def test_a_read_result_of_the_wrong_type_says_what_to_return(
    tmp_path: Path, change: str, found: str
) -> None:
    """Said at once (a retry would get the same), as ConfigError (what read_result returned)
    or DataError (ReadResult's TypeError in the source's read, chained)."""
    with pytest.raises((ConfigError, DataError), match=found):
        _run(tmp_path, change, 0, max_retries=1)


def _parquet_batches(data: Path, shm: Path) -> Iterator[dict[str, Any]]:
    """One epoch of every Parquet file in ``data``: tasks of 10 rows, batches of 7."""
    with shmloader.SharedTaskDataset(
        shmloader.ParquetSource(str(data / "*.parquet")),
        num_readers=2,
        records_per_task=10,
        epochs=1,
        shm_dir=str(shm),
    ) as ds:
        yield from shmloader.DataLoader(ds, batch_size=7)
