"""The master: a pure dispatcher (tasks, epochs, leases) and its write-ahead journal.

See DESIGN.md, part 'master', and docs/master.md for the dispatcher's rules.
"""

from .dispatcher import Dispatcher, UpdateSink
from .journal import FSYNC_POLICIES, Journal, Recovery
from .progress import (
    ConsumerProgress,
    DispatcherConfig,
    EpochProgress,
    Lease,
    Progress,
    QuarantinedTask,
)
from .tasks import EpochSchedule, Task, TaskTable, build_schedule, task_order

__all__ = [
    "FSYNC_POLICIES",
    "ConsumerProgress",
    "Dispatcher",
    "DispatcherConfig",
    "EpochProgress",
    "EpochSchedule",
    "Journal",
    "Lease",
    "Progress",
    "QuarantinedTask",
    "Recovery",
    "Task",
    "TaskTable",
    "UpdateSink",
    "build_schedule",
    "task_order",
]
