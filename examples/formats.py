"""One small dataset in each format shmloader reads, written and then read back
(docs/how-to/formats.md includes its parts).

    python examples/formats.py

For each format it writes 2,000 records into a temporary folder, builds the source, and
reads one epoch through ``shmloader.DataLoader``, checking that every record came once.
"""

from __future__ import annotations

import io
import json
import tarfile
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq

import shmloader

RECORDS = 2_000
FILES = 2


def rows(f: int) -> range:
    """The ids file ``f`` holds: each file its own contiguous run."""
    per_file = RECORDS // FILES
    return range(f * per_file, (f + 1) * per_file)


def features(i: int) -> np.ndarray:
    """Four float32 features that are a function of the id, so a test can check them."""
    return np.arange(4, dtype=np.float32) + i


# --8<-- [start:tfrecord]
def write_tfrecord_examples(folder: Path) -> shmloader.RecordFileSource:
    """TFRecord files of tf.train.Example records, read without TensorFlow."""
    for f in range(FILES):
        shmloader.write_records(
            folder / f"train-{f}.tfrecord",
            (shmloader.encode_example({"id": i, "x": features(i)}) for i in rows(f)),
        )
    # The spec says each feature's shape and type; the batch decoder turns a block of
    # records into numpy columns at once, and its schema tells the source the columns.
    decoder = shmloader.ExampleBatchDecoder(
        {
            "id": shmloader.FixedLenFeature((), "int64"),
            "x": shmloader.FixedLenFeature((4,), "float32"),
        }
    )
    return shmloader.RecordFileSource(
        str(folder / "train-*.tfrecord"), decode_batch=decoder, schema=decoder.schema
    )


# --8<-- [end:tfrecord]


def table(f: int) -> pa.Table:
    """File ``f``'s rows as an Arrow table: an id and a fixed-size list of 4 floats."""
    ids = np.asarray(rows(f), dtype=np.int64)
    x = np.stack([features(i) for i in rows(f)])
    return pa.table({"id": ids, "x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 4)})


# --8<-- [start:parquet]
def write_parquet(folder: Path) -> shmloader.ParquetSource:
    """Parquet files: one shard per file, row counts from the footers."""
    for f in range(FILES):
        pq.write_table(table(f), folder / f"part-{f}.parquet", row_group_size=250)
    return shmloader.ParquetSource(str(folder / "part-*.parquet"), columns=["id", "x"])


# --8<-- [end:parquet]


# --8<-- [start:arrow]
def write_arrow(folder: Path) -> shmloader.ArrowSource:
    """Arrow IPC files (Feather v2); a Hugging Face save_to_disk folder reads the same way."""
    for f in range(FILES):
        feather.write_feather(table(f), str(folder / f"part-{f}.arrow"), chunksize=250)
    return shmloader.ArrowSource(str(folder / "part-*.arrow"))


# --8<-- [end:arrow]


# --8<-- [start:jsonl]
def write_jsonl(folder: Path) -> shmloader.JSONLSource:
    """JSON Lines: one object per line; a sidecar index of line offsets is built on first use."""
    for f in range(FILES):
        with open(folder / f"part-{f}.jsonl", "w") as out:
            for i in rows(f):
                out.write(json.dumps({"id": i, "x": features(i).tolist()}) + "\n")
    return shmloader.JSONLSource(str(folder / "part-*.jsonl"))


# --8<-- [end:jsonl]


# --8<-- [start:csv]
def write_csv(folder: Path) -> shmloader.CSVSource:
    """CSV with a header line; column types are inferred once and pinned for every task."""
    for f in range(FILES):
        with open(folder / f"part-{f}.csv", "w") as out:
            out.write("id,x0,x1,x2,x3\n")
            for i in rows(f):
                out.write(",".join([str(i), *(f"{v:g}" for v in features(i))]) + "\n")
    return shmloader.CSVSource(str(folder / "part-*.csv"))


# --8<-- [end:csv]


# --8<-- [start:webdataset]
def write_webdataset(folder: Path) -> shmloader.WebDatasetSource:
    """WebDataset tar shards: members with the same key (``000042.npy``, ``000042.cls``) form a
    sample; ``decode`` gets ``{"__key__": ..., "npy": bytes, "cls": bytes}``."""
    for f in range(FILES):
        with tarfile.open(folder / f"shard-{f}.tar", "w") as tar:
            for i in rows(f):
                buffer = io.BytesIO()
                np.save(buffer, features(i))
                for field, data in (("npy", buffer.getvalue()), ("cls", str(i).encode())):
                    member = tarfile.TarInfo(f"{i:06d}.{field}")
                    member.size = len(data)
                    tar.addfile(member, io.BytesIO(data))
    return shmloader.WebDatasetSource(str(folder / "shard-*.tar"), decode=decode_sample)


def decode_sample(sample: dict[str, bytes]) -> dict[str, object]:
    """A sample's members as columns; it runs in the reader processes."""
    return {"id": int(sample["cls"]), "x": np.load(io.BytesIO(sample["npy"]))}


# --8<-- [end:webdataset]

WRITERS: dict[str, Callable[[Path], shmloader.Source]] = {
    "tfrecord + tf.train.Example": write_tfrecord_examples,
    "parquet": write_parquet,
    "arrow": write_arrow,
    "jsonl": write_jsonl,
    "csv": write_csv,
    "webdataset": write_webdataset,
}


# --8<-- [start:read]
def read_one_epoch(source: shmloader.Source) -> Counter[int]:
    """Every id the loop saw in one epoch, with how often it saw it."""
    seen: Counter[int] = Counter()
    with shmloader.SharedTaskDataset(source, num_readers=2, records_per_task=250, seed=0) as ds:
        for batch in shmloader.DataLoader(ds, batch_size=128):
            seen.update(batch["id"].tolist())
    return seen


# --8<-- [end:read]


def main() -> None:
    expected = Counter(range(RECORDS))
    for name, write in WRITERS.items():
        with tempfile.TemporaryDirectory() as tmp:
            source = write(Path(tmp))
            seen = read_one_epoch(source)
        print(f"{name}: {sum(seen.values()):,} records, each once: {seen == expected}")


if __name__ == "__main__":
    main()
