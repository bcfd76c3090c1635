"""A DDP rank that joins a standalone master's epoch in progress without a loaded state.

Each rank's pass delivers what the master has not marked done of its own queue, whole: the
tasks the earlier job had partly consumed come again in full. Rank boundaries cut tasks at
different places, so those amounts differ between ranks: the ranks would run different numbers
of steps in that epoch, and the first collective after the shortest rank's last step would wait
until its timeout. Only the ranks' states say which rows of those tasks were consumed, so a
rank whose queue is not whole refuses to start, before its readers lease anything (until then
nobody but this rank takes from its queue, so the count is not a race with the other ranks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import ConfigError

if TYPE_CHECKING:
    from ...master.client import ConsumerInfo, MasterClient


def check_whole_share(
    client: MasterClient,
    consumer: str,
    joined: ConsumerInfo,
    epoch: int,
    *,
    rank: int | None,
    under_torchrun: bool,
    loaded: bool,
) -> None:
    """ConfigError unless this rank's queue of ``epoch`` is whole at the master (nothing done),
    for a DDP rank (``joined``: the master's reply to its registration) of a standalone master
    (under torchrun each job starts its own) that loaded no state (``loaded``: one was).
    Loaded states resume as they always did; so do elastic trainers and a world of one (no
    collective to hang).

    A queue with nothing done delivers ``num_records`` rows like every other rank's. A master
    that does not report ``left_records`` (older than this check) is not checked."""
    world_size = joined.world_size
    if under_torchrun or rank is None or world_size is None or world_size < 2:
        return
    if loaded:
        return
    if joined.epochs is not None and epoch >= joined.epochs:  # past the end: an empty pass
        return
    info = client.epoch_info(consumer, epoch)
    left = list(info.left_records)
    if len(left) != world_size or left[rank] >= info.num_records:
        return
    ranks = ", ".join(f"rank {r}: {n}" for r, n in enumerate(left))
    raise ConfigError(
        f"rank {rank}: epoch {epoch} is partly consumed at the master already (by an earlier "
        f"job, or an earlier dataset of this rank), and no state was loaded: records left of "
        f"each rank's {info.num_records} are {ranks} (as the master has them now). Without "
        "the ranks' states each rank would deliver again, whole, the tasks it had partly "
        "consumed, so the ranks would get different numbers of batches in this epoch and a "
        "collective would wait until it times out. Load each rank's state_dict(), saved at "
        "the same step, into the same rank (or shmloader.merge_states of them all into every "
        "rank) before the first batch; or start a fresh master (given the merged state with "
        "--resume, it leaves out what was consumed)"
    )
