"""A schema given, or inferred before the first batch from a sample spread over the data.

:class:`~shmloader.sources.records.RecordFileSource`, the indexed sources (CSV with
``decode``, JSON Lines, WebDataset) and :class:`~shmloader.sources.files.FileSource` decode
records into one batch of one schema. Given with ``schema=``, it is used as it is. Otherwise
every process infers it alike, from the same sample (:func:`infer_schema_from`):

* the first :data:`INFER_SAMPLE` records that decode, in plan order;
* :data:`INFER_POINTS` runs of :data:`INFER_RUN` records spread evenly over the whole plan,
  so that a column whose lists grow longer further on (token lists of 3 values in the first
  hundred rows, of 200 after row 500) is a variable-length list from the start, instead of
  a :class:`~shmloader.SchemaMismatchError` at that record, after training began.

The spread runs are read only when they could change what the first records show (a 1-D
tensor column, or one of Python ints). The sample is a count of records, not a time budget:
readers infer the schema each for itself, and only a sample that does not depend on how fast
a read is gives them one schema. A record the sample missed that still does not fit raises an
error naming it, and the exact ``schema=`` to give (``BatchBuilder(schema, inferred=True)``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from ..augment import outside_task
from ..errors import ConfigError, DecodeError
from ._decoding import At
from .base import BaseSource, Shard
from .columns import BatchBuilder, merge_inferred

INFER_ATTEMPTS = 1000  # records that may fail to decode while inferring a schema
# The first records whose schemas are merged (columns.merge_inferred): enough for a column
# whose length varies near the start to show it, few enough to cost nothing at start-up.
INFER_SAMPLE = 16
# Runs of records further on, spread evenly over the plan, and the records in each: one read
# per run (a range request on an object store), 32 records decoded in all.
INFER_POINTS = 8
INFER_RUN = 4

# One record of the sample: the file it is in, where in it, and what is decoded.
Candidate = tuple[str, At, Any]


def infer_schema_from(
    first: Iterable[Candidate],
    schema_of: Callable[[str, Any], pa.Schema],
    *,
    spread: Iterable[Candidate] = (),
    lists_vary: bool = False,
) -> pa.Schema:
    """The schemas ``schema_of(path, item)`` of the first :data:`INFER_SAMPLE` candidates in
    ``first`` for which it does not raise and of every one in ``spread``, merged
    (:func:`~shmloader.sources.columns.merge_inferred`: a column whose length varies among
    them is a variable-length list; under ``lists_vary`` every 1-D column of numbers is).

    Failures are passed over even with ``on_error="raise"``: reading their own range reports
    them properly. After :data:`INFER_ATTEMPTS` of them in ``first`` the data is taken to be
    wrong. A reader infers the schema in its first task: ``task_rng()`` is the one of no task
    meanwhile, or that task's records would draw other numbers than when another reader reads
    it.
    """
    failures: list[str] = []
    schemas: list[pa.Schema] = []
    for path, at, item in first:
        schema = _schema_or_failure(path, at, item, schema_of, failures)
        if schema is not None:
            schemas.append(schema)
        if len(schemas) >= INFER_SAMPLE or len(failures) >= INFER_ATTEMPTS:
            break
    if not schemas:
        if not failures:
            raise ConfigError("cannot infer a schema: the files hold no records; pass schema=")
        raise DecodeError(
            f"cannot infer a schema: the first {len(failures)} records all failed to decode; "
            f"first failure: {failures[0]}; pass schema= or fix the data",
            fix="",  # on_error="skip" does not help: there is no schema to read any record with
        )
    first_seen = merge_inferred(schemas, lists_vary=lists_vary)
    if not _may_change(first_seen):
        return first_seen  # the spread reads spared
    for path, at, item in spread:
        schema = _schema_or_failure(path, at, item, schema_of, [])
        if schema is not None and schema.names == schemas[0].names:
            schemas.append(schema)
    return merge_inferred(schemas, lists_vary=lists_vary)


def _may_change(schema: pa.Schema) -> bool:
    """Whether more records could change ``schema`` when merged in: a 1-D tensor may turn out
    to be a list, an int64 column of Python ints float64. Images and other arrays of two
    dimensions or more, floats, strings and bytes cannot, and a source of them reads no
    more than the first records (a decode of 32 more images per reader is not free)."""
    for field in schema:
        typ = field.type
        if typ == pa.int64():
            return True
        if isinstance(typ, pa.FixedShapeTensorType) and len(typ.shape) == 1:
            return True
    return False


def _schema_or_failure(
    path: str,
    at: At,
    item: Any,
    schema_of: Callable[[str, Any], pa.Schema],
    failures: list[str],
) -> pa.Schema | None:
    try:
        with outside_task():
            return schema_of(path, item)
    except Exception as exc:
        failures.append(f"{path}, record {at.index}, byte offset {at.offset}: {exc!r}")
        return None


def spread_runs(plan: Sequence[Shard]) -> list[tuple[str, int, int]]:
    """Where the spread part of the sample is read: (path, start, stop) of
    :data:`INFER_POINTS` runs of up to :data:`INFER_RUN` records, starting at the middles of
    as many equal parts of all the plan's records (in plan order), runs that overlap merged."""
    total = sum(shard.num_records for shard in plan)
    if not total:
        return []
    ends = list(itertools.accumulate(shard.num_records for shard in plan))
    runs: list[tuple[str, int, int]] = []
    for point in range(INFER_POINTS):
        at = (2 * point + 1) * total // (2 * INFER_POINTS)
        index = next(i for i, end in enumerate(ends) if at < end)
        shard = plan[index]
        start = at - (ends[index] - shard.num_records)
        stop = min(start + INFER_RUN, shard.num_records)
        if runs and runs[-1][0] == shard.path and runs[-1][2] >= start:
            runs[-1] = (shard.path, runs[-1][1], stop)
        else:
            runs.append((shard.path, start, stop))
    return runs


