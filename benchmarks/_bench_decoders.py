"""Record layouts and decode functions of the data-plane benchmark.

They live in their own small module, not in the benchmark script, because reader processes
unpickle the source and with it these functions: a function of the script's ``__main__`` would
make every reader re-run the script (and import torch, +1.4 s). The benchmark puts this folder
on ``PYTHONPATH`` so readers import this module directly.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from shmloader.formats.payloads import payload_rows


@dataclass(frozen=True)
class Layout:
    """A fixed-size record: ``value`` (``dtype`` of ``shape``) then an int64 label."""

    name: str
    key: str  # column name of the value
    dtype: str
    shape: tuple[int, ...]

    @cached_property
    def count(self) -> int:
        return int(np.prod(self.shape))

    @cached_property
    def value_bytes(self) -> int:
        return self.count * np.dtype(self.dtype).itemsize

    @property
    def record_bytes(self) -> int:
        return self.value_bytes + 8

    def payloads(self, first: int, count: int, seed: int) -> list[bytes]:
        """Records ``first .. first+count``: random values, label = record number."""
        rng = np.random.default_rng([seed, first])
        n = int(np.prod(self.shape))
        if np.dtype(self.dtype).kind == "f":
            values = rng.standard_normal((count, n), dtype=np.float32).astype(self.dtype)
        else:
            values = rng.integers(0, 256, (count, n), dtype=np.uint8).astype(self.dtype)
        labels = np.arange(first, first + count, dtype=np.int64).reshape(count, 1)
        raw = np.concatenate([values.view(np.uint8), labels.view(np.uint8)], axis=1)
        return [row.tobytes() for row in raw]

    def payload_stream(self, first: int, count: int, seed: int) -> Iterator[bytes]:
        """:meth:`payloads` of records ``first .. first+count``, made in pieces (the payloads
        of 40,000 images are half a gigabyte)."""
        for start in range(first, first + count, 8192):
            yield from self.payloads(start, min(8192, first + count - start), seed)

    def decode(self, payload: bytes) -> dict[str, Any]:
        """One record, the way a per-record ``decode`` (or ``__getitem__``) does it."""
        # What a careful user writes: no per-call shape arithmetic, a plain int label.
        value = np.frombuffer(payload, self.dtype, self.count).reshape(self.shape)
        label = int.from_bytes(payload[self.value_bytes :], "little", signed=True)
        return {self.key: value, "label": label}

    def decode_batch(self, payloads: list[bytes]) -> dict[str, np.ndarray]:
        """Many records as columns sliced out of one 2-D array of their payloads.

        ``payload_rows`` joins a plain list of payloads (what (b) reads), one ``frombuffer``
        over the joined bytes; a reader's block of equal-length records it views in place.
        """
        if os.environ.get("SHMLOADER_BENCH_JOIN"):  # the earlier function, for comparison
            raw = np.frombuffer(b"".join(payloads), np.uint8).reshape(len(payloads), -1)
        else:
            raw = payload_rows(payloads)
        values = raw[:, : self.value_bytes].view(self.dtype).reshape(len(payloads), *self.shape)
        labels = raw[:, self.value_bytes :].view(np.int64)[:, 0]
        return {self.key: values, "label": labels}


TABULAR = Layout("tabular", "x", "float32", (64,))
IMAGES = Layout("images", "image", "uint8", (3, 64, 64))
LAYOUTS = {layout.name: layout for layout in (TABULAR, IMAGES)}


# The layouts' bound methods, which torch's (a) and (b) call too: the same call per record on
# both sides. They pickle as (layout, method name), and readers unpickle the layout by
# importing this small module (not the benchmark script).
DECODE: dict[str, Callable[[bytes], Mapping[str, Any]]] = {
    "tabular": TABULAR.decode,
    "images": IMAGES.decode,
}
DECODE_BATCH: dict[str, Callable[[list[bytes]], Mapping[str, Any]]] = {
    "tabular": TABULAR.decode_batch,
    "images": IMAGES.decode_batch,
}
