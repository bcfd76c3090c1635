"""Damaged framing in one file of a dataset, its index missing: with on_error="skip" an epoch
delivers every good record exactly once and reports the damage (file, record, byte range) in
every epoch; without skip the dataset refuses to start, naming file and offset, as before."""

from __future__ import annotations

import glob
import os
from collections import Counter
from pathlib import Path

import pytest
from _dataset_helpers import dataset, ids_of, write_dataset
from test_tfrecord_errors import flip

import shmloader
from shmloader.errors import CorruptRecordError
from shmloader.formats.tfrecord import scan_offsets


def damaged_dataset(directory: Path) -> tuple[list[int], list[int], list[int]]:
    """Two files: record 250 of the first has a damaged length field, the second is cut
    inside its last record (id 799); no indexes. Returns ids and both files' offsets."""
    expected = write_dataset(directory, [500, 300])
    first, second = (str(directory / f"part-0000{i}.tfrecord") for i in (0, 1))
    offsets = [[int(o) for o in scan_offsets(p)] for p in (first, second)]
    flip(first, offsets[0][250] + 2)
    os.truncate(second, offsets[1][299] + 20)
    for index in glob.glob(str(directory / "*.shmidx")):
        os.unlink(index)
    return expected, offsets[0], offsets[1]


def test_skip_steps_over_damaged_framing_and_reports_it_every_epoch(tmp_path: Path) -> None:
    directory = tmp_path / "data"
    expected, first_offsets, second_offsets = damaged_dataset(directory)
    good = Counter(set(expected) - {250, 799})
    with dataset(directory, tmp_path / "shm", epochs=2, on_error="skip") as ds:
        dl = shmloader.DataLoader(ds, batch_size=50, num_workers=2)
        for epoch in range(2):
            got = [i for batch in dl for i in ids_of(batch)]
            assert Counter(got) == good, epoch
        stats = ds.stats()
        assert stats.records_skipped == 4  # one range per file, two epochs
        assert stats.task_failures == 0 and stats.quarantined_tasks == 0
        first, second = (str(directory / f"part-0000{i}.tfrecord") for i in (0, 1))
        skipped = sorted(ds.runtime.skipped, key=lambda s: (s.path, s.index))
        assert [(s.path, s.index, s.offset) for s in skipped] == [
            (first, 250, first_offsets[250]),
            (first, 250, first_offsets[250]),
            (second, 299, second_offsets[299]),
            (second, 299, second_offsets[299]),
        ]
        lost_range = f"bytes {first_offsets[250]}..{first_offsets[251]}"
        assert lost_range in skipped[0].error and "1 record lost" in skipped[0].error
        assert "cut short: 1 record lost" in skipped[2].error


def test_without_skip_the_damaged_dataset_is_refused_naming_file_and_offset(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "data"
    _, first_offsets, _ = damaged_dataset(directory)
    with (
        pytest.raises(CorruptRecordError, match="length CRC") as info,
        dataset(directory, tmp_path / "shm", epochs=1) as ds,
    ):
        list(shmloader.DataLoader(ds, batch_size=50))
    assert info.value.path == str(directory / "part-00000.tfrecord")
    assert info.value.offset == first_offsets[250] and info.value.index == 250
