"""The trainer's view of the master (dataset/master_ops.py) over real gRPC on 127.0.0.1: what
it keeps of epoch sizes stays bounded however many epochs a long run goes through."""

from __future__ import annotations

from shmloader.dataset.runtime.master_ops import EPOCHS_KEPT, MasterOps
from shmloader.master.client import MasterClient
from shmloader.master.server import Master
from shmloader.sources.base import Shard

PLAN = [Shard("/data/a", 23), Shard("/data/b", 7)]


def test_epoch_sizes_kept_stay_bounded_over_many_epochs() -> None:
    """It kept every epoch's size for the trainer's life: about 300 bytes per epoch, measured
    growing for 1000 short epochs of one dataset."""
    with Master(PLAN, records_per_task=5, epochs=None, shuffle=False).start() as master:
        client = MasterClient(master.address)
        try:
            client.register("c")
            ops = MasterOps(client, "c", None)
            for epoch in range(5 * EPOCHS_KEPT):
                assert ops.epoch_tasks(epoch) == 7  # 5 of a, 2 of b
                assert ops.epoch_records(epoch) == 30
                assert ops.epoch_records(epoch + 1) == 30  # the plane looks one ahead too
            assert ops.epochs_known <= EPOCHS_KEPT
            assert ops.epoch_tasks(0) == 7  # a size that went is asked again, the same
        finally:
            client.close()
