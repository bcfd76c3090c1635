"""The gather ledger: how DataLoader workers report to the trainer which rows they have copied out.

A segment may be released only when no batch can still read it, but batches are gathered in
worker processes the trainer does not control (a plain ``torch.utils.data.DataLoader`` under any
start method). So every process that gathers appends the sample indices it copied to files of
its own in the dataset's shared-memory folder; the trainer reads the new bytes. One writer per
file means no locks and nothing a SIGKILL can leave held. A writer moves to a new file every
``ROTATE_BYTES`` so the trainer can delete what it has read: the ledger stays small however long
training runs.

An index is written as is when the row counts as consumed once gathered (a plain DataLoader's
gather), negated when it counts only once the loop receives it (``consumed=False``: a batch
whose delivery the DataLoader's requests report, delivery.py). Sample indices are at least
``2**32``, so the sign is free.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import numpy as np

FOLDER = "ledger"
ROTATE_BYTES = 1 << 20
_NAME = re.compile(r"^(\d+)-(\d+)$")


def ledger_dir(store_path: str) -> str:
    return os.path.join(store_path, FOLDER)


class LedgerWriter:
    """Appends gathered indices; each process (also a forked one) writes files of its own."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._fd = -1
        self._pid = -1
        self._part = 0
        self._written = 0

    def record(self, indices: np.ndarray, *, consumed: bool = True) -> None:
        pid = os.getpid()
        if not consumed:
            indices = np.negative(indices, dtype=np.int64)
        if self._pid != pid or self._written >= ROTATE_BYTES:
            self._open_next(pid)
        view = np.ascontiguousarray(indices, dtype="<i8").data.cast("B")  # no copy
        self._written += len(view)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]

    def _open_next(self, pid: int) -> None:
        if self._pid == pid and self._fd >= 0:
            os.close(self._fd)
            self._part += 1
        else:
            # A forked child must not share its parent's file (two writers, one offset).
            self._part = 0
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, f"{pid}-{self._part}")
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._pid = pid
        self._written = 0

    def __getstate__(self) -> dict[str, object]:
        return {"directory": self.directory, "_fd": -1, "_pid": -1, "_part": 0, "_written": 0}

    def close(self) -> None:
        if self._fd >= 0 and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = -1
        self._pid = -1


@dataclass
class LedgerReader:
    """Reads what every writer appended since the last ``poll``; deletes finished files."""

    directory: str
    _offsets: dict[str, int] = field(default_factory=dict)

    def poll(self) -> np.ndarray:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return np.empty(0, dtype=np.int64)
        files: dict[int, list[int]] = {}
        for name in names:
            m = _NAME.match(name)
            if m:
                files.setdefault(int(m.group(1)), []).append(int(m.group(2)))
        chunks: list[np.ndarray] = []
        for pid, parts in files.items():
            parts.sort()
            for i, part in enumerate(parts):
                name = f"{pid}-{part}"
                chunks.append(self._read_new(name))
                # The writer opens part k+1 only after its last write to part k returned.
                if i + 1 < len(parts):
                    os.unlink(os.path.join(self.directory, name))
                    self._offsets.pop(name, None)
        chunks = [c for c in chunks if len(c)]
        if not chunks:
            return np.empty(0, dtype=np.int64)
        return np.concatenate(chunks)

    def _read_new(self, name: str) -> np.ndarray:
        offset = self._offsets.get(name, 0)
        with open(os.path.join(self.directory, name), "rb") as f:
            f.seek(offset)
            data = f.read()
        usable = len(data) - len(data) % 8
        self._offsets[name] = offset + usable
        return np.frombuffer(data[:usable], dtype="<i8").astype(np.int64)
