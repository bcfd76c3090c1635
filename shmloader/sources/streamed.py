"""A range's ``decode_batch`` results, decoded a block of records at a time as they are taken.

A reader that decodes a whole task (4096 records of 12-KiB images: 50 MiB) before writing it
moves every byte through main memory four times: the file's blocks are read, checked, joined by
``decode_batch`` and copied into the segment, each pass over more bytes than the CPU caches
hold. Handing the columns over block by block (about 2 MiB, ``formats/_framing.BLOCK``) lets a
writer copy each block's columns into their place in the segment while the block is still in
the cache, and a reader does not hold a task's worth of decoded memory.

The row count is known before decoding (the range's size) unless records are skipped, so a
writer can reserve the segment first (``shm/template.py``); when fewer rows come, or a block's
columns are not fixed-width, it assembles what it has with :meth:`StreamedColumns.assemble`
and writes that the ordinary way.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeAlias

import numpy as np
import pyarrow as pa

from .columns import BatchBuilder, FixedColumns
from .skipped import SkippedRecord

Chunk: TypeAlias = (
    FixedColumns | pa.RecordBatch
)  # one block's records: fixed-width columns, or built


class StreamedColumns:
    """The records of a range as chunks, each decoded when it is taken; taken once.

    ``num_rows`` is the range's size: the rows there will be if no record is skipped (a
    writer sizes its segment by it). Skipped records are known once every chunk was taken.
    """

    def __init__(
        self,
        builder: BatchBuilder,
        num_rows: int,
        chunks: Iterator[Chunk],
        skipped: list[SkippedRecord],
    ) -> None:
        self.builder = builder
        self.num_rows = num_rows
        self._chunks = chunks
        self._skipped = skipped  # filled as the chunks are decoded
        self._taken = False
        self.done = False

    @classmethod
    def of(cls, columns: FixedColumns) -> StreamedColumns:
        """``columns`` decoded already, as a stream of one chunk."""
        return cls(columns.builder, columns.num_rows, iter([columns]), [])

    @property
    def schema(self) -> pa.Schema:
        return self.builder.schema

    def __iter__(self) -> Iterator[Chunk]:
        if self._taken:
            raise RuntimeError("these records were taken already (a StreamedColumns is read once)")
        self._taken = True
        yield from self._chunks
        self.done = True

    @property
    def skipped(self) -> tuple[SkippedRecord, ...]:
        """The records left out, in record order (once every chunk was taken)."""
        if not self.done:
            raise RuntimeError("the skipped records are known once every chunk was taken")
        return tuple(sorted(self._skipped, key=lambda s: s.index))

    def collect(self) -> FixedColumns | pa.RecordBatch:
        """Every chunk as one (fixed-width columns stay numpy arrays, or RowArrays)."""
        return self.assemble(0, (), list(self))

    def to_batch(self) -> pa.RecordBatch:
        collected = self.collect()
        return collected if isinstance(collected, pa.RecordBatch) else collected.to_batch()

    def assemble(
        self, head_rows: int, head: Sequence[np.ndarray], rest: Sequence[Chunk]
    ) -> FixedColumns | pa.RecordBatch:
        """``head`` (arrays of the first ``head_rows`` rows, e.g. copied back out of a
        segment) followed by the chunks ``rest``, as one."""
        chunks: list[Chunk] = (
            [FixedColumns(self.builder, head_rows, tuple(head))] if head_rows else []
        )
        chunks += [c for c in rest if c.num_rows]
        if not chunks:
            return self.builder.empty()
        if len(chunks) == 1:
            return chunks[0]
        fixed = [c for c in chunks if isinstance(c, FixedColumns)]
        if len(fixed) == len(chunks):
            arrays = tuple(np.concatenate(a) for a in zip(*(c.arrays for c in fixed), strict=True))
            return FixedColumns(self.builder, sum(c.num_rows for c in fixed), arrays)
        batches = [c if isinstance(c, pa.RecordBatch) else c.to_batch() for c in chunks]
        return concat_batches(batches)


def concat_batches(batches: Sequence[pa.RecordBatch]) -> pa.RecordBatch:
    """One batch of ``batches``, whose types may differ by a ``large_`` promotion (a chunk
    with over 2 GiB of strings is built with 64-bit offsets, the others are not)."""
    if len({b.schema for b in batches}) == 1:
        return pa.concat_batches(list(batches))
    table = pa.concat_tables(
        [pa.Table.from_batches([b]) for b in batches], promote_options="permissive"
    )
    return table.combine_chunks().to_batches()[0]
