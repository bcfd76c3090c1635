"""Checkpoints of a loader's position: which rows of the current epoch were delivered.

A state is plain JSON (no pickle), small (task ids, plus row numbers only for the few tasks of
the shuffle window that were partly consumed) and checked against the dataset it is loaded
into, so a checkpoint from another dataset or another task split is refused, not misapplied.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError

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
    epoch, completed, partial = ds.runtime.plane.position()
    return {
        "format": STATE_FORMAT,
        "dataset": _identity(ds),
        "epoch": epoch,
        "completed_seqs": completed,
        "partial_seqs": {str(k): v for k, v in partial.items()},
    }


def restore_state(ds: SharedTaskDataset, state: dict[str, Any]) -> None:
    if ds._runtime is not None:
        raise ConfigError(
            "load_state_dict must come before the first iteration (the readers start from it); "
            "make a new dataset and loader to resume"
        )
    if state.get("format") != STATE_FORMAT:
        raise ConfigError(f"not a shmloader loader state (format {state.get('format')!r})")
    mine, theirs = _identity(ds), state.get("dataset", {})
    diffs = [k for k in mine if mine[k] != theirs.get(k)]
    if diffs:
        raise ConfigError(f"the state was saved for another dataset; differing: {diffs}")
    epoch = int(state["epoch"])
    ds._start_epoch = epoch
    ds._skip_tasks = {(epoch, int(t)) for t in state["completed_seqs"]}
    ds._exclude = {
        (epoch, int(t)): np.asarray(rows, dtype=np.int64)
        for t, rows in state["partial_seqs"].items()
    }
