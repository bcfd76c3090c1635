"""Where segments live, and whether that filesystem can hold the budget."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple

from ..errors import ConfigError, ShmSpaceError
from .sizes import format_size, parse_size

DEFAULT_BASE_DIR = "/dev/shm"
BASE_DIR_ENV = "SHMLOADER_SHM_DIR"

AUTO_BUDGET = "auto"
AUTO_CEILING = 1 << 30  # what "auto" takes where the filesystem has room: 1 GiB
AUTO_SHARE = 0.75  # of the free space (of the size, for task sizing), among the machine's ranks
AUTO_FLOOR = 8 << 20  # below this, "auto" finds no usable room and says so


class Space(NamedTuple):
    """Capacity of the filesystem under a base directory, in bytes."""

    total: int
    free: int  # available to unprivileged processes (f_bavail), which is what we can use


def resolve_base_dir(base_dir: str | os.PathLike[str] | None = None) -> str:
    """The base directory: the argument, else ``$SHMLOADER_SHM_DIR``, else ``/dev/shm``."""
    chosen = base_dir if base_dir is not None else os.environ.get(BASE_DIR_ENV) or DEFAULT_BASE_DIR
    path = os.path.abspath(os.fspath(chosen))
    if not os.path.isdir(path):
        source = "base_dir" if base_dir is not None else f"${BASE_DIR_ENV} or the default"
        raise ConfigError(f"shared-memory base directory {path} (from {source}) is not a directory")
    return path


def space(base_dir: str) -> Space:
    st = os.statvfs(base_dir)
    return Space(total=st.f_blocks * st.f_frsize, free=st.f_bavail * st.f_frsize)


def mount_point(path: str) -> str:
    """The filesystem's mount point that holds ``path`` (what ``mount -o remount`` takes)."""
    path = os.path.realpath(path)
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path


def budget_bytes(budget: int | str, base_dir: str | None, environ: Mapping[str, str]) -> int:
    """``shm_budget`` in bytes. ``"auto"`` (the default) is 1 GiB where the shared-memory
    filesystem has room, else three quarters of what it has free, split among the ranks this
    machine runs (``$LOCAL_WORLD_SIZE``, which torchrun and accelerate set): a container's
    64 MB ``/dev/shm`` then holds a dataset of small tasks instead of refusing to start,
    and the quarter left is for what else uses it (torch's DataLoader workers hand batches
    over through it). ShmSpaceError when less than 8 MiB comes out; a task larger than the
    budget is refused when it is read (shm/budget.py), naming both sizes."""
    if budget != AUTO_BUDGET:
        return parse_size(budget, what="shm_budget")
    base = resolve_base_dir(base_dir)
    have = space(base)
    ranks = _local_ranks(environ)
    sized = min(AUTO_CEILING, int(have.free * AUTO_SHARE) // ranks)
    if sized >= AUTO_FLOOR:
        return sized
    on = f" for each of the {ranks} ranks of this machine" if ranks > 1 else ""
    raise ShmSpaceError(
        f"{base} has {format_size(have.free)} free of {format_size(have.total)}: too little "
        f"for shared-memory segments (shm_budget='auto' takes three quarters of what is "
        f"free{on}, at most {format_size(AUTO_CEILING)}, and needs {format_size(AUTO_FLOOR)}). "
        f"Fix one of: {room_fixes(base, have, AUTO_CEILING * ranks)}"
    )


def nominal_budget(budget: int | str, base_dir: str | None, environ: Mapping[str, str]) -> int:
    """What tasks sized from the data are sized for (master/task_size.py): ``shm_budget`` as
    given, and for ``"auto"`` what it comes to on this filesystem when nothing else uses it
    (its size, not what is free): the same on every run on this machine, so that a job's
    tasks, its order and its checkpoints do not move with what other programs hold."""
    if budget != AUTO_BUDGET:
        return parse_size(budget, what="shm_budget")
    total = space(resolve_base_dir(base_dir)).total
    return min(AUTO_CEILING, int(total * AUTO_SHARE) // _local_ranks(environ))


def _local_ranks(environ: Mapping[str, str]) -> int:
    try:
        return max(1, int(environ.get("LOCAL_WORLD_SIZE") or 1))
    except ValueError:
        return 1  # the launcher's own check names a bad value


def check_space(base_dir: str, budget: int) -> Space:
    """Fail now, with the fix spelled out, rather than with SIGBUS or ENOSPC mid-epoch.

    Docker gives containers a 64 MB /dev/shm by default, which is the usual cause.
    """
    have = space(base_dir)
    if budget <= have.free:
        return have
    raise ShmSpaceError(
        f"{base_dir} has {format_size(have.free)} free of {format_size(have.total)}, but "
        f"shm_budget needs {format_size(budget)} ({budget} bytes). Fix one of: "
        f"{room_fixes(base_dir, have, budget)}; or lower shm_budget to at most "
        f"{format_size(have.free)}."
    )


def room_fixes(base_dir: str, have: Space, need: int) -> str:
    """The ways to give ``base_dir`` room for ``need`` bytes beside what others hold there
    (rounded up to whole GiB)."""
    suggest = -(-(have.total - have.free + need) // 1024**3)
    return (
        f"run the container with `docker run --shm-size={suggest}g ...` (Kubernetes: mount an "
        f"emptyDir with medium: Memory at /dev/shm); enlarge it with `sudo mount -o "
        f"remount,size={suggest}G {mount_point(base_dir)}`; point ${BASE_DIR_ENV} at a larger "
        "tmpfs"
    )
