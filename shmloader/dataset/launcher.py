"""``master="torchrun"``: rank 0 hosts the master, the other ranks find it in the launcher's store.

Under torchrun (or any launcher that sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` and serves a ``torch.distributed.TCPStore`` there) nobody has to start a
standalone master or pass its address around: rank 0's dataset starts an embedded master with
``world_size`` = the job's, writes its address under a key of the store, and every other rank
reads it from there when its dataset starts. The key names the launcher's restart round, so a
job restarted by torchrun never reads the address of the master that died with it, and the
dataset's number in its process (the k-th dataset made with ``master="torchrun"``), so a train
and a validation dataset each get their own master; every rank must make them in the same
order, as the same script does.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from ..errors import ConfigError, MasterError

if TYPE_CHECKING:
    from torch.distributed import Store

log = logging.getLogger(__name__)

TORCHRUN = "torchrun"
# Rank 0 starts its master with its dataset (at the first batch), which may come a while after
# the other ranks' datasets start, e.g. after loading a large model: wait as long as torch's
# own collectives do by default.
LOOKUP_SECONDS = 600.0
CONNECT_SECONDS = 60.0
_WILDCARDS = ("0.0.0.0", "::", "")
_numbers = itertools.count()  # datasets made with master="torchrun" in this process


@dataclass(frozen=True)
class Rendezvous:
    """Where this rank stands in the launched job, and where the master's address is kept."""

    rank: int
    world_size: int
    store_host: str
    store_port: int
    key: str
    bind_host: str  # where rank 0's master listens
    advertise_host: str  # how the other ranks reach it

    @property
    def hosts_master(self) -> bool:
        return self.rank == 0

    def publish(self, port: int) -> str:
        """Rank 0: tell the other ranks where its master listens; returns that address."""
        host = self.advertise_host
        address = (
            f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
        )
        if self.world_size > 1:
            self._store().set(self.key, address)
        return address

    def lookup(self, timeout: float = LOOKUP_SECONDS) -> str:
        """Ranks but 0: the address rank 0 published, waiting up to ``timeout`` for it."""
        store = self._store()
        try:
            store.wait([self.key], timedelta(seconds=timeout))
        except RuntimeError as exc:  # torch's DistStoreError: the wait timed out
            raise MasterError(
                f"rank {self.rank}: rank 0 did not publish its master's address within "
                f"{timeout:.0f} s (key {self.key!r} of the launcher's store at "
                f"{self.store_host}:{self.store_port}). Rank 0 starts its master with its "
                "dataset's first batch (or SharedTaskDataset.start()); did it get there? "
                f"({exc})"
            ) from exc
        return bytes(store.get(self.key)).decode()

    def _store(self) -> Store:
        from torch.distributed import TCPStore

        try:
            return TCPStore(
                self.store_host,
                self.store_port,
                is_master=False,
                timeout=timedelta(seconds=CONNECT_SECONDS),
            )
        except RuntimeError as exc:
            raise MasterError(
                f"rank {self.rank}: cannot reach the launcher's store at "
                f"{self.store_host}:{self.store_port} (MASTER_ADDR, MASTER_PORT): {exc}. "
                "torchrun serves one there; with another launcher, call "
                "torch.distributed.init_process_group first"
            ) from exc


def rendezvous_from_env(
    *,
    rank: int | None,
    world_size: int | None,
    master_host: str | None,
    environ: Mapping[str, str] = os.environ,
) -> Rendezvous:
    """The rendezvous of this rank, from the variables the launcher set; ConfigError names
    what is missing or contradicts them."""
    needed = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    missing = [name for name in needed if not environ.get(name)]
    if missing:
        raise ConfigError(
            f"master='{TORCHRUN}' needs the variables torchrun sets ({', '.join(needed)}); "
            f"missing: {', '.join(missing)}. Launch with torchrun, or give rank=, "
            "world_size= and master='host:port' of a standalone master"
        )
    try:
        env_rank, env_world = int(environ["RANK"]), int(environ["WORLD_SIZE"])
        store_port = int(environ["MASTER_PORT"])
        local_world = int(environ.get("LOCAL_WORLD_SIZE") or env_world)
    except ValueError as exc:
        raise ConfigError(
            f"master='{TORCHRUN}': a launcher variable is not a number: {exc}"
        ) from exc
    for name, given, env in (("rank", rank, env_rank), ("world_size", world_size, env_world)):
        if given is not None and given != env:
            raise ConfigError(
                f"{name}={given} contradicts the launcher's {name.upper()}={env}; with "
                f"master='{TORCHRUN}' leave {name} out (it comes from the launcher)"
            )
    if master_host is None:
        if local_world < env_world:
            raise ConfigError(
                f"the job's ranks run on several machines (WORLD_SIZE={env_world}, "
                f"LOCAL_WORLD_SIZE={local_world}): rank 0's master must listen where the "
                "others reach it. Give master_host='0.0.0.0' (every interface) or that "
                "machine's address, and a token= every rank shares"
            )
        master_host = "127.0.0.1"
    store_host = environ["MASTER_ADDR"]
    advertise = store_host if master_host in _WILDCARDS else master_host
    restart = environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return Rendezvous(
        rank=env_rank,
        world_size=env_world,
        store_host=store_host,
        store_port=store_port,
        key=f"shmloader/restart-{restart}/dataset-{next(_numbers)}/master",
        bind_host=master_host,
        advertise_host=advertise,
    )
