"""The segment store: one directory per dataset, one Arrow IPC file per segment.

``SegmentStore.create()`` runs in the process that owns the dataset (the trainer) and removes
the directory when it closes or exits. ``store.handle()`` is a small picklable
:class:`StoreHandle` for reader processes and DataLoader workers: it writes, opens and releases
segments but never deletes the store. Pickling the owner itself also yields a plain handle, so
an owner captured by a Dataset sent to a spawned worker cannot delete anything there.

Segments are plain files on tmpfs, written through a writable mapping that the writer keeps for
the next segment written into the same file (``written.py``: its pages are allocated first, so a
full tmpfs gives ENOSPC, not SIGBUS) and read through ``mmap``, read-only. Not
``multiprocessing.shared_memory``: its resource tracker unlinks segments created by a process
when that process exits, and warns about "leaked" ones, which is wrong for segments handed
between processes.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import pyarrow as pa

from ..errors import ConfigError, ShmSpaceError
from ..sources.columns import FixedColumns
from ..sources.streamed import Chunk, StreamedColumns
from . import budget as _budget
from . import hints, lifecycle
from .names import LOCK_NAME, is_segment_name, new_dataset_name, new_segment_name
from .reap import reap_stale
from .region import Placed, Region
from .sizes import format_size, parse_size
from .space import check_space, resolve_base_dir
from .template import Filled, Layout, Layouts, learn_from_zeros, write_chunks, zeros_like
from .written import WrittenMappings, write_ipc_into

DEFAULT_MAX_OPEN = 64
DEFAULT_MAX_WRITTEN = 256  # writable mappings a writer keeps (written.py)


def read_segment(buffer: pa.Buffer) -> pa.RecordBatch:
    """The batch of a segment file's bytes, zero-copy.

    Parsed from one buffer of the whole mapping, not from a file object: the file reader's
    many small reads cost about 4x more per segment.
    """
    return pa.ipc.open_file(buffer).get_batch(0)


class SegmentInfo(NamedTuple):
    """What crosses processes about a segment: its name, rows and size in bytes, and how long
    its writer waited for room in the budget."""

    name: str
    num_rows: int
    nbytes: int
    budget_wait_seconds: float = 0.0


class Occupancy(NamedTuple):
    """What a store's files hold, in bytes: segments in use (sealed or being written), spares
    kept for writers to reuse, and cached segments kept for the next epoch (``cache=True``).
    Together never more than the budget."""

    in_use: int
    spare: int
    cached: int


class _Plan(NamedTuple):
    """How a write goes: ``built`` written the ordinary way, or ``chunks`` of ``columns`` by
    ``layout``."""

    nbytes: int
    num_rows: int
    built: pa.RecordBatch | None
    columns: StreamedColumns | None = None
    chunks: Iterator[Chunk] | None = None
    layout: Layout | None = None
    learned: bool = False  # the layout was learned for this write (from zeros)


def _whole(columns: StreamedColumns, chunks: list[Chunk]) -> _Plan:
    """The plan to write ``chunks`` of ``columns`` as one batch, the ordinary way."""
    whole = columns.assemble(0, (), chunks)
    built = whole if isinstance(whole, pa.RecordBatch) else whole.to_batch()
    return _Plan(ipc_file_size(built), built.num_rows, built)


def ipc_file_size(batch: pa.RecordBatch) -> int:
    """Exact size of ``batch`` as an Arrow IPC file, computed without writing it anywhere."""
    sink = pa.MockOutputStream()
    with pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return int(sink.size())


class StoreHandle:
    """Access to one dataset's segments from any process; picklable, never deletes the store.

    Each process (each unpickled copy) keeps its own cache of at most ``max_open`` open
    mappings, least recently used first out. An unlinked segment's memory is freed only when
    every process has dropped its mapping *and* every Arrow array taken from it is gone: call
    :meth:`drop` / :meth:`drop_missing` in consumers once segments are released.
    """

    def __init__(
        self, base_dir: str, dataset: str, budget: int, *, max_open: int = DEFAULT_MAX_OPEN
    ) -> None:
        if max_open < 1:
            raise ConfigError(f"max_open must be at least 1, got {max_open}")
        self.base_dir = base_dir
        self.dataset = dataset
        self.budget = budget
        self.max_open = max_open
        self._maps: OrderedDict[str, tuple[pa.MemoryMappedFile, pa.RecordBatch]] = OrderedDict()
        # A writer may keep as many files mapped as the budget holds: those still in the store
        # hold no memory beyond it, and removed ones are swept before each write.
        self.written = WrittenMappings(DEFAULT_MAX_WRITTEN, budget)
        self.layouts = Layouts()

    @property
    def path(self) -> str:
        """The dataset directory."""
        return os.path.join(self.base_dir, self.dataset)

    def __reduce__(self) -> tuple[object, ...]:
        # Only the address travels; the mapping cache is per process.
        return (_rebuild_handle, (self.base_dir, self.dataset, self.budget, self.max_open))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r}, budget={format_size(self.budget)})"

    # -- writer side -------------------------------------------------------------------------

    def write(
        self,
        batch: pa.RecordBatch | FixedColumns | StreamedColumns,
        *,
        timeout: float | None = None,
        should_stop: _budget.StopSignal | None = None,
        name: str | None = None,
        urgent: Callable[[], bool] | None = None,
    ) -> SegmentInfo | None:
        """Write ``batch`` into a new sealed segment, waiting for budget if needed.

        ``batch`` may also be the fixed-width numpy columns a batch would be built from
        (``FixedColumns``), whole or as chunks decoded while they are written
        (``StreamedColumns``): after the first of a schema and row count, they are written
        without building the batch (``template.py``).

        ``name``: the segment name to seal under (from ``new_segment_name()``), for a writer
        that sends someone the name before it seals; a fresh one by default. ``urgent``: see
        :func:`shmloader.shm.budget.reserve` (with :meth:`wanted` / :meth:`want`).

        Returns None if ``should_stop`` (an Event or a callable) turned true while waiting;
        raises :class:`TimeoutError` after waiting ``timeout`` seconds, :class:`ShmSpaceError`
        if the batch is larger than the whole budget or the filesystem is full,
        :class:`StoreClosedError` if the owner closed the store.
        """
        if name is not None and not is_segment_name(name):
            raise ValueError(f"{name!r} is not a segment name (expected 'seg-' + 32 hex digits)")
        plan = self._plan(batch)
        self.sweep_written()
        waits: list[float] = []
        temp = _budget.reserve(
            self.path,
            plan.nbytes,
            self.budget,
            timeout=timeout,
            should_stop=should_stop,
            urgent=urgent,
            on_wait=waits.append,
        )
        waited = sum(waits)
        if temp is None:
            return None
        try:
            filled = self._fill(temp, plan)
            if filled is not None:
                # Fewer rows came than the range holds (records were skipped), or a chunk
                # that is not fixed-width: write what came as one, the ordinary way.
                os.unlink(temp)
                assert plan.columns is not None
                rest = plan.columns.assemble(filled.rows, filled.head, filled.rest)
                wait = dict(timeout=timeout, should_stop=should_stop, urgent=urgent)
                info = self.write(rest, name=name, **wait)  # type: ignore[arg-type]
                if info is None:
                    return None
                return info._replace(budget_wait_seconds=info.budget_wait_seconds + waited)
            name = name or new_segment_name()
            _budget.seal(self.path, temp, name)
        except BaseException:
            # Includes KeyboardInterrupt: give the reservation back, then let it propagate.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            raise
        return SegmentInfo(name, plan.num_rows, plan.nbytes, waited)

    def _plan(self, batch: pa.RecordBatch | FixedColumns | StreamedColumns) -> _Plan:
        """How ``batch`` will be written, and the size of its file."""
        if isinstance(batch, pa.RecordBatch):
            return _Plan(ipc_file_size(batch), batch.num_rows, batch)
        columns = batch if isinstance(batch, StreamedColumns) else StreamedColumns.of(batch)
        layout = self.layouts.find(columns.schema, columns.num_rows)
        if layout is not None:
            return _Plan(layout.nbytes, columns.num_rows, None, columns, iter(columns), layout)
        # The first of its schema and row count. A file of zeros (they take no memory, and are
        # not written: template.py) teaches the layout; the chunks go in by it, as later.
        chunks = iter(columns)
        first = next((chunk for chunk in chunks if chunk.num_rows), None)
        if not isinstance(first, FixedColumns):
            return _whole(columns, [] if first is None else [first, *chunks])
        zeros = zeros_like(first.arrays, columns.num_rows)
        built = FixedColumns(first.builder, columns.num_rows, tuple(zeros)).to_batch()
        rest = itertools.chain([first], chunks)
        layout = learn_from_zeros(built, zeros, ipc_file_size(built))
        if layout is None:  # not one to write in place: the whole batch the ordinary way
            return _whole(columns, list(rest))
        self.layouts.remember(columns.schema, columns.num_rows, layout)
        return _Plan(layout.nbytes, columns.num_rows, None, columns, rest, layout, learned=True)

    def _fill(self, temp: str, plan: _Plan) -> Filled | None:
        """Write ``plan`` into the reserved file ``temp``: its batch the ordinary way, or its
        chunks of columns by its layout. Returns what the chunks left unwritten if they did
        not fill the file (None when it is whole)."""
        try:
            fd = os.open(temp, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError as exc:
            raise _budget.closed_error(self.path) from exc
        try:
            inode, mapping = self.written.mapping(fd, plan.nbytes)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise ShmSpaceError(
                    f"{self.base_dir} is full while writing a segment of "
                    f"{format_size(plan.nbytes)} into {temp}; other programs use it too: "
                    f"enlarge it or lower shm_budget"
                ) from exc
            raise
        finally:
            os.close(fd)
        filled = None
        try:
            written = plan.nbytes
            if plan.built is not None:
                written = write_ipc_into(mapping, plan.built, plan.nbytes)
            if plan.layout is not None and plan.chunks is not None:
                filled = write_chunks(mapping, plan.layout, plan.num_rows, plan.chunks)
                if filled.rows == plan.num_rows and not filled.rest:
                    filled = None
                    self.layouts.used += not plan.learned
        except BaseException:
            mapping.close()
            raise
        self.written.keep(inode, mapping)
        if written != plan.nbytes:  # pragma: no cover - would be an Arrow bug
            raise RuntimeError(
                f"{temp}: wrote {written} bytes, the size computed was {plan.nbytes}"
            )
        return filled

    def sweep_written(self) -> None:
        """Unmap this writer's kept mappings of files that left the store (``written.py``):
        done before each write, and by idle writers, so removed files do not stay in memory."""
        if not len(self.written):
            return
        try:
            inodes = [entry.inode() for entry in os.scandir(self.path)]
        except FileNotFoundError:
            inodes = []  # the store is gone: nothing of it is worth keeping
        self.written.sweep(inodes)

    # -- reader side -------------------------------------------------------------------------

    def open(self, name: str) -> pa.RecordBatch:
        """The segment's batch, memory-mapped read-only and zero-copy (cached per process)."""
        cached = self._maps.get(name)
        if cached is not None:
            self._maps.move_to_end(name)
            return cached[1]
        path = self._segment_path(name)
        try:
            mm = pa.memory_map(path, "r")
        except FileNotFoundError as exc:
            raise self._missing(name, path) from exc
        try:
            batch = read_segment(mm.read_buffer())
        except BaseException:
            mm.close()
            raise
        self._maps[name] = (mm, batch)
        while len(self._maps) > self.max_open:
            self._close_mapping(next(iter(self._maps)))
        return batch

    def place_in(
        self,
        name: str,
        region: Region,
        reuse: Callable[[int, int], Placed | None] | None = None,
    ) -> Placed | None:
        """The segment's file mapped into ``region``, not parsed (None if it has no room
        left; :func:`read_segment` parses it).

        Not cached here: the caller owns the placement and calls ``region.unmap`` once no
        array over it is used any more (reading one afterwards faults). ``reuse(inode,
        size)`` may return the caller's mapping of the same file, kept from when it was an
        earlier segment (segment files are written again as spares): it is adopted instead
        of mapping the file anew.
        """
        path = self._segment_path(name)
        try:
            if reuse is not None:  # a kept mapping needs no descriptor: one stat finds it
                info = os.stat(path)
                kept = reuse(info.st_ino, info.st_size)
                if kept is not None:
                    return region.adopt(kept, info.st_size)
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError as exc:
            raise self._missing(name, path) from exc
        try:
            info = os.fstat(fd)  # of the file opened (a sealed segment never changes)
            return region.map_file(fd, info.st_size, info.st_ino)
        finally:
            os.close(fd)

    def _missing(self, name: str, path: str) -> Exception:
        if not os.path.isdir(self.path):
            return _budget.closed_error(self.path)
        why = "its rows were consumed and it was released (a sample index kept from an earlier "
        why += "pass and gathered again?), or the dataset's sampler never handed it out"
        return FileNotFoundError(errno.ENOENT, f"segment {name} is not in the store: {why}", path)

    def drop(self, name: str) -> None:
        """Forget this process's mapping of ``name`` (arrays already taken stay valid)."""
        if name in self._maps:
            self._close_mapping(name)

    def drop_all(self) -> None:
        """Forget this process's mappings of segments, for reading and for writing."""
        for name in list(self._maps):
            self._close_mapping(name)
        self.written.clear()

    def drop_missing(self) -> int:
        """Drop mappings of segments released by any process; returns how many were dropped."""
        try:
            present = set(os.listdir(self.path))
        except FileNotFoundError:
            present = set()
        gone = [name for name in self._maps if name not in present]
        for name in gone:
            self._close_mapping(name)
        return len(gone)

    @property
    def mapped_segments(self) -> list[str]:
        """The segments this process holds mapped through :meth:`open`, least recently used
        first (the next to go past ``max_open``): a released segment's memory comes back only
        once its last mapping goes, so this says what :meth:`drop` and :meth:`drop_missing`
        have left to do here."""
        return list(self._maps)

    def _close_mapping(self, name: str) -> None:
        mm, _ = self._maps.pop(name)
        # Buffers of batches handed out keep the mapping alive until they are freed.
        mm.close()

    # -- both ----------------------------------------------------------------------------------

    def release(self, name: str, *, missing_ok: bool = False, cache_as: str = "") -> None:
        """Give the segment's bytes back to the budget and drop this process's mapping.

        The file stays as a spare that the next writer takes over (see budget.py): its bytes
        count as free, and nothing reads it as this segment again. ``cache_as``: a cache key
        (``reader/cache_key.py``): the file keeps its content under that key instead, for
        :meth:`take_cached`, until a writer needs its room.
        """
        self.drop(name)
        path = self._segment_path(name)
        try:
            if cache_as:
                _budget.make_cached(self.path, path, cache_as)
            else:
                _budget.make_spare(self.path, path)
        except FileNotFoundError as exc:
            if missing_ok:
                return
            if not os.path.isdir(self.path):
                raise _budget.closed_error(self.path) from exc
            raise FileNotFoundError(
                errno.ENOENT, f"segment {name} is not in the store (released twice?)", path
            ) from exc

    def cache(self, name: str, key: str) -> None:
        """Keep the sealed segment ``name``'s content under ``key`` too, for the next reader of
        its task (:meth:`take_cached`), also while it is read (budget.py)."""
        _budget.link_cached(self.path, self._segment_path(name), key)

    def take_cached(
        self, key: str, name: str, urgent: Callable[[], bool] | None = None
    ) -> tuple[SegmentInfo, pa.Schema] | None:
        """The segment cached under ``key``, sealed again as ``name`` (a fresh segment name):
        its rows and size, and its schema; None if the cache does not hold it (any more), or
        if taking it now would leave too little room (``urgent``: as for :meth:`write`; see
        :func:`shmloader.shm.budget.take_cached`)."""
        path = self._segment_path(name)
        if not _budget.take_cached(self.path, key, path, self.budget, urgent):
            return None
        nbytes = os.stat(path).st_size
        with pa.memory_map(path, "r") as mm:  # the footer and the batch's header: no data
            batch = read_segment(mm.read_buffer())
            info, schema = SegmentInfo(name, batch.num_rows, nbytes), batch.schema
            del batch
        return info, schema

    def rename(self, name: str, new_name: str) -> None:
        """Give a sealed segment another segment name (the trainer numbers them by slot).

        Done under the budget lock so that a concurrent ``usage`` scan never misses the file.
        """
        self.drop(name)
        src, dst = self._segment_path(name), self._segment_path(new_name)
        with _budget.locked(self.path):
            if os.path.exists(dst):
                raise FileExistsError(errno.EEXIST, f"segment {new_name} exists already", dst)
            os.rename(src, dst)

    def want(self, keys: Sequence[str]) -> None:
        """Say which segments the consumer waits for now (``keys`` of the writer's choosing,
        e.g. ``"epoch:seq"``); writers of those may use the room others leave (see write)."""
        try:
            hints.want(self.path, keys)
        except FileNotFoundError as exc:
            raise _budget.closed_error(self.path) from exc

    def wanted(self) -> set[str]:
        """The keys last given to :meth:`want` (empty if none)."""
        return hints.wanted(self.path)

    def set_ahead(self, ahead: bool) -> None:
        """Whether the consumer holds enough segments not taken up yet (see shm/hints.py)."""
        try:
            hints.set_ahead(self.path, ahead)
        except FileNotFoundError as exc:
            raise _budget.closed_error(self.path) from exc

    def is_ahead(self) -> bool:
        return hints.is_ahead(self.path)

    def set_last_epoch(self, epoch: int | None) -> None:
        """The last epoch whose tasks the writers may read now (see shm/hints.py)."""
        try:
            hints.set_last_epoch(self.path, epoch)
        except FileNotFoundError as exc:
            raise _budget.closed_error(self.path) from exc

    def last_epoch(self) -> int | None:
        return hints.last_epoch(self.path)

    def in_use(self) -> int:
        """Bytes held by sealed and unsealed segments now (exact: taken under the lock)."""
        with _budget.locked(self.path):
            return _budget.usage(self.path)

    def occupancy(self) -> Occupancy:
        """Bytes of segments (sealed or not), of spares and of cached segments, from one scan
        under the lock."""
        with _budget.locked(self.path):
            found = _budget.scan(self.path)
        return Occupancy(found.in_use, sum(found.spares.values()), sum(found.cached.values()))

    def peak(self) -> int:
        """The most bytes of segments the store held at once, since it was made."""
        return hints.peak(self.path)

    def held(self) -> int:
        """Bytes of all the store's files: segments, sealed or not, spares kept for reuse and
        cached segments (never more than the budget)."""
        return sum(self.occupancy())

    def segments(self) -> dict[str, int]:
        """Sealed segment names and sizes, e.g. to find segments nobody announced."""
        out: dict[str, int] = {}
        try:
            entries = list(os.scandir(self.path))
        except FileNotFoundError as exc:
            raise _budget.closed_error(self.path) from exc
        for entry in entries:
            if is_segment_name(entry.name):
                try:
                    out[entry.name] = entry.stat(follow_symlinks=False).st_size
                except FileNotFoundError:
                    continue
        return out

    def _segment_path(self, name: str) -> str:
        if not is_segment_name(name):
            raise ValueError(f"{name!r} is not a segment name (expected 'seg-' + 32 hex digits)")
        return os.path.join(self.path, name)


