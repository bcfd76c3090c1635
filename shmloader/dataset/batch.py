"""The batch a gather hands out: a dict that says so when it is taken for a list of samples.

``__getitems__`` returns a batch already collated. Given to a plain DataLoader without
``collate_fn=ds.collate``, torch's ``default_collate`` indexes it as a list of samples
(``batch[0]``), which on a plain dict raises a bare ``KeyError: 0`` from inside torch. The
subclass turns that one misuse into an error that names the fix; every other use is a dict's.
"""

from __future__ import annotations

from typing import Any

COLLATE_HINT = (
    "a SharedTaskDataset batch is already collated (a dict of column name -> tensor or list), "
    "but it was indexed as a list of samples: torch's default_collate does that. Give the "
    "DataLoader collate_fn=ds.collate (and sampler=ds.sampler()), or use shmloader.DataLoader"
)


class Batch(dict[str, Any]):
    """Column name -> batch-first tensor (or list, for variable-length and string columns)."""

    __slots__ = ()

    def __missing__(self, key: object) -> Any:
        if isinstance(key, int):
            raise TypeError(f"{COLLATE_HINT} (asked for item {key!r})")
        raise KeyError(key)
