"""A master that could not run for a while (process stopped, or starved of the GIL by the
trainer it is embedded in) gives everyone fresh deadlines before its timer expires anything:
it could not have heard from anyone, so the silence is its own."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from _master_helpers import Recorder

from shmloader.master import Dispatcher, JobConfig
from shmloader.master.journal import Journal
from shmloader.master.server import stall_threshold, tick
from shmloader.master.service import MasterService
from shmloader.master.updates import MasterResumed, decode_update, encode_update
from shmloader.sources.base import Shard

PLAN = [Shard("a", 10), Shard("b", 5), Shard("d", 7)]
INTERVAL = 0.5  # the server's tick for lease_timeout=2 (a quarter of it)


def config(lease_timeout: float = 2.0, consumer_timeout: float = 10.0) -> JobConfig:
    return JobConfig(
        records_per_task=4,
        epochs=2,
        lease_timeout=lease_timeout,
        consumer_timeout=consumer_timeout,
        max_retries=1,
    )


def _stall(d: Dispatcher) -> tuple[int, int]:
    """Consumer "a" holds two leases from t=1, one taken; then the master's timer runs at 2.0
    and next at 14.0, twelve seconds later (the trainer held the GIL)."""
    d.register("a", 1.0)
    taken, plain = (x.lease_id for x in d.lease("a", 2, 1.0))
    d.mark_taken([taken], 1.0)
    service = MasterService(d)
    tick(service, INTERVAL, 1.5, 2.0)
    tick(service, INTERVAL, 2.0, 14.0)
    return taken, plain


def test_a_tick_after_a_long_gap_gives_fresh_deadlines_instead_of_expiring(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = Recorder()
    d = Dispatcher(PLAN, config(), sink=sink)
    with caplog.at_level(logging.WARNING, logger="shmloader.master.server"):
        taken, plain = _stall(d)
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [
        "the master was not running for 12.0 s (process stopped or starved of the GIL): "
        "leases and consumers get fresh deadlines"
    ]
    assert [c.consumer for c in d.progress().consumers] == ["a"]  # not declared dead
    assert d.progress().counters["expired"] == 0
    # every lease lasts the restart grace, max(lease_timeout, consumer_timeout), from now
    assert d.get_lease(plain).deadline == 14.0 + 10.0
    assert d.get_lease(taken).deadline == 14.0 + 10.0  # also a taken lease's hold
    assert MasterResumed(14.0, 24.0, 12.0) in sink.updates
    # fresh deadlines are deadlines: a holder that does not renew loses the lease after them
    d.heartbeat("a", 20.0)
    d.renew(taken, 20.0)
    tick(MasterService(d), INTERVAL, 24.0, 24.5)
    assert d.progress().counters["expired"] == 1
    assert [x.lease_id for x in d.leases_of("a")] == [taken]
    # replayed with other timeouts: the same state, decided by the records alone
    again = Dispatcher(PLAN, config(lease_timeout=1.0, consumer_timeout=500.0))
    for update in sink.updates:
        again.apply(decode_update(encode_update(update)))
    assert again.state_dict() == d.state_dict()


def test_a_tick_that_is_merely_late_changes_nothing() -> None:
    assert stall_threshold(INTERVAL) == 2.0 and stall_threshold(1.0) == 4.0
    sink = Recorder()
    d = Dispatcher(PLAN, config(), sink=sink)
    d.register("a", 1.0)
    d.lease("a", 1, 1.0)
    tick(MasterService(d), INTERVAL, 1.0, 2.9)  # 1.9 s: no gap
    assert not [u for u in sink.updates if isinstance(u, MasterResumed)]
    assert [x.deadline for x in d.leases_of("a")] == [3.0]


def test_the_journal_replays_the_fresh_deadlines(tmp_path: Path) -> None:
    with Journal.open(tmp_path, PLAN, config(), 0.0, fsync="always") as j:
        _, plain = _stall(j.dispatcher)
    # Reopened just after, with shorter timeouts: the restart's own fresh deadline
    # (14.5 + 0.5) is earlier, so the lease keeps the one its MasterResumed record gave it.
    with Journal.open(tmp_path, PLAN, config(lease_timeout=0.5, consumer_timeout=0.5), 14.5) as j:
        assert j.dispatcher.get_lease(plain).deadline == 24.0
        assert [c.consumer for c in j.dispatcher.progress().consumers] == ["a"]
        assert j.dispatcher.progress().counters["expired"] == 0
