"""Records larger than a block through real readers: ``decode_batch`` runs a block at a time
and each block is written into the segment as it comes (``sources/streamed.py``); tasks with
skipped records are written the ordinary way. Every good record still arrives once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from _dataset_helpers import data_loader, ids_of, shm_entries, write_dataset
from _decoders import SCHEMA, decode_batch_padded, encode_padded

import shmloader

SIZES = [300, 250]  # tasks of 100 records of 40 kB: two blocks each
POISONED = {5, 260, 444}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("padded")
    write_dataset(directory, SIZES, poison=POISONED, encoder=encode_padded)
    return directory


@pytest.mark.parametrize("kind, num_workers", [("shmloader", 0), ("torch", 2)])
def test_blocks_streamed_into_segments_deliver_every_good_record_once(
    tmp_path: Path, data: Path, kind: str, num_workers: int
) -> None:
    source = shmloader.RecordFileSource(
        str(data / "*.tfrecord"),
        decode_batch=decode_batch_padded,
        schema=SCHEMA,
        on_error="skip",
        views=True,
    )
    shm_dir = tmp_path / "shm"
    shm_dir.mkdir()
    options = dict(num_readers=2, records_per_task=100, shuffle=True, seed=3, epochs=2)
    with shmloader.SharedTaskDataset(
        source, shm_budget="64MiB", shm_dir=str(shm_dir), **options
    ) as ds:
        dl = data_loader(ds, kind, 32, num_workers)
        expected = sorted(set(range(sum(SIZES))) - POISONED)
        for _ in range(2):
            got = Counter(i for batch in dl for i in ids_of(batch))
            assert sorted(got) == expected and set(got.values()) == {1}
        stats = ds.stats()
        assert stats.records_skipped == 2 * len(POISONED)
        where = sorted((Path(s.path).name, s.index) for s in ds.runtime.skipped)
        assert where == sorted(
            2
            * [
                ("part-00000.tfrecord", 5),
                ("part-00000.tfrecord", 260),
                ("part-00001.tfrecord", 144),
            ]
        )
    assert shm_entries(shm_dir) == []
