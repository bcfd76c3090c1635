"""How a batch's rows count travels with it: a value (``IndexBatch``), not a kind of array.

The batch sampler hands torch a ``SampleIndices`` (a list of ints, as torch types a batch
sampler's batches) that keeps the ``IndexBatch`` it was made from; pickled to a DataLoader
worker it arrives as that ``IndexBatch``, its receipt a field. Indices the batch sampler did
not issue (another sampler's list, a copy of the indices) are not taken for its batches.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from shmloader.dataset.core.receipts import IndexBatch, Receipt, SampleIndices, issued_batch

INDICES = np.array([(1 << 32) | 3, (1 << 32) | 9, (2 << 32) | 0], dtype=np.int64)


@pytest.mark.parametrize("receipt", list(Receipt))
def test_a_batch_reaches_a_worker_as_its_indices_and_receipt(receipt: Receipt) -> None:
    handed = SampleIndices(IndexBatch(INDICES, receipt))
    assert handed == INDICES.tolist()  # what torch and a user's code see: a list of ints
    assert issued_batch(handed) is handed.batch  # in the trainer: the value behind the list
    arrived = pickle.loads(pickle.dumps(handed))  # as torch sends it to a worker
    assert type(arrived) is IndexBatch
    assert arrived.receipt is receipt
    assert np.array_equal(arrived.indices, INDICES) and arrived.indices.dtype == np.int64
    assert issued_batch(arrived) is arrived


def test_indices_the_batch_sampler_did_not_issue_are_not_taken_for_its_batches() -> None:
    handed = SampleIndices(IndexBatch(INDICES, Receipt.REQUESTS))
    assert issued_batch(list(handed)) is None  # a copy of the list
    assert issued_batch(np.asarray(handed)) is None  # a copy as an array
    assert issued_batch(INDICES) is None
    assert issued_batch([0, 1, 2]) is None  # torch's positions


def test_the_value_is_immutable() -> None:
    batch = IndexBatch(INDICES, Receipt.LOOP)
    with pytest.raises(AttributeError):
        batch.receipt = Receipt.GATHER  # type: ignore[misc]
