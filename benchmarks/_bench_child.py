"""Running a benchmark script again as a child process, for one measurement in a fresh one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def run_script_child(script: str, spec: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """``python script --child JSON(spec)``, with this folder on ``PYTHONPATH``.

    Readers unpickle decode functions by module name, so ``_bench_decoders`` must be
    importable in them without loading the script (which multiprocessing's preparation would
    do), and children import the other ``_bench_*`` modules the same way.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, os.path.abspath(script), "--child", json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
