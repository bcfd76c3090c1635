"""A user's script over the public API, checked by ``mypy --strict`` as a user's CI would:
every name of the README's usage has its real type (not ``Any``), and closed choices are
``Literal`` types, so a misspelt one is an error before anything runs.

mypy runs outside the checkout, so it finds shmloader as a user's does: installed (here the
editable install, whose plain .pth file mypy follows; pyproject.toml says why).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _dataset_helpers import REPO_ROOT

pytestmark = pytest.mark.long  # the long tier: .ci/run runs it after the README's command

USAGE = """
import torch.utils.data

import shmloader

source = shmloader.RecordFileSource("data/*.tfrecord", on_error="skip")
ds = shmloader.SharedTaskDataset(source, num_readers="auto", epochs=3, metrics_port=9400)
dl = shmloader.DataLoader(ds, batch_size=256, num_workers=2, format="numpy", length="epoch")
for batch in dl:
    reveal_type(batch)
    break
state = dl.state_dict()
reveal_type(ds)
reveal_type(dl)
reveal_type(ds.stats())
reveal_type(shmloader.merge_states([state]))
reveal_type(shmloader.Master)
plain = torch.utils.data.DataLoader(ds, batch_sampler=ds.batch_sampler(64), num_workers=2)
reveal_type(ds.batch_sampler(64))
try:
    pass
except shmloader.DecodeError as exc:
    reveal_type(exc)
"""

MISTAKES = """
import shmloader

shmloader.RecordFileSource("data/*.tfrecord", on_error="ignore")
shmloader.SharedTaskDataset(shmloader.CSVSource("a.csv"), ddp_policy="repeat")
shmloader.RecordFileSource("data/*.tfrecord", None)
shmloader.SharedTaskDataset(shmloader.CSVSource("a.csv"), num_readers="many")
shmloader.DataLoader(shmloader.SharedTaskDataset(shmloader.CSVSource("a.csv")), format="jax")
"""


def _mypy(tmp_path: Path, code: str) -> str:
    script = tmp_path / "train.py"
    script.write_text(code)
    return _run_mypy(tmp_path, [str(script)])


def _run_mypy(tmp_path: Path, paths: list[str], *options: str) -> str:
    # The package is analysed as an installed one is (its own errors silent), found from
    # outside the checkout.
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--follow-imports=silent",
            "--cache-dir",
            str(tmp_path / "cache"),
            *options,
            *paths,
        ],
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=240,
    )
    return run.stdout + run.stderr


def test_the_readme_usage_type_checks_with_real_types(tmp_path: Path) -> None:
    out = _mypy(tmp_path, USAGE)
    assert "Success: no issues found" in out, out
    revealed = [
        line.split("Revealed type is ")[1] for line in out.splitlines() if "Revealed" in line
    ]
    assert revealed[:5] + revealed[6:] == [
        '"dict[str, Any]"',
        '"shmloader.dataset.dataset.SharedTaskDataset"',
        '"shmloader.dataset.loader.DataLoader"',
        '"shmloader.stats.stats.Stats"',
        '"dict[str, Any]"',
        '"shmloader.dataset.order.batch_sampler.TaskBatchSampler"',
        '"shmloader.errors.DecodeError"',
    ], out
    assert revealed[5].endswith('-> shmloader.master.server.Master"'), out  # its constructor


def test_closed_choices_and_keyword_only_options_are_checked(tmp_path: Path) -> None:
    out = _mypy(tmp_path, MISTAKES)
    assert 'Argument "on_error"' in out and "Literal['ignore']" in out, out
    assert 'Argument "ddp_policy"' in out and "Literal['repeat']" in out, out
    assert "Too many positional arguments" in out, out
    assert 'Argument "num_readers"' in out and "Literal['many']" in out, out
    assert 'Argument "format"' in out and "Literal['jax']" in out, out


def test_the_examples_the_docs_show_type_check(tmp_path: Path) -> None:
    """The pages' code is the examples' (scripts/sync_doc_examples.py): all of it passes
    ``mypy --strict``. Third-party gaps a user's configuration would cover too are allowed:
    libraries without type information (pyarrow, accelerate) and torch's unannotated
    ``Tensor.backward``."""
    examples = sorted(str(p) for p in (REPO_ROOT / "examples").glob("*.py"))
    out = _run_mypy(tmp_path, examples, "--ignore-missing-imports", "--untyped-calls-exclude=torch")
    assert "Success: no issues found" in out, out
