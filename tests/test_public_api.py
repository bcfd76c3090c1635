"""Every name ``shmloader`` exports resolves, lazily, and the package imports without torch."""

from __future__ import annotations

import subprocess
import sys

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


def test_import_and_sources_do_not_import_torch():
    # Reader processes and the CLI stay light: only the dataset part needs torch.
    code = (
        "import sys, shmloader; shmloader.RecordFileSource; shmloader.Master; "
        "shmloader.MasterClient; import shmloader.reader.process; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
