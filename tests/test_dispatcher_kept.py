"""A lease whose trainer took its task does not lapse at its deadline (elastic mode).

Its reading is done and its rows sit in that trainer's shared memory: a trainer that merely
stalled past ``lease_timeout`` still delivers them, so handing the task to another trainer
would make them come twice. Only the holder's death (``consumer_timeout``) or leave frees it.
Untaken leases (a reader still at work, perhaps stuck) lapse at their deadline as before, and
DDP leases too (a rank's queue is its own). No network, no clock.
"""

from __future__ import annotations

from pathlib import Path

from shmloader.master import Dispatcher, DispatcherConfig
from shmloader.master.journal import Journal
from shmloader.master.updates import ConsumerLeft, LeaseExpired, Update
from shmloader.sources.base import Shard

PLAN = [Shard("a", 10), Shard("b", 6)]  # 4 records per task: 5 tasks
LEASE, CONSUMER = 10.0, 30.0


def config(**kw: object) -> DispatcherConfig:
    return DispatcherConfig(
        records_per_task=4,
        shuffle=False,
        lease_timeout=LEASE,
        consumer_timeout=CONSUMER,
        **kw,  # type: ignore[arg-type]
    )


def stalled(d: Dispatcher, rank: int | None = None) -> tuple[int, int]:
    """'a' leases two tasks at t=0 and takes the first; nobody renews: (taken, untaken)."""
    d.register("a", 0.0, rank)
    taken, untaken = (x.lease_id for x in d.lease("a", 2, 0.0))
    assert d.mark_taken([taken], 0.5) == {}
    return taken, untaken


def expired(updates: list[Update]) -> list[int]:
    return [u.lease_id for u in updates if isinstance(u, LeaseExpired)]


def test_only_the_untaken_lease_lapses_at_its_deadline() -> None:
    d = Dispatcher(PLAN, config())
    taken, untaken = stalled(d)
    d.register("b", 0.0)
    d.heartbeat("a", 11.0)  # a's heartbeat thread lives on; its leases are not renewed
    assert expired(d.expire(11.0)) == [untaken]
    assert [x.lease_id for x in d.leases_of("a")] == [taken]
    # b gets the untaken task (and the rest), never the taken one.
    got = d.lease("b", 10, 11.5)
    assert taken not in {x.lease_id for x in got} and len(got) == 4
    assert d.whereabouts("b", 0, [0]) == ["taken"]
    # Long past its deadline, a's lease is still good: it completes it, counted once.
    d.heartbeat("a", 25.0)
    assert taken not in expired(d.expire(25.0))  # (b's untaken leases lapse: not renewed)
    d.complete(taken, 26.0)
    assert d.progress().epochs[0].done_units == 1


def test_the_holders_death_or_leave_still_frees_it() -> None:
    d = Dispatcher(PLAN, config())
    taken, untaken = stalled(d)
    assert expired(d.expire(11.0)) == [untaken]
    assert expired(d.expire(CONSUMER + 0.5)) == []  # last seen at 0.5 (Taken): still alive
    dead = d.expire(CONSUMER + 1)  # a dead trainer's task comes back after consumer_timeout
    assert expired(dead) == [taken]
    assert isinstance(dead[-1], ConsumerLeft) and dead[-1].reason == "timeout"
    d.register("b", 31.0)
    assert {x.task.task_id for x in d.lease("b", 10, 31.0)} == {0, 1, 2, 3, 4}
    # A clean leave frees a taken lease at once.
    d2 = Dispatcher(PLAN, config())
    stalled(d2)
    d2.leave("a", 5.0)
    assert d2.progress().epochs[0].leased_units == 0


def test_ddp_leases_lapse_at_their_deadline_taken_or_not() -> None:
    d = Dispatcher(PLAN, config(world_size=2))
    taken, untaken = stalled(d, rank=0)
    assert sorted(expired(d.expire(11.0))) == sorted([taken, untaken])


def test_a_replay_and_a_restart_from_the_journal_keep_it(tmp_path: Path) -> None:
    journal = Journal.open(tmp_path, PLAN, config(), 0.0)
    d = journal.dispatcher
    taken, untaken = stalled(d)
    assert expired(d.expire(11.0)) == [untaken]
    journal.close()
    # Restart at t=20 (a fresh consumer_timeout from there, MasterStarted.lease_deadline for
    # the deadlines): the replay rebuilds "taken", so the lease still does not lapse.
    journal = Journal.open(tmp_path, PLAN, config(), 20.0)
    d = journal.dispatcher
    assert [(x.lease_id, x.taken) for x in d.leases_of("a")] == [(taken, True)]
    assert expired(d.expire(20.0 + LEASE + 1)) == []
    assert expired(d.expire(20.0 + CONSUMER + 1)) == [taken]  # a never came back
    journal.close()
    # And that expiry replays as it was decided.
    journal = Journal.open(tmp_path, PLAN, config(), 60.0)
    assert journal.dispatcher.progress().epochs[0].leased_units == 0
    assert journal.dispatcher.progress().counters["expired"] == 2
    journal.close()


def test_a_silent_holders_taken_task_is_other_so_the_others_wait_for_it() -> None:
    # Trainers do not wait at the end of a pass for tasks another trainer took ("taken"), but
    # do for "other". A holder silent for over lease_timeout may be dead, and its taken task
    # comes back only after consumer_timeout: the others must wait, or their last pass could
    # end first and its rows be lost.
    d = Dispatcher(PLAN, config())
    stalled(d)
    d.register("b", 0.0)
    assert d.whereabouts("b", 0, [0, 1]) == ["taken", "other"]  # no clock: as before
    assert d.whereabouts("b", 0, [0], now=LEASE) == ["taken"]  # a last seen at 0.5
    assert d.whereabouts("b", 0, [0], now=LEASE + 1) == ["other"]
    d.heartbeat("a", LEASE + 1)  # a comes back
    assert d.whereabouts("b", 0, [0], now=LEASE + 2) == ["taken"]
