"""The end of the master's last epoch in elastic mode, when a trainer dies holding tasks of it.

Trainers that share a standalone master's epochs do not wait, at the end of a pass, for tasks
another trainer took in hand: those come to them in the next pass should that
trainer die. The last epoch has no next pass: a trainer SIGKILLed shortly before the survivor
finished had its tasks of it lost, the survivor exiting 0 without a word. The survivor now
waits for them once nothing of its own is in flight, and delivers those that come to it when
the dead trainer's leases lapse (a plain DataLoader that cannot wait is told so).

Real processes, a real standalone master over gRPC, real files, a real SIGKILL.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
from _dataset_helpers import (
    STANDALONE_SIZES,
    Trainer,
    shm_entries,
    standalone_master,
    wait_gone,
    write_dataset,
)

import shmloader
from shmloader.master.client import MasterClient
from shmloader.shm.reap import reap_stale

pytestmark = pytest.mark.long  # the long tier: .ci/run runs it after the README's command


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    directory = tmp_path_factory.mktemp("data")
    return directory, write_dataset(directory, STANDALONE_SIZES)


def _until_only_taken_tasks_are_left(master: shmloader.Master, timeout: float = 120.0) -> None:
    """Until every task of epoch 0 is done or taken in hand by a trainer, some of them taken:
    the moment a trainer of the pass's end stops waiting for others (taken tasks are not
    waited for while rows are in flight), so the moment to kill their holder."""
    client = MasterClient(master.address)
    client.register("probe")
    try:
        seqs = list(range(master.progress().num_tasks))
        deadline = time.monotonic() + timeout
        while True:
            where = Counter(client.whereabouts("probe", 0, seqs))
            if where["taken"] and where["taken"] + where["done"] == len(seqs):
                return
            assert time.monotonic() < deadline, where
            time.sleep(0.02)
    finally:
        client.leave("probe")
        client.close()


@pytest.mark.parametrize(
    ("kind", "workers"),
    [("shmloader", 0), ("shmloader", 2), ("batch_sampler", 2)],
    ids=["shmloader-in-process", "shmloader-workers", "plain-workers"],
)
def test_the_survivor_delivers_what_a_trainer_that_died_in_the_last_epoch_held(
    tmp_path: Path, data: tuple[Path, list[int]], kind: str, workers: int
) -> None:
    directory, expected = data
    # Leases last longer than the survivor's pass after the kill.
    with standalone_master(directory, tmp_path, lease_timeout=5.0, consumer_timeout=5.0) as (
        master,
        common,
    ):
        # A slow trainer, held after its first batch until the fast one runs: it cannot do
        # the epoch alone while the other starts (on a loaded machine, many seconds). Once
        # the fast one ends its pass, every task left is in the slow one's hands (its
        # readers lease none ahead once the queue is empty), and it takes each in hand a
        # step of a second before it finishes it: the state polled for lasts that long. Its
        # batches are smaller than a task (8 rows, tasks of 20, one task in hand at a time),
        # so its last task is in hand over at least one step, whatever rows it began with:
        # with batches of 32 a last task could be taken and finished within one batch.
        go = tmp_path / "go"
        slow = {
            **common,
            "dataset": {**common["dataset"], "shuffle_window": 1},
            "batch_size": 8,
        }
        dying = Trainer(tmp_path, "dying", **slow, sleep=1.0, pause_at=[0, 1, str(go)])
        dying.wait_for("paused")
        survivor = Trainer(
            tmp_path, "survivor", **common, kind=kind, loader={"num_workers": workers}
        )
        survivor.wait_for("pass")
        go.touch()
        _until_only_taken_tasks_are_left(master)
        dying.proc.kill()
        dying.proc.wait()
        assert survivor.finish(120) == 0, survivor.output()
        assert master.progress().finished, master.progress()
    by_dying, by_survivor = Counter(dying.ids(0)), Counter(survivor.ids(0))
    assert [i for i, n in by_survivor.items() if n > 1] == []
    # The dead trainer's partly consumed tasks come again whole: their rows twice in all.
    assert set(by_dying) | set(by_survivor) == set(expected)
    # The dead trainer's store goes with the next reaping (any new dataset reaps; so does
    # ``shmloader clean``), once its readers followed it.
    assert wait_gone(dying.wait_for("info")["info"]["readers"]) == []
    reap_stale(tmp_path / "shm")
    assert shm_entries(tmp_path / "shm") == []
