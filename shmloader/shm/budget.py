"""Cross-process budget of one dataset directory.

The truth is the directory itself: bytes in use are the sizes of its files (sealed segments
plus segments being written, which are created at their final size). There is no counter to
get out of step, so a process that crashes cannot leak budget: its files are either released,
reaped (unsealed segments of a dead writer), or removed with the directory.

A released segment becomes a *spare* (renamed, not removed) and the next writer takes it over:
writing into pages a file already has costs about 40% less than into fresh ones, which the
kernel must allocate and zero, and the consumer's last unmapping of a released segment no
longer frees its pages either. Spares do not count as in use; the bytes of segments, segments
being written and spares together still never exceed the budget, because a writer that needs
room removes spares first.

With ``cache=True`` a segment's content is kept for the next epoch's reader of the same task,
under a second name, ``cached-<key>`` (a hard link, :func:`link_cached`, made as the writer
seals it): the next reader takes that name as a sealed segment of its own without reading or
decoding (:func:`take_cached`), also while the segment of the epoch before is still read, and
a released segment keeps only that name (:func:`make_cached`). A file with two names is never
written again: both are sealed, and a scan counts its bytes once, as in use. Cached files
that are nothing else are free room like spares, but worth more: a writer writes over one,
or removes it, only when the budget has no room left without it, so the cache holds what the
budget leaves and gives way to the segments in use.

Every change that could make a scan under-count is done under an exclusive ``flock`` on
``<dataset>/.lock``: creating a reservation (check-then-create must be atomic) and sealing (a
rename makes a file vanish under one name and appear under another). Removing a file needs no
lock: a scan that misses a removal only over-counts, which errs on the safe side.

Writers that do not fit wait by polling with exponential backoff (one
lock, one directory scan per poll). A stop ``Event`` is waited on instead of sleeping, so a
stop request ends the wait at once. There is no queue: a large batch can wait while smaller
ones keep fitting; with equal-sized tasks (the usual case) this does not starve anyone.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple, Protocol

from .._flock import exclusive
from ..errors import ShmSpaceError, StoreClosedError
from . import hints
from .names import (
    CACHED_PREFIX,
    LOCK_NAME,
    SEGMENT_PREFIX,
    SPARE_PREFIX,
    cached_name,
    is_alive,
    new_spare_name,
    new_temp_name,
    parse_temp_name,
)
from .sizes import format_size
from .space import room_fixes, space

_MIN_DELAY = 0.0005
_BLOCKED_EVERY = 0.05  # seconds between looks at whether the consumer waits for a blocked write
_MAX_DELAY = 0.010
_REAP_EVERY = 0.05  # seconds between looks for dead writers' reservations while waiting


class _Event(Protocol):
    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = ...) -> bool: ...


StopSignal = _Event | Callable[[], bool]
"""An Event (threading or multiprocessing) or a callable; true means "stop waiting"."""


def closed_error(dataset_path: str) -> StoreClosedError:
    return StoreClosedError(
        f"segment store {dataset_path} no longer exists: its owner closed it or exited"
    )


@contextmanager
def locked(dataset_path: str) -> Iterator[None]:
    """Hold the dataset's lock (threads of one process exclude each other too, and a fork
    meanwhile cannot leave it held: see ``_flock.py``)."""
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(exclusive(os.path.join(dataset_path, LOCK_NAME)))
        except FileNotFoundError as exc:
            raise closed_error(dataset_path) from exc
        yield


# Sizes of sealed segments seen by this process, per dataset: sealed files never change size,
# so a scan stats only new and unsealed files (a store may hold hundreds of segments).
_sealed_sizes: dict[str, dict[str, int]] = {}


class Scan(NamedTuple):
    """What a directory scan finds: bytes in use (segments sealed or being written), the
    spares with their sizes, the largest segment, and the cached segments with their sizes."""

    in_use: int
    spares: dict[str, int]
    largest: int
    cached: dict[str, int]


def usage(dataset_path: str) -> int:
    """Bytes of segments, sealed or being written; exact only under :func:`locked`."""
    return scan(dataset_path).in_use


def scan(dataset_path: str) -> Scan:
    """Sizes of the store's files, by kind; exact only under :func:`locked`."""
    try:
        entries = list(os.scandir(dataset_path))
    except FileNotFoundError as exc:
        _sealed_sizes.pop(dataset_path, None)
        raise closed_error(dataset_path) from exc
    known = _sealed_sizes.get(dataset_path, {})
    stable: dict[str, int] = {}
    spares: dict[str, int] = {}
    cached: dict[str, int] = {}
    linked: set[int] = set()  # inodes of segments in use: a cached name of one costs nothing
    cached_inodes: dict[str, int] = {}
    total = largest = 0
    for entry in entries:
        # Only segments (sealed or being written), spares and cached segments hold memory;
        # other files (the lock, the dataset's gather ledger folder) are bookkeeping.
        name = entry.name
        sealed = name.startswith(SEGMENT_PREFIX)
        spare = not sealed and name.startswith(SPARE_PREFIX)
        kept = not sealed and not spare and name.startswith(CACHED_PREFIX)
        if not sealed and not spare and not kept and parse_temp_name(name) is None:
            continue
        size = known.get(name)
        if size is None:
            try:
                size = entry.stat(follow_symlinks=False).st_size
            except FileNotFoundError:
                continue  # released or taken meanwhile
        if sealed or spare or kept:  # names of files that never change size
            stable[name] = size
        if spare:
            spares[name] = size
        elif kept:
            cached[name] = size
            cached_inodes[name] = entry.inode()
        else:
            inode = entry.inode()
            if inode in linked:  # a cached task taken while its last epoch's copy is read
                continue
            linked.add(inode)
            total += size
            largest = max(largest, size)
    _sealed_sizes[dataset_path] = stable
    if linked:
        cached = {n: size for n, size in cached.items() if cached_inodes[n] not in linked}
    return Scan(total, spares, largest, cached)


