"""The embedded master's own trainer calls it in-process (master/local.py): the same service,
lock and journal as over gRPC, errors as the same status codes and reasons, and UNAVAILABLE
once the master stops. Its readers still use gRPC."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _dataset_helpers import ids_of, source, write_dataset

import shmloader
from shmloader.errors import LeaseError, MasterError
from shmloader.master.client import MasterClient, RenewError
from shmloader.master.server import Master
from shmloader.sources.base import Shard

PLAN = [Shard("a", 10), Shard("b", 7)]


@pytest.fixture
def master() -> Iterator[Master]:
    m = Master(PLAN, records_per_task=3, epochs=2).start()
    yield m
    m.stop()


def _outcome(call: Callable[[], Any]) -> tuple[str, str]:
    """What a call gave: its result's repr, or its error's class and words."""
    try:
        return "ok", repr(call())
    except MasterError as exc:
        return type(exc).__name__, str(exc)


def test_failures_read_the_same_as_over_grpc(master: Master) -> None:
    with (
        MasterClient(master.address, timeout=5, retry_for=1) as wire,
        MasterClient(master.address, timeout=5, retry_for=1, local=master.local_stub()) as local,
    ):
        assert local.local and not wire.local
        wire.register("w")
        local.register("l")
        done = local.lease("l", 1).leases[0]
        local.complete(done.lease_id)
        calls: list[Callable[[MasterClient], Any]] = [
            lambda c: c.complete(done.lease_id),  # completed already: LeaseError
            lambda c: c.complete(12345),  # unknown lease
            lambda c: c.fail(99, "x"),
            lambda c: c.lease("l", -1),  # INVALID_ARGUMENT: MasterError, not LeaseError
            lambda c: c.heartbeat("never-registered"),
            lambda c: c.epoch_info("l", 5),  # NOT_FOUND
            lambda c: c.register(""),
        ]
        for call in calls:
            over_wire = _outcome(functools.partial(call, wire))
            in_process = _outcome(functools.partial(call, local))
            assert in_process == over_wire
            assert in_process[0] in ("LeaseError", "MasterError"), in_process
        held = local.lease("l", 1).leases[0]
        with pytest.raises(RenewError) as renew:
            local.renew([held.lease_id, done.lease_id])
        assert set(renew.value.renewed) == {held.lease_id}
        assert isinstance(renew.value, LeaseError)


def test_a_forgotten_consumer_is_registered_again_in_process(master: Master) -> None:
    """The master's "unknown consumer" reason (trailing metadata over gRPC) reaches the local
    client too, which registers the consumer again and retries, as over gRPC."""
    with MasterClient(master.address, local=master.local_stub(), retry_for=1) as trainer:
        trainer.register("t")
        trainer.leave("t")  # the master forgets it, as after a stall
        trainer.speak_for("t")
        assert len(trainer.lease("t", 1).leases) == 1
        assert "t" in {c.consumer for c in master.progress().consumers}


def test_calls_after_the_master_stopped_fail_as_unreachable() -> None:
    m = Master(PLAN, records_per_task=3)
    with pytest.raises(MasterError, match="not been started"):
        m.local_stub()
    m.start()
    client = MasterClient(m.address, local=m.local_stub(), retry_for=0.2)
    client.register("c")
    m.stop()
    with pytest.raises(MasterError, match="unreachable"):
        client.progress()
    client.close()
    with pytest.raises(MasterError, match="closed"):
        client.progress()


def test_a_dataset_calls_its_embedded_master_in_process_and_a_standalone_one_over_grpc(
    tmp_path: Path,
) -> None:
    expected = write_dataset(tmp_path / "data", [120, 80])
    (tmp_path / "shm").mkdir()
    options: dict[str, Any] = {
        "num_readers": 2,
        "records_per_task": 30,
        "epochs": 2,
        "shm_dir": str(tmp_path / "shm"),
    }
    src = source(tmp_path / "data")
    with shmloader.SharedTaskDataset(src, **options) as ds:
        for _ in range(2):
            got = [i for batch in shmloader.DataLoader(ds, batch_size=16) for i in ids_of(batch)]
            assert sorted(got) == expected
        assert ds.runtime.client.local
    standalone = shmloader.Master(src, records_per_task=30, epochs=1).start()
    try:
        with shmloader.SharedTaskDataset(src, master=standalone.address, **options) as ds:
            got = [i for batch in shmloader.DataLoader(ds, batch_size=16) for i in ids_of(batch)]
            assert sorted(got) == expected
            assert not ds.runtime.client.local
    finally:
        standalone.stop()
