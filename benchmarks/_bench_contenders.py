"""One contender of the data-plane benchmark, run in a fresh process (``bench_dataplane.py
--child SPEC``) so that its memory and CPU are its own: nothing of the parent or of an earlier
contender is in its PSS, and no leftover worker competes for the two cores.

Every loop touches every batch by summing its label column; the sum is also checked against
the labels of the files, so each contender proves it delivered every record once per epoch.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
from _bench_decoders import DECODE, DECODE_BATCH, LAYOUTS, Layout
from _bench_memory import Sampler

RECORDS_PER_TASK = 4096
WINDOW = 8  # the sampler's default shuffle window (tasks)
Spec = dict[str, Any]


def _epochs(
    spec: Spec, batches: Callable[[int], Iterable[Any]], sampler: Sampler | None
) -> list[dict[str, Any]]:
    """Runs ``spec["epochs"]`` epochs of ``batches(epoch)``; times and checks each."""
    out = []
    for epoch in range(spec["epochs"]):
        rows = total = 0
        t0 = time.perf_counter()
        for batch in batches(epoch):
            labels = batch["label"]
            total += int(labels.sum())
            rows += len(labels)
        seconds = time.perf_counter() - t0
        _check(spec, epoch, rows, total)
        entry: dict[str, Any] = {"rows": rows, "seconds": seconds}
        if sampler is not None:
            entry["pss"], entry["cpu"] = sampler.mark()
        out.append(entry)
    return out


def _imports_torch(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "libtorch" in f.read()
    except OSError:
        return False


def run_loader(spec: Spec) -> dict[str, Any]:
    """(a)-(d): a torch DataLoader over a plain Dataset or a SharedTaskDataset."""
    import torch.utils.data

    layout = LAYOUTS[spec["dataset"]]
    kind = spec["contender"]
    t0 = time.perf_counter()
    ds: Any
    if kind in ("a", "b"):
        from _bench_baselines import BatchRecordDataset, RecordDataset, identity

        ds = (RecordDataset if kind == "a" else BatchRecordDataset)(spec["paths"], layout)
        dl = torch.utils.data.DataLoader(
            ds,
            batch_size=spec["batch"],
            shuffle=True,
            num_workers=spec["workers"],
            persistent_workers=spec["workers"] > 0,
            collate_fn=None if kind == "a" else identity,
            generator=torch.Generator().manual_seed(spec["seed"]),
        )
        shm_dir = None
    else:
        import shmloader

        fns = DECODE if kind == "c" else DECODE_BATCH
        key = "decode" if kind == "c" else "decode_batch"
        src = shmloader.RecordFileSource(
            spec["paths"], **{key: fns[spec["dataset"]]}, views=spec.get("views", False)
        )
        src.schema  # noqa: B018 - inferred once here instead of once per reader
        ds = shmloader.SharedTaskDataset(
            src,
            num_readers=spec["readers"],
            records_per_task=RECORDS_PER_TASK,
            shuffle=True,
            seed=spec["seed"],
            shm_budget=spec["budget"],
            epochs=None,
        )
        if spec.get("loader") == "torch":  # the plain torch DataLoader, as the issue shows
            dl = torch.utils.data.DataLoader(
                ds,
                batch_size=spec["batch"],
                sampler=ds.sampler(),
                collate_fn=ds.collate,
                num_workers=spec["workers"],
                persistent_workers=spec["workers"] > 0,
            )
        elif spec.get("loader") == "torch-batches":  # deliveries reported by its requests
            dl = torch.utils.data.DataLoader(
                ds,
                batch_sampler=ds.batch_sampler(spec["batch"]),
                collate_fn=ds.collate,
                num_workers=spec["workers"],
                persistent_workers=spec["workers"] > 0,
            )
        else:  # ours: hands sorted index arrays to __getitems__, completes on delivery
            dl = shmloader.DataLoader(
                ds,
                batch_size=spec["batch"],
                num_workers=spec["workers"],
                persistent_workers=spec["workers"] > 0,
            )
        shm_dir = ds._store.path if ds._store is not None else None
    sampler = Sampler(shm_dir=shm_dir).start()
    first: dict[str, Any] = {}

    def batches(epoch: int) -> Iterator[Any]:
        for batch in dl:
            if not first:
                first["ttfb"] = time.perf_counter() - t0
            yield batch

    try:
        epochs = _epochs(spec, batches, sampler)
        extra: dict[str, Any] = {}
        if kind in ("c", "d"):
            pids = ds.runtime.pool.pids()
            extra["readers_import_torch"] = any(_imports_torch(p) for p in pids)
    finally:
        sampler.stop()
        if kind in ("c", "d"):
            ds.close()
    return {"ttfb": first["ttfb"], "epochs": epochs, **extra}


def load_arrays(spec: Spec) -> dict[str, np.ndarray]:
    """The whole dataset decoded into one in-memory array per column."""
    from shmloader.formats.tfrecord import read_records

    layout: Layout = LAYOUTS[spec["dataset"]]
    parts = [layout.decode_batch(list(read_records(p))) for p in spec["paths"]]
    return {k: np.ascontiguousarray(np.concatenate([p[k] for p in parts])) for k in parts[0]}


def run_ceiling(spec: Spec) -> dict[str, Any]:
    """(e): ``numpy.take`` of the same shuffled rows from in-memory arrays, one core.

    ``spec["how"] == "sorted"`` sorts each batch's indices first, as shmloader.DataLoader does
    (same rows per batch, read in address order), for a ceiling on equal terms.
    """
    arrays = load_arrays(spec)
    n, b = spec["records"], spec["batch"]
    rng = np.random.default_rng(spec["seed"])
    ordered = spec.get("how") == "sorted"
    # Index lists are made before the clock starts: only the takes are timed.
    plans = []
    for _ in range(spec["epochs"]):
        perm = rng.permutation(n)
        chunks = [perm[i : i + b] for i in range(0, n, b)]
        plans.append([np.sort(c) for c in chunks] if ordered else chunks)

    def batches(epoch: int) -> Iterator[dict[str, np.ndarray]]:
        for idx in plans[epoch]:
            yield {k: np.take(v, idx, axis=0) for k, v in arrays.items()}

    return {"epochs": _epochs(spec, batches, None)}


def run_gather(spec: Spec) -> dict[str, Any]:
    """The gather alone: decoded rows already in shared-memory segments, gathered into
    batches in this one process, as a DataLoader worker does.

    Each epoch writes the segments first (untimed), then gathers window by window in the
    sampler's order and releases a window's segments once it is consumed, as the trainer does
    (so the worker's view cache holds what it holds in a real run). ``spec["how"]`` is
    ``"Gatherer"`` (what ``__getitems__`` runs in a plain DataLoader's worker: gather + ledger
    + cache upkeep), ``"Gatherer-noledger"`` (the same without the ledger, as in the workers of
    ``shmloader.DataLoader``), ``"gather"``
    (the copy alone, segments opened and first touched as it goes) or ``"warm"`` (the copy
    alone from segments opened and touched before the clock starts: no mapping costs).
    """
    from shmloader.dataset.accounting.plane import slot_name
    from shmloader.dataset.core.indices import encode_indices
    from shmloader.dataset.core.receipts import Receipt
    from shmloader.dataset.gather.gather import gather
    from shmloader.dataset.gather.gatherer import Gatherer
    from shmloader.dataset.order.blocks import block_permutation
    from shmloader.shm.store import SegmentStore
    from shmloader.sources.records import RecordFileSource

    src = RecordFileSource(spec["paths"], decode_batch=DECODE_BATCH[spec["dataset"]])
    segments = [
        src.read(shard, a, min(a + RECORDS_PER_TASK, shard.num_records))
        for shard in src.plan()
        for a in range(0, shard.num_records, RECORDS_PER_TASK)
    ]
    store = SegmentStore.create(spec["budget"])
    handle = store.handle()
    gatherer = Gatherer(handle, list(segments[0].schema.names))
    # As in shmloader.DataLoader's workers, which write no ledger for the batches of its loop.
    receipt = Receipt.LOOP if spec["how"] == "Gatherer-noledger" else Receipt.GATHER
    copy = (
        functools.partial(gatherer.gather, receipt=receipt)
        if spec["how"].startswith("Gatherer")
        else None
    )
    out = []
    try:
        for epoch in range(spec["epochs"]):
            slots: list[tuple[int, int]] = []
            for batch in segments:
                slot = epoch * len(segments) + len(slots)
                info = handle.write(batch)
                assert info is not None  # None only when told to stop waiting
                handle.rename(info.name, slot_name(slot))
                slots.append((slot, batch.num_rows))
            if spec["how"] == "warm":  # segments mapped and every page touched beforehand
                for slot, _n in slots:
                    for view in gatherer.views(slot).values():
                        if view.dense is not None:
                            view.dense.sum()
            # The sampler's work (shuffled windows, cut into batches, each sorted: what
            # shmloader.DataLoader hands over) is done before the clock starts.
            plan = []
            for w in range(0, len(slots), WINDOW):
                block = slots[w : w + WINDOW]
                idx = np.concatenate([encode_indices(s, np.arange(n)) for s, n in block])
                idx = idx[block_permutation(spec["seed"], epoch, w, len(idx))]
                chunks = [
                    np.sort(idx[i : i + spec["batch"]]) for i in range(0, len(idx), spec["batch"])
                ]
                plan.append((block, chunks))
            rows = total = 0
            t0 = time.perf_counter()
            for block, chunks in plan:
                for chunk in chunks:
                    if copy is not None:
                        batch_out = copy(chunk)
                    else:
                        batch_out = gather(gatherer.views, chunk, gatherer.columns, gatherer.region)
                    labels: Any = batch_out["label"]
                    total += int(labels.sum())
                    rows += len(labels)
                for s, _n in block:
                    handle.release(slot_name(s))
            seconds = time.perf_counter() - t0
            _check(spec, epoch, rows, total)
            out.append({"rows": rows, "seconds": seconds})
    finally:
        store.close()
    return {"epochs": out}


def _check(spec: Spec, epoch: int, rows: int, total: int) -> None:
    if rows != spec["records"] or total != spec["label_sum"]:
        raise RuntimeError(
            f"epoch {epoch}: got {rows} rows (label sum {total}), expected "
            f"{spec['records']} (label sum {spec['label_sum']})"
        )


RUNNERS: dict[str, Callable[[Spec], dict[str, Any]]] = {
    "a": run_loader,
    "b": run_loader,
    "c": run_loader,
    "d": run_loader,
    "e": run_ceiling,
    "gather": run_gather,
}


def run(spec: Spec) -> dict[str, Any]:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    return RUNNERS[spec["contender"]](spec)
