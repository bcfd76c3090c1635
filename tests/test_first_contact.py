"""What a new user tries first and used to trip over: looking at a record with ``ds[0]``,
arguments of the wrong kind, torch DataLoader options that shmloader.DataLoader sets itself."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _dataset_helpers import dataset, write_dataset

import shmloader


def test_ds_of_an_index_is_that_record_read_from_the_source(tmp_path: Path) -> None:
    """``ds[0]`` used to gather sample index 0 from shared memory, before any task was there:
    FileNotFoundError. It is record 0 of the plan now, read in this process."""
    write_dataset(tmp_path / "data", [30, 20])
    with dataset(tmp_path / "data", tmp_path / "shm") as ds:
        first, last = ds[0], ds[-1]
        assert int(first["id"]) == 0 and float(first["x"]) == 0.0
        assert int(last["id"]) == 49 and int(ds[35]["id"]) == 35  # the second file's 6th
        assert int(ds.read_record(-1)["id"]) == 49  # what ds[i] calls, by its name
        assert first["id"].shape == ()  # one record: no batch axis
        with pytest.raises(IndexError, match="record 50 of a dataset of 50 records"):
            ds[50]
        assert [int(r["id"]) for r in list(ds)[:3]] == [0, 1, 2]  # iteration ends too
        # Nothing of an epoch was consumed: the loop still gets every record.
        got = sorted(int(i) for b in shmloader.DataLoader(ds, batch_size=16) for i in b["id"])
        assert got == list(range(50))


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        (
            "num_readers",
            "many",
            r"num_readers must be a whole number .* or \"auto\"; got 'many' \(str\)",
        ),
        ("num_readers", 0, r"num_readers must be at least 1, got 0: .* or \"auto\""),
        ("records_per_task", 100.0, r"records_per_task must be a whole number .* \(float\)"),
        ("shuffle_window", 0, "shuffle_window must be at least 1"),
        ("max_retries", -1, "max_retries must be at least 0"),
        ("epochs", 0, "epochs must be at least 1, got 0"),
    ],
)
def test_arguments_of_the_wrong_kind_are_a_config_error(
    tmp_path: Path, option: str, value: object, says: str
) -> None:
    write_dataset(tmp_path / "data", [10])
    with pytest.raises(shmloader.ConfigError, match=says):
        dataset(tmp_path / "data", tmp_path / "shm", **{option: value})


def test_a_misspelt_keyword_names_the_one_meant(tmp_path: Path) -> None:
    """Python's own error said only "unexpected keyword argument 'num_reader'"."""
    write_dataset(tmp_path / "data", [10])
    (tmp_path / "a.csv").write_text("x\n1\n")
    with pytest.raises(TypeError, match=r"SharedTaskDataset\(\) got an unexpected keyword "
                       r"argument 'num_reader' \(did you mean 'num_readers'\?\)"):  # fmt: skip
        dataset(tmp_path / "data", tmp_path / "shm", num_reader=2)
    with pytest.raises(TypeError, match=r"'colums' \(did you mean 'columns'\?\)"):
        shmloader.CSVSource(str(tmp_path / "a.csv"), colums=["x"])  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"'seeed' \(did you mean 'seed'\?\)"):
        shmloader.Master(shmloader.CSVSource(str(tmp_path / "a.csv")), seeed=1)  # type: ignore[call-arg]
    with dataset(tmp_path / "data", tmp_path / "shm") as ds:
        # torch's options pass through shmloader.DataLoader, and are suggested too.
        with pytest.raises(TypeError, match=r"'num_worker' \(did you mean 'num_workers'\?\)"):
            shmloader.DataLoader(ds, batch_size=4, num_worker=2)
        assert len(list(shmloader.DataLoader(ds, batch_size=4, timeout=0))) == 3


def test_numpy_integers_are_counts_for_every_option(tmp_path: Path) -> None:
    """Counts are checked once (``JobConfig``, ``DatasetOptions``): the dataset's own check
    took ``np.int64`` and the job's refused it, so ``records_per_task=np.int64(10)`` failed
    with "must be an int >= 1, got np.int64(10)"."""
    write_dataset(tmp_path / "data", [30, 20])
    counts = {"records_per_task": np.int64(10), "epochs": np.int64(1), "seed": np.int32(3)}
    with dataset(tmp_path / "data", tmp_path / "shm", num_readers=np.int64(1), **counts) as ds:
        assert ds.job.records_per_task == 10 and type(ds.job.records_per_task) is int
        got = sorted(int(i) for b in shmloader.DataLoader(ds, batch_size=16) for i in b["id"])
        assert got == list(range(50))
        json.dumps(ds.state_dict())  # a checkpoint of the job is JSON, counts included


@pytest.mark.parametrize(
    ("option", "says"),
    [
        ("shuffle", r"SharedTaskDataset\(\.\.\., shuffle=True, seed=\.\.\.\)"),
        ("collate_fn", "give transform= for a function of each batch"),
    ],
)
def test_our_loader_says_where_a_torch_option_goes_instead(
    tmp_path: Path, option: str, says: str
) -> None:
    write_dataset(tmp_path / "data", [10])
    given = {option: True if option == "shuffle" else print}
    with (
        dataset(tmp_path / "data", tmp_path / "shm") as ds,
        pytest.raises(shmloader.ConfigError, match=says),
    ):
        shmloader.DataLoader(ds, batch_size=4, **given)
