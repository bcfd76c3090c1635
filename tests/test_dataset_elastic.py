"""Several trainers on one master without world_size (elastic mode): they share its epochs.

Real reader processes, a real standalone master over gRPC, real files. Each trainer delivers
the tasks its own readers leased; a trainer gives up waiting for a task once the master says
another trainer holds it, so together they deliver every record once per epoch, and a trainer
that dies hands its unconsumed tasks back to the queue for the others.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest
import torch.utils.data

import shmloader
from shmloader.errors import ConfigError

RECORDS = 240


@pytest.fixture
def source(tmp_path):
    path = str(tmp_path / "r.tfrecord")
    shmloader.write_records(path, [i.to_bytes(4, "little") for i in range(RECORDS)])
    return shmloader.RecordFileSource(path)


def ids(batch) -> list[int]:
    return [int.from_bytes(r, "little") for r in batch["record"]]


def make_loader(kind: str, ds):
    if kind == "ours":
        return shmloader.DataLoader(ds, batch_size=8)
    # torch's own, with workers: tasks complete when gathered, through the ledger
    return torch.utils.data.DataLoader(
        ds, batch_size=8, sampler=ds.sampler(), collate_fn=ds.collate, num_workers=2
    )


@pytest.mark.parametrize("kinds", [("ours", "ours"), ("torch", "ours")])
def test_two_trainers_share_every_epoch_exactly_once(tmp_path, source, kinds):
    with shmloader.Master(source, records_per_task=10, epochs=2, seed=1) as master:
        datasets = [
            shmloader.SharedTaskDataset(
                source,
                num_readers=1,
                master=master.address,
                shm_budget="8MiB",
                shm_dir=str(tmp_path),
            )
            for _ in range(2)
        ]
        got: list[list[list[int]]] = [[], []]
        errors: list[BaseException] = []
        loaders = [make_loader(kind, ds) for kind, ds in zip(kinds, datasets, strict=True)]

        def train(i: int) -> None:
            try:
                loader = loaders[i]
                for _ in range(2):
                    got[i].append([r for batch in loader for r in ids(batch)])
            except BaseException as exc:  # re-raised below, in the test's thread
                errors.append(exc)

        try:
            for ds in datasets:
                ds.start()
            threads = [threading.Thread(target=train, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert not errors, errors
            assert not any(t.is_alive() for t in threads)
            for epoch in range(2):
                assert sorted(got[0][epoch] + got[1][epoch]) == list(range(RECORDS))
            assert any(ds.runtime.plane.figures().shares_epochs for ds in datasets)
            checked = 0
            for ds, loader in zip(datasets, loaders, strict=True):
                if ds.runtime.plane.figures().shares_epochs and isinstance(
                    loader, shmloader.DataLoader
                ):
                    check_master_held_state(loader.state_dict(), source, master, tmp_path)
                    checked += 1
            assert checked or "torch" in kinds
        finally:
            for ds in datasets:
                ds.close()  # sends the last completions
        progress = master.progress()
        assert progress.finished and progress.counters["expired"] == 0


def check_master_held_state(state, source, master, tmp_path) -> None:
    """A sharing trainer's state says the master holds the position: loading it against that
    master is fine (nothing to skip), against an embedded one it is refused."""
    assert state["position"] == "master" and state["master"] == master.address
    options = {"num_readers": 1, "shm_budget": "8MiB", "shm_dir": str(tmp_path)}
    with shmloader.SharedTaskDataset(source, master=master.address, **options) as again:
        shmloader.DataLoader(again, batch_size=8).load_state_dict(state)
        # private: what a loaded state leaves out is the dataset's own resume point
        # (dataset.py, resume/); nothing public tells an empty one from a fresh start yet.
        assert not again._resume.loaded  # nothing skipped, nothing left out of the schedule
    with (
        shmloader.SharedTaskDataset(source, **options) as alone,
        pytest.raises(ConfigError, match="that master keeps the position"),
    ):
        shmloader.DataLoader(alone, batch_size=8).load_state_dict(state)


def test_a_trainer_that_closes_mid_epoch_hands_back_what_its_loop_received(tmp_path, source):
    # Trainer a stops after 5 batches of 7 rows (35: inside a task of 10) and closes, while b
    # is in the middle of the epoch; b delivers the rest. The tasks a was in the middle of go
    # back with the rows a received, which b skips: every record once.
    options = {"num_readers": 1, "shm_budget": "8MiB", "shm_dir": str(tmp_path)}
    with shmloader.Master(source, records_per_task=10, epochs=1, seed=1) as master:
        a = shmloader.SharedTaskDataset(source, master=master.address, **options)
        b = shmloader.SharedTaskDataset(source, master=master.address, **options)
        got_a: list[int] = []
        got_b: list[int] = []
        a_closed = threading.Event()
        errors: list[BaseException] = []

        def train_b() -> None:
            try:
                for i, batch in enumerate(shmloader.DataLoader(b, batch_size=7)):
                    got_b.extend(ids(batch))
                    if i == 0:
                        a_closed.wait(30)  # b is mid-epoch when a leaves
            except BaseException as exc:  # re-raised below, in the test's thread
                errors.append(exc)

        try:
            a.start()
            b.start()
            thread = threading.Thread(target=train_b)
            thread.start()
            for i, batch in enumerate(shmloader.DataLoader(a, batch_size=7)):
                got_a.extend(ids(batch))
                if i + 1 == 5:
                    break
            per_task = Counter(r // 10 for r in got_a)  # record r is in task r // 10
            assert any(n < 10 for n in per_task.values())  # a is in the middle of some
            a.close()
            a_closed.set()
            thread.join(60)
            assert not errors, errors
            assert not thread.is_alive()
        finally:
            a_closed.set()
            a.close()
            b.close()
        assert len(got_a) == 35
        assert Counter(got_a + got_b) == Counter(range(RECORDS))  # every record exactly once
        progress = master.progress()
        assert progress.finished and progress.counters["released"] > 0


TRAINER = """
import sys, time, shmloader
source = shmloader.RecordFileSource(sys.argv[1])
ds = shmloader.SharedTaskDataset(source, num_readers=1, master=sys.argv[2], shm_budget="8MiB",
                                 shm_dir=sys.argv[3])
