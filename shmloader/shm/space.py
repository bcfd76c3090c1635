"""Where segments live, and whether that filesystem can hold the budget."""

from __future__ import annotations

import os
from typing import NamedTuple

from ..errors import ConfigError, ShmSpaceError
from .sizes import format_size

DEFAULT_BASE_DIR = "/dev/shm"
BASE_DIR_ENV = "SHMLOADER_SHM_DIR"


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


def check_space(base_dir: str, budget: int) -> Space:
    """Fail now, with the fix spelled out, rather than with SIGBUS or ENOSPC mid-epoch.

    Docker gives containers a 64 MB /dev/shm by default, which is the usual cause.
    """
    have = space(base_dir)
    if budget <= have.free:
        return have
    used = have.total - have.free
    # Enough for what others already hold plus our budget, rounded up to whole GiB.
    gib = 1024**3
    suggest = -(-(used + budget) // gib)
    raise ShmSpaceError(
        f"{base_dir} has {format_size(have.free)} free of {format_size(have.total)}, but "
        f"shm_budget needs {format_size(budget)} ({budget} bytes). Fix one of: run the container "
        f"with `docker run --shm-size={suggest}g ...` (Kubernetes: mount an emptyDir with "
        f"medium: Memory at /dev/shm); enlarge it with `sudo mount -o remount,size={suggest}G "
        f"{mount_point(base_dir)}`; point ${BASE_DIR_ENV} at a larger tmpfs; or lower "
        f"shm_budget to at most {format_size(have.free)}."
    )
