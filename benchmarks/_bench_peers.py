"""The contenders of ``peers.py``: each library's writer for the generated records, and its
loader configured as its own documentation shows, over ``num_workers`` data processes.

Every contender reads the same records (``_bench_decoders.Layout``: a value array and an
int64 label, packed in one payload) stored in its library's own format, and decodes them
with the same per-record ``Layout.decode`` (or ``decode_batch`` where a library takes a batch
at once): the libraries differ in how they store, shuffle, move and batch records, not in the
decode. Loaders are made in the child process that measures them (``peers.py --child``).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from _bench_decoders import DECODE, DECODE_BATCH, Layout

# shmloader's tasks: its default (None: sized from the data), or a fixed count where a
# contender's name ends in "tasks of N" (4096: the fixed default of shmloader 0.1).
RECORDS_PER_TASK: int | None = None
SHUFFLE_BUFFER = 1000  # webdataset's sample shuffle buffer, as its docs show

Batches = Callable[[], Iterable[Any]]  # one epoch's batches, each a dict with "label"


@dataclass(frozen=True)
class Job:
    """What a contender is run on: ``files`` were written by its ``write`` beforehand."""

    layout: Layout
    files: str  # the folder of this contender's files
    records: int
    batch: int
    workers: int
    seed: int
    shm_budget: str | None = None  # shmloader's; None: SharedTaskDataset's default


def stack(rows: Sequence[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Per-record dicts into one batch of numpy arrays (the collate of libraries that have
    none of their own for dicts)."""
    return {key: np.stack([row[key] for row in rows]) for key in rows[0]}


@dataclass(frozen=True)
class DecodePayload:
    """A stored sample, ``{key: payload bytes}``, to the decoded record; picklable."""

    layout: Layout
    key: str = "payload"

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        return self.layout.decode(sample[self.key])


@dataclass(frozen=True)
class DecodeRows:
    """A batch of ``{"payload": bytes}`` rows, decoded and stacked (a DataLoader collate)."""

    layout: Layout

    def __call__(self, rows: Sequence[dict[str, Any]]) -> dict[str, np.ndarray]:
        return stack([self.layout.decode(row["payload"]) for row in rows])


def _torch_loader(dataset: Any, job: Job, **kwargs: Any) -> Batches:
    import torch.utils.data

    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=job.batch,
        shuffle=True,
        num_workers=job.workers,
        persistent_workers=job.workers > 0,
        generator=torch.Generator().manual_seed(job.seed),
        **kwargs,
    )
    return lambda: loader


# -- torch, one record per __getitem__ (TFRecord files, read by record number) -----------------
def write_tfrecord(job: Job) -> None:
    from shmloader.formats.tfrecord import write_records

    write_records(
        os.path.join(job.files, "data.tfrecord"), job.layout.payload_stream(0, job.records, 0)
    )


def torch_per_sample(job: Job) -> Batches:
    from _bench_baselines import RecordDataset

    return _torch_loader(RecordDataset([os.path.join(job.files, "data.tfrecord")], job.layout), job)


# -- torch, a vectorised __getitems__ over a fixed-stride file -----------------------------------
def write_fixed_stride(job: Job) -> None:
    with open(os.path.join(job.files, "rows.bin"), "wb") as f:
        for payload in job.layout.payload_stream(0, job.records, 0):
            f.write(payload)


class FixedStrideRows:
    """A map-style Dataset whose ``__getitems__`` takes a whole batch of fixed-size records
    from a ``np.memmap`` with one fancy index and slices the columns out: the careful
    hand-written loader for records of one size."""

    def __init__(self, path: str, layout: Layout, records: int) -> None:
        self.path, self.layout, self.records = path, layout, records
        self._rows: np.memmap | None = None

    def __len__(self) -> int:
        return self.records

    def __getitems__(self, indices: list[int]) -> dict[str, Any]:
        import torch

        if self._rows is None:  # mapped in the worker that reads
            shape = (self.records, self.layout.record_bytes)
            self._rows = np.memmap(self.path, dtype=np.uint8, mode="r", shape=shape)
        raw = self._rows[np.sort(np.asarray(indices))]
        layout = self.layout
        values = raw[:, : layout.value_bytes].view(layout.dtype).reshape(-1, *layout.shape)
        labels = raw[:, layout.value_bytes :].view(np.int64)[:, 0]
        return {layout.key: torch.from_numpy(values), "label": torch.from_numpy(labels)}


