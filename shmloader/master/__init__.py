"""The master: a pure dispatcher (tasks, epochs, leases), its write-ahead journal, and the
gRPC layer that serves it (:class:`Master`) and talks to it (:class:`MasterClient`).

See DESIGN.md, part 'master', and docs/master.md for the dispatcher's rules.
"""

# Before anything imports grpc (see the module).
from . import _grpc_env  # noqa: F401  # isort: skip
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
