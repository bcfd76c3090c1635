"""Finding and removing what dead processes left in a base directory."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from typing import Literal

from .budget import reap_dead_writers
from .names import PREFIX, is_alive, parse_dataset_name, parse_temp_name
from .space import resolve_base_dir

Action = Literal["removed", "would remove", "left", "failed"]


@dataclass(frozen=True)
class ReapEntry:
    """One store directory or unsealed segment looked at; ``nbytes`` is memory it holds."""

    path: str
    nbytes: int
    action: Action
    reason: str


@dataclass
class ReapReport:
    base_dir: str
    entries: list[ReapEntry] = field(default_factory=list)

    @property
    def removed(self) -> list[ReapEntry]:
        return [e for e in self.entries if e.action in ("removed", "would remove")]

    @property
    def left(self) -> list[ReapEntry]:
        return [e for e in self.entries if e.action == "left"]

    @property
    def failed(self) -> list[ReapEntry]:
        return [e for e in self.entries if e.action == "failed"]


def held_bytes(path: str) -> int:
    """Memory held by a file or a directory tree (allocated blocks, not apparent size)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0
    if not os.path.isdir(path):
        return st.st_blocks * 512
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                continue
    return total


def reap_stale(
    base_dir: str | os.PathLike[str] | None = None, *, dry_run: bool = False
) -> ReapReport:
    """Remove stores whose owner is dead, and unsealed segments of dead writers in live stores.

    Only names we create are touched (``shmloader-<pid>-<start>-<hex>``); anything else starting
    with ``shmloader`` is reported as left. A store that cannot be removed (another user's, say)
    is reported as ``failed`` with the error, and the rest goes on.
    """
    base = resolve_base_dir(base_dir)
    report = ReapReport(base)
    remove: Action = "would remove" if dry_run else "removed"
    for name in sorted(os.listdir(base)):
        if not name.startswith(PREFIX):
            continue
        path = os.path.join(base, name)
        owner = parse_dataset_name(name)
        if owner is None or not os.path.isdir(path):
            report.entries.append(ReapEntry(path, held_bytes(path), "left", "not a store name"))
            continue
        pid, token = owner
        if is_alive(pid, token):
            for temp, nbytes in reap_dead_writers(path, dry_run=dry_run):
                writer = parse_temp_name(temp)
                who = f"writer pid {writer[0]}" if writer else "writer"
                reason = f"unsealed segment, {who} is gone"
                report.entries.append(ReapEntry(os.path.join(path, temp), nbytes, remove, reason))
            reason = f"owner pid {pid} is alive"
            report.entries.append(ReapEntry(path, held_bytes(path), "left", reason))
            continue
        nbytes = held_bytes(path)
        try:
            if not dry_run:
                shutil.rmtree(path)
        except FileNotFoundError:
            continue  # another reaper removed it first
        except OSError as exc:
            report.entries.append(
                ReapEntry(path, nbytes, "failed", f"owner pid {pid} is gone; {exc}")
            )
            continue
        report.entries.append(ReapEntry(path, nbytes, remove, f"owner pid {pid} is gone"))
    return report
