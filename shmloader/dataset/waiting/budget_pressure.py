"""Budget pressure: how ``shm_budget`` stands, for the sampler's waits.

Readers write a task's segment only where the budget has room for it; the rows that hold the
room go once the loop consumes them. While the sampler waits for a task, the wait asks here how
things stand (:class:`~shmloader.dataset.core.tasks.Pressure`): readers merely starved (room
comes back as the loop consumes), a reader of a task waited for blocked on room, the rows a
batcher holds pinning that room (only letting them go can help), or no row left to consume that
could make room at all (a dead end, which the wait raises on).
"""

from __future__ import annotations

from collections.abc import Callable

from ..core.tasks import Pressure


class BudgetPressure:
    """The pressure probes over the reader pool's hints and the rows not consumed yet."""

    def __init__(
        self,
        *,
        starved: Callable[[], bool] | None = None,  # readers wait for budget
        blocked: Callable[[], bool] | None = None,  # a wanted task's reader has no room
        unconsumed_rows: Callable[[], int],  # rows handed out and not consumed yet
    ) -> None:
        self._starved = starved or (lambda: False)
        self._blocked = blocked or (lambda: False)
        self.unconsumed_rows = unconsumed_rows

    def starved(self) -> bool:
        """Readers wait for room in the budget: more tasks cannot arrive until rows go."""
        return self._starved()

    def blocked(self) -> bool:
        """A reader of a task the sampler waits for has no room (shm/hints.py)."""
        return self._blocked()

    def pinned(self, held: int) -> bool:
        """Blocked, and the ``held`` rows a batcher holds are all that is not consumed: only
        letting those go can make room (TaskBatchSampler)."""
        return self._blocked() and self.unconsumed_rows() == held

    def dead_end(self) -> bool:
        """Blocked, and no row handed out is left to consume that could make room."""
        return self.pinned(0)

    def now(self, stuck: Callable[[], bool] | None = None) -> Pressure:
        """How the budget stands for the sampler's wait; ``stuck()``: whether the rows the batcher
        holds pin the room (the batcher's own view of what it holds)."""
        if not self._blocked():
            return Pressure.STARVED if self._starved() else Pressure.NONE
        if stuck is not None and stuck():
            return Pressure.PINNED
        return Pressure.DEAD_END if self.dead_end() else Pressure.BLOCKED
