"""A Lease call retried after its answer was lost gets the same leases, not new ones.

A lease granted for a try whose answer never arrived would be an orphan: it lapses unread and
counts as a failed attempt of its task. The client sends one request id per logical call (the
same on every try); the dispatcher remembers the leases it granted for each of a consumer's
recent ids, also across journal replay and snapshots. The gRPC test starves the master's
handlers (its lock held past the client's deadline, as a trainer step holding the GIL starves
an embedded master) so that the first try times out.
"""

from __future__ import annotations

import threading
from pathlib import Path

import grpc

from shmloader._proto import master_pb2 as pb
from shmloader._proto import master_pb2_grpc as pb_grpc
from shmloader.master import Dispatcher, JobConfig
from shmloader.master.client import MasterClient
from shmloader.master.journal import Journal
from shmloader.master.server import Master
from shmloader.master.snapshot import REQUEST_MEMORY
from shmloader.master.updates import LeaseGranted, decode_update, encode_update
from shmloader.sources.base import Shard

PLAN = [Shard("a", 10), Shard("b", 7)]
CONFIG = JobConfig(records_per_task=3, epochs=2, lease_timeout=10.0)


def _ids(leases: list) -> list[int]:
    return [x.lease_id for x in leases]


def test_the_same_request_id_twice_grants_once_and_returns_the_same_leases() -> None:
    d = Dispatcher(PLAN, CONFIG)
    d.register("c", 0.0)
    first = d.lease("c", 2, 1.0, request=77)
    again = d.lease("c", 2, 2.0, request=77)
    assert len(first) == 2 and again == first
    assert d.progress().counters["granted"] == 2
    assert _ids(d.leases_of("c")) == _ids(first)
    other = d.lease("c", 1, 3.0, request=78)  # another call: a new lease
    assert len(other) == 1 and other[0].lease_id not in _ids(first)
    # Those no longer active are left out; nothing is granted in their place.
    d.complete(first[0].lease_id, 4.0)
    assert d.lease("c", 2, 5.0, request=77) == [first[1]]
    assert d.progress().counters["granted"] == 3
    # Calls without an id grant anew, as before the id existed.
    assert len(d.lease("c", 1, 6.0)) == 1 and len(d.lease("c", 1, 6.0)) == 1


def test_the_memo_is_per_consumer_and_keeps_the_latest_ids() -> None:
    d = Dispatcher([Shard("big", 200)], JobConfig(records_per_task=1, epochs=1))
    d.register("c", 0.0)
    d.register("e", 0.0)
    mine = d.lease("c", 1, 1.0, request=5)
    theirs = d.lease("e", 1, 1.0, request=5)  # the same id from another consumer
    assert _ids(theirs) != _ids(mine)
    for request in range(100, 100 + REQUEST_MEMORY):  # other readers of the trainer lease
        d.lease("c", 1, 2.0, request=request)
    forgotten = d.lease("c", 1, 3.0, request=5)  # pushed out of the memo: granted anew
    assert _ids(forgotten) != _ids(mine)
    assert d.lease("c", 1, 4.0, request=100 + REQUEST_MEMORY - 1)[0].lease_id < _ids(forgotten)[0]


def test_request_ids_survive_journal_replay_and_snapshots(tmp_path: Path) -> None:
    for every in (10_000, 1):  # replayed from records; loaded from a snapshot
        folder = tmp_path / str(every)
        with Journal.open(folder, PLAN, CONFIG, 0.0, snapshot_every=every) as j:
            j.dispatcher.register("c", 0.0)
            first = j.dispatcher.lease("c", 2, 1.0, request=1234)
        with Journal.open(folder, PLAN, CONFIG, 5.0, snapshot_every=every) as j:
            d = j.dispatcher
            again = d.lease("c", 2, 6.0, request=1234)
            assert _ids(again) == _ids(first)
            assert d.progress().counters["granted"] == 2


def test_records_and_states_from_before_request_ids_still_load() -> None:
    old = b'{"attempt":1,"consumer":"c","deadline":11.0,"epoch":0,"lease_id":1,"now":1.0,'
    old += b'"type":"LeaseGranted","unit":0}'
    assert decode_update(old) == LeaseGranted(1.0, 1, "c", 0, 0, 1, 11.0)
    granted = LeaseGranted(1.0, 1, "c", 0, 0, 1, 11.0, request=2**62)
    assert decode_update(encode_update(granted)) == granted
    d = Dispatcher(PLAN, CONFIG)
    d.register("c", 0.0)
    d.lease("c", 1, 1.0, request=9)
    state = d.state_dict()
    assert state["consumers"][0]["requests"] == [[9, [1]]]
    del state["consumers"][0]["requests"]  # as a state saved before request ids
    d.load_state_dict(state)
    assert _ids(d.lease("c", 1, 2.0, request=9)) == [2]  # nothing remembered: granted anew


def test_a_raw_repeat_of_a_request_id_gets_the_same_leases() -> None:
    with Master(PLAN, records_per_task=3, epochs=2).start() as m:
        channel = grpc.insecure_channel(m.address)
        stub = pb_grpc.MasterStub(channel)
        stub.Register(pb.RegisterRequest(consumer="c"), timeout=5)
        ask = pb.LeaseRequest(consumer="c", max_tasks=2, request_id=42)
        first, again = stub.Lease(ask, timeout=5), stub.Lease(ask, timeout=5)
        assert len(first.leases) == 2 and list(again.leases) == list(first.leases)
        plain = pb.LeaseRequest(consumer="c", max_tasks=1)  # an older client: no id
        assert stub.Lease(plain, timeout=5).leases[0].lease_id not in {
            x.lease_id for x in first.leases
        }
        channel.close()


def test_a_lease_whose_first_answer_is_lost_is_retried_without_an_orphan() -> None:
    """The master's lock is held past the client's deadline, so the first try times out in
    the client (its handler still grants, later); the retry must get that same lease."""
    with (
        Master(PLAN, records_per_task=3, epochs=2).start() as m,
        MasterClient(m.address, timeout=0.3, retry_for=30) as client,
    ):
        client.register("c")
        release = threading.Event()
        holding = threading.Event()

        def hold(_: Dispatcher) -> None:
            holding.set()
            release.wait(30)

        holder = threading.Thread(target=m.dispatcher_call, args=(hold,))
        holder.start()
        holding.wait(10)
        try:
            timer = threading.Timer(1.5, release.set)  # past several 0.3-s deadlines
            timer.start()
            reply = client.lease("c", 1)
        finally:
            release.set()
            holder.join()
        timer.join()
        progress = m.progress()
        (consumer,) = progress.consumers
        assert len(reply.leases) == 1
        assert list(consumer.leases) == [reply.leases[0].lease_id]  # no orphan
        assert progress.counters["granted"] == 1