class InferringSource(BaseSource):
    """A source that decodes records into batches of one schema: given, or inferred from the
    sample the module doc describes, once per process (the same in every one).

    A subclass sets ``self._given_schema`` (None: infer) and says how to read candidates:
    :meth:`_candidates` (records ``[start, stop)`` of a file, each as decode gets it) and
    :meth:`_schema_of` (one candidate's schema).
    """

    _given_schema: pa.Schema | None = None
    _inferred_schema: pa.Schema | None = None
    _builder: BatchBuilder | None = None

    @property
    def schema(self) -> pa.Schema:
        """The batches' schema: as given, or inferred from a sample of the records (the
        first ones and runs spread over all of them: sources/_inferred.py)."""
        if self._given_schema is not None:
            return self._given_schema
        if self._inferred_schema is None:
            self._inferred_schema = self._infer_schema()
        return self._inferred_schema

    def builder(self) -> BatchBuilder:
        """What turns records into batches of :attr:`schema` (made once per process); an
        inferred schema's builder names the ``schema=`` to give when a record misfits."""
        if self._builder is None:
            self._builder = BatchBuilder(self.schema, inferred=self._given_schema is None)
        return self._builder

    def forget_decided_types(self) -> None:
        self._inferred_schema = None
        self._builder = None

    def _infer_schema(self) -> pa.Schema:
        return infer_schema_from(
            self._first_candidates(),
            self._schema_of,
            spread=self._spread_candidates(),
            lists_vary=self.lists_vary,
        )

    def _first_candidates(self) -> Iterator[Candidate]:
        """Records in plan order, read in growing pieces (most data infers from the first
        :data:`INFER_SAMPLE`), at most :data:`INFER_ATTEMPTS` of each file."""
        for shard in self.plan():
            pos, piece = 0, INFER_SAMPLE
            while pos < min(shard.num_records, INFER_ATTEMPTS):
                stop = min(shard.num_records, pos + piece)
                yield from self._candidates(shard.path, pos, stop)
                pos, piece = stop, piece * 4

    def _spread_candidates(self) -> Iterator[Candidate]:
        for path, start, stop in spread_runs(self.plan()):
            yield from self._candidates(path, start, stop)

    def _candidates(self, path: str, start: int, stop: int) -> Iterator[Candidate]:
        """Records ``[start, stop)`` of ``path`` as ``schema_of`` takes them (a record that
        cannot be read may be an exception, which ``schema_of`` raises)."""
        raise NotImplementedError

    def _schema_of(self, path: str, item: Any) -> pa.Schema:
        raise NotImplementedError
