"""Any interleaving of requests, expiries, deaths and restarts delivers every unit exactly once.

A hypothesis state machine drives a dispatcher with random leases, renewals, completions
(also of stale leases), failures, clock jumps with expiry, heartbeats, departures and restarts
(replaying every update record so far, as bytes, into a fresh dispatcher). Each successful
``complete`` is counted per (epoch, unit); at the end the remaining work is driven to
completion and every unit of every epoch must have been completed exactly once.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from shmloader.errors import LeaseError, MasterError
from shmloader.master import Dispatcher, JobConfig, Lease
from shmloader.master.tasks import build_schedule
from shmloader.master.updates import Update, decode_update, encode_update
from shmloader.sources.base import Shard

PLAN = [Shard("a", 7), Shard("empty", 0), Shard("b", 5), Shard("c", 3)]
CONSUMERS = ("c0", "c1", "c2")
EPOCHS = 2


class Recorder:
    def __init__(self) -> None:
        self.records: list[bytes] = []

    def record(self, update: Update) -> None:
        self.records.append(encode_update(update))

    def commit(self, now: float) -> None:
        pass


class DispatcherMachine(RuleBasedStateMachine):
    world_size: int | None = None

    def __init__(self) -> None:
        super().__init__()
        self.config = JobConfig(
            records_per_task=2,
            epochs=EPOCHS,
            seed=11,
            lease_timeout=5.0,
            consumer_timeout=8.0,
            max_retries=10_000,  # nothing is quarantined: everything must complete
            world_size=self.world_size,
        )
        self.sink = Recorder()
        self.d = Dispatcher(PLAN, self.config, sink=self.sink)
        self.now = 0.0
        self.seen: list[Lease] = []  # every lease ever granted, stale ones included
        self.completed: Counter[tuple[int, int]] = Counter()
        self.snapshot: dict | None = None  # what sink.records start from, like a journal's

    def rank(self, consumer: str) -> int | None:
        return None if self.world_size is None else CONSUMERS.index(consumer) % self.world_size

    def active(self) -> set[int]:
        return {i for c in self.d.progress().consumers for i in c.leases}

    def registered(self) -> set[str]:
        return {c.consumer for c in self.d.progress().consumers}

    def _complete(self, lease: Lease) -> bool:
        try:
            self.d.complete(lease.lease_id, self.now)
        except LeaseError:
            return False
        self.completed[(lease.epoch, lease.unit)] += 1
        assert self.completed[(lease.epoch, lease.unit)] == 1, f"{lease} completed twice"
        return True

    # ------------------------------------------------------------------ rules

    @initialize()
    def everyone_registers(self) -> None:
        for consumer in CONSUMERS:
            self.register(consumer)

    @rule(consumer=st.sampled_from(CONSUMERS))
    def register(self, consumer: str) -> None:
        self.d.register(consumer, self.now, rank=self.rank(consumer))

    @rule(consumer=st.sampled_from(CONSUMERS), n=st.integers(0, 3))
    def lease(self, consumer: str, n: int) -> None:
        if consumer not in self.registered():
            try:
                self.d.lease(consumer, n, self.now)
            except MasterError as exc:
                assert "is not registered" in str(exc)
                return
            raise AssertionError(f"{consumer} leased without being registered")
        got = self.d.lease(consumer, n, self.now)
        assert len(got) <= n
        for x in got:
            assert x.rank == self.rank(consumer) and x.deadline == self.now + 5.0
        self.seen.extend(got)

    @precondition(lambda self: self.seen)
    @rule(i=st.integers(0, 10_000))
    def complete(self, i: int) -> None:
        self._complete(self.seen[i % len(self.seen)])

    @precondition(lambda self: self.seen)
    @rule(i=st.integers(0, 10_000))
    def renew(self, i: int) -> None:
        lease_id = self.seen[i % len(self.seen)].lease_id
        if lease_id in self.active():
            lease = self.d.get_lease(lease_id)
            # A taken elastic lease is held for max(lease_timeout, consumer_timeout).
            hold = 8.0 if lease.taken and lease.rank is None else 5.0
            assert self.d.renew(lease_id, self.now).deadline == self.now + hold
        else:
            with pytest.raises(LeaseError, match=f"lease {lease_id} is"):
                self.d.renew(lease_id, self.now)

    @precondition(lambda self: self.seen)
    @rule(i=st.integers(0, 10_000))
    def mark_taken(self, i: int) -> None:
        lease = self.seen[i % len(self.seen)]
        problems = self.d.mark_taken([lease.lease_id], self.now)
        assert (lease.lease_id in problems) == (lease.lease_id not in self.active())
        if not problems:
            holder = lease.consumer
            others = [c for c in self.registered() if c != holder]
            if others:  # what another consumer is told of that unit now
                where = self.d.whereabouts(others[0], lease.epoch, [lease.unit])
                assert where == ["taken"]

    @precondition(lambda self: self.seen)
    @rule(i=st.integers(0, 10_000))
    def fail(self, i: int) -> None:
        lease_id = self.seen[i % len(self.seen)].lease_id
        if lease_id in self.active():
            self.d.fail(lease_id, "reader error", self.now)
        else:
            with pytest.raises(LeaseError, match=f"lease {lease_id} is"):
                self.d.fail(lease_id, "reader error", self.now)

    @rule(dt=st.sampled_from([0.5, 2.0, 6.0, 10.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.d.expire(self.now)

    @rule(consumer=st.sampled_from(CONSUMERS))
    def heartbeat_or_leave(self, consumer: str) -> None:
        if consumer not in self.registered():
            return
        if CONSUMERS.index(consumer) == 2:
            self.d.leave(consumer, self.now)
        else:
            self.d.heartbeat(consumer, self.now)

    @rule()
    def restart_from_journal(self) -> None:
        before = self.d.state_dict()
        fresh = Dispatcher(PLAN, self.config)
        if self.snapshot is not None:
            fresh.load_state_dict(self.snapshot)
        for payload in self.sink.records:
            fresh.apply(decode_update(payload))
        assert fresh.state_dict() == before
        fresh.sink = self.sink
        fresh.restart(self.now)
        self.d = fresh

    @rule()
    def restart_from_snapshot(self) -> None:
        state = json.loads(json.dumps(self.d.state_dict()))
        fresh = Dispatcher(PLAN, self.config, sink=self.sink)
        fresh.load_state_dict(state)
        assert fresh.state_dict() == state
        self.d = fresh
        self.sink.records = []  # compaction: later replays start from this snapshot
        self.snapshot = state

    @invariant()
    def counts_add_up(self) -> None:
        for ep in self.d.progress().epochs:
            parts = ep.todo_records + ep.leased_records + ep.done_records + ep.quarantined_records
            assert parts == ep.total_records
            assert ep.quarantined_units == 0

    # ----------------------------------------------------------------- finish

    def teardown(self) -> None:
        self.now += 100.0  # every old lease and consumer times out
        self.d.expire(self.now)
        finishers = [f"finisher{r}" for r in range(self.world_size or 1)]
        for r, name in enumerate(finishers):
            self.d.register(name, self.now, rank=None if self.world_size is None else r)
        for _ in range(100):
            if self.d.finished:
                break
            for name in finishers:
                for x in self.d.lease(name, 1000, self.now):
                    assert self._complete(x)
        assert self.d.finished
        for epoch in range(EPOCHS):
            schedule = build_schedule(
                self.d.table, epoch, seed=11, shuffle=True, world_size=self.world_size
            )
            for unit in range(len(schedule)):
                assert self.completed[(epoch, unit)] == 1, (epoch, unit)
            if self.world_size is None:  # elastic: units are exactly the tasks
                assert sorted(schedule.task.tolist()) == list(range(len(self.d.table)))
        counters = self.d.progress().counters
        for name in ("late_completed", "expired", "failed", "released"):
            event(f"{name} > 0: {counters[name] > 0}")  # coverage, see --hypothesis-show-statistics
        assert sum(self.completed.values()) == sum(
            ep.total_units for ep in self.d.progress().epochs
        )


class DdpMachine(DispatcherMachine):
    world_size = 2


SETTINGS = settings(
    max_examples=120,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestElastic = DispatcherMachine.TestCase
TestElastic.settings = SETTINGS
TestDdp = DdpMachine.TestCase
TestDdp.settings = SETTINGS
