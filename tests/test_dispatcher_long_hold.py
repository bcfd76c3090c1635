"""A lease whose trainer took its task is held past lease_timeout (elastic mode).

Its reading is done and its rows sit in that trainer's shared memory: a trainer that merely
stalled past ``lease_timeout`` still delivers them, so handing the task to another trainer
would make them come twice. A renewal (or the marking) of a taken lease therefore holds it for
``max(lease_timeout, consumer_timeout)``: it lapses when its own renewals stop for that long,
whatever else its consumer still calls (a trainer whose main process is stuck while its
readers call on must not hold its tasks for ever), or with its consumer's death or leave.
Untaken leases (a reader still at work, perhaps stuck) lapse after ``lease_timeout`` as
before, and DDP leases too (a rank's queue is its own). No network, no clock.
"""

from __future__ import annotations

from pathlib import Path

from _master_helpers import Recorder

from shmloader.master import Dispatcher, JobConfig
from shmloader.master.journal import Journal
from shmloader.master.updates import (
    ConsumerLeft,
    LeaseExpired,
    Update,
    decode_update,
    encode_update,
)
from shmloader.sources.base import Shard

PLAN = [Shard("a", 10), Shard("b", 6)]  # 4 records per task: 5 tasks
LEASE, CONSUMER = 10.0, 30.0


def config(**kw: object) -> JobConfig:
    settings: dict[str, object] = {"lease_timeout": LEASE, "consumer_timeout": CONSUMER, **kw}
    return JobConfig(records_per_task=4, shuffle=False, **settings)  # type: ignore[arg-type]


def stalled(d: Dispatcher, rank: int | None = None) -> tuple[int, int]:
    """'a' leases two tasks at t=0 and takes the first; nobody renews: (taken, untaken)."""
    d.register("a", 0.0, rank)
    taken, untaken = (x.lease_id for x in d.lease("a", 2, 0.0))
    assert d.mark_taken([taken], 0.5) == {}
    return taken, untaken


def expired(updates: list[Update]) -> list[int]:
    return [u.lease_id for u in updates if isinstance(u, LeaseExpired)]


def test_only_the_untaken_lease_lapses_after_lease_timeout() -> None:
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
    # Past lease_timeout, within consumer_timeout: a's lease is still good; it completes it,
    # counted once.
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
    # Restart at t=20: the replay rebuilds "taken", and nobody could renew while the master
    # was down, so the restart renews the taken lease for its hold (journaled LeaseRenewed).
    journal = Journal.open(tmp_path, PLAN, config(), 20.0)
    d = journal.dispatcher
    assert [(x.lease_id, x.taken) for x in d.leases_of("a")] == [(taken, True)]
    assert d.get_lease(taken).deadline == 20.0 + CONSUMER
    assert expired(d.expire(20.0 + LEASE + 1)) == []
    assert expired(d.expire(20.0 + CONSUMER + 1)) == [taken]  # a never came back
    journal.close()
    # And that expiry replays as it was decided.
    journal = Journal.open(tmp_path, PLAN, config(), 60.0)
    assert journal.dispatcher.progress().epochs[0].leased_units == 0
    assert journal.dispatcher.progress().counters["expired"] == 2
    journal.close()


def test_the_longer_deadlines_come_from_the_records_whatever_the_timeouts_on_replay() -> None:
    sink = Recorder()
    d = Dispatcher(PLAN, config(), sink=sink)
    taken, _ = stalled(d)
    d.renew(taken, 5.0)
    d.restart(8.0)  # every lease lasts the restart grace, max(LEASE, CONSUMER), from here
    d.renew(taken, 8.0 + LEASE)  # its holder renews, the untaken one's never does
    d.heartbeat("a", 8.0 + LEASE)
    assert expired(d.expire(8.0 + CONSUMER + 1)) != []  # the untaken lease
    # Replayed with other timeouts (allowed to change between restarts): the same state.
    again = Dispatcher(PLAN, config(lease_timeout=1.0, consumer_timeout=500.0))
    for update in [decode_update(encode_update(u)) for u in sink.updates]:
        again.apply(update)
    assert again.state_dict() == d.state_dict()
    assert again.get_lease(taken).deadline == 8.0 + LEASE + CONSUMER


