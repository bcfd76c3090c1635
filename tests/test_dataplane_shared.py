"""Several trainers sharing one master's epochs (elastic mode, no world_size), without
processes: a real dispatcher, real stores, planes, samplers and gatherers; the test plays the
readers, so who leases which task is chosen at will."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time

from _dataplane_helpers import OFFSETS, SHARDS, TOTAL, announce, trainer

from shmloader.dataset.gather.gatherer import Gatherer
from shmloader.master.config import JobConfig
from shmloader.master.dispatcher import Dispatcher


def dispatcher(epochs: int) -> Dispatcher:
    return Dispatcher(SHARDS, JobConfig(records_per_task=8, epochs=epochs, seed=3))


def consume(store, plane, sampler) -> list[int]:
    """One pass of a trainer's loop: gather everything the sampler yields."""
    indices = list(iter(sampler))
    ids = Gatherer(store.handle(), ["id"]).gather(indices)["id"].tolist() if indices else []
    plane.read_ledger_and_send()
    return ids


@contextlib.contextmanager
def maintained(*planes):
    """What each trainer's maintenance thread does: report to the master what was taken and
    consumed, every few milliseconds."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(0.005):
            for plane in planes:
                plane.read_ledger_and_send()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def concurrently(*trainers) -> list[list[int]]:
    """One pass of each trainer's loop, all at once (as separate trainers run)."""
    out: list[list[int]] = [[] for _ in trainers]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            out[i] = consume(*trainers[i])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(trainers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads), "a pass did not end"
    return out


def test_two_trainers_split_every_epoch_exactly_once(tmp_path):
    d = dispatcher(epochs=2)
    a = trainer(d, "a", tmp_path / "a")
    b = trainer(d, "b", tmp_path / "b")
    with a[0], b[0], maintained(a[1], b[1]):
        for epoch in range(2):
            # Their readers take turns: a gets tasks 0, 2, 4, ... and b the others.
            for unit in range(9):
                store, plane, _ = (a, b)[unit % 2]
                (lease,) = d.lease(("a", "b")[unit % 2], 1, time.time())
                assert (lease.epoch, lease.unit) == (epoch, unit)
                announce(store, plane, lease)
            got_a, got_b = concurrently(a, b)
            assert got_a and got_b
            assert sorted(got_a + got_b) == list(range(TOTAL))
        assert d.finished
        assert a[1].figures().shares_epochs and b[1].figures().shares_epochs
        assert a[0].handle().in_use() == b[0].handle().in_use() == 0


def b_holds_3_and_4(d: Dispatcher, a, *, taken: bool) -> None:
    """Epoch 0's 9 tasks: trainer a's readers read all but 3 and 4, which b's readers lease
    (and b's sampler takes in hand, if ``taken``)."""
    for unit in range(9):
        consumer = "b" if unit in (3, 4) else "a"
        (lease,) = d.lease(consumer, 1, time.time())
        if consumer == "a":
            announce(a[0], a[1], lease)
        elif taken:
            d.mark_taken([lease.lease_id], time.time())


def consume_as_it_goes(store, plane, sampler) -> list[int]:
    """One pass of a trainer's loop that gathers each chunk as the sampler yields it (as a
    DataLoader's workers do), so nothing handed out stays unconsumed for long."""
    gatherer = Gatherer(store.handle(), ["id"])
    ids: list[int] = []
    for chunk in sampler.chunks():
        if len(chunk):
            ids += gatherer.gather(chunk)["id"].tolist()
        plane.read_ledger_and_send()
    return ids


def b_dies_later(d: Dispatcher, a, delay: float = 0.5) -> threading.Thread:
    """After ``delay``: b falls silent and the master drops it (its leases go back), and a's
    readers lease and read what is left."""

    def run() -> None:
        time.sleep(delay)
        d.leave("b", time.time())
        for lease in d.lease("a", 20, time.time()):
            announce(a[0], a[1], lease)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_the_pass_waits_for_tasks_a_dead_trainers_readers_held(tmp_path):
    d = dispatcher(epochs=1)
    a = trainer(d, "a", tmp_path / "a")
    d.register("b", time.time())
    with a[0], maintained(a[1]):
        b_holds_3_and_4(d, a, taken=False)
        # By then a's pass has given tasks 3 and 4 up and waits to see them go.
        thread = b_dies_later(d, a, delay=0.3)
        (got,) = concurrently(a)
        thread.join()
        assert sorted(got) == list(range(TOTAL))
        assert d.finished


