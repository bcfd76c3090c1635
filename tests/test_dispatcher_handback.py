"""A trainer leaving an elastic job hands back the records it consumed of its partly consumed
tasks (master/handback.py): whoever leases such a task next skips them."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest
from _master_helpers import Recorder

from shmloader._proto import master_pb2 as pb
from shmloader.errors import ConfigError, MasterError
from shmloader.master import Dispatcher, JobConfig, Master, MasterClient
from shmloader.master.journal import Journal
from shmloader.master.updates import LeaseHandedBack, decode_update, encode_update
from shmloader.sources.base import Shard

PLAN = [Shard("a", 10), Shard("b", 5), Shard("d", 7)]  # rpt 4: tasks a0..a2, b0..b1, d0..d1


def make(**kw: object) -> Dispatcher:
    settings: dict = {"records_per_task": 4, "shuffle": False, "lease_timeout": 10.0}
    settings.update(kw)
    return Dispatcher(PLAN, JobConfig(**settings))


def test_a_leaving_consumer_hands_back_what_it_consumed_and_the_next_lease_carries_it() -> None:
    d = make()
    d.register("a", 0.0)
    d.register("b", 0.0)
    x, y, z = d.lease("a", 3, 0.0)  # records 0..4, 4..8, 8..10 of "a"
    assert x.consumed == ()
    # Two ranges of x (touching ones merged), nothing of y, all of z's own ranges.
    d.leave("a", 1.0, {x.lease_id: [(2, 3), (0, 1), (1, 2)], y.lease_id: [], z.lease_id: [(8, 9)]})
    got = {g.task.task_id: g for g in d.lease("b", 3, 1.0)}
    assert got[x.task.task_id].consumed == ((0, 3),)
    assert got[y.task.task_id].consumed == ()
    assert got[z.task.task_id].consumed == ((8, 9),)
    assert {g.attempt for g in got.values()} == {1}  # not a failure
    assert d.progress().counters["released"] == 3


def test_handed_back_records_accumulate_survive_a_death_and_go_with_completion() -> None:
    d = make(epochs=2, consumer_timeout=5.0, lease_timeout=100.0)
    for c in "abc":
        d.register(c, 0.0)
    (x,) = d.lease("a", 1, 0.0)
    d.leave("a", 1.0, {x.lease_id: [(0, 1)]})
    (y,) = d.lease("b", 1, 1.0)
    assert y.task == x.task and y.consumed == ((0, 1),)
    d.leave("b", 2.0, {y.lease_id: [(2, 3)]})  # a trainer hands back only its own
    (z,) = d.lease("c", 1, 2.0)
    assert z.consumed == ((0, 1), (2, 3))
    d.register("a2", 2.0)
    d.heartbeat("a2", 6.0)
    d.expire(8.0)  # "c" died: what it consumed comes again, what was handed back does not
    (w,) = d.lease("a2", 1, 8.0)
    assert w.task == x.task and w.consumed == ((0, 1), (2, 3)) and w.attempt == 2
    d.complete(w.lease_id, 9.0)
    later = [g for g in d.lease("a2", 20, 9.0) if g.task == x.task]
    assert later and later[0].epoch == 1 and later[0].consumed == ()  # a new epoch: whole


def test_bad_hand_backs_are_refused_before_anything_changes_and_others_ignored() -> None:
    d = make()
    d.register("a", 0.0)
    d.register("b", 0.0)
    x, y = d.lease("a", 2, 0.0)
    (other,) = d.lease("b", 1, 0.0)
    before = d.state_dict()
    with pytest.raises(ConfigError, match=r"consumed records \[3, 6\) are not within its task's"):
        d.leave("a", 1.0, {x.lease_id: [(0, 1)], y.lease_id: [(3, 6)]})
    assert d.state_dict() == before and len(d.leases_of("a")) == 2
    # Another consumer's lease, an unknown one: nothing to hand back for them.
    d.leave("a", 1.0, {other.lease_id: [(8, 9)], 999: [(0, 1)]})
    assert [g.consumed for g in d.lease("b", 2, 1.0)] == [(), ()]
    with pytest.raises(MasterError, match="records outside the lease's task"):
        d.apply(LeaseHandedBack(2.0, other.lease_id, ((0, 1),)))


def test_ddp_mode_keeps_nothing() -> None:
    d = make(world_size=2)
    d.register("r0", 0.0, rank=0)
    (x,) = d.lease("r0", 1, 0.0)
    d.leave("r0", 1.0, {x.lease_id: [(x.task.start, x.task.start + 1)]})
    d.register("r0", 1.0, rank=0)
    (again,) = d.lease("r0", 1, 1.0)
    assert again.task == x.task and again.consumed == ()


def _drive(d: Dispatcher) -> int:
    d.register("a", 0.0)
    d.register("b", 0.0)
    x, y = d.lease("a", 2, 0.0)
    d.leave("a", 1.0, {x.lease_id: [(1, 3)], y.lease_id: [(4, 5)]})
    (z,) = d.lease("b", 1, 1.0)
    return z.task.task_id


def test_replay_and_state_dict_keep_handed_back_records() -> None:
    sink = Recorder()
    d = make()
    d.sink = sink
    _drive(d)
    assert [u for u in sink.updates if isinstance(u, LeaseHandedBack)] == [
        LeaseHandedBack(1.0, 1, ((1, 3),)),
        LeaseHandedBack(1.0, 2, ((4, 5),)),
    ]
    fresh = make()
    for u in sink.updates:
        fresh.apply(decode_update(encode_update(u)))
    assert fresh.state_dict() == d.state_dict()
    again = make()
    again.load_state_dict(d.state_dict())
    assert [g.consumed for g in again.leases_of("b")] == [((1, 3),)]
    assert [g.consumed for g in again.lease("b", 1, 2.0)] == [((4, 5),)]
    # A state saved before hand-backs existed has no "consumed": nothing was handed back.
    state = make().state_dict()
    for ep in state["open_epochs"]:
        ep.pop("consumed", None)
    make().load_state_dict(state)


def test_the_journal_recovers_handed_back_records(tmp_path: Path) -> None:
    config = JobConfig(records_per_task=4, shuffle=False, lease_timeout=10.0)
    with Journal.open(tmp_path, PLAN, config, 0.0, fsync="always") as j:
        _drive(j.dispatcher)
    with Journal.open(tmp_path, PLAN, config, 2.0) as j:
        d = j.dispatcher
        assert [g.consumed for g in d.leases_of("b")] == [((1, 3),)]
        d.register("c", 2.0)
        assert [g.consumed for g in d.lease("c", 1, 2.0)] == [((4, 5),)]
        j.snapshot()
        (held,) = d.leases_of("b")
        d.leave("b", 3.0, {held.lease_id: [(0, 1), (3, 4)]})
    with Journal.open(tmp_path, PLAN, config, 4.0) as j:
        d = j.dispatcher
        d.register("e", 4.0)
        assert [g.consumed for g in d.lease("e", 1, 4.0)] == [((0, 4),)]


def test_leave_over_grpc_hands_back_and_the_lease_reply_carries_it() -> None:
    with (
        Master(PLAN, records_per_task=4, shuffle=False, epochs=1) as master,
        MasterClient(master.address, timeout=5, retry_for=1) as client,
    ):
        client.register("a")
        client.register("b")
        (x,) = client.lease("a", 1).leases
        assert x.consumed == ()
        client.leave("a", {x.lease_id: [(2, 4), (0, 1)]})
        (y,) = client.lease("b", 1).leases
        assert (y.task_id, y.seq, y.consumed) == (x.task_id, x.seq, ((0, 1), (2, 4)))
        client.register("c")
        with pytest.raises(MasterError, match=r"INVALID_ARGUMENT\): lease \d+: consumed rec"):
            client.leave("b", {y.lease_id: [(5, 9)]})
        # An older client's Leave: a ConsumerRequest (field 1 alike), nothing handed back.
        with grpc.insecure_channel(master.address) as channel:
            old_leave = channel.unary_unary(
                "/shmloader.master.Master/Leave",
                request_serializer=pb.ConsumerRequest.SerializeToString,
                response_deserializer=pb.Empty.FromString,
            )
            old_leave(pb.ConsumerRequest(consumer="b"), timeout=5)
        (z,) = client.lease("c", 1).leases
        assert z.consumed == ((0, 1), (2, 4))
        assert [c.consumer for c in client.progress().consumers] == ["c"]


def test_a_checkpoint_is_handed_back_when_its_holder_dies_not_when_it_leaves() -> None:
    # A trainer saved its state counting records of its leases (Checkpoint), then died: its
    # leases lapse, and their tasks go back less what the state counted.
    sink = Recorder()
    d = make(consumer_timeout=5.0, lease_timeout=100.0)
    d.sink = sink
    for c in "ab":
        d.register(c, 0.0)
    x, y = d.lease("a", 2, 0.0)
    d.checkpoint("a", {x.lease_id: [(0, 1)]}, 1.0)
    d.checkpoint("a", {x.lease_id: [(0, 2)], y.lease_id: [(5, 6)]}, 2.0)  # the later one counts
    assert [g.checkpointed for g in d.leases_of("a")] == [((0, 2),), ((5, 6),)]
    assert [g.consumed for g in d.leases_of("a")] == [(), ()]  # nothing skipped while it lives
    d.heartbeat("b", 6.0)
    d.expire(8.0)  # "a" declared dead
    got = {g.task.task_id: g for g in d.lease("b", 2, 8.0)}
    assert got[x.task.task_id].consumed == ((0, 2),)
    assert got[y.task.task_id].consumed == ((5, 6),)
    # Replayed and reloaded alike.
    fresh = make(consumer_timeout=5.0, lease_timeout=100.0)
    for u in sink.updates:
        fresh.apply(decode_update(encode_update(u)))
    assert fresh.state_dict() == d.state_dict()
    # A Leave hands back what it says, whatever was checkpointed (a trainer resumed from an
    # older state hands back that state's rows: the later checkpoint's model is gone).
    d.register("c", 8.0)
    d.checkpoint("b", {g.lease_id: [(g.task.start, g.task.stop)] for g in got.values()}, 8.5)
    (first,) = [g for g in got.values() if g.task == x.task]
    d.leave("b", 9.0, {first.lease_id: [(2, 3)]})
    assert {g.task.task_id: g.consumed for g in d.lease("c", 2, 9.0)} == {
        x.task.task_id: ((0, 3),),
        y.task.task_id: ((5, 6),),
    }


def test_a_lease_that_expires_keeps_its_checkpoint_and_bad_ones_are_refused() -> None:
    d = make(lease_timeout=2.0, consumer_timeout=50.0)
    d.register("a", 0.0)
    d.register("b", 0.0)
    (x,) = d.lease("a", 1, 0.0)
    with pytest.raises(ConfigError, match=r"consumed records \[5, 9\) are not within"):
        d.checkpoint("a", {x.lease_id: [(5, 9)]}, 1.0)
    d.checkpoint("b", {x.lease_id: [(0, 1)]}, 1.0)  # not b's: left out
    assert d.get_lease(x.lease_id).checkpointed == ()
    d.checkpoint("a", {x.lease_id: [(1, 2)]}, 1.0)
    d.heartbeat("b", 3.0)
    d.expire(3.0)  # the lease lapsed (a stalled trainer); its consumer lives on
    (y,) = d.lease("b", 1, 3.0)
    assert y.task == x.task and y.consumed == ((1, 2),) and y.attempt == 2
    state = d.state_dict()
    again = make(lease_timeout=2.0, consumer_timeout=50.0)
    again.load_state_dict(state)
    assert again.state_dict() == state


def test_checkpoint_over_grpc() -> None:
    with (
        Master(PLAN, records_per_task=4, shuffle=False, epochs=1, consumer_timeout=1.0) as master,
        MasterClient(master.address, timeout=5, retry_for=1) as client,
    ):
        client.register("a")
        (x,) = client.lease("a", 1).leases
        assert client.checkpoint("a", {x.lease_id: [(0, 2)]})
        client.register("b")
        deadline = time.monotonic() + 30
        while "a" in {c.consumer for c in client.progress().consumers}:  # declared dead
            client.heartbeat("b")
            assert time.monotonic() < deadline
            time.sleep(0.1)
        (y,) = client.lease("b", 1).leases
        assert (y.task_id, y.consumed) == (x.task_id, ((0, 2),))