def _rebuild_handle(base_dir: str, dataset: str, budget: int, max_open: int) -> StoreHandle:
    return StoreHandle(base_dir, dataset, budget, max_open=max_open)


class SegmentStore(StoreHandle):
    """The owner: creates the dataset directory and removes it on :meth:`close` or exit."""

    _finalizer: weakref.finalize[Any, Any]

    @classmethod
    def create(
        cls,
        budget: int | str,
        base_dir: str | os.PathLike[str] | None = None,
        *,
        max_open: int = DEFAULT_MAX_OPEN,
        reap: bool = True,
    ) -> SegmentStore:
        """Make a new store of ``budget`` bytes under ``base_dir`` (default ``$SHMLOADER_SHM_DIR``
        or ``/dev/shm``), after reaping stores of dead owners there (``reap=False`` skips it).

        Raises :class:`ShmSpaceError` if the filesystem has less free space than ``budget``.
        """
        nbytes = parse_size(budget, what="shm_budget")
        if nbytes <= 0:
            raise ConfigError(f"shm_budget must be positive, got {budget!r}")
        base = resolve_base_dir(base_dir)
        if reap:
            reap_stale(base)
        check_space(base, nbytes)
        dataset = new_dataset_name()
        path = os.path.join(base, dataset)
        os.mkdir(path, 0o700)
        store = cls(base, dataset, nbytes, max_open=max_open)
        store._finalizer = lifecycle.register(store, path)
        try:
            os.close(os.open(os.path.join(path, LOCK_NAME), os.O_CREAT | os.O_EXCL, 0o600))
        except BaseException:
            store.close()
            raise
        return store

    def handle(self, *, max_open: int | None = None) -> StoreHandle:
        """A picklable handle for other processes (pickling the store gives the same)."""
        limit = self.max_open if max_open is None else max_open
        return StoreHandle(self.base_dir, self.dataset, self.budget, max_open=limit)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        """Remove the dataset directory and everything in it. Idempotent."""
        self.drop_all()
        self._finalizer()

    def __enter__(self) -> SegmentStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
