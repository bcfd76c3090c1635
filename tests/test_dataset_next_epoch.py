"""How far readers read into an epoch the training loop has not begun.

With ``epochs=None`` the master hands out epochs without end, and a script counts its own
(``for epoch in range(2): for batch in loader``). Readers read the next epoch's first window
of tasks while the loop is still in its epoch, so that the next epoch starts at full speed,
but no further: when the script stops after its last pass, that window is decoded for
nothing, not the ``2 * shuffle_window`` tasks readers may otherwise hold ready and those they
read meanwhile (with few tasks an epoch, whole epochs). The store's ``last_epoch`` hint says
how far (shm/hints.py); counts here, never timings.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _dataset_helpers import dataset, ids_of, write_dataset

import shmloader
from shmloader.dataset.runtime.runtime import next_epoch_tasks

RECORDS_PER_TASK = 25
SIZES = [450, 300]  # 30 tasks of 25 an epoch


def _records_read(ds: Any, settle: float = 1.0, most: float = 10.0) -> int:
    """The records the readers read, once the count stopped moving for ``settle`` seconds:
    readers that would read on do so while nothing consumes what they read."""
    began = time.monotonic()
    last, since = -1, time.monotonic()
    while time.monotonic() - began < most:
        now = sum(r.records for r in ds.stats().readers)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= settle:
            break
        time.sleep(0.05)
    return last


@pytest.mark.parametrize("epochs", [None, 2])
def test_two_epochs_read_little_of_the_third(tmp_path: Path, epochs: int | None) -> None:
    directory = tmp_path / "data"
    expected = write_dataset(directory, SIZES)
    with dataset(
        directory,
        tmp_path / "shm",
        epochs=epochs,
        records_per_task=RECORDS_PER_TASK,
        shm_budget="64MiB",
        # 2 ms a record: a task lasts longer than the trainer takes to hear of its start, as
        # real tasks do (tiny ones could each start several more meanwhile).
        slow=True,
    ) as ds:
        loader = shmloader.DataLoader(ds, batch_size=32)
        for epoch in range(2):
            got = Counter(i for batch in loader for i in ids_of(batch))
            assert got == Counter(expected), epoch  # every record once an epoch
        read = _records_read(ds)
        readers = len(ds.stats().readers)
    two_epochs = 2 * len(expected)
    if epochs == 2:
        assert read == two_epochs  # the master hands out nothing after its last epoch
        return
    # The next epoch's first window, and one more per reader that started one as the count
    # was reached; not the 2 * shuffle_window tasks of the ready bound and those read
    # meanwhile.
    window = next_epoch_tasks(ds.options.shuffle_window, readers) + readers
    assert two_epochs <= read <= two_epochs + window * RECORDS_PER_TASK, read


def test_epochs_run_on_exactly_once_after_the_next_epoch_was_held_back(tmp_path: Path) -> None:
    """Readers held back at the next epoch read it once the loop begins it: every record once
    an epoch, epoch after epoch, with a small window ahead at each boundary."""
    directory = tmp_path / "data"
    expected = write_dataset(directory, SIZES)
    with dataset(directory, tmp_path / "shm", epochs=None, records_per_task=RECORDS_PER_TASK) as ds:
        loader = shmloader.DataLoader(ds, batch_size=50)
        for epoch in range(4):
            got = Counter(i for batch in loader for i in ids_of(batch))
            assert got == Counter(expected), epoch
            time.sleep(0.2)  # readers catch up with the held-back window meanwhile
        stats = ds.stats()
        assert stats.duplicate_tasks == 0
        assert loader.state_dict()["epoch"] == 4


def test_a_state_saved_with_the_next_epoch_held_back_resumes_exactly(tmp_path: Path) -> None:
    """A checkpoint in the second epoch, while readers hold tasks of the third leased and
    unread, resumes in a fresh dataset with the rest of the second epoch, then the third
    whole: every record once an epoch."""
    directory = tmp_path / "data"
    expected = write_dataset(directory, SIZES)
    options: dict[str, Any] = {"epochs": None, "records_per_task": RECORDS_PER_TASK}
    with dataset(directory, tmp_path / "shm", **options) as ds:
        loader = shmloader.DataLoader(ds, batch_size=50)
        assert Counter(i for batch in loader for i in ids_of(batch)) == Counter(expected)
        before: list[int] = []
        for batch in loader:
            before += ids_of(batch)
            if len(before) >= len(expected) // 2:
                break
        time.sleep(0.5)  # readers reach the third epoch's window and stop there
        state = loader.state_dict()
    with dataset(directory, tmp_path / "shm2", **options) as ds:
        loader = shmloader.DataLoader(ds, batch_size=50)
        loader.load_state_dict(state)
        rest = [i for batch in loader for i in ids_of(batch)]
        assert Counter(before + rest) == Counter(expected)
        assert Counter(i for batch in loader for i in ids_of(batch)) == Counter(expected)
