"""Fixed-width columns written straight into a segment, by the layout of one written before.

A ``decode_batch`` result is usually numpy views of one joined buffer: strided arrays (a label
after each image). Arrow has no strides, so building the batch copies every such array, and
writing the batch into shared memory copies it again; for images each of those copies costs
about as much as decoding.

But an Arrow IPC file of fixed-width columns without nulls is laid out by the schema and the
row count alone: every buffer's offset and length, and with them all the metadata bytes, follow
from those two (the same fact the gather's reuse of parsed views rests on,
``dataset/view_cache.py``). So for the first batch of a schema and row count, pyarrow writes a
file of zeros of that schema and row count (:func:`zeros_like`: they take no memory) onto a
scratch mapping, stepping over the zeros themselves (:func:`ipc_skipping_values`), and the
store learns from it where each column's values go, keeping all the other bytes (file magic,
schema and batch metadata, padding, footer). Every batch of that schema and row count,
the first included, is then written as those bytes plus one ``numpy.copyto`` per column, from
the strided arrays straight into the file's pages: per chunk of rows, as a reader decodes them
(:func:`write_chunks`, ``sources/streamed.py``).

The layout is learned from a file pyarrow wrote, never computed here; and a file written from it
is byte for byte the file pyarrow would write (``tests/test_shm_template.py`` compares them).
"""

from __future__ import annotations

import math
import mmap
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from ..sources.row_arrays import RowArrays

MAX_LAYOUTS = 8  # layouts a writer keeps: tasks come in a few sizes (the last of a file is short)


class Layout(NamedTuple):
    """Where a file of fixed-width columns puts each column's values, and its other bytes."""

    nbytes: int
    columns: tuple[tuple[int, int], ...]  # (offset, length) of each column's values
    other: tuple[tuple[int, bytes], ...]  # every other byte of the file, as (offset, bytes)


def all_buffers(array: pa.Array) -> list[pa.Buffer | None]:
    """Every buffer of ``array``: its own and its children's, and a dictionary's."""
    found = list(array.buffers())
    if isinstance(array, pa.DictionaryArray):
        found += all_buffers(array.dictionary)
    return found


def buffer_spans(array: pa.Array, file: pa.Buffer) -> list[tuple[int, int]] | None:
    """``(offset, length)`` in ``file`` of each non-empty buffer of ``array``, or None if one
    lies outside it (a copy, not a view of the file)."""
    spans = []
    for buf in all_buffers(array):
        if buf is None or buf.size == 0:
            continue
        offset = buf.address - file.address
        if offset < 0 or offset + buf.size > file.size:
            return None
        spans.append((offset, buf.size))
    return spans


def learn(file: pa.Buffer, parsed: pa.RecordBatch) -> Layout | None:
    """The layout of ``file``, an IPC file that ``parsed`` was read from zero-copy; None unless
    each column has exactly one non-empty buffer, inside the file (fixed-width, no nulls)."""
    spans = []
    for column in parsed.columns:
        found = buffer_spans(column, file)
        if column.null_count or found is None or len(found) != 1:
            return None
        spans.append(found[0])
    other = []
    at = 0
    for offset, length in sorted(spans):
        if offset < at:
            return None  # overlapping buffers: not a layout to write into
        if offset > at:
            other.append((at, file.slice(at, offset - at).to_pybytes()))
        at = offset + length
    if at < file.size:
        other.append((at, file.slice(at).to_pybytes()))
    return Layout(file.size, tuple(spans), tuple(other))


def write_other(mapping: mmap.mmap, layout: Layout) -> None:
    """Every byte of a file of ``layout`` but the columns' values."""
    for offset, data in layout.other:
        mapping[offset : offset + len(data)] = data


def column_places(
    mapping: mmap.mmap, layout: Layout, like: Sequence[np.ndarray | RowArrays], num_rows: int
) -> list[np.ndarray] | None:
    """Writable numpy views of each column's place in ``mapping``, for ``num_rows`` rows of
    the dtypes and row shapes of ``like``; None if a place is not of that size."""
    places = []
    for (offset, length), array in zip(layout.columns, like, strict=True):
        row_shape = array.shape[1:]
        count = num_rows * math.prod(row_shape)
        if count * array.dtype.itemsize != length:
            return None
        places.append(
            np.frombuffer(mapping, array.dtype, count, offset).reshape(num_rows, *row_shape)
        )
    return places


def zeros_like(arrays: Sequence[np.ndarray | RowArrays], num_rows: int) -> list[np.ndarray]:
    """Zeros of ``arrays``' dtypes and row shapes, ``num_rows`` rows, that take no memory:
    each lies on an anonymous mapping never written, whose pages all read as the kernel's one
    zero page. A file written from them teaches a layout as well as the real columns would."""
    out = []
    for array in arrays:
        shape = (num_rows, *array.shape[1:])
        nbytes = math.prod(shape) * array.dtype.itemsize
        # Private: a shared anonymous page that is read gets memory of its own.
        zeros = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE)
        out.append(np.ndarray(shape, array.dtype, buffer=zeros))
    return out


