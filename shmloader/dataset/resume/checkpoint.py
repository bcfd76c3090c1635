"""Checkpoints: the state a loader saves, and the :class:`ResumePoint` a loaded one becomes.

A state is plain JSON (no pickle), small (task ids, plus row numbers only for the few tasks of
the shuffle window that were partly consumed) and checked against the dataset it is loaded
into, so a checkpoint from another dataset or another task split is refused, not misapplied.
Loading one builds a :class:`ResumePoint` once; that frozen value is what the runtime, the
embedded master, the readers and the consumption accounting are given, unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import ConfigError
from ...master.config import JobConfig
from ...master.tasks import TaskTable
from ..core.record_ranges import Ranges, count, union
from .handover import Handover

if TYPE_CHECKING:
    from ...sources.base import Source

STATE_FORMAT = 1
# What a state may differ in from the dataset it is loaded into (another world size resumes
# from record ranges).
_WORLD = ("world_size", "rank")


@dataclass(frozen=True)
class Position:
    """What a checkpoint stores of the first epoch not wholly consumed."""

    epoch: int
    completed: list[int]  # consumed task positions
    partial: dict[int, list[int]]  # position -> consumed rows, of partly consumed tasks
    ranges: Ranges  # every record consumed of the epoch, by task id


@dataclass(frozen=True)
class LoopState:
    """Where a running dataset's loop stands, taken in one step under the data plane's lock
    (``DataPlane.loop_state``): all a saved state is made of, so the epoch, the position and
    the leases handed over cannot come from different moments of the maintenance thread's
    work."""

    epoch: int  # the epoch the loop iterates (or is about to)
    # What the loop consumed of its first epoch not wholly consumed; None when the master holds
    # the position (other trainers took part of the epoch: Position would not be where it is).
    position: Position | None
    # Elastic mode: the leases of the tasks the loop consumed rows of, for the trainer resumed
    # from this state to take over (handover.py); None otherwise, and when closing.
    handover: Handover | None = None


@dataclass(frozen=True)
class ResumePoint:
    """Where a loaded state leaves the job: built once (:func:`resume_point`), passed as is.

    The default is a fresh start: epoch 0, nothing consumed.
    """

    epoch: int = 0  # the epoch to start in
    # A state of the same world (its positions name the same tasks): positions of ``epoch``'s
    # tasks consumed whole, and the rows consumed of those consumed in part.
    done: frozenset[int] = frozenset()
    partial: Mapping[int, np.ndarray] = field(default_factory=dict)
    # The record ranges consumed of ``epoch``, by task id.
    consumed: Ranges | None = None
    # Whether the master leaves ``consumed`` out of the epoch's schedule (another world size,
    # a merged state, a state saved after the last epoch); else they are only kept in this
    # trainer's checkpoints (the tasks in ``done`` may never come here again).
    reschedule: bool = False
    # A state saved after the last epoch of a finite run: every pass is empty.
    finished: bool = False
    # Records of ``epoch`` the state consumed, left out of ``len()`` until their tasks come.
    consumed_records: int = 0
    # A loaded elastic state's: the saving trainer's leases, taken over at the start.
    handover: Handover | None = None

    @property
    def by_position(self) -> bool:
        """Whether the state names tasks by their position in the epoch (the same world)."""
        return bool(self.done or self.partial)

    @property
    def loaded(self) -> bool:
        """Whether any state was loaded that left records out."""
        return self.by_position or self.reschedule

    def skip_tasks(self) -> frozenset[tuple[int, int]]:
        """(epoch, position) of the tasks consumed whole: readers do not read them again."""
        return frozenset((self.epoch, seq) for seq in self.done)

    def excluded(self, epoch: int, seq: int) -> np.ndarray | None:
        """The rows of task ``seq`` of ``epoch`` the state consumed (None: none)."""
        return self.partial.get(seq) if epoch == self.epoch else None

    def schedule_resume(self) -> Ranges | None:
        """What the embedded master leaves out of the epoch's schedule."""
        return self.consumed if self.reschedule else None

    def job(self, job: JobConfig) -> JobConfig:
        """``job`` as a master resumed at this point runs it: from this epoch, without the
        records the state leaves out of the schedule."""
        return dataclasses.replace(job, first_epoch=self.epoch, resume=self.schedule_resume())

    def without_positions(self) -> ResumePoint:
        """As if the state had named no positions: a standalone master started from it
        (``--resume``) already left what it consumed out of its schedule."""
        return dataclasses.replace(
            self,
            done=frozenset(),
            partial={},
            consumed=self.schedule_resume(),
            consumed_records=0,
            handover=None,
        )


FRESH_START = ResumePoint()


