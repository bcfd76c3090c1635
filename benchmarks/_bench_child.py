"""Running a benchmark script again as a child process, for one measurement in a fresh one."""

from __future__ import annotations

import compileall
import functools
import json
import os
import subprocess
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


@functools.cache
def byte_compile() -> bool:
    """Write the bytecode of shmloader and of these benchmarks once, before any child runs.

    An installed package comes byte-compiled (pip does it), but a checkout installed with
    ``pip install -e`` is compiled by the first process that imports it, and not even then
    where ``PYTHONDONTWRITEBYTECODE`` is set (as on our CI machines): every trainer and every
    reader then compiled our ~100 modules again, about 0.09 s of CPU each, all of it at
    start-up, which is what "time to first batch" measures. Returns whether all compiled.
    """
    import shmloader

    package = os.path.dirname(os.path.abspath(shmloader.__file__))
    return all(compileall.compile_dir(d, quiet=1) for d in (package, HERE))


def run_script_child(script: str, spec: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """``python script --child JSON(spec)``, with this folder on ``PYTHONPATH``.

    Readers unpickle decode functions by module name, so ``_bench_decoders`` must be
    importable in them without loading the script (which multiprocessing's preparation would
    do), and children import the other ``_bench_*`` modules the same way.
    """
    byte_compile()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, os.path.abspath(script), "--child", json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
