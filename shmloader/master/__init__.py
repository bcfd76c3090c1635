"""The master: a pure dispatcher (tasks, epochs, leases), its write-ahead journal, and the
gRPC layer that serves it (:class:`Master`) and talks to it (:class:`MasterClient`).

See DESIGN.md, part 'master', and docs/master.md for the dispatcher's rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

# Before anything imports grpc (see the module).
from . import _grpc_env  # noqa: F401  # isort: skip

if TYPE_CHECKING:
    from ._convert import ConsumerInfo, EpochInfo, LeaseInfo, LeaseReply
    from .client import MasterClient, RenewError
    from .dispatcher import Dispatcher
    from .journal import FSYNC_POLICIES, Journal, Recovery
    from .progress import (
        ConsumerProgress,
        DispatcherConfig,
        EpochProgress,
        Lease,
        Progress,
        QuarantinedTask,
    )
    from .server import Master
    from .tasks import EpochSchedule, Task, TaskTable, build_schedule, task_order
    from .updates import UpdateSink

# Imported on first use, like the top-level package: a reader process needs the client only,
# and the server side (dispatcher, journal, gRPC server) cost it about 0.1 s of start-up.
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
    "DispatcherConfig": ".progress",
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


__all__ = [
    "FSYNC_POLICIES",
    "ConsumerInfo",
    "ConsumerProgress",
    "Dispatcher",
    "DispatcherConfig",
    "EpochInfo",
    "EpochProgress",
    "EpochSchedule",
    "Journal",
    "Lease",
    "LeaseInfo",
    "LeaseReply",
    "Master",
    "MasterClient",
    "Progress",
    "QuarantinedTask",
    "Recovery",
    "RenewError",
    "Task",
    "TaskTable",
    "UpdateSink",
    "build_schedule",
    "task_order",
]
