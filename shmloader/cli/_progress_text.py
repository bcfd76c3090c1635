"""A master's progress as lines of text, for ``shmloader master``'s last words and ``top``."""

from __future__ import annotations

from collections.abc import Sequence

from ..master.progress import EpochProgress, Progress


def epoch_lines(e: EpochProgress) -> list[str]:
    """One line for the epoch, plus one per quarantined task (lost records are never hidden)."""
    state = "finished" if e.finished else "open"
    lines = [
        f"  epoch {e.epoch} ({state}): {e.done_records}/{e.total_records} records done, "
        f"{e.leased_records} leased, {e.quarantined_records} quarantined, "
        f"{e.dropped_records} dropped"
    ]
    lines.extend(
        f"    quarantined task {q.task.task_id} ({q.task.path} [{q.task.start}, "
        f"{q.task.stop})): {q.error}"
        for q in e.quarantined
    )
    return lines


def epochs_to_show(epochs: Sequence[EpochProgress], last: int = 3) -> list[EpochProgress]:
    """The last ``last`` epochs, and every other one that is open or lost or dropped records:
    a job of 20,000 short epochs printed a line for each when its master stopped."""
    first_of_last = len(epochs) - last
    return [
        e
        for i, e in enumerate(epochs)
        if i >= first_of_last or not e.finished or e.quarantined_records or e.dropped_records
    ]


def counter_line(p: Progress) -> str:
    return "  " + ", ".join(f"{k} {v}" for k, v in sorted(p.counters.items()))
