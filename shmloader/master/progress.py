"""Values the dispatcher hands out: leases and progress reports.

They are plain frozen dataclasses so the gRPC layer can copy them field by field into messages
and tests can compare them; none of them holds a reference into the dispatcher's state.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .tasks import Task


@dataclass(frozen=True)
class Lease:
    """The right to read ``task`` for ``epoch`` until ``deadline`` (wall clock, seconds).

    ``unit`` is the position of this piece of work in the epoch's schedule (what the master
    counts exactly once); ``attempt`` is 1 + the failed or expired attempts of that unit so far
    this epoch; ``rank`` is the DDP rank whose queue it came from (None in elastic mode).
    """

    lease_id: int
    task: Task
    epoch: int
    consumer: str
    deadline: float
    attempt: int
    unit: int
    rank: int | None
    # The holder's trainer took the task into its sampler (see Dispatcher.mark_taken).
    taken: bool = False
    # Records of the unit that earlier holders consumed before they left: to be skipped.
    consumed: tuple[tuple[int, int], ...] = ()
    # Records of the unit its holder's last saved state counts as delivered (elastic mode):
    # handed back for it should the lease lapse (Dispatcher.checkpoint).
    checkpointed: tuple[tuple[int, int], ...] = ()

    @property
    def long_hold(self) -> bool:
        """Elastic, and taken: its rows are in its trainer's shared memory, so a trainer that
        stalled past ``lease_timeout`` still delivers them; letting it lapse then would make
        them come twice (docs/master.md). It is held for the longer ``JobConfig.hold``."""
        return self.taken and self.rank is None


@dataclass(frozen=True)
class QuarantinedTask:
    """A unit that exhausted its retries in ``epoch``: its records are lost for that epoch."""

    epoch: int
    unit: int
    task: Task
    error: str


@dataclass(frozen=True)
class EpochProgress:
    """Counts of one started epoch, in records and in units (tasks or DDP task pieces).

    ``total_records`` is what the epoch schedules (padding repeats included); ``dropped_records``
    are records the DDP "drop" policy left out of it, listed in ``dropped``.
    """

    epoch: int
    total_records: int
    todo_records: int
    leased_records: int
    done_records: int
    quarantined_records: int
    dropped_records: int
    total_units: int
    todo_units: int
    leased_units: int
    done_units: int
    quarantined_units: int
    finished: bool
    quarantined: tuple[QuarantinedTask, ...]
    dropped: tuple[Task, ...]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EpochProgress:
        fields = dict(data)
        fields["quarantined"] = tuple(
            QuarantinedTask(q["epoch"], q["unit"], Task(**q["task"]), q["error"])
            for q in data["quarantined"]
        )
        fields["dropped"] = tuple(Task(**t) for t in data["dropped"])
        return cls(**fields)


@dataclass(frozen=True)
class ConsumerProgress:
    consumer: str
    rank: int | None
    last_seen: float
    leases: tuple[int, ...]
    leased_records: int


@dataclass(frozen=True)
class Progress:
    """Where the whole job stands; ``epochs`` holds every started epoch, oldest first (but
    finished ones before the ``since_epoch`` a caller asked from).

    ``finished`` is true once the configured number of epochs have all finished (never for
    ``epochs=None``). Quarantined and dropped records are listed per epoch, never hidden.
    """

    epochs_planned: int | None
    epochs_started: int
    epochs_finished: int
    finished: bool
    num_tasks: int
    total_records: int
    epochs: tuple[EpochProgress, ...]
    consumers: tuple[ConsumerProgress, ...]
    counters: dict[str, int]

    @property
    def quarantined(self) -> tuple[QuarantinedTask, ...]:
        return tuple(q for e in self.epochs for q in e.quarantined)
