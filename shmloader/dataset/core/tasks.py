"""A task ready in shared memory, and where room in ``shm_budget`` stands: plain values.

Readers announce a :class:`ReadyTask` as they seal its segment; the sampler, the book, the
outbox and checkpoints all read it, so it sits below all of them. :class:`Pressure` is what a
wait for tasks (``waiting/ready.py``) looks at on every poll.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Pressure(enum.Enum):
    """Where room in ``shm_budget`` stands while the sampler waits for tasks: what a wait
    (:meth:`ReadyTasks.take`) looks at on every poll. Each state implies those above it."""

    #: Readers have room: the tasks come as they are read.
    NONE = 0
    #: Readers wait for room, which rows handed out and not consumed yet hold (starved).
    STARVED = 1
    #: A reader of a task waited for has said it has no room.
    BLOCKED = 2
    #: Blocked, and the rows the caller's batcher keeps (or the batches in flight that only it
    #: could let be received) are all that is not consumed: only letting them go makes room.
    PINNED = 3
    #: Blocked with nothing handed out left to consume: no wait can end.
    DEAD_END = 4


def no_pressure() -> Pressure:
    return Pressure.NONE


@dataclass(frozen=True)
class ReadyTask:
    """A task whose rows are in the sealed ``segment`` ("" when none are left to read)."""

    epoch: int
    seq: int  # position in this consumer's task order for the epoch
    task_id: int
    segment: str
    num_rows: int
    lease_id: int
    # The unit: records [start, stop) of the task (stop None: start + num_rows), less the
    # records the source skipped; rows map to the records left, in order.
    start: int = 0
    stop: int | None = None
    skipped: tuple[int, ...] = ()
    # Records earlier holders of the task consumed before they left: its rows are not issued.
    consumed: tuple[tuple[int, int], ...] = ()
    path: str = ""  # the task's file, for messages
    nbytes: int = 0  # its segment's size: what its rows weigh as they are delivered
    # cache=True: the key its segment is kept under once released (reader/cache_key.py); ""
    # when it is not kept.
    cache_key: str = ""

    def records(self) -> tuple[int, int]:
        return self.start, self.start + self.num_rows if self.stop is None else self.stop
