"""The batch a gather hands out: a dict, already collated, that torch's default_collate keeps.

``__getitems__`` returns a batch already collated. A plain DataLoader without a
``collate_fn`` hands it to torch's ``default_collate``, which looks at the type of
``batch[0]`` to choose how to collate a list of samples. A :class:`Batch` answers ``batch[0]``
with a marker whose type torch's ``default_collate_fn_map`` (the documented way to extend
``default_collate``) maps to "already collated": the batch passes through unchanged, so
``DataLoader(ds, batch_size=64)`` needs no ``collate_fn``. Any other use of it as a list of
samples raises an error that names the fix; every other use is a dict's.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data._utils.collate import default_collate_fn_map

COLLATE_HINT = (
    "a SharedTaskDataset batch is already collated (a dict of column name -> tensor or list), "
    "but it was taken for a list of samples: a collate_fn that indexes it cannot use it. Pass "
    "it through (torch's default_collate does, and so does collate_fn=ds.collate) and work on "
    "the dict: shmloader.DataLoader(ds, transform=fn) for a function of each batch"
)


class Batch(dict[str, Any]):
    """Column name -> batch-first tensor (or list, for variable-length and string columns)."""

    __slots__ = ()

    def __missing__(self, key: object) -> Any:
        if type(key) is int and key == 0:
            return COLLATED  # default_collate asking what the samples are
        if isinstance(key, int):
            raise TypeError(f"{COLLATE_HINT} (asked for item {key!r})")
        raise KeyError(key)


class Collated:
    """What a :class:`Batch` gives for ``batch[0]``: the mark of a batch already collated.
    Used as a sample, it says so."""

    __slots__ = ()

    def __getitem__(self, key: object) -> Any:
        raise TypeError(f"{COLLATE_HINT} (asked for item 0, then {key!r} of it)")

    def __repr__(self) -> str:
        return "<a SharedTaskDataset batch, already collated: not a sample>"


COLLATED = Collated()


def _pass_through(batch: Batch, *, collate_fn_map: object = None) -> Batch:
    return batch


default_collate_fn_map[Collated] = _pass_through
