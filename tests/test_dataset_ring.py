"""Batches from DataLoader workers through ring slots (``shmloader/dataset/gather/ring.py``)."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data
from _dataset_helpers import dataset, ids_of, write_dataset

import shmloader
from shmloader.dataset.core.batch import Batch
from shmloader.dataset.gather import ring as ring_module
from shmloader.dataset.gather.gather import block_layout
from shmloader.dataset.gather.ring import RING_PREFIX, BatchRing, RingBatch, RingColumn

SIZES = [400, 333]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    directory = tmp_path_factory.mktemp("data")
    return directory, write_dataset(directory, SIZES)


def test_a_slot_is_copied_out_and_freed(tmp_path: Path) -> None:
    specs = [((4, 3), np.dtype(np.float32)), ((4,), np.dtype(np.int64))]
    _, nbytes = block_layout(specs)
    ring = BatchRing.create(str(tmp_path), slots=2, batch_bytes=nbytes)
    assert os.path.basename(ring.path).startswith(RING_PREFIX)
    first, second = ring.claim(nbytes), ring.claim(nbytes)
    assert (first, second) == (0, 1)
    assert ring.claim(1) is None  # both busy: the worker falls back, never waits
    assert ring.claim(ring.slot_bytes + 1) is None
    placed = ring.alloc(1, specs)
    placed[0][1][...] = np.arange(12, dtype=np.float32).reshape(4, 3)
    placed[1][1][...] = [7, 8, 9, 10]
    batch = RingBatch(ring.path, 1, ring.slot_bytes, {"x": placed[0][0], "id": placed[1][0]})
    batch.columns["name"] = ["a", "b", "c", "d"]  # other columns travel as they are
    out = pickle.loads(pickle.dumps(batch))  # what crosses from the worker: the copy is the batch
    assert type(out) is Batch and isinstance(out, dict)  # never a RingBatch on this side
    assert isinstance(out["x"], torch.Tensor) and out["x"].shape == (4, 3)
    assert out["x"].flatten().tolist() == list(range(12))
    assert out["id"].tolist() == [7, 8, 9, 10] and out["name"] == ["a", "b", "c", "d"]
    placed[1][1][...] = 0  # the slot is the worker's again: the tensors are copies
    assert out["id"].tolist() == [7, 8, 9, 10]
    assert not os.path.exists(ring.path)  # unlinked once mapped here: no file outlives the maps
    assert ring.claim(1) == 1  # freed by the copy
    ring.release(0)
    assert ring.claim(1) == 0
    assert isinstance(placed[0][0], RingColumn)
    # The worker's own RingBatch, pickled and dropped, frees nothing: the slot is the copy's.
    sent = RingBatch(ring.path, 0, ring.slot_bytes, {"id": placed[1][0]})
    pickle.dumps(sent)
    del sent
    assert ring.claim(1) is None  # both slots still busy
    ring_module.forget(str(tmp_path))
    assert ring_module.mapped_rings() == []


def _mapped_rings(ds: Any) -> list[str]:
    return ring_module.mapped_rings(str(ds.runtime.store.path))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_hand_batches_over_through_rings(
    tmp_path: Path, data: tuple[Path, list[int]], context: str
) -> None:
    directory, expected = data
    with dataset(directory, tmp_path, epochs=None) as ds:
        dl = shmloader.DataLoader(
            ds,
            batch_size=50,
            num_workers=2,
            multiprocessing_context=context,
            persistent_workers=True,
        )
        for _ in range(2):
            got = []
            for batch in dl:
                assert isinstance(batch, dict) and isinstance(batch["id"], torch.Tensor)
                got += ids_of(batch)
            assert sorted(got) == expected
        rings = _mapped_rings(ds)
        assert len(rings) == 2  # one ring per worker, mapped here: the path was taken
        # A plain DataLoader's workers, started afterwards, use torch's transport: the rings
        # were set up for shmloader.DataLoader's workers only, not in the dataset they fork.
        plain = torch.utils.data.DataLoader(
            ds,
            batch_size=50,
            sampler=ds.sampler(),
            collate_fn=ds.collate,
            num_workers=1,
            multiprocessing_context=context,
        )
        got = [i for batch in plain for i in ids_of(batch)]
        assert sorted(got) == expected
        assert _mapped_rings(ds) == rings  # no ring of the plain loader's worker arrived


def test_without_persistent_workers_the_rings_go_with_each_epoch(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    directory, expected = data
    with dataset(directory, tmp_path, epochs=None) as ds:
        dl = shmloader.DataLoader(ds, batch_size=50, num_workers=2)
        for _ in range(2):
            assert sorted(i for batch in dl for i in ids_of(batch)) == expected
            assert _mapped_rings(ds) == []  # unmapped; the files were unlinked when first mapped
            store = Path(ds.runtime.store.path)
            assert not [p for p in store.iterdir() if p.name.startswith(RING_PREFIX)]


def test_batches_dropped_by_a_broken_off_loop_free_their_slots(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    # With persistent workers, torch discards the batches in flight when the next pass
    # starts. Their slots must come back, or after a few such passes every batch would take
    # torch's slower transport.
    directory, expected = data
    with dataset(directory, tmp_path, epochs=None) as ds:
        dl = shmloader.DataLoader(ds, batch_size=20, num_workers=2, persistent_workers=True)
        for _ in range(3):
            for _batch in dl:
                break  # batches of both workers are in flight (prefetch)
        got = [i for batch in dl for i in ids_of(batch)]
        assert set(got) <= set(expected) and len(got) == len(set(got))
        rings = _mapped_rings(ds)
        assert len(rings) == 2
        busy = [ring_module.busy_slots(p) for p in rings]
        assert busy == [[], []], f"slots still taken after a full pass: {busy}"
