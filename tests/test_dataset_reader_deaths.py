"""A long job's readers die now and then (OOM killer, a node's hiccup): each death is
restarted and the epoch still delivers every record once. The pool gives up only on deaths in
a row with no task read in between (a crash loop); it counted every death of the run and gave
up at the 11th, however far apart they were. A death is seen even when the reader's pipe
outlives it."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest
from _dataset_helpers import dataset, ids_of, reader_pid, write_dataset
from _decoders import HOLDERS_ENV, SCHEMA, decode_holding_fds

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
        kills, read_at_kill, killed = 0, -1, 0
        for epoch in range(40):
            got: list[int] = []
            for i, batch in enumerate(dl):
                got += ids_of(batch)
                # A death once the reader read a task since the last one (not a crash loop),
                # and only of a reader started since: a task the dead one announced as it
                # died counts too, and its pid stays until the pool has started another.
                if i == 1 and kills < 5 and info.tasks > read_at_kill:
                    pid = reader_pid(ds, 0)  # the running one's, known
                    if pid != killed:
                        read_at_kill, killed = info.tasks, pid
                        os.kill(pid, signal.SIGKILL)
                        kills += 1
            assert sorted(got) == expected, f"epoch {epoch}"
            if kills == 5 and info.restarts == 5:
                break
        assert kills == 5 and info.restarts == 5  # more than the cap, none in a row


@pytest.mark.timeout(120)
def test_a_reader_whose_pipe_outlives_it_is_seen_dead_and_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader SIGKILLed while a child of it holds its pipe open: no end of file reaches the
    trainer, and only the pool's look at the process (``EXIT_CHECK_SECONDS``, also while
    messages keep coming) tells it the reader died."""
    holders = tmp_path / "holders"
    holders.mkdir()
    (tmp_path / "shm").mkdir()
    monkeypatch.setenv(HOLDERS_ENV, str(holders))
    expected = write_dataset(tmp_path / "data", [300, 200])
    src = shmloader.RecordFileSource(
        str(tmp_path / "data" / "*.tfrecord"), decode=decode_holding_fds, schema=SCHEMA
    )
    try:
        with shmloader.SharedTaskDataset(
            src,
            num_readers=1,
            records_per_task=100,
            seed=7,
            shm_budget="16MiB",
            epochs=1,
            lease_timeout=1.0,
            shm_dir=str(tmp_path / "shm"),
        ) as ds:
            ds.start()
            info = ds.runtime.pool.readers[0]
            got: list[int] = []
            for i, batch in enumerate(shmloader.DataLoader(ds, batch_size=50)):
                got += ids_of(batch)
                if i == 1:
                    os.kill(reader_pid(ds, 0), signal.SIGKILL)
            assert sorted(got) == expected
            assert info.restarts == 1 and info.exit_codes == [-signal.SIGKILL]
            assert len(os.listdir(holders)) == 2  # the pipe of the first was held open
    finally:
        for name in os.listdir(holders):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(name), signal.SIGKILL)
