"""Readers keep freed buffers for their next task (``shmloader/reader/heap.py``).

Measured in a fresh interpreter, where nothing else has moved glibc's thresholds: a 64 MiB
block freed without the setting goes back to the OS (resident memory drops), with it the heap
keeps it for the next allocation.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, sys, psutil
from shmloader.reader.heap import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
me = psutil.Process()
block = bytearray(64 << 20)
block[::4096] = b"x" * len(block[::4096])  # touch every page
held = me.memory_info().rss
del block
print(json.dumps({"applied": applied, "returned": held - me.memory_info().rss}))
"""


def _probe(mode: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True
    ).stdout
    return dict(json.loads(out))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's knobs")
def test_freed_task_buffers_stay_in_the_heap() -> None:
    plain = _probe("plain")
    kept = _probe("keep")
    if kept["applied"] is False:
        pytest.skip("this libc has no mallopt thresholds (not glibc)")
    assert kept["applied"] is True
    assert isinstance(plain["returned"], int) and plain["returned"] > 48 << 20
    assert isinstance(kept["returned"], int) and kept["returned"] < 8 << 20