def reap_dead_writers(dataset_path: str, *, dry_run: bool = False) -> list[tuple[str, int]]:
    """Remove unsealed segments whose writer is gone; return ``(name, bytes held)`` of each."""
    found: list[tuple[str, int]] = []
    try:
        entries = list(os.scandir(dataset_path))
    except FileNotFoundError:
        return found
    for entry in entries:
        writer = parse_temp_name(entry.name)
        if writer is None or is_alive(*writer):
            continue
        try:
            held = entry.stat(follow_symlinks=False).st_blocks * 512
            if not dry_run:
                os.unlink(entry.path)
        except FileNotFoundError:
            continue  # another reaper was faster
        found.append((entry.name, held))
    return found


def _stop_requested(should_stop: StopSignal | None) -> bool:
    if should_stop is None:
        return False
    is_set = getattr(should_stop, "is_set", None)
    return bool(is_set()) if callable(is_set) else bool(should_stop())  # type: ignore[operator]


def _pause(seconds: float, should_stop: StopSignal | None) -> None:
    wait = getattr(should_stop, "wait", None)
    if callable(wait) and callable(getattr(should_stop, "is_set", None)):
        wait(seconds)
    else:
        time.sleep(seconds)


def _filesystem_too_small(dataset_path: str, nbytes: int) -> str:
    """What to add to a segment-never-fits error when the filesystem itself could not hold a
    budget of two such segments (a container's small /dev/shm, which shm_budget="auto"
    sized itself to): raising shm_budget alone would then be refused. Room is what is free
    plus what this store holds already."""
    base_dir = os.path.dirname(dataset_path)
    have = space(base_dir)
    if have.free + usage(dataset_path) >= 2 * nbytes:
        return ""
    return (
        f". {base_dir} has {format_size(have.free)} free of {format_size(have.total)}, too "
        f"little for a larger budget: {room_fixes(base_dir, have, 2 * nbytes)}"
    )


