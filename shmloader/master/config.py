"""The job's parameters, each defined once with its default: how the plan is cut into tasks,
how epochs are ordered, and how leases are held.

One :class:`JobConfig` is what a master's dispatcher runs (``Master``, ``shmloader master``),
what its journal and snapshots record, and what ``SharedTaskDataset`` builds for its embedded
master; the defaults of those faces are read from here.
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, MasterError
from .tasks import DDP_POLICIES, DdpPolicy, merge_ranges

if TYPE_CHECKING:
    from .progress import Lease

# Records per task where none are given: a ``SharedTaskDataset``'s embedded master. A master
# you start is told (``Master(records_per_task=)``, ``--records-per-task``): trainers that share
# it must agree, and the plan check at registration compares theirs with it.
DEFAULT_RECORDS_PER_TASK = 4096

# Settings that shape the task schedule: a journal or state_dict only fits a dispatcher that
# agrees on all of them (and on the plan). The others may change between restarts.
SCHEDULE_FIELDS = ("records_per_task", "seed", "shuffle", "world_size", "ddp_policy", "resume")


@dataclass(frozen=True)
class JobConfig:
    """How the plan is cut and handed out (docs/master.md). Each field's default here is the
    default of ``Master``, ``shmloader master`` and ``SharedTaskDataset`` alike, with one
    exception, ``epochs``: a master you start plans 1 epoch unless told, so that trainers
    sharing it know which epoch is the last (they wait at its end for the tasks of any that
    died); a ``SharedTaskDataset``'s embedded master has none (``epochs=None``) unless given,
    as a torch DataLoader may be iterated as often as the loop likes, and it has one trainer.

    ``max_retries`` is how many times a unit that failed or whose lease expired is handed out
    again in the same epoch; the failure after that quarantines it (0: the first failure does).
    """

    records_per_task: int = DEFAULT_RECORDS_PER_TASK
    epochs: int | None = 1
    shuffle: bool = True
    seed: int = 0
    lease_timeout: float = 30.0
    consumer_timeout: float = 60.0
    max_retries: int = 3
    world_size: int | None = None
    ddp_policy: DdpPolicy = "pad"
    # Epochs before this one count as done: a job resumed from a checkpoint starts here.
    first_epoch: int = 0
    # Records of ``first_epoch`` a checkpoint already consumed (task id -> [start, stop)
    # ranges): left out of that epoch's schedule, so a job resumed with another world size
    # splits only the rest. Normalized (int keys, sorted joined ranges) so it survives JSON.
    resume: dict[int, list[tuple[int, int]]] | None = None

    def __post_init__(self) -> None:
        # Each count checked here, once, for every face (SharedTaskDataset, Master, the CLI, a
        # journal), and kept as a plain int: a numpy integer is a count too, and JSON takes it.
        counts = [
            ("records_per_task", 1, "records per task, e.g. 4096"),
            ("first_epoch", 0, "epochs already done, e.g. 0"),
            ("seed", 0, "e.g. 0"),
            ("max_retries", 0, "retries of a failed task, e.g. 3"),
        ]
        if self.epochs is not None:
            counts.append(("epochs", 1, "epochs, or None for no end"))
        if self.world_size is not None:
            counts.append(("world_size", 1, "ranks, or None for elastic trainers"))
        for name, least, example in counts:
            object.__setattr__(self, name, check_count(name, getattr(self, name), least, example))
        if self.resume is not None:
            object.__setattr__(self, "resume", _normalize_resume(self.resume))
        if self.epochs is not None and self.first_epoch >= self.epochs:
            raise ConfigError(
                f"first_epoch {self.first_epoch} is past the last epoch (epochs={self.epochs})"
            )
        for name in ("lease_timeout", "consumer_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
        if self.ddp_policy not in DDP_POLICIES:
            raise ConfigError(f"ddp_policy must be one of {DDP_POLICIES}, got {self.ddp_policy!r}")
        if not isinstance(self.shuffle, bool):
            raise ConfigError(f"shuffle must be True or False, got {self.shuffle!r}")

    def hold(self, lease: Lease) -> float:
        """How long a renewal keeps ``lease``: ``lease_timeout``, or for a ``long_hold`` one
        ``max(lease_timeout, consumer_timeout)``. Bounded by the lease's own renewals (only
        its trainer's maintenance thread renews a taken lease), not by the consumer's other
        calls: a trainer whose main process is stuck while its readers still call the master
        under its consumer id must not keep its taken tasks for ever."""
        if lease.long_hold:
            return max(self.lease_timeout, self.consumer_timeout)
        return self.lease_timeout

    @property
    def restart_grace(self) -> float:
        """How long every active lease lasts at least after the master (re)starts or finds it
        had stalled: ``max(lease_timeout, consumer_timeout)``. Consumers count as seen at the
        restart, so a live trainer is presumed alive for ``consumer_timeout``; its clients come
        back only after their retry backoff (up to seconds), and renewals due while the master
        was down arrive late. A grace of ``lease_timeout`` alone let leases of live trainers
        lapse (their tasks then came to two trainers); a dead trainer's tasks return after
        ``consumer_timeout``, when it is declared dead anyway."""
        return max(self.lease_timeout, self.consumer_timeout)

    def check_rank(self, consumer: str, rank: int | None) -> None:
        """MasterError unless ``consumer`` is a usable id and ``rank`` fits the mode."""
        if not isinstance(consumer, str) or not consumer:
            raise MasterError(f"a consumer id must be a non-empty string, got {consumer!r}")
        ws = self.world_size
        if ws is None and rank is not None:
            raise MasterError(f"consumer {consumer!r} gave rank {rank} but there is no world_size")
        if ws is not None and (not isinstance(rank, int) or not 0 <= rank < ws):
            raise MasterError(
                f"consumer {consumer!r} must register with a rank in 0..{ws - 1} "
                f"(world_size={ws}), got {rank!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown dispatcher setting(s) {unknown}; known: {sorted(known)}")
        return cls(**data)


def _normalize_resume(resume: object) -> dict[int, list[tuple[int, int]]] | None:
    if not isinstance(resume, dict):
        raise ConfigError(f"resume must be a dict task id -> [[start, stop], ...], got {resume!r}")
    try:
        out = {int(t): merge_ranges(ranges) for t, ranges in resume.items()}
    except (TypeError, ValueError, IndexError) as exc:
        raise ConfigError(f"resume must map task ids to [[start, stop], ...]: {exc}") from exc
    out = {t: r for t, r in sorted(out.items()) if r}
    return out or None


def resume_key(resume: dict[int, list[tuple[int, int]]] | None) -> list[list[int]] | None:
    """``resume`` as JSON-stable ``[[task, start, stop], ...]``, for schedule keys."""
    if resume is None:
        return None
    return [[t, a, b] for t, ranges in sorted(resume.items()) for a, b in ranges]


def check_count(name: str, value: object, least: int, example: str) -> int:
    """``value`` as an int, or a ConfigError naming ``name``: a count must be a whole number
    (an int or a numpy integer, not a bool or a float such as ``4096.0``, which would fail
    later with a TypeError about a comparison) of at least ``least``."""
    try:
        count = None if isinstance(value, bool) else operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        count = None
    if count is None:
        raise ConfigError(
            f"{name} must be a whole number (at least {least}): {example}; got "
            f"{value!r} ({type(value).__name__})"
        )
    if count < least:
        raise ConfigError(f"{name} must be at least {least}, got {count}: {example}")
    return count