def test_a_silent_holders_taken_task_is_other_so_the_others_wait_for_it() -> None:
    # Trainers do not wait at the end of a pass for tasks another trainer took ("taken"), but
    # do for "other". A taken lease not renewed for over lease_timeout may be a dead or stuck
    # trainer's, and comes back only at the end of its hold: the others must wait, or their
    # last pass could end first and its rows be lost.
    d = Dispatcher(PLAN, config())
    taken, _ = stalled(d)
    d.register("b", 0.0)
    assert d.whereabouts("b", 0, [0, 1]) == ["taken", "other"]  # no clock: as before
    assert d.whereabouts("b", 0, [0], now=LEASE + 0.5) == ["taken"]  # marked (renewed) at 0.5
    assert d.whereabouts("b", 0, [0], now=LEASE + 1) == ["other"]
    d.heartbeat("a", LEASE + 1)  # a sign of life of the consumer is not a renewal
    assert d.whereabouts("b", 0, [0], now=LEASE + 2) == ["other"]
    d.renew(taken, LEASE + 2)  # its trainer goes on
    assert d.whereabouts("b", 0, [0], now=LEASE + 3) == ["taken"]


def test_a_taken_lease_not_renewed_lapses_after_consumer_timeout_while_its_consumer_calls_on() -> (
    None
):
    # a's main process is stuck (its maintenance thread renews nothing), its readers live on:
    # they renew the leases of the tasks they read, under a's consumer id.
    d = Dispatcher(PLAN, config())
    taken, untaken = stalled(d)
    d.register("b", 0.0)
    t = 0.0
    while t < 0.5 + CONSUMER - 1:
        t += 3.0
        assert d.renew(untaken, t).deadline == t + LEASE  # an untaken lease: lease_timeout
        d.heartbeat("b", t)
        assert expired(d.expire(t)) == []
    assert d.whereabouts("b", 0, [0], now=t) == ["other"]  # b waits for it, but not for ever
    assert expired(d.expire(0.5 + CONSUMER)) == []  # marked taken at 0.5: held until 30.5
    assert expired(d.expire(0.5 + CONSUMER + 0.1)) == [taken]
    assert [x.lease_id for x in d.leases_of("a")] == [untaken]  # a is alive and still a member
    assert d.whereabouts("b", 0, [0], now=31.0) == ["todo"]  # back in the queue for b
    assert 0 in {x.unit for x in d.lease("b", 10, 31.0)}


def test_renewing_a_taken_lease_holds_it_for_the_longer_of_the_two_timeouts() -> None:
    d = Dispatcher(PLAN, config())
    taken, untaken = stalled(d)
    assert d.get_lease(taken).deadline == 0.5 + CONSUMER  # marking it taken renewed it
    assert d.renew(taken, 20.0).deadline == 20.0 + CONSUMER
    assert d.renew(untaken, 20.0).deadline == 20.0 + LEASE
    assert expired(d.expire(20.0 + CONSUMER - 0.1)) == [untaken]  # a renewed at 20: alive
    # With consumer_timeout below lease_timeout, a taken lease keeps lease_timeout.
    short = Dispatcher(PLAN, config(consumer_timeout=LEASE / 2))
    taken, _ = stalled(short)
    assert short.renew(taken, 1.0).deadline == 1.0 + LEASE
    # In DDP mode taken or not, lease_timeout.
    ddp = Dispatcher(PLAN, config(world_size=2))
    taken, _ = stalled(ddp, rank=0)
    assert ddp.renew(taken, 1.0).deadline == 1.0 + LEASE