def test_a_task_a_dead_trainer_had_taken_comes_back_in_the_next_pass(tmp_path):
    d = dispatcher(epochs=2)
    a = trainer(d, "a", tmp_path / "a")
    d.register("b", time.time())
    with a[0], maintained(a[1]):
        b_holds_3_and_4(d, a, taken=True)  # in b's sampler: not waited for
        (first,) = concurrently(a)
        assert sorted(first) == sorted(set(range(TOTAL)) - set(_records(d, 0, (3, 4))))
        d.leave("b", time.time())  # b died before its loop got those rows
        leases = d.lease("a", 20, time.time())
        assert [(x.epoch, x.unit) for x in leases[:2]] == [(0, 3), (0, 4)]
        for lease in leases:
            announce(a[0], a[1], lease)
        (second,) = concurrently(a)  # epoch 1, with epoch 0's tasks elsewhere
        assert sorted(first + second) == sorted(list(range(TOTAL)) * 2)
        assert d.finished


def test_the_last_epoch_waits_for_tasks_another_trainer_took_in_hand(tmp_path):
    # No pass comes after the master's last epoch: had a's pass ended without 3 and 4, and b
    # died, nobody would deliver them. With every row it handed out consumed, a waits.
    d = dispatcher(epochs=1)
    a = trainer(d, "a", tmp_path / "a")
    d.register("b", time.time())
    with a[0], maintained(a[1]):
        b_holds_3_and_4(d, a, taken=True)
        thread = b_dies_later(d, a)
        got = consume_as_it_goes(*a)
        thread.join()
        assert sorted(got) == list(range(TOTAL))
        assert d.finished and a[2].left_open is None


def test_the_last_epoch_is_left_open_while_rows_are_in_flight(tmp_path, caplog):
    # Rows a handed out are not consumed (a batcher keeps them, or the loop gets them only
    # once the pass ends): waiting could close a cycle with b waiting for a, so the pass ends
    # with the epoch open, says so, and the next pass waits for the rest.
    d = dispatcher(epochs=1)
    a = trainer(d, "a", tmp_path / "a")
    d.register("b", time.time())
    with a[0], maintained(a[1]):
        b_holds_3_and_4(d, a, taken=True)
        (first,) = concurrently(a)  # gathers only once the pass has ended
        assert a[2].left_open == 0
        assert "epoch 0, the master's last, is not over" in caplog.text
        assert sorted(first) == sorted(set(range(TOTAL)) - set(_records(d, 0, (3, 4))))
        b_dies_later(d, a, delay=0.3).join()
        (rest,) = concurrently(a)
        assert sorted(first + rest) == list(range(TOTAL))
        assert d.finished and a[2].left_open is None


def test_a_task_another_trainer_takes_while_this_one_waits_is_not_waited_for(tmp_path):
    d = dispatcher(epochs=1)
    store, plane, sampler = trainer(d, "a", tmp_path / "a")
    d.register("b", time.time())

    def readers() -> None:
        time.sleep(0.3)  # the sampler waits for task 0 by then
        (lease_b,) = d.lease("b", 1, time.time())  # task 0 goes to trainer b
        for lease in d.lease("a", 20, time.time()):
            announce(store, plane, lease)
        d.complete(lease_b.lease_id, time.time())

    thread = threading.Thread(target=readers)
    with store, maintained(plane):
        thread.start()
        (got,) = concurrently((store, plane, sampler))
        thread.join()
        assert sorted(got) == sorted(set(range(TOTAL)) - set(_records(d, 0, (0,))))
        assert d.finished


def test_a_trainer_that_leaves_hands_back_what_it_consumed_of_its_tasks(tmp_path):
    d = dispatcher(epochs=1)
    a = trainer(d, "a", tmp_path / "a")
    b = trainer(d, "b", tmp_path / "b")
    with a[0], b[0]:
        task_of = {}
        for lease in d.lease("a", 20, time.time()):
            announce(a[0], a[1], lease)
            task_of[lease.lease_id] = lease.task.task_id
        store, plane, sampler = a
        # a's loop gets 13 rows (tasks have 8 or fewer: one task at least is partly consumed)
        indices = list(itertools.islice(iter(sampler), 13))
        first = Gatherer(store.handle(), ["id"]).gather(indices)["id"].tolist()
        plane.read_ledger_and_send()
        handed = plane.hand_back()
        assert handed and sum(b - a for rs in handed.values() for a, b in rs) < 13
        d.leave("a", time.time(), handed)
        leases = d.lease("b", 20, time.time())
        consumed = {x.task.task_id: list(x.consumed) for x in leases if x.consumed}
        assert consumed == {task_of[i]: rs for i, rs in handed.items()}
        for lease in leases:
            announce(b[0], b[1], lease)
        with maintained(b[1]):
            (rest,) = concurrently(b)
        assert sorted(first + rest) == list(range(TOTAL))  # every record once
        assert d.finished and b[0].handle().in_use() == 0