with open(sys.argv[4], "a") as out:
    for n, batch in enumerate(shmloader.DataLoader(ds, batch_size=8), 1):
        out.write(" ".join(str(int.from_bytes(r, "little")) for r in batch["record"]) + "\\n")
        out.flush()
        if n == 3:  # killed here, mid-epoch, while it holds tasks
            time.sleep(600)
"""


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_trainer_leaves_its_tasks_to_the_others(tmp_path, source, how):
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    delivered = tmp_path / "delivered.txt"
    delivered.touch()
    with shmloader.Master(
        source, records_per_task=10, epochs=2, seed=1, lease_timeout=2.0, consumer_timeout=2.0
    ) as master:
        child = subprocess.Popen(
            [
                sys.executable,
                str(script),
                source.paths[0],
                master.address,
                str(tmp_path),
                str(delivered),
            ],
        )
        try:
            give_up = time.monotonic() + 60
            while len(delivered.read_text().splitlines()) < 3:
                assert child.poll() is None, "the trainer exited early"
                assert time.monotonic() < give_up, "the trainer delivered nothing"
                time.sleep(0.05)
            os.kill(child.pid, how)
            child.wait(30)
        finally:
            child.kill()
            child.wait()
        by_dead = [int(r) for line in delivered.read_text().splitlines() for r in line.split()]
        with shmloader.SharedTaskDataset(
            source, num_readers=2, master=master.address, shm_budget="8MiB", shm_dir=str(tmp_path)
        ) as ds:
            loader = shmloader.DataLoader(ds, batch_size=8)
            by_survivor = [r for _ in range(2) for batch in loader for r in ids(batch)]
        # Epoch 0 was partly delivered to the dead trainer: the survivor delivers the rest of
        # it (and again the rows of the tasks the dead one was in the middle of), then all of
        # epoch 1. Nothing is lost.
        counts = Counter(by_survivor)
        if how == signal.SIGTERM:  # it left as close() would: what it received is not redone
            assert counts + Counter(by_dead) == Counter(2 * list(range(RECORDS)))
        assert set(counts) == set(range(RECORDS))
        assert all(n <= 2 for n in counts.values())
        once = {r for r, n in counts.items() if n == 1}
        assert once <= set(by_dead)
        progress = master.progress()
        assert progress.finished and not progress.quarantined
    leftovers = [n for n in os.listdir(tmp_path) if n.startswith("shmloader")]
    assert leftovers == [], "the killed trainer's segments were not reaped"


def test_readers_do_not_lease_far_ahead_of_the_sampler(tmp_path, source):
    # Without a bound, a trainer's readers would lease every task its budget can hold, and
    # other trainers sharing the master would find them all taken.
    with shmloader.Master(source, records_per_task=4, epochs=1) as master:  # 60 tasks
        with shmloader.SharedTaskDataset(
            source,
            num_readers=1,
            master=master.address,
            shm_budget="8MiB",
            shm_dir=str(tmp_path),
            shuffle_window=1,  # at most 2 tasks ready ahead
        ) as ds:
            ds.start()
            ahead = os.path.join(ds.runtime.handle.path, "ahead")
            give_up = time.monotonic() + 60  # the reader starts in well under a second
            while not os.path.exists(ahead):  # the sampler takes nothing meanwhile
                assert time.monotonic() < give_up, "the readers were never held back"
                time.sleep(0.05)
            time.sleep(1.5)  # for a lease call under way when the flag rose
            (epoch,) = master.progress().epochs
            # 2 ready, plus what the reader held when the flag rose: the rest of a lease call
            # of 4, and another call if the trainer's thread was slow to raise the flag after
            # the announcement that filled it, and a task leased to give way. Without the
            # bound: all 60.
            assert 2 <= epoch.leased_units <= 2 + 2 * 4 + 1
            time.sleep(0.5)
            (later,) = master.progress().epochs
            assert later.leased_units == epoch.leased_units  # held back: no more leases
            rows = [r for batch in shmloader.DataLoader(ds, batch_size=8) for r in ids(batch)]
        assert sorted(rows) == list(range(RECORDS))


@pytest.mark.parametrize("with_state", [False, True])
def test_a_trainer_restarted_against_the_master_goes_on_with_the_epoch(
    tmp_path, source, with_state
):
    # The master knows which tasks are done: the new trainer skips those and delivers the
    # rest. Rows of tasks the old one had partly consumed do not come again: it handed them
    # back when it closed (and its state says the same).
    options = {"num_readers": 1, "shm_budget": "8MiB", "shm_dir": str(tmp_path)}
    with shmloader.Master(source, records_per_task=10, epochs=1, seed=3) as master:
        first: list[int] = []
        with shmloader.SharedTaskDataset(source, master=master.address, **options) as ds:
            loader = shmloader.DataLoader(ds, batch_size=8)
            for batch in loader:
                first += ids(batch)
                if len(first) >= 100:
                    break
            state = loader.state_dict()
        with shmloader.SharedTaskDataset(source, master=master.address, **options) as ds:
            loader = shmloader.DataLoader(ds, batch_size=8)
            if with_state:
                loader.load_state_dict(state)
            rest = [r for batch in loader for r in ids(batch)]
            # It found tasks done before it started: it shares the master's epoch, whose
            # position the master holds, and its states say so, with or without a state loaded.
            assert ds.runtime.plane.figures().shares_epochs
            assert loader.state_dict()["position"] == "master"
        assert master.progress().finished
    counts = Counter(first + rest)
    assert set(counts) == set(range(RECORDS))
    assert max(counts.values()) == 1
    assert len(rest) < RECORDS  # done tasks were not read again


def test_a_trainer_joining_a_master_in_a_later_epoch_starts_there(tmp_path, source):
    # Its first pass is the master's oldest unfinished epoch, not an empty pass over epoch 0.
    options = {"num_readers": 1, "shm_budget": "8MiB", "shm_dir": str(tmp_path)}
    with shmloader.Master(source, records_per_task=10, epochs=3, seed=3) as master:
        first: list[int] = []
        with shmloader.SharedTaskDataset(source, master=master.address, **options) as ds:
            loader = shmloader.DataLoader(ds, batch_size=8)
            first += [r for batch in loader for r in ids(batch)]  # epoch 0, whole
            for batch in loader:  # part of epoch 1
                first += ids(batch)
                if len(first) >= RECORDS + 100:
                    break
        with shmloader.SharedTaskDataset(source, master=master.address, **options) as ds:
            loader = shmloader.DataLoader(ds, batch_size=8)
            passes = [[r for batch in loader for r in ids(batch)] for _ in range(2)]
        assert master.progress().finished
    assert 0 < len(passes[0]) < RECORDS  # the rest of epoch 1
    assert sorted(passes[1]) == list(range(RECORDS))  # epoch 2
    counts = Counter(first + passes[0])
    assert set(counts) == set(range(RECORDS)) and max(counts.values()) <= 3
