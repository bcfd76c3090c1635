"""The plain-PyTorch contenders of the data-plane benchmark: what one writes without shmloader.

Both read the same TFRecord files by record number, through the offsets of shmloader's sidecar
index (``RecordFile.offsets``), from a read-only ``mmap`` of each file (opened lazily in each
process, so forked workers get their own). Neither checks CRCs: a typical hand-written dataset
does not, which only flatters them.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np
import torch
import torch.utils.data
from _bench_decoders import Layout

from shmloader.formats.tfrecord import RecordFile

HEADER = 12  # TFRecord: uint64 length + uint32 masked CRC of the length, then the payload
FOOTER = 4  # uint32 masked CRC of the payload


class RecordDataset(torch.utils.data.Dataset[dict[str, Any]]):
    """(a) One record read and decoded per ``__getitem__``; torch's default collate stacks."""

    def __init__(self, paths: list[str], layout: Layout) -> None:
        self.paths = paths
        self.layout = layout
        starts: list[np.ndarray] = []
        sizes: list[np.ndarray] = []
        files: list[np.ndarray] = []
        for i, path in enumerate(paths):
            offsets = RecordFile(path).offsets.astype(np.int64)
            starts.append(offsets[:-1] + HEADER)
            sizes.append(np.diff(offsets) - HEADER - FOOTER)
            files.append(np.full(len(offsets) - 1, i, dtype=np.int32))
        # numpy arrays, not lists of ints: no per-record Python objects for workers to copy
        self.starts = np.concatenate(starts)
        self.sizes = np.concatenate(sizes)
        self.files = np.concatenate(files)
        self._maps: dict[int, mmap.mmap] = {}
        self._pid = -1

    def __len__(self) -> int:
        return len(self.starts)

    def _map(self, file: int) -> mmap.mmap:
        if self._pid != os.getpid():  # a forked worker maps the files itself
            self._maps, self._pid = {}, os.getpid()
        m = self._maps.get(file)
        if m is None:
            with open(self.paths[file], "rb") as f:
                m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._maps[file] = m
        return m

    def payload(self, i: int) -> bytes:
        start = int(self.starts[i])
        return self._map(int(self.files[i]))[start : start + int(self.sizes[i])]

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.layout.decode(self.payload(i))


class BatchRecordDataset(RecordDataset):
    """(b) ``__getitems__`` reads a whole batch and decodes it with one ``frombuffer``."""

    def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        columns = self.layout.decode_batch([self.payload(i) for i in indices])
        # ascontiguousarray: the views of the joined bytes are read-only and strided
        return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in columns.items()}


def identity(batch: Any) -> Any:
    """Collate for ``__getitems__`` datasets that already return a batch (picklable)."""
    return batch
