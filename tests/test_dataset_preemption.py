"""A trainer whose own SIGTERM handler (installed before the dataset) asks for a graceful stop:
the loop finishes its step on a live dataset, saves its state, exits cleanly, and nothing of
ours is left. The dataset's exit path (close, or atexit) still reports to the master what the loop
consumed, so the records come exactly once, resumed from the state or by another trainer.

Real trainer processes (tests/_dataset_trainer.py), SIGTERM sent from this process, real
readers, a real standalone master over gRPC, real files.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _dataset_helpers import (
    Trainer,
    ids_of,
    reader_pid,
    shm_entries,
    source,
    wait_gone,
    write_dataset,
)

import shmloader

AT, FINISH = 3, 4  # SIGTERM comes during the step after batch AT; FINISH batches end it
BATCH = 10  # = records per task: each batch after the signal needs a task read anew
TASKS = 20  # of the data: 200 records


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    directory = tmp_path_factory.mktemp("data")
    return directory, write_dataset(directory, [120, 80])


def preempted(trainer: Trainer, shm_dir: Path) -> list[int]:
    """SIGTERM the trainer mid-step; it must finish the step and exit 0. Returns what its
    loop received."""
    info = trainer.wait_for("info")["info"]
    trainer.wait_for("waiting")
    os.kill(trainer.proc.pid, signal.SIGTERM)
    assert trainer.finish() == 0, trainer.output()
    assert trainer.wait_for("preempted")
    got = trainer.ids(0)
    assert len(got) == (AT + FINISH) * BATCH  # batches after SIGTERM came from a live dataset
    assert shm_entries(shm_dir) == []
    assert wait_gone(info["readers"]) == []
    return got


def test_a_preempted_trainer_finishes_its_step_saves_and_resumes(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    directory, expected = data
    state = tmp_path / "state.json"
    common = {
        "data": str(directory),
        "shm_dir": str(tmp_path / "shm"),
        "dataset": {"records_per_task": BATCH, "epochs": 1},
        "loader": {"num_workers": 2},  # forked workers inherit the application's handler
        "batch_size": BATCH,
    }
    first = Trainer(
        tmp_path, "first", **common, preempt=[AT, FINISH], save_state=str(state), then="close"
    )
    before = preempted(first, tmp_path / "shm")
    saved = json.loads(state.read_text())
    second = Trainer(tmp_path, "second", **common, load_state=str(state))
    assert second.finish() == 0, second.output()
    second.wait_for("done")
    rest = second.ids(0)
    assert saved["epoch"] == 0 and not set(before) & set(rest)
    assert Counter(before + rest) == Counter(expected)
    assert shm_entries(tmp_path / "shm") == []


def test_a_preempted_trainer_hands_back_what_it_consumed_at_exit(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    directory, expected = data
    shm_dir = tmp_path / "shm"
    with shmloader.Master(
        source(directory), records_per_task=BATCH, epochs=1, seed=3, consumer_timeout=30.0
    ) as master:
        dead = Trainer(
            tmp_path,
            "dead",
            data=str(directory),
            shm_dir=str(shm_dir),
            dataset={"master": master.address, "num_readers": 1, "records_per_task": BATCH},
            batch_size=BATCH,
            preempt=[AT, FINISH],
            then="exit",  # no close(): interpreter exit leaves the master, handing back
        )
        by_dead = preempted(dead, shm_dir)
        with shmloader.SharedTaskDataset(
            source(directory), num_readers=2, master=master.address, shm_dir=str(shm_dir)
        ) as ds:
            by_survivor = [i for b in shmloader.DataLoader(ds, batch_size=BATCH) for i in ids_of(b)]
        # The dead trainer left as close() would, at once (not after consumer_timeout): what
        # its loop received is not delivered again, the rest of its tasks is.
        assert Counter(by_dead + by_survivor) == Counter(expected)
        progress = master.progress()
        assert progress.finished and not progress.quarantined
    assert shm_entries(shm_dir) == []


def test_readers_do_not_register_again_a_trainer_that_left_on_sigterm(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    """The SIGTERM hook leaves the master while the readers still run (they die with the
    trainer, a moment later). A reader's next Lease finds the consumer unknown: registering it
    again (as it must after a stall, MasterClient.speak_for) made a ghost of the leaving
    trainer that leased tasks nobody would read, each lapsing only after lease_timeout as a
    failed attempt (in SIGTERMed trainer processes: 1 in 2 left such a ghost, with up to 323
    leases). The hook is called here as the signal would call it, in a live process."""
    # shuffle_window: readers are never held back, so they poll the master when idle.
    with _trainer_of_a_standalone_master(data[0], tmp_path, 2, shuffle_window=64) as (master, ds):
        runtime = ds.runtime
        pool = runtime.pool
        assert pool is not None
        leased = _waiter("the readers to lease every task")
        while master.progress().counters["granted"] < TASKS:
            leased()
        runtime.on_sigterm()  # as the signal calls it (a real one would end pytest itself)
        assert [c.consumer for c in master.progress().consumers] == []
        lost = _waiter("the readers to hear the master forgot their trainer")
        while not all(info.master_lost for info in pool.readers):
            consumers = [c.consumer for c in master.progress().consumers]
            assert consumers == [], f"a reader registered the trainer that left: {consumers}"
            lost()
    assert shm_entries(tmp_path / "shm") == []


def test_sigterm_leaves_the_master_even_while_the_loop_holds_the_plane_s_lock(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    """The signal interrupts the main thread anywhere, also inside the plane's lock, which
    the leave (completions, hand-back) then waits for until the process dies: the consumer
    and its leases stayed at the master until consumer_timeout (in about half the SIGTERMs
    of a tight loop). Now it leaves without them. The hook is called as the signal would
    call it, with the lock held by the calling (main) thread."""
    with _trainer_of_a_standalone_master(data[0], tmp_path, 1) as (master, ds):
        runtime = ds.runtime
        leased = _waiter("the reader to lease")
        while not master.progress().counters["granted"]:
            leased()
        # As if the signal came inside the plane's code: a question to the book runs under the
        # plane's lock (a real SIGTERM would end pytest itself).
        runtime.plane.read(lambda book: runtime.on_sigterm())
        assert [c.consumer for c in master.progress().consumers] == []
    assert shm_entries(tmp_path / "shm") == []


def test_sigterm_while_close_stops_the_readers_still_leaves_the_master(
    tmp_path: Path, data: tuple[Path, list[int]]
) -> None:
    """close() stops the readers (up to 5 s) before it leaves the master. A SIGTERM meanwhile
    (a scheduler's at the end of the run, or torchrun's once another rank ended) found the
    dataset closed and did nothing: the process died by it with the consumer and its leases
    at the master until consumer_timeout, its last completions unsent. The hook is called as
    the signal would call it while the main thread's close() waits for a stopped reader."""
    with _trainer_of_a_standalone_master(data[0], tmp_path, 1) as (master, ds):
        runtime, pool = ds.runtime, ds.runtime.pool
        assert pool is not None
        leased = _waiter("the reader to lease")
        while not master.progress().counters["granted"]:
            leased()
        reader = reader_pid(ds, 0)
        os.kill(reader, signal.SIGSTOP)  # close() then waits for it to stop
        left: list[list[str]] = []

        def sigterm_during_close() -> None:
            try:
                stopping = _waiter("close() to stop the readers")
                while not pool.stopping:
                    stopping()
                # The SIGTERM hook, called as the signal calls it (a real one would end
                # pytest itself), while close() waits for a stopped reader
                runtime.on_sigterm()
                left.append([c.consumer for c in master.progress().consumers])
            finally:
                os.kill(reader, signal.SIGCONT)

        signaller = threading.Thread(target=sigterm_during_close)
        signaller.start()
        ds.close()
        signaller.join(60)
        assert left == [[]]
    assert shm_entries(tmp_path / "shm") == []


@contextlib.contextmanager
def _trainer_of_a_standalone_master(
    directory: Path, tmp_path: Path, num_readers: int, **options: Any
) -> Iterator[tuple[shmloader.Master, shmloader.SharedTaskDataset]]:
    """A started dataset (its shared memory under tmp_path/shm) of a master in this process
    that does not time its consumer out during the test; closed after."""
    (tmp_path / "shm").mkdir()
    with shmloader.Master(
        source(directory), records_per_task=BATCH, epochs=1, consumer_timeout=60.0
    ) as master:
        ds = shmloader.SharedTaskDataset(
            source(directory),
            num_readers=num_readers,
            master=master.address,
            records_per_task=BATCH,
            shm_dir=str(tmp_path / "shm"),
            **options,
        )
        try:
            ds.start()
            yield master, ds
        finally:
            ds.close()


def _waiter(what: str, timeout: float = 60.0) -> Any:
    """A step of a wait for ``what``: sleeps a little, fails once ``timeout`` is past."""
    give_up = time.monotonic() + timeout

    def step() -> None:
        assert time.monotonic() < give_up, f"timed out waiting for {what}"
        time.sleep(0.02)

    return step