@dataclass(frozen=True)
class DatasetFacts:
    """What a state is checked against, and what loading it needs, of the dataset."""

    identity: dict[str, Any]
    source: Source
    records_per_task: int
    epochs: int | None
    master_given: bool  # master= was given: a running master's address, or torchrun's rank 0
    standalone_master: bool  # master= names a running master (not torchrun's)


def identity(
    source: Source,
    *,
    records_per_task: int,
    seed: int,
    shuffle: bool,
    world_size: int | None,
    rank: int | None,
    ddp_policy: str,
) -> dict[str, Any]:
    """What a state is saved for: a state is refused by a dataset that differs in these."""
    return {
        "records_per_task": records_per_task,
        "seed": seed,
        "shuffle": shuffle,
        "world_size": world_size,
        "rank": rank,
        "ddp_policy": ddp_policy,
        "plan": [[s.path, s.num_records] for s in source.plan()],
    }


def saved_state(
    facts: DatasetFacts, point: ResumePoint, loop: LoopState, *, master: str | None
) -> dict[str, Any]:
    """The state of a running dataset, from where its loop stands (``loop``): plain JSON.
    ``master``: the master's address, named by a state whose position the master holds."""
    taken = {} if loop.handover is None else loop.handover.to_json()
    at = loop.position
    if at is None:
        # Other trainers took part of the epoch (elastic mode), or it was partly done before
        # this trainer started: what this one consumed is not where the epoch stands. The
        # master holds the position (and its journal keeps it across a crash).
        return {
            "format": STATE_FORMAT,
            "dataset": facts.identity,
            "epoch": loop.epoch,
            "position": "master",
            "master": master,
            **taken,
        }
    return {
        **taken,
        "format": STATE_FORMAT,
        "dataset": facts.identity,
        "epoch": at.epoch,
        "completed_seqs": at.completed,
        "partial_seqs": {str(k): v for k, v in at.partial.items()},
        "consumed": {str(t): [list(r) for r in rs] for t, rs in at.ranges.items()},
        # Positions of a job resumed from ranges are in its reduced schedule: such a state
        # must resume from ranges too.
        "resumed": point.reschedule and at.epoch == point.epoch,
    }


