"""The master's gRPC layer in one process: every RPC, status codes, auth, TLS, restarts.

Real servers on 127.0.0.1 and real channels; only the process boundary is left to
test_master_processes.py.
"""

from __future__ import annotations

import errno
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from shmloader._proto import master_pb2 as pb
from shmloader._proto import master_pb2_grpc as pb_grpc
from shmloader.errors import ConfigError, LeaseError, MasterError
from shmloader.master import build_schedule
from shmloader.master.client import EpochInfo, MasterClient, RenewError
from shmloader.master.config import JobConfig
from shmloader.master.dispatcher import Dispatcher
from shmloader.master.server import SERVICE_NAME, Master
from shmloader.master.updates import Update
from shmloader.master.wire import MAX_ERROR_CHARS, MAX_ID_CHARS
from shmloader.sources.base import Shard

PLAN = [Shard("a", 10), Shard("b", 7)]  # records_per_task=3: tasks of 3,3,3,1 and 3,3,1
NUM_TASKS = 7


def _master(**kw: Any) -> Master:
    kw.setdefault("records_per_task", 3)
    return Master(PLAN, **kw).start()


@pytest.fixture
def master() -> Iterator[Master]:
    m = _master(epochs=2)
    yield m
    m.stop()


@pytest.fixture(params=["grpc", "local"])
def client(master: Master, request: pytest.FixtureRequest) -> Iterator[MasterClient]:
    """A client over gRPC, and one calling the service in-process (``Master.local_stub``, as
    the embedded master's own trainer does): the same calls must give the same answers."""
    local = master.local_stub() if request.param == "local" else None
    with MasterClient(master.address, timeout=5, retry_for=1, local=local) as c:
        assert c.local is (local is not None)
        yield c


def _raw(master: Master, **kw: Any) -> tuple[grpc.Channel, pb_grpc.MasterStub]:
    channel = grpc.insecure_channel(master.address)
    return channel, pb_grpc.MasterStub(channel)


