"""Keep a reader's freed buffers for its next task instead of giving them back to the OS.

A reader allocates a task's worth of memory several times per task: file blocks, payloads,
the joined bytes of a ``decode_batch``, contiguous columns. For 4096 records of 12 KB images
that is 50 MiB each time. glibc serves blocks above its mmap threshold (32 MiB at most by
default) with a fresh ``mmap`` and unmaps them on ``free``, so every task faults all those
pages in again, zero-filled by the kernel: for images, faulting dominated a ``decode_batch``
that joins payloads (``benchmarks/bench_reader_steps.py`` measures a reader's steps).

Raising the mmap and trim thresholds sends freed blocks back to the heap, where the next task
reuses them. The price is that a reader stays near its peak resident memory, about one task's
working set (docs/performance.md; ``Stats`` reports every reader's PSS). Only glibc has these
knobs; elsewhere this does nothing.
"""

from __future__ import annotations

import ctypes
import sys

KEEP_BYTES = 256 << 20  # blocks up to this size come from (and go back to) the heap
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_memory(limit: int = KEEP_BYTES) -> bool:
    """Make ``free`` keep blocks up to ``limit`` bytes for reuse; True where it took effect."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # musl's mallopt exists but returns 0: then nothing changed, and we say so.
    return bool(mallopt(_M_MMAP_THRESHOLD, limit)) and bool(mallopt(_M_TRIM_THRESHOLD, limit))
