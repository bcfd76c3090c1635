"""User code defined anywhere reaches the readers by value (reader/by_value.py).

A ``decode`` at the top of an unguarded script, in a notebook cell, in ``python -c``, a lambda,
a closure, a ``Source`` class of the script's own: each used to fail (readers ran the training
script again, the script trained once more per reader, then 'Can't get attribute decode').
Each test runs real readers and checks every record arrives once, and, where a script is run,
that its top-level code ran once.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _dataset_helpers import REPO_ROOT, shm_entries, subprocess_env, write_dataset

import shmloader
from shmloader.errors import ConfigError
from shmloader.reader.by_value import trainer_sys_path

# The body of a training script as a user writes it: decode, data and loop at the top level,
# no __main__ guard. It prints one line each time its top level runs, and what the loop got.
SCRIPT = """
import struct
import numpy as np, pyarrow as pa, shmloader
from shmloader.sources.base import ReadResult, Shard

print("TOP LEVEL RAN", flush=True)
SCALE = 2.0  # a global decode uses: goes with it

def decode(payload):
    record_id, _ = struct.unpack("<qB", payload)
    return {"id": record_id, "x": np.float32(SCALE * record_id)}

class CountingSource:
    \"\"\"A source class of the script's own.\"\"\"
    def __init__(self, n):
        self.n = n
    def plan(self):
        return [Shard("ids", self.n)]
    def read_result(self, shard, start, stop):
        ids = np.arange(start, stop)
        return ReadResult(pa.record_batch({"id": ids, "x": (SCALE * ids).astype("float32")}))
    def read(self, shard, start, stop):
        return self.read_result(shard, start, stop).batch

sources = [
    shmloader.RecordFileSource(DATA + "/*.tfrecord", decode=decode),
    shmloader.RecordFileSource(DATA + "/*.tfrecord", decode=lambda p: decode(p)),
    CountingSource(300),
]
for src in sources:
    with shmloader.SharedTaskDataset(src, num_readers=2, records_per_task=50, epochs=1,
                                     shm_dir=SHM_DIR) as ds:
        ids = []
        for batch in shmloader.DataLoader(ds, batch_size=32):
            assert (batch["x"].numpy() == 2 * batch["id"].numpy()).all()
            ids += batch["id"].tolist()
    print("IDS", sorted(ids) == list(range(300)), len(ids), flush=True)
"""


def _script(tmp_path: Path) -> str:
    write_dataset(tmp_path / "data", [150, 150])
    (tmp_path / "shm").mkdir()
    head = f"DATA = {str(tmp_path / 'data')!r}\nSHM_DIR = {str(tmp_path / 'shm')!r}\n"
    return head + textwrap.dedent(SCRIPT)


def _check_ran_once(done: subprocess.CompletedProcess[str], tmp_path: Path) -> None:
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert out.count("TOP LEVEL RAN") == 1, out  # never again in a reader
    assert done.stdout.count("IDS True 300") == 3, out
    assert shm_entries(tmp_path / "shm") == []


def _run(args: list[str], cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=cwd,
        timeout=200,
    )


@pytest.mark.timeout(240)
def test_an_unguarded_script_run_with_python(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(_script(tmp_path))
    _check_ran_once(_run([str(script)], tmp_path), tmp_path)


@pytest.mark.long
@pytest.mark.timeout(240)
def test_python_dash_c_and_stdin(tmp_path: Path) -> None:
    code = _script(tmp_path)
    _check_ran_once(_run(["-c", code], tmp_path), tmp_path)
    _check_ran_once(_run(["-"], tmp_path, stdin=code), tmp_path)


@pytest.mark.timeout(240)
def test_a_notebook(tmp_path: Path) -> None:
    """The script as notebook cells, executed by a real Jupyter kernel (ipykernel)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    code = _script(tmp_path)
    cut = code.index("sources = [")  # definitions in one cell, the training loop in another
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell(
            f"import sys; sys.path[:0] = {[str(REPO_ROOT)]!r}\n" + code[:cut]
        ),
        nbformat.v4.new_code_cell(code[cut:]),
    ]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    client = nbclient.NotebookClient(
        notebook, timeout=180, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    )
    client.execute()
    printed = "".join(
        out.get("text", "")
        for cell in notebook.cells
        for out in cell.outputs
        if out.get("output_type") == "stream"
    )
    assert printed.count("TOP LEVEL RAN") == 1, printed
    assert printed.count("IDS True 300") == 3, printed
    assert shm_entries(tmp_path / "shm") == []


