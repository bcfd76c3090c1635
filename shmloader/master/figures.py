"""``TrainerFigures``: what a trainer measured of itself, carried to its master by its heartbeat
for the master's ``/metrics`` (metrics.py). They are figures, not state: the master keeps the
last ones of each consumer in memory, never in its journal."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TrainerFigures:
    """Totals since the trainer started, and its shared memory and memory now."""

    records_consumed: int = 0
    bytes_consumed: int = 0  # what those rows weigh in shared memory
    bytes_read: int = 0  # by its readers, into shared memory
    batches: int = 0  # received by the loop (shmloader.DataLoader only)
    loop_seconds: float = 0.0
    loop_wait_seconds: float = 0.0
    reader_wait_seconds: float = 0.0
    shm_in_use_bytes: int = 0
    shm_budget_bytes: int = 0
    pss_bytes: dict[str, int] = field(default_factory=dict)  # by role: trainer, worker, reader
    readers: int = 0  # running now
    records_skipped: int = 0
