"""A long job's readers die now and then (OOM killer, a node's hiccup): each death is
restarted and the epoch still delivers every record once. The pool gives up only on deaths in
a row with no task read in between (a crash loop); it counted every death of the run and gave
up at the 11th, however far apart they were."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from _dataset_helpers import dataset, ids_of, write_dataset

import shmloader


def test_readers_that_die_now_and_then_are_restarted_past_the_cap(tmp_path: Path) -> None:
    expected = write_dataset(tmp_path / "data", [300, 200])
    options = {"epochs": None, "num_readers": 1, "lease_timeout": 1.0}
    with dataset(tmp_path / "data", tmp_path / "shm", **options) as ds:
        ds.start()
        pool = ds.runtime.pool
        pool._max_restarts = 2  # the cap (10 by default), low to keep the test short
        info = pool.readers[0]
        dl = shmloader.DataLoader(ds, batch_size=50)
        kills, read_at_kill = 0, -1
        for epoch in range(40):
            got: list[int] = []
            for i, batch in enumerate(dl):
                got += ids_of(batch)
                # A death once the reader read a task since the last one (not a crash loop).
                if i == 1 and kills < 5 and info.tasks > read_at_kill:
                    read_at_kill = info.tasks
                    os.kill(info.pid, signal.SIGKILL)
                    kills += 1
            assert sorted(got) == expected, f"epoch {epoch}"
            if kills == 5 and info.restarts == 5:
                break
        assert kills == 5 and info.restarts == 5  # more than the cap, none in a row
