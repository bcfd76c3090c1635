"""What the sampler needs from the trainer's data plane, kept narrow (tests give their own)."""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np

from ..core.tasks import ReadyTask
from ..waiting.budget_pressure import BudgetPressure
from ..waiting.elsewhere import ElsewhereCount
from ..waiting.ready import ReadyTasks


class Feed(Protocol):
    """What the sampler needs from the dataset's data plane (kept narrow for testing)."""

    ready: ReadyTasks
    pressure: BudgetPressure  # how the budget stands, for the waits

    @property
    def elsewhere(self) -> ElsewhereFeed:
        """The tasks the sampler waits for that are not ready here."""
        ...

    def epoch_to_iterate(self) -> int:
        """The unfinished epoch, or the next one."""
        ...

    def remaining_seqs(self, epoch: int) -> list[int]:
        """Task positions of ``epoch`` not yet admitted, in order."""
        ...

    def epochs_over(self, epoch: int) -> int | None:
        """The master's number of epochs if ``epoch`` is past its last one, else None."""
        ...

    def ledger_rows(self) -> int:
        """Rows a plain DataLoader's workers reported gathered so far (consumed as gathered)."""
        ...

    def reclaim(self, epoch: int) -> np.ndarray:
        """Indices emitted earlier in ``epoch`` but never consumed (an abandoned pass)."""
        ...

    def rest_of_last_pass(self, epoch: int, *, poll: bool = True) -> np.ndarray:
        """Indices the finished pass of the epoch before ``epoch`` left unconsumed."""
        ...

    def admit(self, task: ReadyTask) -> np.ndarray:
        """Start tracking ``task``; returns the indices of its rows still to deliver."""
        ...

    def handed_out(self, indices: np.ndarray) -> None:
        """The sampler hands these admitted rows out, in this order: ``reclaim`` gives back
        those left unconsumed in it."""
        ...

    def pass_rows(self, epoch: int) -> int:
        """Rows a pass over ``epoch`` delivers: what ``reclaim`` gives back, and the epoch's
        rows not admitted yet, less those consumed before a resume."""
        ...

    def epoch_rows(self, epoch: int) -> int:
        """Rows ``epoch`` schedules for this consumer, consumed or not."""
        ...

    def finish_epoch(self, epoch: int) -> None: ...

    def find_elsewhere(self, epoch: int, seqs: list[int]) -> set[int]:
        """Those of ``seqs`` that will not come here (another trainer took them, or done)."""
        ...


class FirstPass(NamedTuple):
    """The first pass while the dataset has not started (worked out from the plan, so that
    ``len()`` starts nothing): its epoch's rows for this consumer, and those left of them."""

    epoch_rows: int
    left: int


class ElsewhereFeed(Protocol):
    """What the sampler asks of the tasks it waits for that are not ready here (elsewhere.py)."""

    def want(self, epoch: int, seqs: list[int]) -> None:
        """The sampler is about to wait for these tasks (empty: for none)."""
        ...

    def take_ready(self) -> list[ReadyTask]:
        """Tasks given up as elsewhere that came here after all, ready now."""
        ...

    def look(self) -> ElsewhereCount:
        """Of the tasks given up as elsewhere, how many may still come here and how many
        another trainer took in hand."""
        ...

    def want_all(self) -> None:
        """The sampler is about to wait for the tasks given up as elsewhere."""
        ...
