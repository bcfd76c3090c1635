"""A lapsed lease whose task was handed out again names who got it (no network, no clock).

The old holder (a stalled trainer) may still deliver the task's rows, and so does the new one:
the master says who the new one is in its answer to the old holder's renew, complete or taken
call, so the old holder can warn that those rows may come twice (docs/trainers.md,
"A trainer that stalls").
"""

from __future__ import annotations

import json

import pytest
from _master_helpers import Recorder

from shmloader.errors import LeaseError, NotActive
from shmloader.master import Dispatcher, JobConfig
from shmloader.master import snapshot as snapshot_module
from shmloader.master._convert import problem_to_msg, problems_from_msg
from shmloader.master.updates import decode_update, encode_update
from shmloader.sources.base import Shard

PLAN = [Shard("a", 10), Shard("b", 5)]  # 4 records per task: 5 tasks


def make() -> Dispatcher:
    config = JobConfig(records_per_task=4, shuffle=False, lease_timeout=10.0, consumer_timeout=30.0)
    return Dispatcher(PLAN, config)


def stall_and_hand_over(d: Dispatcher) -> tuple[int, int]:
    """'slow' leases a task and stalls past its lease; 'fast' gets the task: the two leases."""
    d.register("slow", 0.0)
    d.register("fast", 0.0)
    (old,) = d.lease("slow", 1, 0.0)
    d.heartbeat("fast", 11.0)
    d.heartbeat("slow", 11.0)  # alive (its heartbeat thread), but its lease was not renewed
    (expired,) = d.expire(11.0)
    assert expired.lease_id == old.lease_id  # type: ignore[attr-defined]
    (new,) = d.lease("fast", 1, 11.5)
    assert new.task == old.task
    return old.lease_id, new.lease_id


def test_renew_complete_and_taken_of_the_old_lease_name_the_new_holder() -> None:
    d = make()
    old, new = stall_and_hand_over(d)
    for call in (lambda: d.renew(old, 12.0), lambda: d.complete(old, 12.0)):
        with pytest.raises(LeaseError, match=rf"handed out again as lease {new} to 'fast'") as e:
            call()
        assert (e.value.handed_to, e.value.handed_as) == ("fast", new)
    why = d.mark_taken([old], 12.0)[old]
    assert isinstance(why, NotActive) and (why.handed_to, why.handed_as) == ("fast", new)
    assert "handed out again" in why
    d.complete(new, 13.0)  # the new holder's lease is untouched: counted once
    assert d.progress().epochs[0].done_units == 1


def test_a_lapsed_lease_nobody_took_since_names_nobody() -> None:
    d = make()
    d.register("slow", 0.0)
    (old,) = d.lease("slow", 1, 0.0)
    d.heartbeat("slow", 11.0)
    d.expire(11.0)
    with pytest.raises(LeaseError, match="taken back") as e:
        d.renew(old.lease_id, 12.0)
    assert e.value.handed_to is None and e.value.handed_as is None
    with pytest.raises(LeaseError, match="unknown to this master") as e:
        d.complete(12345, 12.0)
    assert e.value.handed_to is None


def test_a_holder_declared_dead_or_gone_learns_who_got_its_task() -> None:
    d = make()
    d.register("dead", 0.0)
    d.register("fast", 0.0)
    (x,) = d.lease("dead", 1, 0.0)
    d.heartbeat("fast", 31.0)
    d.expire(31.0)  # 'dead' silent past consumer_timeout: declared dead, its lease lapses
    (y,) = d.lease("fast", 1, 31.0)
    with pytest.raises(LeaseError) as e:
        d.complete(x.lease_id, 32.0)
    assert (e.value.handed_to, e.value.handed_as) == ("fast", y.lease_id)


def test_replay_and_state_dict_keep_who_got_it_and_old_states_load() -> None:
    d = make()
    d.sink = sink = Recorder()
    old, new = stall_and_hand_over(d)
    replayed = make()
    for u in sink.updates:  # a journal's replay: no new record type, LeaseGranted suffices
        replayed.apply(decode_update(encode_update(u)))
    state = json.loads(json.dumps(d.state_dict()))
    assert replayed.state_dict() == state and state["handed"] == [[old, new, "fast"]]
    loaded = make()
    loaded.load_state_dict(state)
    with pytest.raises(LeaseError) as e:
        loaded.complete(old, 12.0)
    assert e.value.handed_to == "fast"
    del state["handed"]  # a state saved before the field: loads, names nobody
    older = make()
    older.load_state_dict(state)
    with pytest.raises(LeaseError, match="handed out again") as e:
        older.complete(old, 12.0)
    assert e.value.handed_to is None


def test_who_got_it_is_forgotten_with_the_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshot_module, "GONE_MEMORY", 2)  # what a dispatcher keeps
    d = make()
    old, _ = stall_and_hand_over(d)
    for lease in d.lease("fast", 3, 12.0):  # three more closed leases push it out
        d.complete(lease.lease_id, 12.0)
    assert d.state_dict()["handed"] == []
    with pytest.raises(LeaseError, match="unknown to this master") as e:
        d.complete(old, 13.0)
    assert e.value.handed_to is None


def test_the_wire_message_carries_it_and_an_older_master_names_nobody() -> None:
    why = NotActive.of("lease 1 is not active: ...", "fast", 7)
    (back,) = problems_from_msg([problem_to_msg(1, why)]).values()
    assert back == why and isinstance(back, NotActive)
    assert (back.handed_to, back.handed_as) == ("fast", 7)  # type: ignore[attr-defined]
    (plain,) = problems_from_msg([problem_to_msg(2, "lease 2 is unknown")]).values()
    assert plain == "lease 2 is unknown" and plain.handed_to is None  # type: ignore[attr-defined]
