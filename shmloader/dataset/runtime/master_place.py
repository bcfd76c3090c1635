"""Where a trainer's master runs: started here, in the trainer (embedded; rank 0's under
torchrun), or in another process (a standalone master, ``master="host:port"``; rank 0's, for
the other ranks). The runtime asks the one it has (:func:`find_master`) instead of checking
which it has: where readers reach it, whether its calls may skip gRPC, and whether the master
outlives this trainer (then it must be told when the trainer leaves, its plan is checked, and
it has the last word on where a resumed trainer begins).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .launcher import WILDCARD_HOSTS

if TYPE_CHECKING:
    from ...master.config import JobConfig
    from ...master.local import LocalStub
    from ...master.server import Master
    from .options import DatasetOptions

log = logging.getLogger(__name__)


class MasterHere:
    """A master this trainer started and stops last (``SharedTaskDataset`` without
    ``master=``, or rank 0's under torchrun)."""

    outlives_trainer = False

    def __init__(self, master: Master, address: str) -> None:
        self.master = master
        self.address = address  # what other processes are given (published, under torchrun)

    @property
    def local(self) -> LocalStub:
        """The trainer's own calls skip gRPC (master/local.py)."""
        return self.master.local_stub()

    @property
    def readers_address(self) -> str:
        """Over loopback for a master listening on every interface: the address it gives
        other machines may be a name that resolves beyond this one, where a token may not go
        in clear."""
        host = self.master.host
        if host in WILDCARD_HOSTS:
            return f"{'127.0.0.1' if host == '0.0.0.0' else '[::1]'}:{self.master.port}"
        return self.address

    @property
    def metrics_url(self) -> str | None:
        return self.master.metrics_url

    def stop(self) -> None:
        self.master.stop()


class MasterElsewhere:
    """The master of another process: a standalone one, or rank 0's for the other ranks."""

    outlives_trainer = True
    local = None
    metrics_url = None  # served by that process, which says where

    def __init__(self, address: str) -> None:
        self.address = self.readers_address = address

    def stop(self) -> None:
        """Nothing to stop: the master is that process's."""


MasterPlace = MasterHere | MasterElsewhere


def find_master(options: DatasetOptions, job: JobConfig) -> MasterPlace:
    """``master=``'s; or a master started here for ``job``; or, under torchrun, rank 0's
    (published by rank 0, looked up by the others: launcher.py)."""
    rendezvous = options.rendezvous
    if rendezvous is None:
        standalone = options.standalone_master
        if standalone is not None:
            return MasterElsewhere(standalone)
        return _start_here(options, job, options.master_host)
    if not rendezvous.hosts_master:
        return MasterElsewhere(rendezvous.lookup())
    here = _start_here(options, job, rendezvous.bind_host)
    try:
        here.address = rendezvous.publish(here.master.port)
    except BaseException:
        here.stop()
        raise
    return here


def _start_here(options: DatasetOptions, job: JobConfig, host: str | None) -> MasterHere:
    from ...master.server import LOOPBACK_HOSTS, Master, ServerOptions

    serving = ServerOptions(
        host=host or ServerOptions.host,
        token=options.credentials.token,
        metrics_port=options.metrics_port,
    )
    master = Master.for_job(options.source, job, serving).start()
    if host is not None and host not in LOOPBACK_HOSTS and options.credentials.token is None:
        log.warning(
            "the embedded master listens on %s without a token: anyone who reaches it can "
            "lease and complete this job's tasks",
            master.address,
        )
    return MasterHere(master, str(master.address))
