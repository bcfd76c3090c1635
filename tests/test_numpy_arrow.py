"""NumPy to Arrow and back without pyarrow's look for pandas (sources/_numpy_arrow.py): the
same arrays ``pa.array`` and ``to_numpy`` give, and no pandas imported on the way to the first
batch, in the trainer or in any reader."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from _dataset_helpers import subprocess_env, write_dataset

from shmloader.sources._numpy_arrow import (
    binary_array,
    from_numpy,
    numpy_dtype,
    to_numpy,
    values_view,
)

NUMERIC = [
    pa.int8(),
    pa.int16(),
    pa.int32(),
    pa.int64(),
    pa.uint8(),
    pa.uint16(),
    pa.uint32(),
    pa.uint64(),
    pa.float16(),
    pa.float32(),
    pa.float64(),
]


@pytest.mark.parametrize("typ", NUMERIC, ids=str)
def test_numbers_become_the_array_pa_array_gives_over_the_same_memory(typ: pa.DataType) -> None:
    values = np.arange(10).astype(numpy_dtype(typ))
    assert numpy_dtype(typ) == pa.array([], type=typ).to_numpy(zero_copy_only=False).dtype
    got = from_numpy(values, typ)
    assert got.equals(pa.array(values, type=typ))
    assert got.buffers()[1].address == values.ctypes.data  # no copy
    back = to_numpy(got.slice(3, 4))
    np.testing.assert_array_equal(back, values[3:7])
    assert not back.flags.writeable  # a view of a buffer others may read


@pytest.mark.parametrize(
    "values, typ",
    [
        (np.arange(10, dtype=np.int64)[::2], pa.int64()),  # strided
        (np.arange(4, dtype=np.int64), pa.int32()),  # another dtype: pyarrow converts
        (np.array([True, False, True]), pa.bool_()),  # bit-packed in Arrow
    ],
    ids=["strided", "converted", "bool"],
)
def test_other_arrays_go_through_pyarrow_with_the_same_result(
    values: np.ndarray, typ: pa.DataType
) -> None:
    assert from_numpy(values, typ).equals(pa.array(values, type=typ))


def test_what_pyarrow_refuses_is_refused() -> None:
    with pytest.raises(pa.ArrowInvalid):  # does not fit
        from_numpy(np.array([2**40], dtype=np.int64), pa.int32())
    with pytest.raises(pa.ArrowNotImplementedError):  # not in native byte order
        from_numpy(np.arange(4, dtype=">i4"), pa.int32())


def test_nulls_and_bools_are_read_through_pyarrow() -> None:
    with_null = pa.array([1, None, 3], type=pa.int32())
    assert values_view(with_null) is None
    np.testing.assert_array_equal(to_numpy(with_null), with_null.to_numpy(zero_copy_only=False))
    flags = pa.array([True, False])
    assert values_view(flags) is None
    np.testing.assert_array_equal(to_numpy(flags), [True, False])
    assert values_view(pa.array([], type=pa.float32())).shape == (0,)


@pytest.mark.parametrize("typ", [pa.binary(), pa.large_binary()], ids=str)
@pytest.mark.parametrize(
    "values", [[b"a", b"", b"xyz" * 100], [], [b""]], ids=["some", "none", "empty"]
)
def test_bytes_become_the_array_pa_array_gives(values: list[bytes], typ: pa.DataType) -> None:
    got = binary_array(values, typ)
    assert got.type == typ
    assert got.equals(pa.array(values, type=typ))
    got.validate(full=True)


TRAINER = """
import json, sys
from pathlib import Path
import shmloader
from _decoders import decode_with_payload

source = shmloader.RecordFileSource(sys.argv[1] + "/*.tfrecord", decode=decode_with_payload)
with shmloader.SharedTaskDataset(
    source, num_readers=2, records_per_task=50, shm_dir=sys.argv[2], epochs=1
) as ds:
    batch = next(iter(shmloader.DataLoader(ds, batch_size=32)))
    readers = [r.pid for r in ds.stats().readers]
    in_readers = [p for p in readers if "/pandas/" in Path(f"/proc/{p}/maps").read_text()]
    print(json.dumps({"trainer": "pandas" in sys.modules, "readers": in_readers,
                      "raw": len(batch["raw"]), "n": len(readers)}))
"""


def test_neither_trainer_nor_readers_import_pandas_for_the_first_batch(tmp_path: Path) -> None:
    # Importing pandas (pyarrow's pa.array and to_numpy look for it) cost every reader about
    # 0.2 s of CPU on its first task and the trainer as much on its first batch.
    pytest.importorskip("pandas")  # installed by the test extra: the test means something
    write_dataset(tmp_path / "data", [200, 200])
    (tmp_path / "shm").mkdir()
    done = subprocess.run(
        [sys.executable, "-c", TRAINER, str(tmp_path / "data"), str(tmp_path / "shm")],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"trainer": False, "readers": [], "raw": 32, "n": 2}, done.stderr
