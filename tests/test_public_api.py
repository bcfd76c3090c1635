"""Every name ``shmloader`` exports resolves, lazily, and the package imports without torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

import shmloader


def test_every_exported_name_resolves():
    for name in shmloader.__all__:
        assert getattr(shmloader, name) is not None, name


def test_unknown_name_is_an_attribute_error():
    try:
        shmloader.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("no AttributeError")


def _in_fresh_python(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by a new interpreter, where nothing of shmloader is imported yet."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)


def test_import_and_sources_do_not_import_torch():
    # Reader processes and the CLI stay light: only the dataset part needs torch.
    code = (
        "import sys, shmloader; shmloader.RecordFileSource; shmloader.Master; "
        "shmloader.MasterClient; import shmloader.reader.process; "
        "print('torch' in sys.modules)"
    )
    out = _in_fresh_python(code)
    assert out.stdout.strip() == "False"


def test_the_dataset_loads_numpy_random_before_its_threads_start():
    # numpy 2 loads numpy.random on first use; torch's DataLoader workers seed it as they
    # start. Loaded by one of the trainer's threads while a worker was forked, it left the
    # worker waiting for ever on the import lock it inherited (a resumed run with workers, 1
    # in 10). The dataset module loads it, in the thread that imports it, before any thread.
    code = (
        "import sys, shmloader; shmloader.SharedTaskDataset; print('numpy.random' in sys.modules)"
    )
    assert _in_fresh_python(code).stdout.strip() == "True"


def test_a_reader_imports_the_master_client_without_the_server_side():
    # Readers only talk to a master: the dispatcher, journal and gRPC server stay unimported
    # (about 50 ms less of every reader's start-up, on the way to the first batch).
    code = (
        "import sys, shmloader.reader.process, shmloader.master.client; "
        "print(sorted(m for m in sys.modules if m.startswith('shmloader.master.')))"
    )
    out = _in_fresh_python(code)
    loaded = out.stdout.strip()
    for server_side in ("dispatcher", "journal", "server", "service", "updates", "epochs"):
        assert f"'shmloader.master.{server_side}'" not in loaded, loaded


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="elsewhere names.py needs it")
def test_a_reader_does_not_import_psutil():
    # Owners' liveness comes from /proc on Linux; psutil is 20-50 ms of every reader's start,
    # on the way to the first batch.
    code = (
        "import sys, shmloader.reader.process, shmloader.sources.records; "
        "from shmloader.shm.names import self_identity, is_alive; "
        "print('psutil' in sys.modules, is_alive(*self_identity()))"
    )
    out = _in_fresh_python(code)
    assert out.stdout.split() == ["False", "True"], out.stdout


def test_the_master_package_still_exports_its_names_on_first_use():
    import shmloader.master as master

    for name in master.__all__:
        assert getattr(master, name) is not None, name
    assert master.Master.__module__ == "shmloader.master.server"


def test_dir_of_the_master_package_lists_its_names_before_they_load():
    # dir() feeds tab completion and pydoc: the lazily loaded names must be listed before
    # first use (a fresh process, where none is loaded yet), with the loaded submodules.
    code = (
        "import shmloader.master.forked, shmloader.master as m; "
        "print(sorted(set(m.__all__) - set(dir(m))), 'forked' in dir(m), "
        "'Master' in m.__dict__)"
    )
    out = _in_fresh_python(code)
    assert out.stdout.split() == ["[]", "True", "False"], out.stdout


def test_type_checkers_see_every_exported_name_from_its_module():
    # The lazy table and the TYPE_CHECKING imports name the same things from the same places:
    # mypy and IDEs see each name as what the import at run time gives.
    import ast
    import importlib
    from pathlib import Path

    tree = ast.parse(Path(shmloader.__file__).read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.dump(n))
    seen = {
        alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert set(shmloader.__all__) == {*seen, "__version__"}
    for name, module in seen.items():  # the import the type checker sees gives the very object
        assert getattr(importlib.import_module(module), name) is getattr(shmloader, name), name


def test_internals_are_not_at_the_top_level():
    # What users build and catch is at the top; the parts inside come from their modules.
    for name in ("Dispatcher", "JobConfig", "Journal", "SegmentStore", "TaskSampler"):
        assert name not in shmloader.__all__
    from shmloader.dataset.order.sampler import TaskSampler
    from shmloader.master import Dispatcher, Journal

    assert TaskSampler and Dispatcher and Journal
