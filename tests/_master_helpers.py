"""What the dispatcher tests share."""

from __future__ import annotations

from shmloader.master.updates import Update


class Recorder:
    """An UpdateSink that keeps what it is given, like the journal but in memory."""

    def __init__(self) -> None:
        self.updates: list[Update] = []
        self.commits = 0

    def record(self, update: Update) -> None:
        self.updates.append(update)

    def commit(self, now: float) -> None:
        self.commits += 1
