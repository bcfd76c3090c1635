"""Random augmentation that differs per epoch and is the same in every run with the same seed.

A ``decode`` (or ``decode_batch``, or a source's ``read_result``) that augments records calls
:func:`task_rng` for its random numbers::

    def decode(payload):
        image = np.frombuffer(payload, np.uint8).reshape(32, 32, 3)
        rng = shmloader.task_rng()
        if rng.random() < 0.5:
            image = image[:, ::-1]             # a flip for about half the records
        return {"image": image, "label": ...}

In a reader, the generator belongs to the task being read: it is seeded from the dataset's
``seed``, the epoch and the task, and the records of a task are decoded in order by one reader,
so each record gets the same numbers in every run with the same seed (whichever reader reads
it, also when a task is read again after a reader died) and other numbers in each epoch. What
a global ``np.random`` call would give instead depends on which reader read what, and on when.

Outside a reader (calling ``decode`` yourself, ``ds[i]``) it is a generator seeded from 0, made
anew at each call, so a look at a record gives the same result every time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np

_task: tuple[int, int, int] | None = None  # (seed, epoch, task_id) of the task being read
_rng: np.random.Generator | None = None


def task_rng() -> np.random.Generator:
    """The random generator of the task being read (see the module's docstring)."""
    global _rng
    if _task is None:
        return np.random.default_rng(0)
    if _rng is None:
        _rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(list(_task))))
    return _rng


def begin_task(seed: int, epoch: int, task_id: int) -> None:
    """A reader starts reading a task: :func:`task_rng` starts that task's sequence (made on
    its first use, so a decode that never asks costs nothing)."""
    global _task, _rng
    _task, _rng = (seed, epoch, task_id), None


def drew() -> bool:
    """Whether the task being read drew from :func:`task_rng` so far (its records then differ
    each epoch: ``cache=True`` does not keep them)."""
    return _task is not None and _rng is not None


@contextlib.contextmanager
def outside_task() -> Iterator[None]:
    """:func:`task_rng` as outside any task while the block runs (a decode called to infer
    the schema must not draw from the numbers of the task being read), then as it was."""
    global _task, _rng
    saved = _task, _rng
    _task, _rng = None, None
    try:
        yield
    finally:
        _task, _rng = saved
