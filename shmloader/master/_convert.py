"""What the client hands back, and the copying between dispatcher values and wire messages.

The reply values are plain frozen dataclasses so user code never touches generated protobuf
classes; the ``*_to_msg`` / ``*_from_msg`` pairs are the only place that knows both sides, so a
field added to a dataclass and forgotten in the proto fails one round-trip test, not a user.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .._proto import master_pb2 as pb
from ..errors import NotActive
from .config import JobConfig
from .figures import TrainerFigures
from .progress import (
    ConsumerProgress,
    EpochProgress,
    Lease,
    Progress,
    QuarantinedTask,
)
from .tasks import Task, TaskTable
from .wire import HandBack


@dataclass(frozen=True)
class LeaseInfo:
    """One lease as a consumer sees it: read records ``[start, stop)`` of ``path``.

    ``seq`` is the task's position in this consumer's queue for ``epoch`` (the rank's queue in
    DDP mode, the single queue otherwise); it stays the same when the unit is retried, so the
    data plane can order tasks by it. ``consumed``: record ranges of the task that earlier
    holders consumed before they left (elastic mode): the trainer skips them.
    """

    lease_id: int
    task_id: int
    epoch: int
    seq: int
    path: str
    start: int
    stop: int
    attempt: int
    deadline: float
    consumed: tuple[tuple[int, int], ...] = ()

    @property
    def num_records(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class LeaseReply:
    """Leases granted by one call; ``finished``: every planned epoch is done, stop asking."""

    leases: list[LeaseInfo]
    finished: bool


@dataclass(frozen=True)
class EpochInfo:
    """Units and records of one consumer's queue in ``epoch`` (known before it starts).

    ``left_records``: records of each queue (rank order) not done yet, as the master had them
    when asked (empty from a master that does not say); a moment's count, not part of the
    epoch's shape, so equality leaves it out."""

    epoch: int
    num_tasks: int
    num_records: int
    left_records: tuple[int, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class ConsumerInfo:
    """What ``register`` tells a consumer about the job; ``paths`` are the only files its
    readers may open."""

    consumer: str
    rank: int | None
    world_size: int | None
    lease_timeout: float
    consumer_timeout: float
    epochs: int | None
    num_tasks: int
    total_records: int
    paths: list[str]
    records: list[int] = field(default_factory=list)  # of each path; empty: not said
    records_per_task: int | None = None  # None: not said (an older master)


# ----------------------------------------------------------------- leases and register


def lease_to_msg(lease: Lease, seq: int) -> pb.TaskLease:
    t = lease.task
    return pb.TaskLease(
        lease_id=lease.lease_id,
        task_id=t.task_id,
        epoch=lease.epoch,
        seq=seq,
        path=t.path,
        start=t.start,
        stop=t.stop,
        attempt=lease.attempt,
        deadline=lease.deadline,
        consumed=[pb.RecordRange(start=a, stop=b) for a, b in lease.consumed],
    )


def lease_from_msg(m: pb.TaskLease) -> LeaseInfo:
    return LeaseInfo(
        lease_id=m.lease_id,
        task_id=m.task_id,
        epoch=m.epoch,
        seq=m.seq,
        path=m.path,
        start=m.start,
        stop=m.stop,
        attempt=m.attempt,
        deadline=m.deadline,
        consumed=tuple((r.start, r.stop) for r in m.consumed),
    )


def handback_to_msgs(consumed: HandBack | None) -> list[pb.HandBack]:
    """Lease id -> ranges as the ``consumed`` field of a Leave or Checkpoint request."""
    return [
        pb.HandBack(
            lease_id=lease_id,
            consumed=[pb.RecordRange(start=int(a), stop=int(b)) for a, b in ranges],
        )
        for lease_id, ranges in sorted((consumed or {}).items())
    ]


def handback_from_msg(
    m: pb.LeaveRequest | pb.CheckpointRequest,
) -> dict[int, list[tuple[int, int]]]:
    """Lease id -> ranges of a Leave or Checkpoint request; a lease named twice gets the
    ranges of both."""
    out: dict[int, list[tuple[int, int]]] = {}
    for h in m.consumed:
        out.setdefault(h.lease_id, []).extend((r.start, r.stop) for r in h.consumed)
    return out


def problem_to_msg(lease_id: int, why: str) -> pb.LeaseProblem:
    """A lease that is not active, and to whom its task went if it lapsed (``NotActive``)."""
    handed_to = getattr(why, "handed_to", None)
    handed_as = getattr(why, "handed_as", None)
    return pb.LeaseProblem(
        lease_id=lease_id, error=str(why), handed_to=handed_to or "", handed_as=handed_as or 0
    )


def problems_from_msg(msgs: Iterable[pb.LeaseProblem]) -> dict[int, str]:
    """Lease id -> why, a ``NotActive`` (``handed_to`` None from masters older than the field)."""
    return {m.lease_id: NotActive.of(m.error, m.handed_to, m.handed_as) for m in msgs}


def register_to_msg(
    consumer: str, rank: int | None, config: JobConfig, table: TaskTable
) -> pb.RegisterReply:
    return pb.RegisterReply(
        consumer=consumer,
        rank=rank,
        world_size=config.world_size,
        lease_timeout=config.lease_timeout,
        consumer_timeout=config.consumer_timeout,
        epochs=config.epochs,
        num_tasks=len(table),
        total_records=table.total_records,
        paths=table.paths,
        records=table.shard_records.tolist(),
        records_per_task=table.records_per_task,
    )


def register_from_msg(m: pb.RegisterReply) -> ConsumerInfo:
    return ConsumerInfo(
        consumer=m.consumer,
        rank=m.rank if m.HasField("rank") else None,
        world_size=m.world_size if m.HasField("world_size") else None,
        lease_timeout=m.lease_timeout,
        consumer_timeout=m.consumer_timeout,
        epochs=m.epochs if m.HasField("epochs") else None,
        num_tasks=m.num_tasks,
        total_records=m.total_records,
        paths=list(m.paths),
        records=list(m.records),
        records_per_task=m.records_per_task or None,
    )


# ------------------------------------------------------------------------- progress


def _task_to_msg(t: Task) -> pb.Task:
    return pb.Task(task_id=t.task_id, shard=t.shard, path=t.path, start=t.start, stop=t.stop)


def _task_from_msg(m: pb.Task) -> Task:
    return Task(task_id=m.task_id, shard=m.shard, path=m.path, start=m.start, stop=m.stop)


# EpochProgress fields that are plain numbers or flags, copied one to one.
_EPOCH_SCALARS = (
    "epoch",
    "total_records",
    "todo_records",
    "leased_records",
    "done_records",
    "quarantined_records",
    "dropped_records",
    "total_units",
    "todo_units",
    "leased_units",
    "done_units",
    "quarantined_units",
    "finished",
)


def _epoch_to_msg(e: EpochProgress) -> pb.EpochProgress:
    m = pb.EpochProgress(**{name: getattr(e, name) for name in _EPOCH_SCALARS})
    m.quarantined.extend(
        pb.QuarantinedTask(epoch=q.epoch, unit=q.unit, task=_task_to_msg(q.task), error=q.error)
        for q in e.quarantined
    )
    m.dropped.extend(_task_to_msg(t) for t in e.dropped)
    return m


def _epoch_from_msg(m: pb.EpochProgress) -> EpochProgress:
    scalars = {name: getattr(m, name) for name in _EPOCH_SCALARS}
    return EpochProgress(
        **scalars,
        quarantined=tuple(
            QuarantinedTask(q.epoch, q.unit, _task_from_msg(q.task), q.error) for q in m.quarantined
        ),
        dropped=tuple(_task_from_msg(t) for t in m.dropped),
    )


def progress_to_msg(p: Progress) -> pb.ProgressReply:
    return pb.ProgressReply(
        epochs_planned=p.epochs_planned,
        epochs_started=p.epochs_started,
        epochs_finished=p.epochs_finished,
        finished=p.finished,
        num_tasks=p.num_tasks,
        total_records=p.total_records,
        epochs=[_epoch_to_msg(e) for e in p.epochs],
        consumers=[
            pb.ConsumerProgress(
                consumer=c.consumer,
                rank=c.rank,
                last_seen=c.last_seen,
                leases=c.leases,
                leased_records=c.leased_records,
            )
            for c in p.consumers
        ],
        counters=p.counters,
    )


def progress_from_msg(m: pb.ProgressReply) -> Progress:
    return Progress(
        epochs_planned=m.epochs_planned if m.HasField("epochs_planned") else None,
        epochs_started=m.epochs_started,
        epochs_finished=m.epochs_finished,
        finished=m.finished,
        num_tasks=m.num_tasks,
        total_records=m.total_records,
        epochs=tuple(_epoch_from_msg(e) for e in m.epochs),
        consumers=tuple(
            ConsumerProgress(
                consumer=c.consumer,
                rank=c.rank if c.HasField("rank") else None,
                last_seen=c.last_seen,
                leases=tuple(c.leases),
                leased_records=c.leased_records,
            )
            for c in m.consumers
        ),
        counters=dict(m.counters),
    )


_FIGURE_FIELDS = tuple(f for f in TrainerFigures.__dataclass_fields__ if f != "pss_bytes")


def figures_to_msg(f: TrainerFigures) -> pb.TrainerFigures:
    m = pb.TrainerFigures(**{name: getattr(f, name) for name in _FIGURE_FIELDS})
    m.pss_bytes.update(f.pss_bytes)
    return m


def figures_from_msg(m: pb.TrainerFigures) -> TrainerFigures:
    values = {name: getattr(m, name) for name in _FIGURE_FIELDS}
    return TrainerFigures(**values, pss_bytes=dict(m.pss_bytes))
