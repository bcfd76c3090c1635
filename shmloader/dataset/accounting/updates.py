"""What changes the consumption book, and what it asks for in return: both plain values.

The book (book.py) changes only through :meth:`~ConsumptionBook.apply` of one of the *updates*
below, as the master's dispatcher changes only through its updates (``master/updates.py``).
Each update says what happened, never what to do about it: a reader sealed a task, the sampler
took one, rows were gathered or consumed. The book decides and answers with *effects*, which the
data plane (plane.py) carries out against the store, the ready board and the master. Effects
carry ids, numbers and frozen values (:class:`AdmittedTask`), never the book's live state, so the
outbox may read them outside the plane's lock while the next update changes the book.

Reports of rows come from three places, all as :class:`Reported` (reports.py turns each into
one): the gather ledger of a plain DataLoader's workers, the training process's own gathers,
and the loop's receipts (``shmloader.DataLoader`` after its transform; torch's requests).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..core.indices import SegmentRows
from ..core.tasks import ReadyTask

# -- updates ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Announced:
    """A reader sealed ``task``'s segment: a new task is made ready, a second copy dropped.
    ``confirmed``: when its lease was last known active (``waiting/lease_check.py``)."""

    task: ReadyTask
    confirmed: float | None = None


@dataclass(frozen=True)
class NotDelivered:
    """``task``, ready here, is not delivered here: its lease lapsed before the sampler took it
    (``waiting/lease_check.py`` asked the master). A later copy is welcome."""

    task: ReadyTask


@dataclass(frozen=True)
class Admitted:
    """The sampler takes ``task``, in its order: its rows get a slot and are issued."""

    task: ReadyTask


@dataclass(frozen=True)
class HandedOut:
    """The sampler hands these sample indices out in this order (their ranks)."""

    indices: np.ndarray


@dataclass(frozen=True)
class Reported:
    """Rows were gathered and/or consumed. ``only_gathered``: of the rows, those gathered
    already are consumed (a plain DataLoader's loop received their batch, reported by torch's
    requests; a row a worker failed to gather is not)."""

    groups: Sequence[SegmentRows]
    gathered: bool
    consumed: bool
    only_gathered: bool = False


@dataclass(frozen=True)
class EpochIterated:
    """The sampler yielded every row of ``epoch``: the next pass is over the next one."""

    epoch: int


@dataclass(frozen=True)
class Elsewhere:
    """The master says tasks ``seqs`` of ``epoch`` will not come here: they are elsewhere."""

    epoch: int
    seqs: tuple[int, ...]


@dataclass(frozen=True)
class Finished:
    """The master finished every epoch before ``before`` and the sampler is past them."""

    before: int


Update = (
    Announced
    | NotDelivered
    | Admitted
    | HandedOut
    | Reported
    | EpochIterated
    | Elsewhere
    | Finished
)


# -- effects ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdmittedTask:
    """A task the sampler took, as a value: what effects carry and what the outbox and the
    lapsed leases read outside the plane's lock (never the book's live slot state, which the
    next update changes)."""

    task: ReadyTask
    rows: int  # rows to deliver
    consumed: int  # of them, consumed so far


@dataclass(frozen=True)
class MakeReady:
    """Put ``task`` on the ready board for the sampler (records earlier holders consumed are
    in ``task.consumed``, those of a crashed trainer whose leases were taken over included).
    ``confirmed``: as announced, for the lease check."""

    task: ReadyTask
    confirmed: float | None = None


@dataclass(frozen=True)
class Issue:
    """Hand the sampler these sample indices of an admitted task (empty: nothing to deliver)."""

    indices: np.ndarray


@dataclass(frozen=True)
class Release:
    """Remove ``segment`` from the store: nothing reads it any more. ``cache_as``: keep its
    content under this key instead, for the next reader of the task (``cache=True``)."""

    segment: str
    cache_as: str = ""


@dataclass(frozen=True)
class Rename:
    """Rename a reader's ``segment`` after the slot it was admitted as (``slot_name``), so a
    DataLoader worker can open it from a sample index alone."""

    segment: str
    to: str


@dataclass(frozen=True)
class MarkTaken:
    """Tell the master the sampler took ``admitted``'s task (other trainers stop waiting for it)."""

    admitted: AdmittedTask


@dataclass(frozen=True)
class Undelivered:
    """``task``'s ready copy is not delivered here (its lease lapsed): the sampler waits for the
    task as for one elsewhere, and its lease is nothing more to warn about."""

    task: ReadyTask


@dataclass(frozen=True)
class Complete:
    """Complete ``lease_id`` at the master: its task was consumed (``admitted``: the task as
    it completed), or its copy came twice (``admitted`` None)."""

    lease_id: int
    admitted: AdmittedTask | None = None


@dataclass(frozen=True)
class ConsumedAgain:
    """``rows`` rows of ``slot`` were reported consumed after the slot was released and
    completed (every row consumed): rows delivered twice. Nothing in the book changes; the
    plane counts them and says so, since exactly-once was broken somewhere upstream."""

    slot: int
    rows: int


@dataclass(frozen=True)
class Forgotten:
    """Epochs before ``before`` are forgotten; ``live_leases`` are still delivered here."""

    before: int
    live_leases: tuple[int, ...]


Effect = (
    MakeReady
    | Issue
    | Release
    | Rename
    | MarkTaken
    | Undelivered
    | Complete
    | ConsumedAgain
    | Forgotten
)