def reserve(
    dataset_path: str,
    nbytes: int,
    budget: int,
    *,
    timeout: float | None = None,
    should_stop: StopSignal | None = None,
    urgent: Callable[[], bool] | None = None,
    on_wait: Callable[[float], None] | None = None,
) -> str | None:
    """Create an unsealed segment of exactly ``nbytes`` once it fits in ``budget``.

    ``on_wait(seconds)``: called, once it is over, with how long it waited for room (not
    called when the segment fitted at once).

    Returns its path, or None if ``should_stop`` became true while waiting. Raises
    :class:`TimeoutError` after ``timeout`` seconds of waiting, :class:`ShmSpaceError` if
    ``nbytes`` exceeds the whole budget (waiting would never end).

    ``urgent``: given by writers whose consumer takes segments in an order of its own (the
    dataset's sampler). Such a writer leaves room for one more segment, as large as the
    largest in the store or the largest the consumer has seen (the ``largest`` hint), unless
    ``urgent()`` says the consumer is waiting for this very one:
    otherwise segments the consumer cannot use yet could fill the budget while the one it
    waits for has no room, and both would wait forever.
    """
    if nbytes > budget:
        raise ShmSpaceError(
            f"a segment of {format_size(nbytes)} ({nbytes} bytes) cannot fit in shm_budget "
            f"{format_size(budget)} ({budget} bytes) even when nothing else is in use; raise "
            f"shm_budget, or make tasks smaller (a lower records_per_task) unless a task is one "
            f"record already{_filesystem_too_small(dataset_path, nbytes)}",
            never_fits=True,
        )
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout
    delay = _MIN_DELAY
    last_reap = start
    blocked = waiting = False
    next_blocked_check = start
    seen = hints.largest(dataset_path) if urgent is not None else 0
    try:
        while True:
            with locked(dataset_path):
                used, spares, largest, cached = scan(dataset_path)
                keep = 0 if urgent is None else max(nbytes, largest, seen)
                fits = used + nbytes + keep <= budget
                if not fits and urgent is not None and used + nbytes <= budget:
                    fits = urgent()
                if fits:
                    _note_peak(dataset_path, used + nbytes)
                    room = budget - used - nbytes
                    return _take_room(dataset_path, nbytes, room, spares, cached)
            if not waiting:  # a reader that waits for room is not stuck: say so (hints.py)
                waiting = True
                hints.set_waiting(dataset_path, True)
            now = time.monotonic()
            # The consumer waits for this very segment, and it has no room: say so (and no
            # more once it stops waiting for it). Asked now and then: it reads a file.
            if urgent is not None and now >= next_blocked_check:
                next_blocked_check = now + _BLOCKED_EVERY
                if (used + nbytes > budget and urgent()) != blocked:
                    blocked = not blocked
                    hints.set_blocked(dataset_path, blocked)
            if now - last_reap >= _REAP_EVERY:
                last_reap = now
                if reap_dead_writers(dataset_path):
                    continue
            if _stop_requested(should_stop):
                return None
            if deadline is not None and now >= deadline:
                raise TimeoutError(
                    f"waited {now - start:.1f} s for {format_size(nbytes)} of shared memory in "
                    f"{dataset_path}: {format_size(used)} of the {format_size(budget)} budget "
                    f"stay in use (segments not released by the consumer?)"
                )
            pause = delay if deadline is None else min(delay, max(deadline - now, 0.0))
            _pause(pause, should_stop)
            delay = min(delay * 2, _MAX_DELAY)
    finally:
        if blocked:
            hints.set_blocked(dataset_path, False)
        if waiting:
            hints.set_waiting(dataset_path, False)
            if on_wait is not None:
                on_wait(time.monotonic() - start)


def _note_peak(dataset_path: str, in_use: int) -> None:
    """Keep the most bytes of segments the store held at once (under the lock, as the
    reservation that reaches it is made)."""
    if in_use > hints.peak(dataset_path):
        hints.set_peak(dataset_path, in_use)


def _take_room(
    dataset_path: str, nbytes: int, room: int, spares: dict[str, int], cached: dict[str, int]
) -> str:
    """A new unsealed segment of ``nbytes``, made from a spare if there is one (under the
    lock); spares, then cached segments, beyond the ``room`` left in the budget are removed.
    A cached segment is written over only when there is no spare and no room without it."""
    if spares:
        reusable = spares
    elif sum(cached.values()) > room:
        reusable = cached
    else:
        return _create(dataset_path, nbytes)
    # The smallest spare that is large enough, else the largest: the fewest new pages. Among
    # equals the one released last (names sort by release time), and the first removed are
    # the largest, oldest ones: gathering processes keep their mappings of the files they
    # released last (spare_maps.py), so those are the ones worth writing into again.
    fits = [n for n in reusable if reusable[n] >= nbytes]
    if fits:
        name = max(fits, key=lambda n: (-reusable[n], n))
    else:
        name = max(reusable, key=lambda n: (reusable[n], n))
    kept = sum(spares.values()) + sum(cached.values()) - reusable[name]
    for group in (spares, cached):
        for extra in sorted(group, key=lambda n: (-group[n], n)):
            if kept <= room:
                break
            if extra == name:
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(dataset_path, extra))
            kept -= group[extra]
    path = os.path.join(dataset_path, new_temp_name())
    try:
        os.rename(os.path.join(dataset_path, name), path)
    except FileNotFoundError:
        if not os.path.isdir(dataset_path):
            raise closed_error(dataset_path) from None
        return _create(dataset_path, nbytes)  # removed by someone else meanwhile
    try:
        os.truncate(path, nbytes)
    except BaseException:
        os.unlink(path)
        raise
    return path


