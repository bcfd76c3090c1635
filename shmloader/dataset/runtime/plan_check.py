"""A trainer's source against a standalone master's plan, checked when the trainer registers.

The master hands out tasks of its own plan (files, record counts, ``records_per_task``); a
trainer whose source plans other files, other counts or other task sizes would read tasks it
does not know, have them refused ("not a file of the planned dataset", about the master's own
file), quarantine them and die. Refused here instead, before any read, naming both sides.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import ConfigError
from ...master._convert import ConsumerInfo
from ...sources.base import Shard

SHOWN = 3  # files named of each side's difference


def check_same_plan(
    plan: Sequence[Shard], records_per_task: int | None, info: ConsumerInfo, address: str
) -> None:
    """ConfigError unless the master at ``address`` (as ``register`` told: ``info``) planned
    the files and records this trainer's source plans, in tasks of ``records_per_task`` (None:
    the trainer left the task size to the master)."""
    ours = [shard.path for shard in plan]
    fix = (
        "; give the trainer the source the master was started with (the same files, "
        "records_per_task and source options), or start the master from this one"
    )
    if ours != info.paths:
        raise ConfigError(
            f"this trainer's source plans {_files(ours)}, but the master at {address} planned "
            f"{_files(info.paths)}{_difference(ours, info.paths)}{fix}"
        )
    counts = [shard.num_records for shard in plan]
    if info.records and counts != info.records:
        path, mine, theirs = next(
            (p, a, b) for p, a, b in zip(ours, counts, info.records, strict=True) if a != b
        )
        raise ConfigError(
            f"{path}: this trainer's source counts {mine} records in it, the master at "
            f"{address} planned {theirs} (the file changed, or the source reads it another "
            f"way){fix}"
        )
    if sum(counts) != info.total_records:
        raise ConfigError(
            f"this trainer's source plans {sum(counts)} records, the master at {address} "
            f"{info.total_records}{fix}"
        )
    theirs_per_task = info.records_per_task
    if None not in (theirs_per_task, records_per_task) and theirs_per_task != records_per_task:
        raise ConfigError(
            f"records_per_task={records_per_task} here, but the master at {address} splits "
            f"the files into tasks of {theirs_per_task} records: use "
            f"records_per_task={theirs_per_task}"
        )


def _files(paths: Sequence[str]) -> str:
    return f"{len(paths)} file{'s' if len(paths) != 1 else ''}"


def _difference(ours: Sequence[str], theirs: Sequence[str]) -> str:
    ours_set, theirs_set = set(ours), set(theirs)
    only_ours = [p for p in ours if p not in theirs_set]
    only_theirs = [p for p in theirs if p not in ours_set]
    parts = []
    if only_ours:
        parts.append(f"only this trainer's: {_some(only_ours)}")
    if only_theirs:
        parts.append(f"only the master's: {_some(only_theirs)}")
    if not parts:
        return " (the same files in another order)"
    return f" ({'; '.join(parts)})"


def _some(paths: Sequence[str]) -> str:
    shown = ", ".join(paths[:SHOWN])
    return shown + (f" and {len(paths) - SHOWN} more" if len(paths) > SHOWN else "")
