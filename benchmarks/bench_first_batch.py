"""Time to the first batch by where ``decode`` is defined: an importable module, or the script.

Run by hand (not a test), from the repository root:
``python benchmarks/bench_first_batch.py [--rounds 7] [--records 20000] [--readers 2]``.

A decode function of an importable module reaches the readers by reference (they import the
module); one defined in the training script itself goes by value (cloudpickle,
``shmloader/reader/by_value.py``). Each round starts a fresh training process per placement,
alternating, so both see the same machine state; the process times from just before
``SharedTaskDataset(...)`` to the first batch in the loop (torch and shmloader imported
before). Readers start with the dataset, so
this covers their start-up, the configuration they are sent and their first task. Prints the
median and the range over the rounds, in seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

MODULE = """
import numpy as np

def decode(payload):
    x = np.frombuffer(payload, dtype="<f4", count=16)
    return {"x": x, "label": int(x[0])}
"""

# The script: decode either imported from the module above, or defined right here.
SCRIPT = """
import sys, time
import numpy as np
import torch  # a training script has it already: its import is not the loader's time
import shmloader

if sys.argv[1] == "module":
    from bench_decode_module import decode
else:
    def decode(payload):
        x = np.frombuffer(payload, dtype="<f4", count=16)
        return {{"x": x, "label": int(x[0])}}

if __name__ == "__main__":
    shmloader.SharedTaskDataset  # imported before the clock starts, as torch is
    t0 = time.perf_counter()
    src = shmloader.RecordFileSource({data!r}, decode=decode)
    with shmloader.SharedTaskDataset(src, num_readers={readers}, records_per_task=4096,
                                     epochs=1, shm_budget="256MiB") as ds:
        for batch in shmloader.DataLoader(ds, batch_size=256):
            print(f"FIRST {{time.perf_counter() - t0:.4f}}", flush=True)
            break
"""

PLACEMENTS = ("module", "script")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--readers", type=int, default=2)
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    import numpy as np

    import shmloader

    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data.tfrecord")
        rng = np.random.default_rng(0)
        shmloader.write_records(
            data, (rng.random(16, dtype=np.float32).tobytes() for _ in range(args.records))
        )
        with open(os.path.join(tmp, "bench_decode_module.py"), "w") as f:
            f.write(textwrap.dedent(MODULE))
        script = os.path.join(tmp, "train.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent(SCRIPT.format(data=data, readers=args.readers)))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, tmp])}
        times: dict[str, list[float]] = {p: [] for p in PLACEMENTS}
        for _ in range(args.rounds):
            for placement in PLACEMENTS:
                out = subprocess.run(
                    [sys.executable, script, placement],
                    env=env,
                    cwd=tmp,
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                times[placement].append(float(out.split("FIRST ")[1].split()[0]))
    print(f"first batch, {args.rounds} rounds, {args.readers} readers (seconds)")
    for placement, seen in times.items():
        print(
            f"  decode in the {placement:<6}: median {statistics.median(seen):.3f}  "
            f"range {min(seen):.3f}-{max(seen):.3f}"
        )


if __name__ == "__main__":
    main()