def torch_vectorised(job: Job) -> Batches:
    from _bench_baselines import identity

    rows = FixedStrideRows(os.path.join(job.files, "rows.bin"), job.layout, job.records)
    return _torch_loader(rows, job, collate_fn=identity)


def torch_vectorised_in_the_loop(job: Job) -> Batches:
    """The same without workers: each batch is taken in the training loop's own process,
    which for large batches beats handing them over from workers (torch moves every batch
    through a new shared-memory file)."""
    return torch_vectorised(replace(job, workers=0))


# -- Mosaic streaming: MDS shards, StreamingDataset in a torch DataLoader ------------------------
def write_mds(job: Job) -> None:
    from streaming import MDSWriter

    with MDSWriter(out=job.files, columns={"payload": "bytes"}, size_limit="64mb") as out:
        for payload in job.layout.payload_stream(0, job.records, 0):
            out.write({"payload": payload})


def mosaic_streaming(job: Job) -> Batches:
    import torch.utils.data
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    class Decoded(StreamingDataset):  # Mosaic's docs: subclass and decode in __getitem__
        def __getitem__(self, index: int) -> dict[str, Any]:
            return job.layout.decode(super().__getitem__(index)["payload"])

    clean_stale_shared_memory()
    dataset = Decoded(local=job.files, shuffle=True, shuffle_seed=job.seed, batch_size=job.batch)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=job.batch, num_workers=job.workers, persistent_workers=True
    )
    return lambda: loader


# -- LitData: optimize() into chunks, StreamingDataset + StreamingDataLoader ---------------------
def litdata_samples(piece: tuple[str, int, int]) -> Iterator[dict[str, bytes]]:
    """One piece of the records for ``litdata.optimize`` (runs in its worker processes)."""
    from _bench_decoders import LAYOUTS

    name, first, count = piece
    for payload in LAYOUTS[name].payloads(first, count, 0):
        yield {"payload": payload}


def write_litdata(job: Job) -> None:
    import litdata

    pieces = [
        (job.layout.name, first, min(8192, job.records - first))
        for first in range(0, job.records, 8192)
    ]
    litdata.optimize(
        fn=litdata_samples,
        inputs=pieces,
        output_dir=job.files,
        chunk_bytes="64MB",
        num_workers=1,
        keep_data_ordered=True,
        verbose=False,
    )


def litdata_loader(job: Job) -> Batches:
    import litdata

    dataset = litdata.StreamingDataset(
        job.files, shuffle=True, seed=job.seed, transform=DecodePayload(job.layout)
    )
    loader = litdata.StreamingDataLoader(
        dataset, batch_size=job.batch, num_workers=job.workers, persistent_workers=True
    )
    return lambda: loader


# -- webdataset: tar shards, WebDataset pipeline, batched in the workers, WebLoader ------------
SHARDS = 4  # a multiple of the workers: each worker reads whole shards


