"""Variable-length numeric list columns in a batch: token ids, boxes, anything whose length
differs from record to record.

A tensor needs rows of one length, so such a column cannot become one tensor as it is.
``SharedTaskDataset(ragged=...)`` chooses what a batch holds instead, for column ``name``:

- ``"list"``: ``batch[name]`` is a list of 1-D tensors, one per row (``None`` for a null row);
- ``"padded"``: ``batch[name]`` is one ``(rows, longest)`` tensor, each row's values followed
  by ``pad_value``, and ``batch[name + "_lengths"]`` the int64 length of each row, as
  ``torch.nn.utils.rnn.pad_sequence`` would build it (a mask is ``arange(longest) <
  lengths[:, None]``);
- ``"offsets"``: ``batch[name]`` is every row's values one after the other (1-D), and
  ``batch[name + "_offsets"]`` the int64 ``rows + 1`` offsets where each row starts and the
  last ends: ``torch.nested.nested_tensor_from_jagged(values, offsets)`` makes a nested
  tensor of them without a copy, and an ``EmbeddingBag`` takes them as they are.

The values are copied out of shared memory either way (a tensor must not keep a released
segment's mapping alive), with one vectorised scatter for the padding.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from ...errors import ConfigError, DataError
from ...sources._numpy_arrow import to_numpy
from ..core.ragged_form import RaggedForm


def ragged_columns(
    name: str, parts: list[pa.Array], form: RaggedForm
) -> dict[str, torch.Tensor | list[torch.Tensor | None]]:
    """The batch's entries for list column ``name``, of the rows ``parts`` (the batch's rows
    of each segment, in batch order): one copy of the values and the offsets of the rows, in
    every form (no Python work per row but the list's own)."""
    whole = pa.concat_arrays(parts) if len(parts) > 1 else parts[0]
    if whole.null_count and form.form != "list":
        raise DataError(
            f"column {name!r} has a null row, which ragged={form.form!r} cannot hold "
            "(ragged='list' gives None for it)"
        )
    offsets = to_numpy(whole.offsets).astype(np.int64)
    # The child's values the rows span (a null row's too, so offsets and values agree).
    values = np.array(to_numpy(whole.values.slice(offsets[0], offsets[-1] - offsets[0])))
    offsets -= offsets[0]
    lengths = np.diff(offsets)
    if form.form == "list":
        rows: list[torch.Tensor | None] = list(torch.from_numpy(values).split(lengths.tolist()))
        for null in np.flatnonzero(to_numpy(whole.is_null())).tolist():
            rows[null] = None
        return {name: rows}
    extra = form.extra_column(name)
    assert extra is not None
    if form.form == "offsets":
        return {name: torch.from_numpy(values), extra: torch.from_numpy(offsets)}
    return {name: torch.from_numpy(_padded(values, offsets, lengths, form.pad_value, name)),
            extra: torch.from_numpy(lengths)}  # fmt: skip


def _padded(
    values: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, pad: float, name: str
) -> np.ndarray:
    rows = len(lengths)
    longest = int(lengths.max()) if rows else 0
    fill = np.asarray(pad)
    if values.dtype.kind in "iub" and fill.dtype.kind == "f" and not float(pad).is_integer():
        raise ConfigError(
            f"pad_value {pad!r} is not a value of column {name!r} ({values.dtype}): give an int"
        )
    out = np.full((rows, longest), pad, dtype=values.dtype)
    row_of = np.repeat(np.arange(rows), lengths)
    place = np.arange(len(values)) - np.repeat(offsets[:-1], lengths)
    out[row_of, place] = values
    return out