def _records(d: Dispatcher, epoch: int, units: tuple[int, ...]) -> list[int]:
    """The record ids of ``units`` of ``epoch``, as the test numbers them."""
    from shmloader.master.epochs import OpenEpoch

    ep = OpenEpoch.create(d.table, d.config, epoch)
    out: list[int] = []
    for unit in units:
        task = ep.unit_task(d.table, unit)
        first = OFFSETS[task.path] + task.start
        out.extend(range(first, first + task.num_records))
    return out


def test_a_stalled_trainer_whose_tasks_went_to_another_warns_and_counts(tmp_path, caplog):
    # Trainer a's readers hold every task; its loop takes 13 rows, then a stalls past the
    # lease timeout (nobody renews: what SIGSTOP or a long pause does) and b's readers get the
    # tasks. a goes on with its pass: it delivers the rows of every task it took, which b
    # delivers too. a warns once per task and counts those rows; a task handed back to a's own
    # readers is no duplicate (the plane drops the second copy) and is not warned about.
    d = dispatcher(epochs=1)
    a = trainer(d, "a", tmp_path / "a")
    d.register("b", time.time())
    store, plane, sampler = a
    with store:
        for lease in d.lease("a", 20, time.time()):
            announce(store, plane, lease)
        it = iter(sampler)
        first = Gatherer(store.handle(), ["id"]).gather(list(itertools.islice(it, 13)))
        plane.read_ledger_and_send()
        # Past consumer_timeout: a is declared dead, and every lease of it not completed
        # lapses, taken or not (tasks of 13 rows or less). A stall shorter than that keeps the
        # taken ones (test_dispatcher_long_hold.py, test_dataplane_lease_check.py).
        later = time.time() + d.config.consumer_timeout + 1
        d.heartbeat("b", later)
        *lapsed, left = d.expire(later)
        assert left.reason == "timeout"
        d.register("a", later)  # what a's client does when the master no longer knows it
        assert len(lapsed) >= 7
        mine = d.lease("a", 1, later)  # one goes back to a's own readers
        to_b = d.lease("b", 20, later)
        announce(store, plane, mine[0])  # a second copy: dropped
        assert plane.figures().duplicates == 1
        with caplog.at_level("WARNING", logger="shmloader.dataset"):
            rest = Gatherer(store.handle(), ["id"]).gather(list(it))
            plane.read_ledger_and_send()
        got = first["id"].tolist() + rest["id"].tolist()
        assert sorted(got) == list(range(TOTAL))  # a delivered every row once itself
        warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warned) == len(to_b) == plane.lapsed_leases.tasks == len(lapsed) - 1
        b_rows = sum(x.task.num_records for x in to_b)
        assert plane.lapsed_leases.records == b_rows  # all of them: a delivered them all
        x = to_b[0]
        text = next(w for w in warned if f"(lease {x.lease_id})" in w)
        task = f"task {x.task.task_id} ({x.task.path}, records {x.task.start}..{x.task.stop})"
        assert f"epoch 0, {task}" in text
        assert "handed the task to consumer 'b'" in text and "may reach training twice" in text


def test_rows_a_checkpoint_hands_over_are_left_out_of_their_own_task_only(tmp_path):
    # The handover names tasks by id, not by their place in the epoch's order: record numbers
    # count from each file's start, so the same numbers of another task are other records.
    d = dispatcher(epochs=1)
    probe = Dispatcher(SHARDS, JobConfig(records_per_task=8, epochs=1, seed=3))
    probe.register("p", time.time())
    tasks = [lease.task for lease in probe.lease("p", 20, time.time())]
    first, other = next(
        (t, u) for t in tasks for u in tasks if t.start == u.start and t.path != u.path
    )
    consumed = ((first.start, first.start + 3),)
    a = trainer(d, "a", tmp_path / "a", taken_over={(0, first.task_id): consumed})
    with a[0], maintained(a[1]):
        for lease in d.lease("a", 20, time.time()):
            announce(a[0], a[1], lease)
        (got,) = concurrently(a)
    skipped = {OFFSETS[first.path] + r for r in range(first.start, first.start + 3)}
    assert sorted(got) == sorted(set(range(TOTAL)) - skipped)
    assert OFFSETS[other.path] + other.start in got  # the same record numbers, another file
    assert d.finished