def write_webdataset(job: Job) -> None:
    import webdataset as wds

    per_shard = -(-job.records // SHARDS)
    pattern = os.path.join(job.files, "shard-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=per_shard, verbose=0) as sink:
        for i, payload in enumerate(job.layout.payload_stream(0, job.records, 0)):
            sink.write({"__key__": f"{i:09d}", "bin": payload})


def webdataset_loader(job: Job) -> Batches:
    import webdataset as wds

    urls = sorted(glob.glob(os.path.join(job.files, "shard-*.tar")))
    dataset = (
        wds.WebDataset(urls, shardshuffle=len(urls), seed=job.seed, empty_check=False)
        .shuffle(SHUFFLE_BUFFER)
        .map(DecodePayload(job.layout, key="bin"))
        .batched(job.batch, collation_fn=stack)
    )
    loader = wds.WebLoader(
        dataset, batch_size=None, num_workers=job.workers, persistent_workers=True
    )
    return lambda: loader


# -- Hugging Face datasets: an Arrow dataset on disk in a torch DataLoader -----------------------
def write_hf(job: Job) -> None:
    import datasets

    def rows() -> Iterator[dict[str, bytes]]:
        for payload in job.layout.payload_stream(0, job.records, 0):
            yield {"payload": payload}

    datasets.Dataset.from_generator(rows).save_to_disk(job.files)


def hf_datasets(job: Job) -> Batches:
    import datasets

    dataset = datasets.load_from_disk(job.files)  # memory-mapped Arrow files
    return _torch_loader(dataset, job, collate_fn=DecodeRows(job.layout))


# -- Grain: ArrayRecord files, IndexSampler, operations, worker processes ------------------------
def write_array_record(job: Job) -> None:
    from array_record.python.array_record_module import ArrayRecordWriter

    writer = ArrayRecordWriter(os.path.join(job.files, "data.array_record"), "group_size:1")
    for payload in job.layout.payload_stream(0, job.records, 0):
        writer.write(payload)
    writer.close()


def grain_loader(job: Job) -> Batches:
    import grain.python as grain
    from _bench_grain import Decode

    source = grain.ArrayRecordDataSource([os.path.join(job.files, "data.array_record")])
    sampler = grain.IndexSampler(
        num_records=len(source),
        shard_options=grain.NoSharding(),
        shuffle=True,
        num_epochs=None,  # one iterator over every epoch: a new one would start workers again
        seed=job.seed,
    )
    loader = grain.DataLoader(
        data_source=source,
        sampler=sampler,
        operations=[Decode(job.layout), grain.Batch(job.batch)],
        worker_count=job.workers,
    )
    batches = iter(loader)
    per_epoch = job.records // job.batch  # records are a multiple of the batch (peers.py)
    return lambda: (next(batches) for _ in range(per_epoch))


# -- shmloader: the same TFRecord files, readers in shared memory, shmloader.DataLoader ----------
def shmloader_loader(
    job: Job, batch_decode: bool, cache: bool = False, records_per_task: int | None = None
) -> tuple[Batches, Any]:
    """shmloader over the TFRecord files; ``cache``: decoded tasks kept across epochs;
    ``records_per_task``: None for the default."""
    import shmloader

    name = job.layout.name
    decode = {"decode_batch": DECODE_BATCH[name]} if batch_decode else {"decode": DECODE[name]}
    source = shmloader.RecordFileSource(os.path.join(job.files, "data.tfrecord"), **decode)
    dataset = shmloader.SharedTaskDataset(
        source,
        num_readers=job.workers,
        records_per_task=records_per_task or RECORDS_PER_TASK,
        seed=job.seed,
        epochs=None,
        cache=cache,
        **({"shm_budget": job.shm_budget} if job.shm_budget else {}),
    )
    loader = shmloader.DataLoader(dataset, batch_size=job.batch)
    return (lambda: loader), dataset


@dataclass(frozen=True)
class Contender:
    name: str
    write: Callable[[Job], None]
    files: str  # the folder its files are written to (shared by contenders of one format)
    peer: bool  # a library a user would pick instead (not a hand-written Dataset, not ours)


CONTENDERS = [
    Contender("torch per sample", write_tfrecord, "tfrecord", False),
    Contender("torch vectorised", write_fixed_stride, "fixed", False),
    Contender("torch vectorised, no workers", write_fixed_stride, "fixed", False),
    Contender("Mosaic streaming", write_mds, "mds", True),
    Contender("LitData", write_litdata, "litdata", True),
    Contender("webdataset", write_webdataset, "wds", True),
    Contender("HF datasets", write_hf, "hf", True),
    Contender("Grain", write_array_record, "array_record", True),
    Contender("shmloader decode", write_tfrecord, "tfrecord", False),
    Contender("shmloader decode_batch", write_tfrecord, "tfrecord", False),
    Contender("shmloader decode, cache", write_tfrecord, "tfrecord", False),
    Contender("shmloader decode_batch, cache", write_tfrecord, "tfrecord", False),
    Contender("shmloader decode, tasks of 4096", write_tfrecord, "tfrecord", False),
    Contender("shmloader decode_batch, tasks of 4096", write_tfrecord, "tfrecord", False),
    Contender("shmloader decode_batch, cache, tasks of 4096", write_tfrecord, "tfrecord", False),
]
LOADERS: dict[str, Callable[[Job], Batches]] = {
    "torch per sample": torch_per_sample,
    "torch vectorised": torch_vectorised,
    "torch vectorised, no workers": torch_vectorised_in_the_loop,
    "Mosaic streaming": mosaic_streaming,
    "LitData": litdata_loader,
    "webdataset": webdataset_loader,
    "HF datasets": hf_datasets,
    "Grain": grain_loader,
}
