"""Nothing empty in silence: a pass after the last epoch says why it is empty, and a trainer
whose source differs from the standalone master's plan is refused before it reads anything.

Both used to go without a word: ``for epoch in range(3)`` over ``epochs=1`` trained once and
then ran two empty passes; a trainer joining a master whose epochs were over got empty passes;
a trainer given other files than the master's read the master's tasks, refused them as "not a
file of the planned dataset" (the master's own file), quarantined them and died.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from _dataset_helpers import dataset, ids_of, shm_entries, source, write_dataset

import shmloader

EMPTY = "this pass is empty"


def _empty_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if EMPTY in r.getMessage()]


@pytest.mark.timeout(120)
def test_passes_after_the_last_epoch_say_once_why_they_are_empty(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    expected = write_dataset(tmp_path / "data", [150, 50])
    with (
        caplog.at_level(logging.WARNING, logger="shmloader"),
        dataset(tmp_path / "data", tmp_path / "shm", epochs=1) as ds,
    ):
        dl = shmloader.DataLoader(ds, batch_size=32)
        passes = [[i for batch in dl for i in ids_of(batch)] for _ in range(3)]
    assert sorted(passes[0]) == expected and passes[1:] == [[], []]
    (said,) = _empty_warnings(caplog)  # once, not once per empty pass
    assert "the master's 1 epoch(s) are over" in said and "epochs=None" in said
    assert "first pass" not in said


@pytest.mark.timeout(120)
def test_a_trainer_joining_a_master_whose_epochs_are_over_is_told(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    expected = write_dataset(tmp_path / "data", [120])
    src = source(tmp_path / "data")
    options = {"master": "", "records_per_task": 40}
    with shmloader.Master(src, records_per_task=40, epochs=1) as master:
        options["master"] = master.address
        with dataset(tmp_path / "data", tmp_path / "shm", **options) as first:
            got = [i for b in shmloader.DataLoader(first, batch_size=32) for i in ids_of(b)]
        assert sorted(got) == expected
        with (
            caplog.at_level(logging.WARNING, logger="shmloader"),
            dataset(tmp_path / "data", tmp_path / "shm", **options) as late,
        ):
            assert [b for b in shmloader.DataLoader(late, batch_size=32)] == []
    (said,) = _empty_warnings(caplog)
    assert "before this trainer's first pass" in said
    assert shm_entries(tmp_path / "shm") == []


@pytest.mark.timeout(120)
def test_a_trainer_with_other_files_than_the_masters_is_refused_naming_both(
    tmp_path: Path,
) -> None:
    write_dataset(tmp_path / "planned", [100, 100])
    write_dataset(tmp_path / "other", [100], first_id=1000)
    with (
        shmloader.Master(source(tmp_path / "planned"), records_per_task=100) as master,
        pytest.raises(shmloader.ConfigError) as info,
        dataset(tmp_path / "other", tmp_path / "shm", master=master.address) as ds,
    ):
        ds.start()
    message = str(info.value)
    assert f"master at {master.address} planned 2 files" in message
    assert f"only this trainer's: {tmp_path / 'other' / 'part-00000.tfrecord'}" in message
    assert str(tmp_path / "planned" / "part-00001.tfrecord") in message
    assert "not a file of the planned dataset" not in message
    assert shm_entries(tmp_path / "shm") == []


@pytest.mark.timeout(120)
def test_a_trainer_with_another_task_size_is_refused(tmp_path: Path) -> None:
    write_dataset(tmp_path / "data", [100])
    with (
        shmloader.Master(source(tmp_path / "data"), records_per_task=25) as master,
        pytest.raises(shmloader.ConfigError, match="use records_per_task=25"),
        dataset(tmp_path / "data", tmp_path / "shm", master=master.address) as ds,
    ):
        ds.start()  # the helper's records_per_task is 100