def merge_states(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One state from every rank's ``state_dict()`` of a DDP job, to load into every rank of a
    job with any number of trainers: the union of what the ranks consumed in the epoch.

    The ranks must have saved at the same step (same epoch) of the same dataset."""
    if not states:
        raise ConfigError("merge_states needs at least one state")
    for i, state in enumerate(states):
        _check_format(state, f"state {i}")
        if "consumed" not in state:
            raise ConfigError(f"state {i} has no consumed record ranges (saved by an old version)")
    first = states[0]
    shared = {k: v for k, v in first["dataset"].items() if k != "rank"}
    for i, state in enumerate(states[1:], 1):
        other = {k: v for k, v in state["dataset"].items() if k != "rank"}
        diffs = [k for k in shared if shared[k] != other.get(k)]
        if diffs:
            raise ConfigError(f"state {i} was saved for another dataset than state 0: {diffs}")
        if state["epoch"] != first["epoch"]:
            raise ConfigError(
                f"state {i} is in epoch {state['epoch']}, state 0 in epoch {first['epoch']}: "
                "save every rank's state at the same step"
            )
    consumed = union(_consumed(s) for s in states)
    return {
        "format": STATE_FORMAT,
        "dataset": {**shared, "rank": None},
        "epoch": int(first["epoch"]),
        "merged": True,
        "completed_seqs": [],
        "partial_seqs": {},
        "consumed": {str(t): [list(r) for r in rs] for t, rs in consumed.items()},
    }


def _consumed(state: dict[str, Any]) -> Ranges:
    try:
        return {int(t): [(int(a), int(b)) for a, b in rs] for t, rs in state["consumed"].items()}
    except (TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(f"the state's consumed ranges are malformed: {exc}") from exc


def _check_format(state: dict[str, Any], what: str) -> None:
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        got = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise ConfigError(f"{what} is not a shmloader loader state (format {got!r})")


def resume_point(facts: DatasetFacts, state: dict[str, Any]) -> ResumePoint:
    """The point ``state`` resumes at, checked against the dataset. Same ranks: skip consumed
    positions. Other world size or rank, or a merged state: the embedded master leaves the
    consumed records out of the epoch's schedule (``reschedule``)."""
    _check_format(state, "the state")
    # First: without that master nothing else of the state can be used.
    if state.get("position") == "master" and not facts.master_given:
        raise ConfigError(
            "this state was saved by a trainer that shared the epochs of the master at "
            f"{state.get('master')} with other trainers (elastic mode): that master keeps "
            "the position. Connect to it (master=...) to go on where the job stands"
        )
    _check_same_dataset(facts.identity, state.get("dataset", {}))
    handover = Handover.from_state(state)
    if state.get("position") == "master":
        return ResumePoint(handover=handover)  # the master hands out what is left, less this
    same_ranks = all(facts.identity[k] == state.get("dataset", {}).get(k) for k in _WORLD)
    if same_ranks and not (state.get("merged") or state.get("resumed")):
        point = _at_positions(state, handover if facts.master_given else None)
    else:
        point = _at_consumed_records(facts, state, same_ranks)
    return _past_the_end(facts, point)


def _check_same_dataset(mine: dict[str, Any], theirs: dict[str, Any]) -> None:
    """ConfigError unless the state (``theirs``) was saved for this dataset, ranks aside."""
    diffs = [k for k in mine if k not in _WORLD and mine[k] != theirs.get(k)]
    if not diffs:
        return
    fix = ""
    if "records_per_task" in diffs:  # tasks sized from the data, or given another size
        fix = (
            f"; records_per_task is {theirs.get('records_per_task')} in the state, "
            f"{mine['records_per_task']} here: give records_per_task="
            f"{theirs.get('records_per_task')} to load it"
        )
    raise ConfigError(f"the state was saved for another dataset; differing: {diffs}{fix}")


def _at_positions(state: dict[str, Any], handover: Handover | None) -> ResumePoint:
    """A state of the same ranks: its epoch's tasks consumed whole are skipped, and the rows
    consumed of the others left out as their tasks are admitted."""
    partial = {
        int(t): _frozen(np.asarray(rows, dtype=np.int64))
        for t, rows in state["partial_seqs"].items()
    }
    # Still in the master's schedule, left out as their tasks are admitted: len() must not
    # count them (ConsumptionBook.rows_left). States of old versions: the partial rows.
    loaded = _consumed(state) if "consumed" in state else None
    return ResumePoint(
        epoch=int(state["epoch"]),
        done=frozenset(int(t) for t in state["completed_seqs"]),
        partial=partial,
        consumed=loaded,
        consumed_records=(
            count(loaded) if loaded is not None else sum(len(r) for r in partial.values())
        ),
        handover=handover,
    )


def _at_consumed_records(
    facts: DatasetFacts, state: dict[str, Any], same_ranks: bool
) -> ResumePoint:
    """A merged state, or one of other ranks: the embedded master leaves the records it
    consumed out of the epoch's schedule (a whole job's state only: one rank's cannot say
    what the others consumed)."""
    epoch = int(state["epoch"])
    theirs = state.get("dataset", {})
    if "consumed" not in state:
        raise ConfigError(
            "the state has no consumed record ranges (saved by an old version): it can only "
            f"resume with world_size={theirs.get('world_size')}, rank={theirs.get('rank')}"
        )
    if (theirs.get("world_size") or 1) > 1 and not state.get("merged"):
        if same_ranks:  # a resumed job's rank
            raise ConfigError(
                f"this state is rank {theirs.get('rank')}'s of {theirs.get('world_size')} of a "
                f"job that resumed epoch {epoch} from merged record ranges: its positions are "
                "in that job's shortened schedule, which one rank's state cannot rebuild. Load "
                "shmloader.merge_states(every rank's state) into every rank (a standalone "
                "master: start a fresh one from the merged state, --resume)"
            )
        raise ConfigError(
            f"this state is rank {theirs.get('rank')}'s of {theirs.get('world_size')}: to resume "
            "with another number of trainers, load shmloader.merge_states(every rank's state)"
        )
    consumed = _consumed(state)
    total = sum(s.num_records for s in facts.source.plan())
    if count(consumed) >= total:  # the epoch was wholly consumed: the next one starts fresh
        return ResumePoint(epoch=epoch + 1)
    return ResumePoint(epoch=epoch, consumed=consumed, reschedule=True)


def _frozen(rows: np.ndarray) -> np.ndarray:
    rows.setflags(write=False)
    return rows


def _past_the_end(facts: DatasetFacts, point: ResumePoint) -> ResumePoint:
    """A state saved after the last epoch of a finite run (``epochs``) resumes with nothing
    left: every pass is empty, as after the last epoch of a run that goes on. An embedded
    master cannot start past its last epoch, so it starts at that epoch with every record
    consumed (an empty schedule), and the sampler is put past it (``finished``). A standalone
    master knows its own end."""
    if facts.epochs is None or point.epoch < facts.epochs or facts.standalone_master:
        return point
    table = TaskTable(facts.source.plan(), facts.records_per_task)
    spans = zip(table.start.tolist(), table.stop.tolist(), strict=True)
    everything = {task: [(a, b)] for task, (a, b) in enumerate(spans)}
    return ResumePoint(epoch=facts.epochs - 1, consumed=everything, reschedule=True, finished=True)
