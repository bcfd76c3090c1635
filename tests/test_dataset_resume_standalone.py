"""Checkpoints of a trainer of a standalone master that crashes (SIGKILL right after saving
its state), is restarted from that state, crashes again and is restarted again, within one
epoch. The master keeps the position (its journal knows which tasks completed, whoever
delivered them); the trainer's states name the leases of the tasks it had partly consumed,
with the rows that reached the loop. The second state must name them too (a state that held
no rows once made tasks partly consumed come again whole, rows delivered before the save a
second time)."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest
from _dataset_helpers import (
    STANDALONE_BATCH,
    STANDALONE_SIZES,
    Trainer,
    standalone_master,
    write_dataset,
)

import shmloader

pytestmark = pytest.mark.long  # the long tier: .ci/run runs it after the README's command

BATCH = STANDALONE_BATCH


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    directory = tmp_path_factory.mktemp("data")
    return directory, write_dataset(directory, STANDALONE_SIZES)


def _forgotten(master: shmloader.Master, timeout: float = 30.0) -> None:
    """Wait until the master has dropped every consumer (a killed trainer's lapsed), so its
    tasks are handed out again rather than counted as a live trainer's."""
    deadline = time.monotonic() + timeout
    while master.progress().consumers:
        assert time.monotonic() < deadline, master.progress().consumers
        time.sleep(0.1)


def _crash_after_saving(trainer: Trainer) -> list[int]:
    """The rows the trainer's loop received before it saved its state, then SIGKILL."""
    trainer.wait_for("stopped")
    trainer.proc.kill()
    trainer.proc.wait()
    return trainer.ids(0)


@pytest.mark.parametrize("restart", ["after_the_lapse", "at_once"])
def test_a_trainer_resumed_twice_against_a_standalone_master_delivers_each_row_once(
    tmp_path: Path, data: tuple[Path, list[int]], restart: str
) -> None:
    # "at_once": each restart comes well within consumer_timeout, while the master still
    # counts the killed trainer's leases as a live trainer's; the restarted one takes over
    # what that trainer had consumed of them (its state names them).
    directory, expected = data
    lapse = 2.0 if restart == "after_the_lapse" else 30.0
    with standalone_master(directory, tmp_path, lease_timeout=2.0, consumer_timeout=lapse) as (
        master,
        shared,
    ):
        common = {**shared, "then": "wait"}
        first_state, second_state = tmp_path / "first.json", tmp_path / "second.json"
        first = Trainer(tmp_path, "first", **common, stop_at=[0, 5], save_state=str(first_state))
        before = _crash_after_saving(first)
        if restart == "after_the_lapse":
            _forgotten(master)
        second = Trainer(
            tmp_path,
            "second",
            **common,
            load_state=str(first_state),
            stop_at=[0, 4],
            save_state=str(second_state),
        )
        between = _crash_after_saving(second)
        if restart == "after_the_lapse":
            _forgotten(master)
        saved = json.loads(second_state.read_text())
        third = Trainer(tmp_path, "third", **common, load_state=str(second_state), passes=1)
        assert third.finish() == 0, third.output()
        third.wait_for("done")
    assert len(before) == 5 * BATCH and len(between) == 4 * BATCH
    delivered = Counter(before + between + third.ids(0))
    assert [i for i, n in delivered.items() if n > 1] == []
    assert delivered == Counter(expected)
    assert saved.get("position") == "master", saved
    assert saved["held"], saved  # the leases of partly consumed tasks, with their rows


@pytest.mark.parametrize("restart", ["at_once", "late"])
def test_a_sharing_trainer_restarted_from_its_state_repeats_nothing_the_others_delivered(
    tmp_path: Path, data: tuple[Path, list[int]], restart: str
) -> None:
    # Two trainers share the epoch (elastic mode); one saves its state, is SIGKILLed and is
    # restarted from that state. The state says the master holds the position, and names the
    # leases of the tasks it was in the middle of, with the rows its loop had received.
    # "at_once": while the master still counts the killed trainer alive, the restarted one
    # hands those leases back for it. "late": only once the master declared it dead and its
    # leases lapsed; the others took its tasks meanwhile, less the rows its state counted,
    # which the master kept when the state was saved. Either way nobody delivers them again.
    directory, expected = data
    # At once: the killed trainer's leases would wait for consumer_timeout. Late: it passes.
    timeouts = (30.0, 30.0) if restart == "at_once" else (2.0, 4.0)
    with standalone_master(
        directory, tmp_path, lease_timeout=timeouts[0], consumer_timeout=timeouts[1]
    ) as (master, common):
        state = tmp_path / "state.json"
        go = tmp_path / "go"
        # The slow trainer's readers lease on while it pauses: one reader and a window of one
        # task keep what it holds (ready, leased ahead) to a few tasks, so the next trainer
        # has tasks to share whatever the two take to start.
        held_back = {**common["dataset"], "num_readers": 1, "shuffle_window": 1}
        slow_common = {**common, "dataset": held_back}
        slow = Trainer(tmp_path, "slow", **slow_common, pause_at=[0, 3, str(go)])
        slow.wait_for("paused")  # it has done tasks: the next trainer shares the epoch
        first = Trainer(
            tmp_path, "first", **common, stop_at=[0, 3], save_state=str(state), then="wait"
        )
        before = _crash_after_saving(first)
        saved = json.loads(state.read_text())
        go.touch()
        if restart == "late":
            _until_dropped(master, saved["consumer"])
        again = Trainer(tmp_path, "again", **common, load_state=str(state))
        assert again.finish(120) == 0, again.output()
        assert slow.finish(120) == 0, slow.output()
        assert master.progress().finished
    assert saved.get("position") == "master" and saved["held"], saved
    delivered = Counter(before + slow.ids(0) + again.ids(0))
    assert [i for i, n in delivered.items() if n > 1] == []
    assert delivered == Counter(expected)


def _until_dropped(master: shmloader.Master, consumer: str, timeout: float = 60.0) -> None:
    """Until the master declared ``consumer`` dead (its consumer_timeout passed): its leases
    lapsed, and went back to the queue."""
    deadline = time.monotonic() + timeout
    while consumer in {c.consumer for c in master.progress().consumers}:
        assert time.monotonic() < deadline, master.progress().consumers
        time.sleep(0.1)
