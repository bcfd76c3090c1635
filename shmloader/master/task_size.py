"""How many records a task holds when ``records_per_task`` is not given: sized from the data.

A task is what a reader leases, decodes into one segment and announces, and what the trainer
admits, renames, releases and completes at the master: a fixed cost of about half a
millisecond of the trainer's time per task whatever its size. With a fixed count of records,
small records made that cost dominate (264-byte rows in tasks of 4096: 1 MiB tasks, epochs
from the cache at half the speed of tasks of 30,000), and large ones made tasks huge (150 KB
images: 600 MiB tasks, eight of them in a shuffle window). Smaller targets cost records of a
few KB their speed: 12 KB images from the cache went at 0.6x in tasks of 8 MiB (681 images)
against tasks of 4096. So a task aims at a size in bytes,
:data:`TASK_BYTES` of the files the plan reads (less where ``shm_budget`` is small:
:func:`task_bytes`), and an epoch keeps at least
:data:`TASKS_PER_RANK` tasks for each rank, so that a small dataset still spreads over the
readers and the ranks. ``benchmarks/bench_gather_floor.py`` measures the first effect (tasks
sized beside tasks of ``--fixed-tasks``); docs/performance.md has the figures.

The size is a pure function of the plan, the files' sizes, the ranks, ``shuffle_window`` and
the budget as given (``"auto"``: as the filesystem's size gives it, not what is free), so
every rank of a job, and a job resumed from a checkpoint on the same machine, comes to the
same one. A source whose shards are not files says their bytes itself (``SizedShards``);
files whose size is not known (not on this machine's file system) keep
:data:`~shmloader.master.config.DEFAULT_RECORDS_PER_TASK`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from .. import _fs
from ..sources.base import Shard, SizedShards, Source
from .config import DEFAULT_RECORDS_PER_TASK

TASK_BYTES = 32 << 20  # bytes of the files read per task, where shm_budget has room
TASKS_PER_RANK = 8  # an epoch has at least this many tasks per rank (where it has the records)
WINDOWS_IN_BUDGET = 4  # shuffle windows of tasks shm_budget holds at least


def task_bytes(shm_budget: int, shuffle_window: int) -> int:
    """The bytes of the files a task aims at: :data:`TASK_BYTES`, less where ``shm_budget``
    would not hold :data:`WINDOWS_IN_BUDGET` shuffle windows of such tasks (the block being
    consumed, two windows ready ahead, the readers' own): a container's small ``/dev/shm``
    (``shm_budget="auto"``) then gets small tasks rather than a shuffle window it cannot hold.
    """
    return max(1, min(TASK_BYTES, shm_budget // (WINDOWS_IN_BUDGET * shuffle_window)))


def records_per_task_for(
    plan: Sequence[Shard],
    file_bytes: Mapping[str, int] | None,
    world_size: int | None,
    bytes_per_task: int = TASK_BYTES,
) -> int:
    """Records per task for ``plan``, whose files hold ``file_bytes`` (path -> bytes; None:
    not known), shared by ``world_size`` ranks (None: one), aiming at ``bytes_per_task`` of
    the files a task (:func:`task_bytes`)."""
    records = sum(shard.num_records for shard in plan)
    if not file_bytes or records == 0:
        return DEFAULT_RECORDS_PER_TASK
    per_record = sum(file_bytes.values()) / records
    by_bytes = int(bytes_per_task / per_record) if per_record > 0 else records
    by_count = -(-records // (TASKS_PER_RANK * (world_size or 1)))
    return max(1, min(by_bytes, by_count))


def data_bytes(source: Source) -> dict[str, int] | None:
    """The bytes each shard of ``source``'s plan reads: as the source says
    (:class:`~shmloader.sources.base.SizedShards`), else the sizes of the files its shards
    are (:func:`file_bytes`); None where they are not known."""
    if isinstance(source, SizedShards):
        return source.shard_bytes()
    return file_bytes(source.plan())


def file_bytes(plan: Sequence[Shard]) -> dict[str, int] | None:
    """The size of each file of ``plan`` (a shard's ``path``), or None if one is not a file on
    this machine (a remote store, or a path a source of the user's own made up)."""
    sizes: dict[str, int] = {}
    for shard in plan:
        if shard.path in sizes:
            continue
        local = _fs.local_path(shard.path)
        if local is None:
            return None
        try:
            sizes[shard.path] = os.path.getsize(local)
        except OSError:
            return None
    return sizes
