"""Names of store directories and segments, and whether the process that owns one is alive.

A name carries its owner's identity ``(pid, start token)`` so that any later process, with no
registry and no daemon, can decide from the name alone whether the owner is gone:

- dataset directory: ``shmloader-<owner pid>-<owner start>-<random>`` (in the base directory);
- segment being written: ``tmp-<writer pid>-<writer start>-<random>`` (inside the dataset);
- sealed segment: ``seg-<random>`` (belongs to the dataset owner, whoever wrote it);
- spare: ``spare-<when><random>``, a released segment kept for a writer to reuse (the owner's
  too); ``<when>`` (16 hex digits of the monotonic clock) makes names sort by release time.

The start token guards against pid reuse. On Linux it is the process start time in clock ticks
since boot (``/proc/<pid>/stat`` field 22): exact and identical for every reader. psutil's
``create_time()`` is derived from the same ticks plus a boot time that the kernel recomputes on
each read and that can move by a second after clock adjustments, so two processes could disagree
about it; elsewhere we fall back to it, in centiseconds.
"""

from __future__ import annotations

import os
import re
import secrets
import sys
import time
import uuid

PREFIX = "shmloader"
LOCK_NAME = ".lock"
SEGMENT_PREFIX = "seg-"
SPARE_PREFIX = "spare-"
CACHED_PREFIX = "cached-"

_DATASET_RE = re.compile(rf"^{PREFIX}-(\d+)-(\d+)-([0-9a-f]+)$")
_TEMP_RE = re.compile(r"^tmp-(\d+)-(\d+)-([0-9a-f]+)$")
_SEGMENT_RE = re.compile(r"^seg-[0-9a-f]{32}$")
_CACHE_KEY_RE = re.compile(r"^[0-9a-f]{32}$")

_self_identity: tuple[int, int] | None = None


def start_token(pid: int) -> int | None:
    """The start token of a running process ``pid``; None if none runs (zombies count as gone)."""
    if sys.platform.startswith("linux"):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except (FileNotFoundError, ProcessLookupError):
            return None
        # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
        fields = stat[stat.rindex(b")") + 2 :].split()
        state, ticks = fields[0], fields[19]
        if state in (b"Z", b"X", b"x"):
            return None
        return int(ticks)
    import psutil  # only here: a reader imports this module, and psutil is slow to import

    try:
        proc = psutil.Process(pid)
        if proc.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            return None
        return round(proc.create_time() * 100)
    except psutil.NoSuchProcess:
        return None


def self_identity() -> tuple[int, int]:
    """``(pid, start token)`` of this process; recomputed after a fork."""
    global _self_identity
    pid = os.getpid()
    if _self_identity is None or _self_identity[0] != pid:
        token = start_token(pid)
        if token is None:  # pragma: no cover - we are running, so /proc/self exists
            raise RuntimeError(f"cannot read the start time of this process (pid {pid})")
        _self_identity = (pid, token)
    return _self_identity


def is_alive(pid: int, token: int) -> bool:
    """Whether the process that had identity ``(pid, token)`` still runs."""
    return start_token(pid) == token


def new_dataset_name() -> str:
    pid, token = self_identity()
    return f"{PREFIX}-{pid}-{token}-{secrets.token_hex(4)}"


def new_temp_name() -> str:
    pid, token = self_identity()
    return f"tmp-{pid}-{token}-{secrets.token_hex(8)}"


def new_segment_name() -> str:
    return f"{SEGMENT_PREFIX}{uuid.uuid4().hex}"


def new_spare_name() -> str:
    # Fixed width, so that names sort as the release times do (see budget._take_room).
    return f"{SPARE_PREFIX}{time.monotonic_ns():016x}{uuid.uuid4().hex}"


def parse_dataset_name(name: str) -> tuple[int, int] | None:
    """Owner ``(pid, token)`` of a dataset directory name; None if it is not one of ours."""
    m = _DATASET_RE.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def parse_temp_name(name: str) -> tuple[int, int] | None:
    """Writer ``(pid, token)`` of an unsealed segment name; None for any other name."""
    m = _TEMP_RE.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def is_segment_name(name: str) -> bool:
    """Whether ``name`` is a sealed segment name (and so safe to join to a directory)."""
    return _SEGMENT_RE.match(name) is not None


def is_cache_key(key: str) -> bool:
    """Whether ``key`` names a cached segment (32 hex digits, so safe to join to a name)."""
    return _CACHE_KEY_RE.match(key) is not None


def cached_name(key: str) -> str:
    """The file name a segment cached under ``key`` has in its store."""
    if not is_cache_key(key):
        raise ValueError(f"{key!r} is not a cache key (expected 32 hex digits)")
    return f"{CACHED_PREFIX}{key}"
