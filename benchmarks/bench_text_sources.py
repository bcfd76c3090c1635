"""Records/s of CSVSource, JSONLSource and WebDatasetSource ``read`` on 4096-record ranges.

Run by hand (not a test): ``python benchmarks/bench_text_sources.py [--records N]``.
Files are written first (so reads come from the page cache: this measures CPU) and indexed by
one ``plan()`` whose time is reported separately. Every range is read once per pass; the best
of ``--repeat`` passes is reported.

Records: JSONL ``{"id", "text", "x": 8 floats, "label"}`` (x -> tensor column); CSV ``id,
name, score, label`` + 8 float columns; WebDataset samples with ``cls`` (text int) and ``npy``
(an 8-float32 ``np.save``), read raw (binary columns) and with a decode (``np.load``, ``int``).
"""

from __future__ import annotations

import argparse
import io
import json
import tarfile
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from shmloader.sources.base import BaseSource
from shmloader.sources.csv import CSVSource
from shmloader.sources.jsonl import JSONLSource
from shmloader.sources.webdataset import WebDatasetSource


def wds_decode(sample: dict[str, Any]) -> Mapping[str, Any]:
    return {"x": np.load(io.BytesIO(sample["npy"])), "label": int(sample["cls"])}


def jsonl_keep(obj: dict[str, Any]) -> Mapping[str, Any]:
    return obj


def write_all(tmp: Path, n: int) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 8)).round(5)
    jl = tmp / "d.jsonl"
    with jl.open("w") as f:
        for i in range(n):
            rec = {"id": i, "text": f"row {i}", "x": x[i].tolist(), "label": i % 10}
            f.write(json.dumps(rec) + "\n")
    cs = tmp / "d.csv"
    with cs.open("w") as f:
        f.write("id,name,score,label," + ",".join(f"x{j}" for j in range(8)) + "\n")
        for i in range(n):
            f.write(f"{i},row {i},{x[i, 0]},{i % 10}," + ",".join(map(str, x[i])) + "\n")
    td = tmp / "d.tar"
    with tarfile.open(td, "w") as tar:
        for i in range(n):
            buf = io.BytesIO()
            np.save(buf, x[i].astype(np.float32))
            for ext, data in (("cls", str(i % 10).encode()), ("npy", buf.getvalue())):
                info = tarfile.TarInfo(f"s/{i:08d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return {"jsonl": jl, "csv": cs, "wds": td}


def bench(name: str, source: BaseSource, rng: int, repeat: int) -> None:
    t0 = time.perf_counter()
    shard = source.plan()[0]
    _ = getattr(source, "schema", None)
    setup = time.perf_counter() - t0
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        rows = 0
        for start in range(0, shard.num_records, rng):
            rows += source.read(shard, start, min(start + rng, shard.num_records)).num_rows
        best = min(best, time.perf_counter() - t0)
    assert rows == shard.num_records
    print(f"{name:28s} {rows / best:12,.0f} records/s   (index + schema {setup:.2f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--range", type=int, default=4096, help="records per read")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="shmloader-bench-") as tmp:
        paths = write_all(Path(tmp), args.records)
        r, k = args.range, args.repeat
        bench("JSONLSource", JSONLSource(str(paths["jsonl"])), r, k)
        bench("JSONLSource (decode)", JSONLSource(str(paths["jsonl"]), decode=jsonl_keep), r, k)
        bench("CSVSource", CSVSource(str(paths["csv"])), r, k)
        bench("WebDatasetSource (raw)", WebDatasetSource(str(paths["wds"])), r, k)
        bench(
            "WebDatasetSource (decode)",
            WebDatasetSource(str(paths["wds"]), decode=wds_decode),
            r,
            k,
        )


if __name__ == "__main__":
    main()
