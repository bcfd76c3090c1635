"""Checkpoints of a loader's position: which rows of the current epoch were delivered.

A state is plain JSON (no pickle), small (task ids, plus row numbers only for the few tasks of
the shuffle window that were partly consumed) and checked against the dataset it is loaded
into, so a checkpoint from another dataset or another task split is refused, not misapplied.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError
from ..master.tasks import TaskTable
from .consumed import Ranges, count, union
from .handover import Handover

if TYPE_CHECKING:
    from .dataset import SharedTaskDataset

STATE_FORMAT = 1


def _identity(ds: SharedTaskDataset) -> dict[str, Any]:
    return {
        "records_per_task": ds.records_per_task,
        "seed": ds.seed,
        "shuffle": ds.shuffle,
        "world_size": ds.world_size,
        "rank": ds.rank,
        "ddp_policy": ds.ddp_policy,
        "plan": [[s.path, s.num_records] for s in ds.source.plan()],
    }


def loader_state(ds: SharedTaskDataset) -> dict[str, Any]:
    runtime = ds.runtime
    plane = runtime.plane
    # Elastic mode: the leases of the tasks the loop consumed rows of, for the trainer resumed
    # from this state to take over (handover.py).
    handover = runtime.handover()
    taken = {} if handover is None else handover.to_json()
    if plane.shares_epochs:
        # Other trainers took part of the epoch (elastic mode), or it was partly done before
        # this trainer started: what this one consumed is not where the epoch stands. The
        # master holds the position (and its journal keeps it across a crash).
        return {
            "format": STATE_FORMAT,
            "dataset": _identity(ds),
            "epoch": plane.epoch_to_iterate(),
            "position": "master",
            "master": runtime.address,
            **taken,
        }
    at = plane.position()
    epoch = at.epoch
    return {
        **taken,
        "format": STATE_FORMAT,
        "dataset": _identity(ds),
        "epoch": epoch,
        "completed_seqs": at.completed,
        "partial_seqs": {str(k): v for k, v in at.partial.items()},
        "consumed": {str(t): [list(r) for r in rs] for t, rs in at.ranges.items()},
        # Positions of a job resumed from ranges are in its reduced schedule: such a state
        # must resume from ranges too.
        "resumed": ds._resume is not None and epoch == ds._start_epoch,
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


def restore_state(ds: SharedTaskDataset, state: dict[str, Any]) -> None:
    """Same ranks: skip consumed positions. Other world size or rank, or a merged state: the
    embedded master leaves the consumed records out of the epoch's schedule (``resume``)."""
    if ds._runtime is not None:
        raise ConfigError(
            "load_state_dict must come before the first iteration (the readers start from it); "
            "make a new dataset and loader to resume"
        )
    _check_format(state, "the state")
    mine, theirs = _identity(ds), state.get("dataset", {})
    diffs = [k for k in mine if k not in _WORLD and mine[k] != theirs.get(k)]
    if diffs:
        raise ConfigError(f"the state was saved for another dataset; differing: {diffs}")
    _forget_loaded(ds)
    handover = Handover.from_state(state)
    if state.get("position") == "master":
        if ds.master is None:
            raise ConfigError(
                "this state was saved by a trainer that shared the epochs of the master at "
                f"{state.get('master')} with other trainers (elastic mode): that master keeps "
                "the position. Connect to it (master=...) to go on where the job stands"
            )
        ds._handover = handover  # the master hands out what is left, less what it names
        return
    epoch = int(state["epoch"])
    if not (state.get("merged") or state.get("resumed")) and all(
        mine[k] == theirs.get(k) for k in _WORLD
    ):
        ds._start_epoch = epoch
        ds._skip_tasks = {(epoch, int(t)) for t in state["completed_seqs"]}
        ds._exclude = {
            (epoch, int(t)): np.asarray(rows, dtype=np.int64)
            for t, rows in state["partial_seqs"].items()
        }
        # Still in the master's schedule, left out as their tasks are admitted: len() must not
        # count them (DataPlane.resumed_before). States of old versions: the partial rows.
        ds._loaded = _consumed(state) if "consumed" in state else None
        ds._resumed_records = (
            count(ds._loaded)
            if ds._loaded is not None
            else sum(len(rows) for rows in ds._exclude.values())
        )
        ds._handover = handover if ds.master is not None else None
        _past_the_end(ds)
        return
    if "consumed" not in state:
        raise ConfigError(
            "the state has no consumed record ranges (saved by an old version): it can only "
            f"resume with world_size={theirs.get('world_size')}, rank={theirs.get('rank')}"
        )
    if (theirs.get("world_size") or 1) > 1 and not state.get("merged"):
        if all(mine[k] == theirs.get(k) for k in _WORLD):  # a resumed job's rank (above)
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
    total = sum(s.num_records for s in ds.source.plan())
    if count(consumed) >= total:  # the epoch was wholly consumed: the next one starts fresh
        ds._start_epoch, ds._resume = epoch + 1, None
    else:
        ds._start_epoch, ds._resume = epoch, consumed
    _past_the_end(ds)


def _forget_loaded(ds: SharedTaskDataset) -> None:
    """What a state loaded before set, as if none had been: the last one loaded counts. A
    state saved after the last epoch, then a mid-epoch one, left ``_finished`` and its
    every-record-consumed ``resume``: the mid-epoch resume delivered the wrong rows."""
    ds._start_epoch, ds._resume, ds._finished = 0, None, False
    ds._skip_tasks, ds._exclude, ds._resumed_records, ds._loaded = set(), {}, 0, None
    ds._handover = None


def _past_the_end(ds: SharedTaskDataset) -> None:
    """A state saved after the last epoch of a finite run (``epochs``) resumes with nothing
    left: every pass is empty, as after the last epoch of a run that goes on. An embedded
    master cannot start past its last epoch, so it starts at that epoch with every record
    consumed (an empty schedule), and the sampler is put past it when the dataset starts
    (``SharedTaskDataset._ensure_started``). A standalone master knows its own end."""
    embedded = ds.master is None or ds._rendezvous is not None
    if ds.epochs is None or ds._start_epoch < ds.epochs or not embedded:
        return
    table = TaskTable(ds.source.plan(), ds.records_per_task)
    spans = zip(table.start.tolist(), table.stop.tolist(), strict=True)
    ds._start_epoch, ds._finished = ds.epochs - 1, True
    ds._resume = {task: [(a, b)] for task, (a, b) in enumerate(spans)}
    ds._skip_tasks, ds._exclude, ds._resumed_records, ds._loaded = set(), {}, 0, None
    ds._handover = None


_WORLD = ("world_size", "rank")