class _SkippingSink:
    """A file object for ``pa.PythonFile`` that writes into ``scratch``, except buffers lying on
    ``skip`` (pyarrow hands an IPC writer's column buffers over as ``pa.Buffer``): those it
    only steps over."""

    def __init__(self, scratch: mmap.mmap, skip: Sequence[np.ndarray]) -> None:
        self.scratch = scratch
        self.skip = [(a.ctypes.data, a.ctypes.data + a.nbytes) for a in skip]
        self.pos = 0
        self.skipped = 0  # bytes stepped over
        self.closed = False

    def write(self, data: Any) -> int:
        skip = isinstance(data, pa.Buffer) and any(
            a <= data.address and data.address + data.size <= b for a, b in self.skip
        )
        view = None if skip else memoryview(data).cast("B")
        size = data.size if view is None else len(view)
        if self.pos + size > len(self.scratch):
            raise RuntimeError(
                f"the IPC file runs past the {len(self.scratch)} bytes computed for it"
            )
        if view is None:
            self.skipped += size
        else:
            self.scratch[self.pos : self.pos + size] = view
        self.pos += size
        return size

    def tell(self) -> int:
        return self.pos

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def ipc_skipping_values(batch: pa.RecordBatch, values: Sequence[np.ndarray], nbytes: int) -> Any:
    """``batch``, whose columns lie on ``values`` (:func:`zeros_like`), as an ``nbytes``-byte
    IPC file on an anonymous mapping, without writing the values: those pages stay the
    kernel's zero page, as zeros read. So teaching a layout costs the metadata's few pages, not
    the file's size in writes (on a reader's first task, on the way to the first batch).
    Returns the mapping; RuntimeError if pyarrow writes another size than ``nbytes``."""
    scratch = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)  # see zeros_like
    sink = _SkippingSink(scratch, values)
    with pa.ipc.new_file(pa.PythonFile(sink, mode="w"), batch.schema) as writer:
        writer.write_batch(batch)
    if sink.pos != nbytes:  # pragma: no cover - would be an Arrow bug
        raise RuntimeError(f"the IPC file took {sink.pos} bytes, the size computed was {nbytes}")
    return scratch


def learn_from_zeros(
    batch: pa.RecordBatch, zeros: Sequence[np.ndarray], nbytes: int
) -> Layout | None:
    """The layout of ``batch``'s IPC file (its columns on ``zeros``), learned from one written
    with the zeros stepped over (:func:`ipc_skipping_values`); None as for :func:`learn`."""
    file = pa.py_buffer(ipc_skipping_values(batch, zeros, nbytes))
    return learn(file, pa.ipc.open_file(file).get_batch(0))


class Filled(NamedTuple):
    """What :func:`write_chunks` wrote: ``rows`` rows. If that is not the whole file, ``head``
    holds copies of them and ``rest`` the chunks not written (the first that was not
    fixed-width columns or did not fit, and all after it)."""

    rows: int
    head: list[np.ndarray]
    rest: list[Any]


def write_chunks(
    mapping: mmap.mmap, layout: Layout, num_rows: int, chunks: Iterable[Any]
) -> Filled:
    """Write a file of ``layout`` (``num_rows`` rows) into ``mapping`` a chunk at a time:
    each chunk of fixed-width columns (anything with ``arrays`` and ``num_rows``) is copied
    into its rows' place as soon as it is taken, while it is still in the CPU cache
    (``sources/streamed.py``). The file is whole if ``rows == num_rows`` and ``rest`` is empty.

    No view of ``mapping`` outlives the call, even when a chunk's decoding raises: the writer
    closes the mapping then, which an exported view would forbid.
    """
    write_other(mapping, layout)
    places: list[np.ndarray] | None = None
    place: np.ndarray | None = None
    rows = 0
    rest: list[Any] = []
    taken = iter(chunks)
    try:
        for chunk in taken:
            if not chunk.num_rows:
                continue
            arrays = getattr(chunk, "arrays", None)  # a built batch has none: not ours to place
            if arrays is not None and places is None:
                places = column_places(mapping, layout, arrays, num_rows)
            if arrays is None or places is None or rows + chunk.num_rows > num_rows:
                rest = [chunk, *taken]
                break
            for place, array in zip(places, arrays, strict=True):
                if isinstance(array, RowArrays):  # per-record arrays: stacked into place
                    array.copy_into(place[rows : rows + chunk.num_rows])
                else:
                    np.copyto(place[rows : rows + chunk.num_rows], array, casting="no")
            rows += chunk.num_rows
        if rows == num_rows and not rest:
            return Filled(rows, [], [])
        return Filled(rows, [p[:rows].copy() for p in places or ()], rest)
    finally:
        places = place = None  # drop the views, in a traceback's frame too


class Layouts:
    """Layouts learned by one writer, by (schema, row count); the most recent few."""

    def __init__(self, max_count: int = MAX_LAYOUTS) -> None:
        self.max_count = max_count
        self._known: OrderedDict[tuple[pa.Schema, int], tuple[pa.Schema, Layout]] = OrderedDict()
        self.used = 0  # how many writes went by a layout (for tests and benchmarks)

    def find(self, schema: pa.Schema, num_rows: int) -> Layout | None:
        known = self._known.get((schema, num_rows))
        # Schemas hash and compare without their metadata, which the file holds too.
        if known is None or not known[0].equals(schema, check_metadata=True):
            return None
        self._known.move_to_end((schema, num_rows))
        return known[1]

    def remember(self, schema: pa.Schema, num_rows: int, layout: Layout) -> None:
        self._known[(schema, num_rows)] = (schema, layout)
        self._known.move_to_end((schema, num_rows))
        while len(self._known) > self.max_count:
            self._known.popitem(last=False)
