"""A tensor column of per-record arrays, checked and not yet stacked into one.

A per-record ``decode`` returns one array per record and column. Stacking them into one array
(``numpy.concatenate``: a copy of every value), which a reader then copies into its
shared-memory segment, would copy each image twice. Kept as the list, the column is stacked
straight into its place in the segment instead, one copy (``shm/template.py``
calls :meth:`RowArrays.copy_into`). Anything else that wants an array gets one built on demand
(``numpy.asarray``).
"""

from __future__ import annotations

from typing import Any

import numpy as np


class RowArrays:
    """``rows``: one array per record, each exactly of ``dtype`` and the row shape (checked by
    the caller). Looks like the stacked ``(len(rows), *row_shape)`` array to the writer."""

    __slots__ = ("dtype", "rows", "shape")

    def __init__(self, rows: list[np.ndarray], dtype: np.dtype, row_shape: tuple[int, ...]):
        if not row_shape:
            raise ValueError("RowArrays holds arrays of at least one dimension")
        self.rows = rows
        self.dtype = dtype
        self.shape = (len(rows), *row_shape)

    def __len__(self) -> int:
        return len(self.rows)

    def copy_into(self, place: np.ndarray) -> None:
        """Stack the rows into ``place``, a C-contiguous array of :attr:`shape`: joined along
        the first axis, ``n`` arrays of ``(a, *rest)`` fill ``(n * a, *rest)``, the same
        memory as ``(n, a, *rest)``."""
        n, first, *rest = self.shape
        np.concatenate(self.rows, axis=0, out=place.reshape(n * first, *rest))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if copy is False:  # numpy's protocol: say so rather than copy when asked not to
            raise ValueError("the rows of a RowArrays are stacked only by copying them")
        out = np.empty(self.shape, self.dtype)
        self.copy_into(out)
        return out if dtype is None else out.astype(dtype, copy=False)