def _code(fn: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        fn()
    return info.value.code(), info.value.details() or ""


def _wait_for(cond: Callable[[], bool], what: str, limit: float = 15.0) -> None:
    give_up = time.monotonic() + limit
    while not cond():
        if time.monotonic() > give_up:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


def test_round_trip_of_every_rpc(master: Master, client: MasterClient) -> None:
    info = client.register("c1")
    assert info.consumer == "c1" and info.rank is None and info.world_size is None
    assert (info.num_tasks, info.total_records, info.epochs) == (NUM_TASKS, 17, 2)
    assert info.paths == ["a", "b"] and info.lease_timeout == JobConfig.lease_timeout  # the default
    client.heartbeat("c1")
    for epoch in (0, 1):
        assert client.epoch_info("c1", epoch) == EpochInfo(epoch, NUM_TASKS, 17)
        assert client.epoch_info("c1", epoch).left_records == (17,)  # not started: all

    reply = client.lease("c1", 3)
    assert not reply.finished and [x.seq for x in reply.leases] == [0, 1, 2]
    order = build_schedule(
        master.dispatcher_call(lambda d: d.table), 0, seed=0, shuffle=True, world_size=None
    ).task
    assert [x.task_id for x in reply.leases] == [int(t) for t in order[:3]]
    first, second, third = reply.leases
    assert first.path in ("a", "b") and first.stop > first.start and first.attempt == 1
    deadlines = client.renew([first.lease_id, second.lease_id])
    assert set(deadlines) == {first.lease_id, second.lease_id}
    assert deadlines[first.lease_id] >= first.deadline
    client.complete(first.lease_id)
    client.fail(second.lease_id, "could not read")

    progress = client.progress()
    assert progress == master.progress()
    assert progress.counters["completed"] == 1 and progress.counters["failed"] == 1
    assert progress.epochs[0].done_records == first.num_records
    # What is left: every record but the completed task's (the failed one is to do again).
    assert client.epoch_info("c1", 0).left_records == (17 - first.num_records,)
    assert progress.consumers[0].leases == (third.lease_id,)

    retry = client.lease("c1", 1).leases[0]  # the failed unit comes back first, same seq
    assert (retry.task_id, retry.seq, retry.attempt) == (second.task_id, second.seq, 2)
    client.fail(retry.lease_id, "DecodeError: record 3", permanent=True)  # over the wire
    assert [q.error for q in client.progress().quarantined] == ["DecodeError: record 3"]
    client.leave("c1")
    after = client.progress()
    assert after.consumers == () and after.counters["released"] == 1  # the third lease
    client.leave("c1")  # leaving twice is harmless

    channel = grpc.insecure_channel(master.address)
    health = health_pb2_grpc.HealthStub(channel)
    for name in ("", SERVICE_NAME):
        status = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status
        assert status == health_pb2.HealthCheckResponse.SERVING
    channel.close()


def test_two_epochs_each_task_once_then_finished(master: Master, client: MasterClient) -> None:
    client.register("c")
    seen: list[tuple[int, int]] = []
    while True:
        reply = client.lease("c", 2)
        for lease in reply.leases:
            seen.append((lease.epoch, lease.task_id))
            client.complete(lease.lease_id)
        if reply.finished:
            break
        assert reply.leases, "no work and not finished, with nothing outstanding"
    assert sorted(seen) == [(e, t) for e in range(2) for t in range(NUM_TASKS)]
    progress = client.progress()
    assert progress.finished and progress.epochs_finished == 2


def test_ddp_seq_is_the_position_in_the_rank_queue() -> None:
    with _master(world_size=2, epochs=None, seed=5) as m, MasterClient(m.address) as c:
        table = m.dispatcher_call(lambda d: d.table)
        for rank in (0, 1):
            assert c.register(f"r{rank}", rank).world_size == 2
        for epoch in (0, 4):  # epoch 4 has not started: computed from the schedule
            s = build_schedule(table, epoch, seed=5, shuffle=True, world_size=2)
            for rank in (0, 1):
                lo, hi = int(s.bounds[rank]), int(s.bounds[rank + 1])
                info = c.epoch_info(f"r{rank}", epoch)
                assert (info.num_tasks, info.num_records) == (hi - lo, 9)  # pad: ceil(17/2)
        s0 = build_schedule(table, 0, seed=5, shuffle=True, world_size=2)
        lo, hi = int(s0.bounds[1]), int(s0.bounds[2])
        got = c.lease("r1", hi - lo).leases
        assert {x.epoch for x in got} == {0}
        assert [x.seq for x in got] == list(range(len(got)))
        assert [(x.task_id, x.start, x.stop) for x in got] == [
            (int(s0.task[lo + i]), int(s0.start[lo + i]), int(s0.stop[lo + i]))
            for i in range(len(got))
        ]
        c.fail(got[1].lease_id, "boom")
        again = c.lease("r1", 1).leases[0]
        assert (again.seq, again.task_id, again.attempt) == (1, got[1].task_id, 2)


def test_status_codes_and_the_server_keeps_serving(master: Master, client: MasterClient) -> None:
    channel, stub = _raw(master)
    lease_req = pb.LeaseRequest
    cases: list[tuple[Callable[[], Any], str, str]] = [
        (lambda: stub.Complete(pb.CompleteRequest(lease_id=1)), "FAILED_PRECONDITION", "unknown"),
        (lambda: stub.Complete(pb.CompleteRequest(lease_id=0)), "INVALID_ARGUMENT", "positive"),
        (lambda: stub.Fail(pb.FailRequest(lease_id=99, error="x")), "FAILED_PRECONDITION", "99"),
        (lambda: stub.Register(pb.RegisterRequest(consumer="")), "INVALID_ARGUMENT", "empty"),
        (
            lambda: stub.Register(pb.RegisterRequest(consumer="x" * (MAX_ID_CHARS + 1))),
            "INVALID_ARGUMENT",
            "characters",
        ),
        (
            lambda: stub.Register(pb.RegisterRequest(consumer="r", rank=0)),
            "INVALID_ARGUMENT",
            "no world_size",
        ),
        (
            lambda: stub.Lease(lease_req(consumer="ghost", max_tasks=1)),
            "FAILED_PRECONDITION",
            "ghost",
        ),
        (
            lambda: stub.Heartbeat(pb.ConsumerRequest(consumer="ghost")),
            "FAILED_PRECONDITION",
            "not",
        ),
        (
            lambda: stub.EpochInfo(pb.EpochInfoRequest(consumer="c", epoch=2)),
            "NOT_FOUND",
            "not planned",
        ),
        (
            lambda: stub.Fail(pb.FailRequest(lease_id=1, error="e" * (MAX_ERROR_CHARS + 1))),
            "INVALID_ARGUMENT",
            "at most",
        ),
    ]
    client.register("c")
    cases.append(
        (lambda: stub.Lease(lease_req(consumer="c", max_tasks=-1)), "INVALID_ARGUMENT", "max_tasks")
    )
    for call, code, words in cases:
        got, details = _code(call)
        assert (got.name, words in details) == (code, True), details
    # The unknown-consumer refusal says so, so that clients know to register again.
    with pytest.raises(grpc.RpcError) as info:
        stub.Lease(lease_req(consumer="ghost", max_tasks=1))
    assert ("shmloader-reason", "unknown-consumer") in info.value.trailing_metadata()

    # The same through the client: lease calls give LeaseError, the rest MasterError.
    lease = client.lease("c", 1).leases[0]
    client.complete(lease.lease_id)
    with pytest.raises(LeaseError, match="is not active: it was completed"):
        client.complete(lease.lease_id)
    with pytest.raises(LeaseError, match="unknown to this master"):
        client.complete(12345)
    with pytest.raises(MasterError, match="INVALID_ARGUMENT") as exc:
        client.lease("c", -1)
    assert not isinstance(exc.value, LeaseError)
    with pytest.raises(MasterError, match="not registered"):
        client.heartbeat("never-registered")  # not registered through this client: no retry
    held = client.lease("c", 1).leases[0]
    with pytest.raises(RenewError) as renew:
        client.renew([held.lease_id, lease.lease_id])
    assert set(renew.value.renewed) == {held.lease_id}
    assert "completed" in renew.value.not_active[lease.lease_id]
    client.fail(held.lease_id, "x" * (MAX_ERROR_CHARS * 2))  # shortened by the client
    quarantined = master.progress().counters["failed"]
    assert quarantined == 1

    # Bytes that are not a message at all.
    raw = channel.unary_unary("/shmloader.master.Master/Lease", None, None)
    got, _ = _code(lambda: raw(b"\xff\xff\xff\x0f garbage", timeout=5))
    assert got != grpc.StatusCode.OK
    assert client.progress().counters["completed"] == 1
    channel.close()


class _FullDisk:
    """An UpdateSink that fails like a journal on a full disk."""

    def record(self, update: Update) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    def commit(self, now: float) -> None:
        pass


def test_unexpected_errors_are_internal_and_serving_goes_on(master: Master) -> None:
    channel, stub = _raw(master)
    stub.Register(pb.RegisterRequest(consumer="c"))

    def set_sink(sink: _FullDisk | None) -> Callable[[Dispatcher], None]:
        return lambda d: setattr(d, "sink", sink)

    master.dispatcher_call(set_sink(_FullDisk()))
    got, details = _code(lambda: stub.Lease(pb.LeaseRequest(consumer="c", max_tasks=1)))
    assert got == grpc.StatusCode.INTERNAL and "No space left on device" in details
    master.dispatcher_call(set_sink(None))
    assert len(stub.Lease(pb.LeaseRequest(consumer="c", max_tasks=2)).leases) == 2
    channel.close()


def test_token_is_required_on_every_call() -> None:
    with _master(token="s3cret") as m:
        for token in (None, "wrong"):
            with (
                MasterClient(m.address, token=token, retry_for=0) as c,
                pytest.raises(MasterError, match="refused the token"),
            ):
                c.register("c")
        channel = grpc.insecure_channel(m.address)
        got, _ = _code(
            lambda: health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
        )
        assert got == grpc.StatusCode.UNAUTHENTICATED
        # Garbage bytes without a token: refused for the token, before anything is parsed
        # (was INTERNAL, from parsing them).
        garbage = channel.unary_unary("/shmloader.master.Master/Lease")
        got, _ = _code(lambda: garbage(b"\xff\xfe\x00 not a LeaseRequest", timeout=5))
        assert got == grpc.StatusCode.UNAUTHENTICATED
        channel.close()
        with MasterClient(m.address, token="s3cret") as c:
            assert c.register("c").num_tasks == NUM_TASKS
            assert len(c.lease("c", 2).leases) == 2


def test_client_registers_again_after_a_restart_without_journal() -> None:
    first = _master(consumer_timeout=30)
    port = first.port
    with MasterClient(first.address, timeout=5, retry_for=10) as c:
        c.register("worker")
        c.register("idle")
        c.start_heartbeat("idle", interval=0.1)
        held = c.lease("worker", 2).leases
        first.stop()
        second = _master(consumer_timeout=30, port=port)
        try:
            # The new master does not know "worker": the client registers it again, silently.
            fresh = c.lease("worker", 2).leases
            assert [x.task_id for x in fresh] == [x.task_id for x in held]
            # Nor "idle", which only the heartbeat thread speaks for.
            _wait_for(
                lambda: "idle" in {x.consumer for x in second.progress().consumers},
                "the heartbeat thread to register 'idle' again",
            )
            with pytest.raises(LeaseError, match="unknown to this master"):
                c.complete(held[0].lease_id + 2**40)
        finally:
            second.stop()


def test_a_client_speaking_for_another_process_s_consumer_registers_it_again(
    master: Master,
) -> None:
    """A reader calls for its trainer's consumer: when the master forgot it (here: it left;
    in a run, declared dead after a stall), the reader's Lease must not fail before the
    trainer's heartbeat registers it again."""
    with (
        MasterClient(master.address, timeout=5, retry_for=1) as trainer,
        MasterClient(master.address, timeout=5, retry_for=1) as reader,
        MasterClient(master.address, timeout=5, retry_for=1) as stranger,
    ):
        trainer.register("t")
        reader.speak_for("t")
        trainer.leave("t")
        with pytest.raises(MasterError, match="not registered"):
            stranger.lease("t", 1)
        assert len(reader.lease("t", 1).leases) == 1
        assert "t" in {c.consumer for c in master.progress().consumers}


def test_progress_since_an_epoch_leaves_out_the_finished_ones_before_it() -> None:
    """A trainer polls progress every few seconds; a long job's finished epochs made every
    reply longer (0.24 s to build and read at 20,000 of them)."""
    with _master(epochs=5) as m, MasterClient(m.address) as c:
        c.register("c")
        while c.progress().epochs_finished < 3:
            for lease in c.lease("c", NUM_TASKS).leases:
                c.complete(lease.lease_id)
        whole = c.progress()
        assert [e.epoch for e in whole.epochs][:3] == [0, 1, 2]
        since = c.progress(since_epoch=2)
        assert [e.epoch for e in since.epochs] == [e.epoch for e in whole.epochs][2:]
        assert since.epochs_finished == whole.epochs_finished and since.counters == whole.counters
        assert c.progress(since_epoch=0) == whole


def test_expired_lease_is_handed_out_again_with_the_same_seq() -> None:
    with _master(lease_timeout=0.5, consumer_timeout=30) as m, MasterClient(m.address) as c:
        c.register("slow")
        lease = c.lease("slow", 1).leases[0]
        _wait_for(lambda: m.progress().counters["expired"] == 1, "the expiry thread")
        again = c.lease("slow", 1).leases[0]
        assert (again.task_id, again.seq, again.attempt) == (lease.task_id, lease.seq, 2)
        with pytest.raises(LeaseError, match="handed out again"):
            c.complete(lease.lease_id)
        c.complete(again.lease_id)


def test_unreachable_master_and_closed_client() -> None:
    m = _master()
    address = m.address
    m.stop()
    with (
        MasterClient(address, timeout=1, retry_for=0.3) as c,
        pytest.raises(MasterError, match="unreachable"),
    ):
        c.progress()
    with pytest.raises(MasterError, match="closed"):
        c.progress()
    with pytest.raises(ConfigError):
        MasterClient(address, timeout=0)


def test_master_arguments_and_lifecycle(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="records_per_task"):
        Master(PLAN, records_per_task=0)
    with pytest.raises(ConfigError, match="port"):
        Master(PLAN, records_per_task=1, port=70000)
    with pytest.raises(ConfigError, match="not a Shard"):
        Master([("a", 3)], records_per_task=1)  # type: ignore[list-item]
    m = _master(journal=str(tmp_path / "j"), fsync="always")
    with pytest.raises(MasterError, match=rf"cannot listen on .*:{m.port}: Address already in use"):
        _master(port=m.port)
    with pytest.raises(MasterError, match="started already"):
        m.start()
    m.stop()
    m.stop()  # idempotent
    assert m.journal is not None
    again = _master(journal=str(tmp_path / "j"))
    assert again.journal is not None and again.journal.recovery is not None
    again.stop()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls(tmp_path: Path) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    with _master(tls=(key.read_bytes(), cert.read_bytes()), token="t") as m:
        with MasterClient(m.address, root_certificates=cert.read_bytes(), token="t") as c:
            assert c.register("c").num_tasks == NUM_TASKS
        with (
            MasterClient(m.address, token="t", timeout=1, retry_for=0.3) as plain,
            pytest.raises(MasterError),
        ):
            plain.register("c")


def test_complete_many_completes_the_rest_and_names_what_it_could_not() -> None:
    with _master(lease_timeout=0.5, consumer_timeout=30) as m, MasterClient(m.address) as c:
        c.register("trainer")
        lapsed = c.lease("trainer", 1).leases[0]
        _wait_for(lambda: m.progress().counters["expired"] == 1, "the expiry thread")
        held = c.lease("trainer", 3).leases
        again = next(x for x in held if x.task_id == lapsed.task_id)
        ids = [x.lease_id for x in held]
        problems = c.complete_many([lapsed.lease_id, *ids, 2**40])
        assert set(problems) == {lapsed.lease_id, 2**40}
        assert "handed out again" in problems[lapsed.lease_id]
        # Who got it, over the wire, for the old holder's warning (LeaseProblem fields 3, 4).
        why = problems[lapsed.lease_id]
        assert (why.handed_to, why.handed_as) == ("trainer", again.lease_id)  # type: ignore[attr-defined]
        with pytest.raises(RenewError) as renew:
            c.renew([lapsed.lease_id])
        assert renew.value.not_active[lapsed.lease_id].handed_to == "trainer"  # type: ignore[attr-defined]
        assert "unknown to this master" in problems[2**40]
        assert m.progress().counters["completed"] == 3
        assert again.lease_id in ids
        assert c.complete_many([]) == {}
        with pytest.raises(LeaseError):
            c.complete(ids[0])  # completed by the batch already


def test_whereabouts_map_seqs_of_the_consumers_queue() -> None:
    m = _master(epochs=1, world_size=2)
    try:
        with MasterClient(m.address, timeout=5, retry_for=1) as client:
            client.register("r0", 0)
            client.register("r1", 1)
            (lease,) = client.lease("r1", 1).leases
            assert lease.seq == 0
            # seq 0 of rank 1's queue is the unit after rank 0's: leased by r1
            assert client.whereabouts("r1", 0, [0, 1]) == ["mine", "todo"]
            assert client.whereabouts("r0", 0, [0]) == ["todo"]
            with pytest.raises(MasterError, match=r"INVALID_ARGUMENT.*not seq 9"):
                client.whereabouts("r0", 0, [9])
            with pytest.raises(MasterError, match="NOT_FOUND"):
                client.whereabouts("r0", 1, [0])
    finally:
        m.stop()
