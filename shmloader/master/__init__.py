"""The master: a pure dispatcher (tasks, epochs, leases), its write-ahead journal, and the
gRPC layer that serves it (:class:`Master`) and talks to it (:class:`MasterClient`).

See docs/master.md for the dispatcher's rules and docs/architecture.md for the parts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

# Before anything imports grpc (see the module).
from . import _grpc_env  # noqa: F401  # isort: skip

if TYPE_CHECKING:  # the names for type checkers (``as``: re-exported)
    from ._convert import ConsumerInfo as ConsumerInfo
    from ._convert import EpochInfo as EpochInfo
    from ._convert import LeaseInfo as LeaseInfo
    from ._convert import LeaseReply as LeaseReply
    from .client import MasterClient as MasterClient
    from .client import RenewError as RenewError
    from .config import JobConfig as JobConfig
    from .dispatcher import Dispatcher as Dispatcher
    from .journal import FSYNC_POLICIES as FSYNC_POLICIES
    from .journal import Journal as Journal
    from .journal import Recovery as Recovery
    from .progress import ConsumerProgress as ConsumerProgress
    from .progress import EpochProgress as EpochProgress
    from .progress import Lease as Lease
    from .progress import Progress as Progress
    from .progress import QuarantinedTask as QuarantinedTask
    from .server import Master as Master
    from .tasks import EpochSchedule as EpochSchedule
    from .tasks import Task as Task
    from .tasks import TaskTable as TaskTable
    from .tasks import build_schedule as build_schedule
    from .tasks import task_order as task_order
    from .updates import UpdateSink as UpdateSink

# Imported on first use, like the top-level package: a reader process needs the client only,
# and importing the server side (dispatcher, journal, gRPC server) would delay its start.
_EXPORTS = {
    "ConsumerInfo": "._convert",
    "EpochInfo": "._convert",
    "LeaseInfo": "._convert",
    "LeaseReply": "._convert",
    "MasterClient": ".client",
    "RenewError": ".client",
    "Dispatcher": ".dispatcher",
    "FSYNC_POLICIES": ".journal",
    "Journal": ".journal",
    "Recovery": ".journal",
    "ConsumerProgress": ".progress",
    "JobConfig": ".config",
    "EpochProgress": ".progress",
    "Lease": ".progress",
    "Progress": ".progress",
    "QuarantinedTask": ".progress",
    "Master": ".server",
    "EpochSchedule": ".tasks",
    "Task": ".tasks",
    "TaskTable": ".tasks",
    "build_schedule": ".tasks",
    "task_order": ".tasks",
    "UpdateSink": ".updates",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


__all__ = sorted(_EXPORTS)