def make_spare(dataset_path: str, segment_path: str) -> None:
    """Keep a released segment for reuse (under the lock: the rename must not escape a scan).
    A segment with another name (a cached one's, or the next epoch's) only loses this one: its
    content is still read."""
    with locked(dataset_path):
        if os.stat(segment_path).st_nlink > 1:
            os.unlink(segment_path)
        else:
            os.rename(segment_path, os.path.join(dataset_path, new_spare_name()))


def link_cached(dataset_path: str, segment_path: str, key: str) -> None:
    """Give a sealed segment its cached name under ``key`` too (a hard link): the next reader
    of its task finds it there, whether or not this one is released by then. A segment cached
    under the key already keeps it (the same records, decoded the same way)."""
    with locked(dataset_path), contextlib.suppress(FileExistsError):
        os.link(segment_path, os.path.join(dataset_path, cached_name(key)))


def make_cached(dataset_path: str, segment_path: str, key: str) -> None:
    """Keep a released segment's content under ``key`` only (under the lock, as for a
    spare): its cached name stays, or it becomes the one (a copy cached under the key before
    is replaced: the same records, decoded the same way)."""
    cached = os.path.join(dataset_path, cached_name(key))
    with locked(dataset_path):
        try:
            same = os.path.samestat(os.stat(cached), os.stat(segment_path))
        except FileNotFoundError:
            same = False
        if same:  # rename() of a name onto another of the same file does nothing
            os.unlink(segment_path)
        else:
            os.rename(segment_path, cached)


def take_cached(
    dataset_path: str,
    key: str,
    segment_path: str,
    budget: int,
    urgent: Callable[[], bool] | None = None,
) -> bool:
    """Make the segment cached under ``key`` the sealed segment ``segment_path``; False if
    none is (never cached, written over to make room, or taken by another reader), or if
    taking it would break :func:`reserve`'s rule for a writer with ``urgent``.

    A cached segment is room a writer may take; once taken, it is a segment in use. So it is
    taken as a write would be: leaving room for one more segment as large as the largest,
    unless ``urgent()`` (the consumer waits for this task). Otherwise readers serving a later
    epoch from the cache could fill the budget with segments the consumer cannot take yet,
    while the task it waits for, not cached, finds no room to be decoded into: a dead end.
    Not taken, the task is read and written the usual way, which waits for room. A cached
    name of a segment still in use (the epoch before reads it) costs no room: taken freely."""
    name = cached_name(key)
    with locked(dataset_path):
        used, _spares, largest, cached = scan(dataset_path)  # one look, under the lock
        nbytes = cached.get(name, 0)  # 0: shared with a segment in use (scan), or none
        if nbytes and urgent is not None:
            keep = max(nbytes, largest, hints.largest(dataset_path))
            if used + nbytes + keep > budget and not urgent():
                return False
        try:
            os.rename(os.path.join(dataset_path, name), segment_path)
        except FileNotFoundError:
            return False  # never cached, written over, or taken by another reader
        _note_peak(dataset_path, used + nbytes)
        return True


def _create(dataset_path: str, nbytes: int) -> str:
    path = os.path.join(dataset_path, new_temp_name())
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    except FileNotFoundError as exc:
        raise closed_error(dataset_path) from exc
    try:
        os.ftruncate(fd, nbytes)
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    return path


def seal(dataset_path: str, temp_path: str, name: str) -> None:
    """Give a fully written segment its final name, atomically and under the lock."""
    with locked(dataset_path):
        try:
            os.rename(temp_path, os.path.join(dataset_path, name))
        except FileNotFoundError as exc:
            if not os.path.isdir(dataset_path):
                raise closed_error(dataset_path) from exc
            raise
