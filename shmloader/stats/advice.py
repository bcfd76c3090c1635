"""``Stats.advice()``: the figures of a snapshot turned into what to change, in plain words.

Each rule looks at a few figures and, when they point one way, says what they show (quoting
them) and what to try. The thresholds below are where the rule starts to speak; a rule never
guesses from figures that are not there (a plain DataLoader hides its loop: then the loop's
rules keep quiet and one line says how to see it).

The figures the rules read are named below (:class:`Figures`, :class:`ReaderFigures`,
:class:`ProcessFigures`): a :class:`~.stats.Stats` has them all, and so do figures made up
to try a rule. The rules know nothing else of a snapshot, and ``Stats.advice()`` asks them.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Protocol

MIB = 1 << 20

# The loop waits for data in more than this share of its time: feeding is the bottleneck;
# in less, with readers idle or waiting for room, the loop is. (Without workers the wait
# includes gathering each batch, a few percent of a short step.)
LOOP_WAITS = 0.10
# Readers are busy reading in more than this share of their time (on average).
READERS_BUSY = 0.70
# Readers are busy in less than this share of their time: they have little to do.
READERS_IDLE = 0.30
# Readers wait for room in the budget in more than this share of their time (on average).
READERS_WAIT_FOR_ROOM = 0.30
# The budget counts as used up when its peak reached this share of it.
FULL_BUDGET = 0.80
# Cores count as free when this job left at least this many of those it may run on unused,
# on average. The job's own use, not the machine's: on a machine other jobs load, the kernel
# shares the cores among processes, and more readers get this job a larger share of them.
FREE_CORES = 0.75
# Batches the loop must have received before its figures say anything (its first batches
# wait for the readers to start).
MIN_BATCHES = 20
# A process's PSS grows: by more than this share and this many bytes from the first epoch
# measured after the first one, over at least MIN_EPOCHS epochs measured.
GROWTH_SHARE = 0.10
GROWTH_BYTES = 32 * MIB
MIN_EPOCHS = 3
# cache=True: tasks decoded again, past this share of those read again, say the budget is
# too small to keep them (a few come at an epoch's start, read while still being written).
DECODED_AGAIN = 0.10


class ReaderFigures(Protocol):
    """What the rules read of one reader slot (a :class:`~.stats.ReaderStats`)."""

    @property
    def index(self) -> int: ...

    @property
    def restarts(self) -> int: ...

    @property
    def busy_share(self) -> float: ...

    @property
    def budget_wait_share(self) -> float: ...

    @property
    def alive(self) -> bool: ...


class ProcessFigures(Protocol):
    """What the rules read of one process (a :class:`~.stats.ProcessStats`): ``memory`` only
    as measured or not (None)."""

    @property
    def pid(self) -> int: ...

    @property
    def role(self) -> str: ...

    @property
    def memory(self) -> object | None: ...

    @property
    def uss_by_epoch(self) -> Sequence[tuple[int, int]]: ...

    @property
    def alive(self) -> bool: ...


class Figures(Protocol):
    """What the rules read of a snapshot (a :class:`~.stats.Stats`, whose docstring says what
    each figure counts)."""

    @property
    def readers(self) -> Sequence[ReaderFigures]: ...

    @property
    def processes(self) -> Sequence[ProcessFigures]: ...

    @property
    def records_consumed(self) -> int: ...

    @property
    def batches_delivered(self) -> int: ...

    @property
    def loop_wait_share(self) -> float | None: ...

    @property
    def reader_wait_share(self) -> float | None: ...

    @property
    def shm_budget(self) -> int: ...

    @property
    def shm_peak(self) -> int: ...

    @property
    def shm_free(self) -> int: ...

    @property
    def cpu_cores(self) -> int: ...

    @property
    def cpu_job_cores(self) -> float: ...

    @property
    def regranted_tasks(self) -> int: ...

    @property
    def regranted_records(self) -> int: ...

    @property
    def tasks_from_cache(self) -> int: ...

    @property
    def tasks_decoded_again(self) -> int: ...

    @property
    def cache_wanted(self) -> int: ...


def advice(stats: Figures) -> list[str]:
    """The advice for ``stats``, most important first; empty when nothing stands out."""
    lines = _feeding(stats)
    lines += [_growth(p) for p in stats.processes if _grows(p)]
    lines += _health(stats)
    lines += _cache(stats)
    return lines


def _cache(stats: Figures) -> list[str]:
    """cache=True with a budget too small to keep every decoded task."""
    again, kept = stats.tasks_decoded_again, stats.tasks_from_cache
    if again < 2 or again <= DECODED_AGAIN * (again + kept):
        return []
    want = stats.cache_wanted + stats.shm_peak
    return [
        f"cache=True: {again} tasks were read and decoded again in a later epoch ({kept} "
        f"came from the cache): shm_budget {_mib(stats.shm_budget)} cannot keep the "
        f"{_mib(stats.cache_wanted)} of decoded tasks beside those being read (peak "
        f"{_mib(stats.shm_peak)}). A shm_budget of about {_mib(want)} keeps them all; "
        "/dev/shm must have that much free."
    ]


def _feeding(stats: Figures) -> list[str]:
    """Who is the bottleneck: the readers, the budget, gathering, or the loop."""
    share, on_readers = stats.loop_wait_share, stats.reader_wait_share
    if share is None or on_readers is None:
        if stats.records_consumed and not stats.batches_delivered:
            return [
                "The loop's wait for data is not measured under a plain torch DataLoader: "
                "iterate shmloader.DataLoader(ds, batch_size=...) to see it, and advice on it."
            ]
        return []
    if stats.batches_delivered < MIN_BATCHES or not stats.readers:
        return []
    running = [r for r in stats.readers if r.alive] or stats.readers  # not those retired
    n = len(running)
    busy = sum(r.busy_share for r in running) / n
    room = sum(r.budget_wait_share for r in running) / n
    free = max(0.0, stats.cpu_cores - stats.cpu_job_cores)
    job = f"this job kept {stats.cpu_job_cores:.1f} of {stats.cpu_cores} cores busy"
    waits = f"The loop waited for data {share:.0%} of its time ({on_readers:.0%} for the readers)"
    if share > LOOP_WAITS and on_readers >= share / 2:  # waiting on the readers, mostly
        if busy > READERS_BUSY and free >= FREE_CORES:
            return [
                f"{waits}, while {_were(n)} busy {busy:.0%} of the time and {job}: the "
                f"readers are the bottleneck. Add readers (num_readers={n + max(1, int(free))}"
                ', or "auto"), or decode with a decode_batch that works on many records at '
                "once."
            ]
        if busy > READERS_BUSY:
            return [
                f"{waits}, while {_were(n)} busy {busy:.0%} of the time and {job}: decoding "
                "needs more CPU than this job's cores give. More readers would not help; a "
                "cheaper decode would (a decode_batch, fewer columns), or more cores."
            ]
        if room > READERS_WAIT_FOR_ROOM:
            return [
                f"{waits}, while the readers waited for room in shared memory {room:.0%} of "
                f"theirs (shm_budget {_mib(stats.shm_budget)}, peak in use "
                f"{_mib(stats.shm_peak)}): rows handed out hold the budget. Raise "
                f"shm_budget (about two shuffle windows of tasks).{_room_to_raise(stats)}"
            ]
        return [
            f"{waits}, but the readers were busy only {busy:.0%} of theirs and waited for "
            f"room {room:.0%}: they wait for tasks. Larger tasks (records_per_task) mean "
            "fewer round trips to the master per record; with several trainers on one "
            "master, see whether it keeps up (shmloader top HOST:PORT)."
        ]
    if share > LOOP_WAITS:  # waiting for batches to be gathered and handed over
        workers = sum(p.role == "worker" and p.alive for p in stats.processes)
        more = free >= FREE_CORES and workers < stats.cpu_cores  # a core for one more
        try_ = f"more DataLoader workers (num_workers={workers + 1})" if more else "fewer columns"
        return [
            f"{waits}: the rows were ready, and the wait is gathering them into batches and "
            f"handing those over. Try {try_}, or a larger batch_size (gathering costs "
            "less per row in larger batches)."
        ]
    if busy < READERS_IDLE or room > READERS_WAIT_FOR_ROOM:
        held = (
            f"waited for room in shared memory {room:.0%} of theirs"
            if room > READERS_WAIT_FOR_ROOM
            else f"were busy only {busy:.0%} of theirs"
        )
        spare = []
        if n > 1:
            spare.append(f"fewer readers (num_readers={n - 1})")
        if stats.shm_peak >= FULL_BUDGET * stats.shm_budget:
            spare.append(f"a smaller shm_budget than {_mib(stats.shm_budget)}")
        said = " or ".join(spare)
        then = (
            f"{said[0].upper()}{said[1:]} would keep its speed and leave cores and memory to "
            "the model."
            if spare
            else "Feeding keeps up; nothing to change on this side."
        )
        return [
            f"{waits}, and the readers {held}: the loop is the bottleneck, and the readers "
            f"are ahead of it. {then}"
        ]
    return []


def _grows(p: ProcessFigures) -> bool:
    # USS: PSS moves as other processes map the same libraries or leave, leak or not. The
    # first epoch warms up (imports, caches, mappings).
    epochs = p.uss_by_epoch[1:]
    if len(epochs) < MIN_EPOCHS - 1 or p.memory is None:
        return False
    first, last = epochs[0][1], epochs[-1][1]
    rising = all(b[1] >= a[1] for a, b in itertools.pairwise(epochs))
    return rising and last - first > max(GROWTH_BYTES, GROWTH_SHARE * first)


def _growth(p: ProcessFigures) -> str:
    (e0, first), (e1, last) = p.uss_by_epoch[1], p.uss_by_epoch[-1]
    return (
        f"The {p.role} pid {p.pid} grew from {_mib(first)} (USS) in epoch {e0} to "
        f"{_mib(last)} in epoch {e1}: something in that process keeps data from "
        "batch to batch (a list of batches or losses that keep their tensors, a cache "
        "without bound)."
    )


def _health(stats: Figures) -> list[str]:
    """Readers that die, tasks that fail, rows that may have come twice."""
    lines = []
    for r in stats.readers:
        if r.restarts:
            lines.append(
                f"Reader {r.index} was restarted {r.restarts} time(s): a reader died (a crash "
                "in decode, or the kernel's out-of-memory killer). Its error output says why."
            )
    if stats.regranted_records:
        lines.append(
            f"{stats.regranted_records} rows of {stats.regranted_tasks} tasks may have come "
            "twice: this trainer stalled longer than the master's lease_timeout and the "
            "master gave its tasks to another trainer. Raise the master's consumer_timeout "
            "above the longest stall."
        )
    return lines


def _room_to_raise(stats: Figures) -> str:
    """Where the shared-memory filesystem has less free than the budget already is, raising
    shm_budget needs a larger filesystem first (the default budget sized itself to it)."""
    if stats.shm_free >= stats.shm_budget:
        return ""
    return (
        f" Its filesystem has only {_mib(stats.shm_free)} free: enlarge it first "
        "(docker run --shm-size=..., docs/how-to/shared-memory.md)."
    )


def _mib(nbytes: int) -> str:
    mib = nbytes / MIB
    return f"{mib:.1f} MiB" if mib < 10 else f"{mib:.0f} MiB"


def _were(n: int) -> str:
    return "the reader was" if n == 1 else f"the {n} readers were"
