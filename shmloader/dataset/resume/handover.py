"""Taking over from a crashed trainer of an elastic job: the leases its checkpoint names.

Trainers that share a standalone master's epochs (elastic mode) each deliver the tasks their
readers leased. A checkpoint (``state_dict()``) of such a trainer names its consumer id at the
master and, per lease of a task the loop had consumed part of (or all of, with the completion
maybe not sent yet), the record ranges consumed. A trainer resumed from that checkpoint
(``load_state_dict``) starts by leaving the master *on behalf of* the saving trainer, handing
those ranges back with its leases (master/handback.py): the tasks go back to the queue at
once, not after ``consumer_timeout``, and whoever leases one next skips what the loop had
consumed. Without that, a trainer killed right after saving and restarted within
``consumer_timeout`` had its partly consumed tasks come again whole: duplicates, with no word.

Should the master have dropped the saving trainer already (its ``consumer_timeout`` passed), the
restart came too late to hand anything back; but the saving trainer reported to the master what
its state counted as it saved it (``Checkpoint``, master/handback.py), and the master handed those
ranges back itself when the leases lapsed: whoever leased the tasks since skips them. The
resumed trainer also leaves the ranges out of any copy of those tasks that comes to it
(``consumed_of``), as a master older than ``Checkpoint`` could not keep them.

Load such a checkpoint only once the trainer that saved it is gone: its leases stop being its.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import ConfigError
from ...master.tasks import merge_ranges

if TYPE_CHECKING:
    from ...master.client import MasterClient

RecordRanges = tuple[tuple[int, int], ...]  # [start, stop) records, sorted


@dataclass(frozen=True)
class HandoverLease:
    """A lease the saving trainer held, of task ``task_id`` (of the plan: a file's records) in
    ``epoch``, and the records of it its loop had consumed. The task, not its place in the
    epoch's order: a schedule rebuilt otherwise (a master started from a merged state) puts
    other tasks at that place, and record numbers count from each file's start."""

    lease_id: int
    epoch: int
    task_id: int
    consumed: RecordRanges


@dataclass(frozen=True)
class Handover:
    """What a checkpoint hands over: the saving trainer's consumer id and its leases."""

    consumer: str
    leases: tuple[HandoverLease, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "consumer": self.consumer,
            "held": [
                {
                    "lease": h.lease_id,
                    "epoch": h.epoch,
                    "task": h.task_id,
                    "consumed": [list(r) for r in h.consumed],
                }
                for h in self.leases
            ],
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Handover | None:
        """The handover a loader state carries; None for a state without one (saved by an
        embedded master's trainer, a DDP rank, or an older version). ConfigError names what is
        malformed."""
        consumer = state.get("consumer")
        if consumer is None:
            return None
        try:
            leases = tuple(
                HandoverLease(
                    int(h["lease"]),
                    int(h["epoch"]),
                    int(h["task"]),
                    tuple((int(a), int(b)) for a, b in h["consumed"]),
                )
                for h in state.get("held", [])
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"the state's held leases are malformed: {exc!r}") from exc
        if not isinstance(consumer, str) or not consumer:
            raise ConfigError(f"the state's consumer must be a consumer id, got {consumer!r}")
        return cls(consumer, leases)

    def consumed_of(self) -> dict[tuple[int, int], RecordRanges]:
        """(epoch, task id) -> records consumed: left out of any copy of the task that comes
        here."""
        out: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for h in self.leases:
            out.setdefault((h.epoch, h.task_id), []).extend(h.consumed)
        return {key: tuple(merge_ranges(ranges)) for key, ranges in out.items()}

    def by_lease(self) -> dict[int, list[tuple[int, int]]]:
        """Lease id -> records consumed: what a Leave hands back, or a Checkpoint records."""
        return {h.lease_id: list(h.consumed) for h in self.leases}

    def take_over(self, client: MasterClient) -> None:
        """Leave the master for the saving trainer, handing its consumed ranges back (a no-op
        where the master has dropped that trainer already)."""
        client.leave(self.consumer, self.by_lease())
