"""The dispatcher's rules, one test per rule, with the error messages users see."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _master_helpers import Recorder

from shmloader.errors import ConfigError, CorruptRecordError, LeaseError, MasterError
from shmloader.master import Dispatcher, JobConfig, Lease
from shmloader.master.tasks import task_order
from shmloader.master.updates import (
    LeaseExpired,
    LeaseFailed,
    LeaseGranted,
    MasterStarted,
    Update,
    decode_update,
    encode_update,
)
from shmloader.sources.base import Shard

PLAN = [Shard("a", 10), Shard("b", 5), Shard("c", 0), Shard("d", 7)]  # rpt 4: 7 tasks, 22 recs


def make(**kw: object) -> Dispatcher:
    settings: dict = {"records_per_task": 4, "shuffle": False, "lease_timeout": 10.0}
    settings.update(kw)
    return Dispatcher(PLAN, JobConfig(**settings))


def ids(leases: list[Lease]) -> list[int]:
    return [x.task.task_id for x in leases]


def test_leases_follow_plan_order_without_shuffle_and_seeded_order_with_it() -> None:
    d = make()
    d.register("c", 0.0)
    assert ids(d.lease("c", 7, 0.0)) == list(range(7))
    d2 = make(shuffle=True, seed=3)
    d2.register("c", 0.0)
    assert ids(d2.lease("c", 7, 0.0)) == task_order(7, seed=3, epoch=0, shuffle=True).tolist()


def test_a_lease_carries_task_epoch_deadline_and_attempt() -> None:
    d = make()
    d.register("c", 100.0)
    (x,) = d.lease("c", 1, 100.0)
    assert (x.task.path, x.task.start, x.task.stop) == ("a", 0, 4)
    assert (x.epoch, x.consumer, x.deadline, x.attempt, x.rank) == (0, "c", 110.0, 1, None)
    assert d.get_lease(x.lease_id) == x and d.leases_of("c") == [x]


def test_next_epoch_starts_once_the_current_has_no_todo_and_at_most_two_are_open() -> None:
    d = make(epochs=3)
    d.register("c", 0.0)
    first = d.lease("c", 7, 0.0)
    assert {x.epoch for x in first} == {0}
    second = d.lease("c", 100, 0.0)  # epoch 0 has nothing todo: epoch 1 starts
    assert {x.epoch for x in second} == {1} and len(second) == 7
    assert d.lease("c", 1, 0.0) == []  # epoch 2 waits for epoch 0 to finish
    for x in first:
        d.complete(x.lease_id, 1.0)
    third = d.lease("c", 100, 1.0)
    assert {x.epoch for x in third} == {2}
    for x in second + third:
        d.complete(x.lease_id, 2.0)
    p = d.progress()
    assert p.finished and p.epochs_finished == 3 and d.lease("c", 5, 3.0) == []
    assert [e.done_records for e in p.epochs] == [22, 22, 22]


def test_unbounded_epochs_never_finish() -> None:
    d = make(epochs=None)
    d.register("c", 0.0)
    for epoch in range(5):
        leases = d.lease("c", 7, 0.0)
        assert {x.epoch for x in leases} == {epoch}
        for x in leases:
            d.complete(x.lease_id, 0.0)
    assert not d.finished and d.progress().epochs_finished == 5


def test_first_epoch_resumes_at_a_later_epoch_with_its_own_order() -> None:
    d = make(epochs=3, first_epoch=2, shuffle=True, seed=5)
    d.register("c", 0.0)
    leases = d.lease("c", 7, 0.0)
    assert {x.epoch for x in leases} == {2}
    assert ids(leases) == task_order(7, seed=5, epoch=2, shuffle=True).tolist()
    for x in leases:
        d.complete(x.lease_id, 0.0)
    assert d.lease("c", 7, 0.0) == [] and d.finished
    with pytest.raises(ConfigError, match="first_epoch 3 is past the last epoch"):
        make(epochs=3, first_epoch=3)


def test_completing_twice_or_an_unknown_lease_raises_and_counts_once() -> None:
    d = make()
    d.register("c", 0.0)
    (x,) = d.lease("c", 1, 0.0)
    d.complete(x.lease_id, 1.0)
    with pytest.raises(LeaseError, match=rf"lease {x.lease_id} is not active: it was completed"):
        d.complete(x.lease_id, 2.0)
    with pytest.raises(LeaseError, match="lease 999 is unknown to this master"):
        d.complete(999, 2.0)
    with pytest.raises(LeaseError, match="it was completed"):
        d.renew(x.lease_id, 2.0)
    assert d.progress().epochs[0].done_records == 4
    assert d.progress().counters["completed"] == 1


def test_renew_moves_the_deadline_and_keeps_the_lease_alive() -> None:
    d = make()
    d.register("c", 0.0)
    (x,) = d.lease("c", 1, 0.0)
    assert d.renew(x.lease_id, 8.0).deadline == 18.0
    assert d.expire(15.0) == []
    assert d.get_lease(x.lease_id).deadline == 18.0


def test_a_failed_lease_is_retried_first_then_quarantined_at_the_cap() -> None:
    d = make(max_retries=1)
    d.register("c", 0.0)
    x, _ = d.lease("c", 2, 0.0)
    d.fail(x.lease_id, "bad CRC at offset 12", 1.0)
    (retry,) = d.lease("c", 1, 1.0)
    assert retry.task == x.task and retry.attempt == 2
    d.fail(retry.lease_id, "bad CRC again", 2.0)
    with pytest.raises(LeaseError, match=r"reported failed at t=2\.0: bad CRC again"):
        d.fail(retry.lease_id, "x", 3.0)
    ep = d.progress().epochs[0]
    assert ep.quarantined_records == 4 and ep.quarantined_units == 1
    (q,) = ep.quarantined
    assert (q.task, q.error, q.epoch) == (x.task, "bad CRC again", 0)
    assert d.lease("c", 1, 3.0)[0].task.task_id == 2  # the quarantined task is not handed out


def test_a_permanent_failure_is_quarantined_at_once() -> None:
    """A record decode rejects fails the same way every time: no retry is handed out."""
    d = make(max_retries=3)
    d.register("c", 0.0)
    x, _ = d.lease("c", 2, 0.0)
    d.fail(x.lease_id, "DecodeError: record 7", 1.0, permanent=True)
    (q,) = d.progress().epochs[0].quarantined
    assert (q.task, q.error) == (x.task, "DecodeError: record 7")
    assert all(lease.task != x.task for lease in d.lease("c", 7, 2.0))


def test_epoch_finishes_with_quarantined_work_reported() -> None:
    d = make(max_retries=0, epochs=1)
    d.register("c", 0.0)
    leases = d.lease("c", 7, 0.0)
    d.fail(leases[0].lease_id, "boom", 0.0)
    for x in leases[1:]:
        d.complete(x.lease_id, 0.0)
    p = d.progress()
    assert p.finished and p.epochs[0].finished
    assert p.epochs[0].done_records == 18 and p.epochs[0].quarantined_records == 4
    assert [q.error for q in p.quarantined] == ["boom"]


def test_expiry_requeues_at_the_front_and_counts_as_a_failure() -> None:
    d = make(max_retries=1)
    d.register("c", 0.0)
    d.register("late", 0.0)
    (x,) = d.lease("late", 1, 0.0)
    assert d.expire(10.0) == []  # not past the deadline yet
    (expired,) = d.expire(10.5)
    assert expired.lease_id == x.lease_id and not expired.quarantine  # type: ignore[attr-defined]
    (again,) = d.lease("c", 1, 11.0)
    assert again.task == x.task and again.attempt == 2
    d.heartbeat("late", 21.0)
    d.heartbeat("c", 21.0)
    (gone,) = d.expire(21.5)
    assert gone.quarantine  # type: ignore[attr-defined]
    assert d.progress().epochs[0].quarantined_units == 1


def test_late_completion_of_an_expired_lease_is_accepted_until_re_leased() -> None:
    d = make()
    d.register("c", 0.0)
    a, b = d.lease("c", 2, 0.0)
    d.heartbeat("c", 20.0)
    d.expire(20.0)
    d.complete(a.lease_id, 21.0)  # nobody took its task since: accepted, counted once
    with pytest.raises(LeaseError, match="it was completed"):
        d.complete(a.lease_id, 21.0)
    (again,) = d.lease("c", 1, 22.0)
    assert again.task == b.task  # a's task is not handed out again
    with pytest.raises(LeaseError, match=rf"was handed out again as lease {again.lease_id}"):
        d.complete(b.lease_id, 23.0)
    d.complete(again.lease_id, 23.0)
    ep = d.progress().epochs[0]
    assert ep.done_records == 8 and d.progress().counters["late_completed"] == 1


def test_leave_requeues_leases_at_once_without_counting_a_failure() -> None:
    d = make()
    d.register("a", 0.0)
    d.register("b", 0.0)
    x, y = d.lease("a", 2, 0.0)
    d.leave("a", 1.0)
    got = d.lease("b", 2, 1.0)
    assert [g.task for g in got] == [x.task, y.task] and {g.attempt for g in got} == {1}
    with pytest.raises(MasterError, match="consumer 'a' is not registered"):
        d.lease("a", 1, 2.0)


def test_silent_consumer_is_declared_dead_and_its_leases_requeued() -> None:
    d = make(consumer_timeout=5.0, lease_timeout=100.0)
    d.register("dead", 0.0)
    d.register("alive", 0.0)
    (x,) = d.lease("dead", 1, 0.0)
    d.heartbeat("alive", 4.0)
    applied = d.expire(6.0)
    assert [type(u).__name__ for u in applied] == ["LeaseExpired", "ConsumerLeft"]
    assert "consumer 'dead' silent since t=0.0" in applied[0].error  # type: ignore[attr-defined]
    (y,) = d.lease("alive", 1, 6.0)
    assert y.task == x.task and y.attempt == 2
    with pytest.raises(MasterError, match=r"declared dead after 5\.0s of silence"):
        d.heartbeat("dead", 7.0)


def test_register_checks_ids_and_ranks() -> None:
    d = make()
    with pytest.raises(MasterError, match="non-empty string"):
        d.register("", 0.0)
    with pytest.raises(MasterError, match="gave rank 1 but there is no world_size"):
        d.register("c", 0.0, rank=1)
    ddp = make(world_size=2)
    with pytest.raises(MasterError, match=r"rank in 0\.\.1 \(world_size=2\), got None"):
        ddp.register("c", 0.0)
    ddp.register("c", 0.0, rank=1)
    ddp.register("c", 1.0, rank=1)  # re-registering is a heartbeat
    with pytest.raises(MasterError, match="registered with rank 1; leave before"):
        ddp.register("c", 1.0, rank=0)
    with pytest.raises(MasterError, match="max_tasks must be an int >= 0"):
        ddp.lease("c", -1, 1.0)


@pytest.mark.parametrize("policy", ["pad", "drop"])
def test_ddp_ranks_read_only_their_queue_and_get_equal_records(policy: str) -> None:
    d = make(world_size=3, ddp_policy=policy, shuffle=True, epochs=2)
    for r in range(3):
        d.register(f"r{r}", 0.0, rank=r)
    per_rank: dict[tuple[int, int], int] = {}
    read: dict[int, list[tuple[str, int]]] = {0: [], 1: []}
    for _ in range(2):
        for r in range(3):
            for x in d.lease(f"r{r}", 100, 0.0):
                assert x.rank == r
                key = (x.epoch, r)
                per_rank[key] = per_rank.get(key, 0) + x.task.num_records
                read[x.epoch].extend((x.task.path, i) for i in range(x.task.start, x.task.stop))
                d.complete(x.lease_id, 0.0)
    expected = 8 if policy == "pad" else 7  # 22 records over 3 ranks
    assert per_rank == {(e, r): expected for e in range(2) for r in range(3)}
    p = d.progress()
    assert p.finished
    every = {(s.path, i) for s in PLAN for i in range(s.num_records)}
    for e in p.epochs:
        dropped = {(t.path, i) for t in e.dropped for i in range(t.start, t.stop)}
        assert e.dropped_records == len(dropped) == (0 if policy == "pad" else 1)
        assert set(read[e.epoch]) == every - dropped  # pad: everything; drop: all but reported
        assert len(read[e.epoch]) == 3 * expected


def test_ddp_queue_of_a_dead_rank_waits_for_the_rank() -> None:
    d = make(world_size=2, consumer_timeout=5.0)
    d.register("r0", 0.0, rank=0)
    d.register("r1", 0.0, rank=1)
    held = d.lease("r1", 1, 0.0)
    d.heartbeat("r0", 4.0)
    d.expire(6.0)  # r1 is dead
    got = d.lease("r0", 100, 6.0)
    assert got and {x.rank for x in got} == {0}  # rank 1's queue is not handed to rank 0
    d.register("r1-restarted", 7.0, rank=1)
    back = d.lease("r1-restarted", 1, 7.0)
    assert back[0].task == held[0].task and back[0].rank == 1


def test_config_and_plan_are_checked() -> None:
    with pytest.raises(ConfigError, match="epochs must be at least 1, got 0"):
        JobConfig(records_per_task=1, epochs=0)
    with pytest.raises(ConfigError, match=r"seed must be a whole number .* got 1\.0 \(float\)"):
        JobConfig(records_per_task=1, seed=1.0)
    with pytest.raises(ConfigError, match=r"max_retries must be a whole number .* \(bool\)"):
        JobConfig(records_per_task=1, max_retries=True)
    # A numpy integer is a count: kept as a plain int, so the journal's JSON takes it.
    counted = JobConfig(records_per_task=np.int64(8), epochs=np.int32(2))
    assert counted.to_dict()["records_per_task"] == 8 and type(counted.epochs) is int
    json.dumps(counted.to_dict())
    with pytest.raises(ConfigError, match="ddp_policy must be one of"):
        JobConfig(records_per_task=1, ddp_policy="repeat")
    with pytest.raises(ConfigError, match="lease_timeout must be a positive number"):
        JobConfig(records_per_task=1, lease_timeout=0)
    with pytest.raises(ConfigError, match="the plan has no records"):
        Dispatcher([Shard("x", 0)], JobConfig(records_per_task=1))
    with pytest.raises(ConfigError, match='"drop" with world_size=30 gives every rank 0'):
        make(world_size=30, ddp_policy="drop")


def _drive(d: Dispatcher) -> None:
    d.register("a", 0.0)
    d.register("b", 0.0)
    x = d.lease("a", 3, 1.0)
    y = d.lease("b", 2, 1.0)
    d.complete(x[0].lease_id, 2.0)
    d.fail(x[1].lease_id, "oops", 2.0)
    d.renew(y[0].lease_id, 3.0)
    d.heartbeat("b", 12.0)
    d.expire(12.0)
    d.complete(x[2].lease_id, 12.5)  # late but accepted
    d.leave("b", 13.0)
    d.lease("a", 2, 13.0)


def test_replaying_the_updates_rebuilds_the_same_state() -> None:
    sink = Recorder()
    d = make(epochs=2, max_retries=1)
    d.sink = sink
    _drive(d)
    assert sink.commits > 0
    fresh = make(epochs=2, max_retries=1)
    for u in sink.updates:
        fresh.apply(decode_update(encode_update(u)))
    assert fresh.state_dict() == d.state_dict()
    assert fresh.progress() == d.progress()


def test_apply_refuses_an_update_that_does_not_fit() -> None:
    d = make()
    d.register("c", 0.0)
    with pytest.raises(MasterError, match="not available or the lease id is reused"):
        d.apply(LeaseGranted(0.0, lease_id=1, consumer="c", epoch=0, unit=0, attempt=1, deadline=1))
    with pytest.raises(MasterError, match="lease 5 is unknown"):
        d.apply(LeaseFailed(0.0, lease_id=5, error="x", quarantine=False))


def test_state_dict_round_trips_through_json_and_continues_identically() -> None:
    d = make(epochs=2, max_retries=1)
    _drive(d)
    state = json.loads(json.dumps(d.state_dict()))
    copy = make(epochs=2, max_retries=1, lease_timeout=10.0)
    copy.load_state_dict(state)
    assert copy.state_dict() == d.state_dict()
    assert copy.lease("a", 20, 14.0) == d.lease("a", 20, 14.0)
    with pytest.raises(ConfigError, match=r"another task schedule; differing: seed: 0 there, 1"):
        make(seed=1).load_state_dict(state)
    with pytest.raises(ConfigError, match="not a dispatcher state_dict"):
        copy.load_state_dict({"format": 99})


def test_restart_moves_lease_ids_to_a_new_range_and_gives_consumers_grace() -> None:
    d = make(consumer_timeout=5.0)
    d.register("c", 0.0)
    d.lease("c", 1, 0.0)
    d.restart(100.0)
    assert d.expire(104.0) == []
    assert d.progress().consumers[0].consumer == "c"  # not dead: it got a grace period
    (y,) = d.lease("c", 1, 104.0)
    assert y.lease_id == (1 << 32) + 1


def test_restart_gives_active_leases_a_fresh_deadline_their_holders_complete_them() -> None:
    # The master was down past the leases' deadlines (10.0): their holders could not renew,
    # and may still be reading. Expiring them now would hand their tasks out twice.
    sink = Recorder()
    d = make(consumer_timeout=5.0)
    d.sink = sink
    for name in ("a", "b"):
        d.register(name, 0.0)
    x, y = d.lease("a", 2, 0.0)
    d.restart(100.0)
    assert sink.updates[-1] == MasterStarted(100.0, 1, lease_deadline=110.0)
    assert [lease.deadline for lease in d.leases_of("a")] == [110.0, 110.0]
    for name in ("a", "b"):
        d.heartbeat(name, 104.0)
    assert d.expire(105.0) == []
    assert x.task.task_id not in ids(d.lease("b", 7, 105.0))  # not handed out again
    d.complete(x.lease_id, 106.0)  # completed normally, not late
    assert d.progress().counters["late_completed"] == 0
    for name in ("a", "b"):
        d.heartbeat(name, 109.0)
    # the fresh deadline is a deadline: a holder that does not renew loses the lease after it
    assert [u.lease_id for u in d.expire(110.5)] == [y.lease_id]  # type: ignore[attr-defined]
    # replaying the records rebuilds the same deadlines, whatever lease_timeout is then
    fresh = make(consumer_timeout=5.0, lease_timeout=99.0)
    for u in sink.updates:
        fresh.apply(decode_update(encode_update(u)))
    assert fresh.state_dict() == d.state_dict()


def test_after_a_restart_leases_wait_for_renewals_as_long_as_their_holders_count_alive() -> None:
    # Clients come back after their retry backoff: a renewal later than lease_timeout after a
    # restart is a live trainer's, not a stall, while its consumer counts as alive.
    d = make(lease_timeout=2.0, consumer_timeout=5.0)
    d.register("a", 0.0)
    d.register("b", 0.0)
    (x,) = d.lease("a", 1, 0.0)
    d.restart(100.0)
    assert d.get_lease(x.lease_id).deadline == 105.0
    d.heartbeat("b", 102.5)
    assert d.expire(103.0) == []  # lease_timeout after the restart: still a's
    assert x.task.task_id not in ids(d.lease("b", 7, 103.0))
    d.renew(x.lease_id, 103.5)  # a's first renewal since the restart
    d.heartbeat("a", 105.0)
    assert x.lease_id not in _lapsed(d.expire(105.5))
    assert d.get_lease(x.lease_id).consumer == "a"
    # the grace is a deadline: a holder that never comes back loses the lease after it
    d.restart(200.0)
    assert x.lease_id in _lapsed(d.expire(205.5))


def _lapsed(updates: list[Update]) -> list[int]:
    return [u.lease_id for u in updates if isinstance(u, LeaseExpired)]


def test_restart_never_shortens_a_lease_and_old_records_extend_none() -> None:
    d = make()
    d.register("c", 0.0)
    (x,) = d.lease("c", 1, 0.0)  # deadline 10.0
    # restarted with shorter timeouts
    shorter = make(lease_timeout=2.0, consumer_timeout=2.0)
    shorter.load_state_dict(d.state_dict())
    shorter.restart(1.0)
    assert shorter.get_lease(x.lease_id).deadline == 10.0
    # a MasterStarted written before the field existed decodes, and extends no lease
    old = decode_update(b'{"type": "MasterStarted", "now": 50.0, "incarnation": 1}')
    assert old == MasterStarted(50.0, 1, lease_deadline=None)
    d.apply(old)
    assert d.get_lease(x.lease_id).deadline == 10.0


def test_update_records_reject_bad_json_with_clear_messages() -> None:
    with pytest.raises(CorruptRecordError, match="not valid JSON"):
        decode_update(b"{nope")
    with pytest.raises(CorruptRecordError, match="unknown update type 'Nope'"):
        decode_update(b'{"type": "Nope"}')
    with pytest.raises(CorruptRecordError, match=r"LeaseRenewed record has fields \['now'\]"):
        decode_update(b'{"type": "LeaseRenewed", "now": 1.0}')


def test_a_damaged_state_dict_is_a_config_error_and_leaves_a_clean_dispatcher() -> None:
    d = make(epochs=2)
    _drive(d)
    state = json.loads(json.dumps(d.state_dict()))
    state["open_epochs"][0]["cursor"] = [999]
    fresh = make(epochs=2)
    with pytest.raises(ConfigError, match="damaged or incomplete"):
        fresh.load_state_dict(state)
    assert fresh.progress().epochs_started == 0
    del state["schedule"]
    with pytest.raises(ConfigError, match="another task schedule"):
        fresh.load_state_dict(state)


def test_whereabouts_tell_a_consumer_which_units_it_may_still_get() -> None:
    d = make(epochs=2, max_retries=0)  # 7 units per epoch
    d.register("a", 0.0)
    d.register("b", 0.0)
    assert d.whereabouts("a", 0, [0, 6]) == ["todo", "todo"]  # not started yet
    a0, a1 = d.lease("a", 2, 0.0)
    (b2,) = d.lease("b", 1, 0.0)
    d.complete(a0.lease_id, 1.0)
    d.fail(a1.lease_id, "bad", 1.0)  # no retries left: quarantined
    assert d.whereabouts("a", 0, [0, 1, 2, 3]) == ["done", "quarantined", "other", "todo"]
    assert d.whereabouts("b", 0, [2]) == ["mine"]
    assert d.mark_taken([b2.lease_id, a0.lease_id], 1.5) == {
        a0.lease_id: f"lease {a0.lease_id} is not active: it was completed at t=1.0; task 0 of "
        "epoch 0 is counted once"
    }
    assert d.whereabouts("a", 0, [2]) == ["taken"]  # b's trainer has it in hand
    d.leave("b", 2.0)  # its unit goes back to the queue
    assert d.whereabouts("a", 0, [2]) == ["todo"]
    rest = d.lease("a", 5, 2.0)
    for lease in rest:
        d.complete(lease.lease_id, 3.0)
    assert d.progress().epochs_finished == 1  # closed: told from what it kept
    assert d.whereabouts("a", 0, [0, 1, 6]) == ["done", "quarantined", "done"]
    with pytest.raises(ConfigError, match=r"epoch 0 has units 0\.\.6, not 7"):
        d.whereabouts("a", 0, [7])
    with pytest.raises(MasterError, match="not registered"):
        d.whereabouts("b", 0, [0])
