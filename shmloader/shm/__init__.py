"""The shared-memory segment store; the API is described in docs/shm.md."""

from .budget import StopSignal
from .reap import ReapEntry, ReapReport, reap_stale
from .sizes import format_size, parse_size
from .space import BASE_DIR_ENV, DEFAULT_BASE_DIR, Space, check_space, resolve_base_dir, space
from .store import SegmentInfo, SegmentStore, StoreHandle, ipc_file_size

__all__ = [
    "BASE_DIR_ENV",
    "DEFAULT_BASE_DIR",
    "ReapEntry",
    "ReapReport",
    "SegmentInfo",
    "SegmentStore",
    "Space",
    "StopSignal",
    "StoreHandle",
    "check_space",
    "format_size",
    "ipc_file_size",
    "parse_size",
    "reap_stale",
    "resolve_base_dir",
    "space",
]
