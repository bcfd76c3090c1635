"""The examples run as documented (small sizes)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from _dataset_helpers import TORCHRUN

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(*command: str) -> str:
    """Run ``command`` in examples/; its stdout, once it exited with 0."""
    done = subprocess.run(command, cwd=EXAMPLES, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.long
def test_elastic_trainers_share_epochs_and_survive_a_kill() -> None:
    out = run_example(
        sys.executable, "elastic.py", "--trainers", "3", "--records", "12000", "--kill"
    )
    # Trainer 0 starts first and is usually the one; on a loaded machine it once delivered
    # nothing before the others took every task, and was never killed.
    assert re.search(r"killed trainer \d after", out), out
    assert "12,000 records x 2 epochs: 0 records short" in out
    assert "master: 2 of 2 epochs finished" in out


@pytest.mark.long
def test_ddp_under_torchrun_gets_equal_shares_of_every_record() -> None:
    out = run_example(
        *TORCHRUN,
        "--standalone",
        "--nproc_per_node",
        "2",
        "ddp.py",
        "--records",
        "6001",
        "--epochs",
        "2",
    )
    for epoch in range(2):
        assert (
            f"epoch {epoch}: steps per rank [12, 12]; 6,001 records, 0 missing, padding rows: 1; ok"
            in out
        )
    assert "2 ranks, master at 127.0.0.1:" in out


def test_augment_is_reproducible_under_its_seed_and_differs_per_epoch() -> None:
    out = run_example(sys.executable, "augment.py", "--records", "1500")
    assert "1500 records x 2 epochs, each record once per epoch: True" in out
    assert "two runs with seed 7 saw the same augmented images: True" in out
    differ = int(re.search(r"differently in epoch 1 than in epoch 0: (\d+) of 1500", out)[1])
    assert differ > 1300, out  # a flip and a crop of 25 places: few repeat by chance


def test_the_quickstart_of_the_getting_started_page_trains() -> None:
    """docs/getting-started.md includes examples/quickstart.py as it is: it must run."""
    out = run_example(sys.executable, "quickstart.py")
    assert "epoch 0: 20000 records" in out and "epoch 1: 20000 records" in out
    assert "next epoch to deliver: 2" in out


def test_the_image_folder_example_reads_every_image_once_per_epoch() -> None:
    """docs/sources.md includes part of examples/image_folder.py: FileSource over class
    folders, two epochs of a small model."""
    out = run_example(sys.executable, "image_folder.py")
    for epoch in range(2):
        assert f"epoch {epoch}: 600 images, each once: True" in out, out


def test_a_checkpoint_of_two_ranks_resumes_in_one_trainer_exactly_once() -> None:
    """docs/how-to/checkpoints.md includes examples/checkpoint.py, which checks it itself."""
    out = run_example(sys.executable, "checkpoint.py")
    assert "every one of the 6000 records came exactly once" in out


@pytest.mark.long
def test_each_format_of_the_formats_page_reads_every_record_once() -> None:
    """docs/how-to/formats.md includes parts of examples/formats.py."""
    out = run_example(sys.executable, "formats.py")
    for name in ("tfrecord + tf.train.Example", "parquet", "arrow", "jsonl", "csv", "webdataset"):
        assert f"{name}: 2,000 records, each once: True" in out, out


@pytest.mark.long
def test_the_lightning_datamodule_resumes_mid_epoch_from_lightnings_checkpoint() -> None:
    """examples/lightning_datamodule.py: Lightning keeps shmloader.DataLoader's position in its
    checkpoint; the resumed run finishes the epoch, then runs the next one whole."""
    pytest.importorskip("lightning")
    out = run_example(sys.executable, "lightning_datamodule.py")
    assert "first run: stopped after 15 steps, 1500 records" in out
    assert "epoch 0: 4000 records, each once: True" in out
    assert "epoch 1: 4000 records, each once: True" in out


@pytest.mark.long
def test_accelerate_and_fabric_loops_of_the_frameworks_page_are_exact() -> None:
    """docs/how-to/frameworks.md includes parts of examples/frameworks.py."""
    pytest.importorskip("accelerate")
    pytest.importorskip("lightning")
    out = run_example(sys.executable, "frameworks.py")
    assert "accelerate: first run stopped after 15 steps, saved" in out, out
    assert "accelerate: resumed run, 2500 records; each record once: True" in out, out
    assert "fabric: 4000 records over a break and a second pass; each once: True" in out, out