def _ids(tmp_path: Path, decode: Callable[[bytes], dict[str, Any]]) -> list[int]:
    (tmp_path / "shm").mkdir(exist_ok=True)
    src = shmloader.RecordFileSource(str(tmp_path / "data" / "*.tfrecord"), decode=decode)
    ids: list[int] = []
    with shmloader.SharedTaskDataset(
        src, num_readers=2, records_per_task=50, epochs=1, shm_dir=str(tmp_path / "shm")
    ) as ds:
        for batch in shmloader.DataLoader(ds, batch_size=32):
            ids += batch["id"].tolist()
    assert shm_entries(tmp_path / "shm") == []
    return sorted(ids)


def _scaled(scale: float) -> Callable[[bytes], dict[str, Any]]:
    def decode(payload: bytes) -> dict[str, Any]:  # a closure: 'make.<locals>.decode'
        record_id, _ = struct.unpack("<qB", payload)
        return {"id": record_id, "x": np.float32(scale * record_id)}

    return decode


@pytest.mark.timeout(120)
def test_a_lambda_and_a_closure(tmp_path: Path) -> None:
    expected = write_dataset(tmp_path / "data", [120, 80])
    assert _ids(tmp_path, _scaled(3.0)) == expected
    assert _ids(tmp_path, lambda p: {"id": struct.unpack("<qB", p)[0]}) == expected


@pytest.mark.timeout(120)
def test_what_cannot_be_pickled_is_a_config_error_naming_it(tmp_path: Path) -> None:
    write_dataset(tmp_path / "data", [50])
    lock = threading.Lock()

    def decode(payload: bytes) -> dict[str, Any]:
        with lock:
            return {"id": struct.unpack("<qB", payload)[0]}

    with pytest.raises(ConfigError, match="cannot send the source to its reader") as caught:
        _ids(tmp_path, decode)
    assert "source.decode's closure variable 'lock', a lock" in str(caught.value)
    assert caught.value.__cause__ is not None


GONE_MODULE = """
import struct
def decode(payload):
    return {"id": struct.unpack("<qB", payload)[0]}
"""


@pytest.mark.timeout(120)
def test_a_module_readers_cannot_import_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decode of a module the trainer imported from a folder that is gone by the time the
    readers start: they cannot import it; the loop says which module, once, and the fix."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "gone_decoders.py").write_text(GONE_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    import gone_decoders  # type: ignore[import-not-found]

    (tmp_path / "mods" / "gone_decoders.py").unlink()
    write_dataset(tmp_path / "data", [50])
    with pytest.raises(ConfigError) as caught:
        _ids(tmp_path, gone_decoders.decode)
    message = str(caught.value)
    assert "module 'gone_decoders'" in message, message
    assert "register_pickle_by_value" in message
    assert message.count("cannot load the source") == 1, message
    sys.modules.pop("gone_decoders", None)


def test_the_readers_import_path_is_the_trainers_made_absolute(tmp_path: Path) -> None:
    assert trainer_sys_path(["", "/lib", ""], cwd=str(tmp_path)) == (
        str(tmp_path),
        "/lib",
        str(tmp_path),
    )
    assert os.getcwd() in trainer_sys_path([""])


@pytest.mark.timeout(120)
def test_a_decode_of_an_importable_module_goes_by_reference(tmp_path: Path) -> None:
    """Functions of importable modules are sent by name, as plain pickle sends them: a
    reader imports the module and does not get a copy of its code."""
    import pickle

    from _decoders import decode

    from shmloader.reader.by_value import pickle_config

    write_dataset(tmp_path / "data", [10])
    src = shmloader.RecordFileSource(str(tmp_path / "data" / "*.tfrecord"), decode=decode)
    config = pickle_config(src)  # type: ignore[arg-type]
    assert b"_decoders" in config.blob and b"cloudpickle" not in config.blob
    assert pickle.loads(config.blob).decode is decode
