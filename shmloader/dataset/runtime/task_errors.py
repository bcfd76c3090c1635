"""What the training loop raises for a task that could not be read.

Two ways a task fails for good, both ending the loop (the epoch cannot be delivered whole):

* a reader's error that a retry cannot fix (a record ``decode`` rejects, a record that does not
  fit the schema, a corrupt frame, a segment larger than the budget): the loop raises that
  very exception (``DecodeError``, ``SchemaMismatchError``, ``CorruptRecordError``,
  ``ShmSpaceError``), the user's own exception chained, as soon as the reader reports it; the
  master quarantines the task at once instead of retrying it;
* a task that failed ``max_retries + 1`` times (I/O errors, readers that died on it): the loop
  raises ``TaskQuarantinedError``, chained to the last exception this trainer's readers
  raised on it, if any (another trainer's readers raise nothing here). Where the last try
  killed a reader of this trainer's, the error begins with that death (reader/death.py):
  which reader, how it died, the record, the fix; a death raises nothing to chain.

:class:`TaskErrors` keeps the exceptions readers raised and the deaths, by task, for both: the
reader pool's thread records them, the maintenance thread asks for the error of a quarantined
task.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from ...errors import TaskQuarantinedError
from ...master.progress import Progress, QuarantinedTask
from ...reader.death import ReaderDeath
from ...reader.failure import unpack_exception
from ...reader.messages import Failed
from ..waiting.ready import ReadyTasks

KEPT = 1000  # tasks whose last error is kept: a long job's I/O retries must not pile up


class TaskErrors:
    """The exceptions this trainer's readers raised, and their deaths, by (epoch, task id)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # The latest of each task: an exception (and whether it was retried), or a death.
        self._raised: OrderedDict[tuple[int, int], tuple[BaseException, bool] | ReaderDeath] = (
            OrderedDict()
        )

    def reader_failed(self, failed: Failed, reader: int, ready: ReadyTasks) -> None:
        """Keep the exception ``failed`` carries (the last one of each of the latest ``KEPT``
        tasks); a permanent one fails ``ready`` now (the loop raises it)."""
        where = (
            f"in reader {reader}, reading task {failed.task_id} of epoch {failed.epoch} "
            f"({failed.path})"
        )
        exc = unpack_exception(failed.raised, where)
        self._keep((failed.epoch, failed.task_id), (exc, failed.retry))
        if not failed.retry:
            ready.fail(exc)

    def reader_died(self, death: ReaderDeath) -> None:
        """Keep a reader's death on its task (the pool knew of one)."""
        if death.task is not None:
            self._keep((death.task.epoch, death.task.task_id), death)

    def _keep(self, key: tuple[int, int], latest: tuple[BaseException, bool] | ReaderDeath) -> None:
        with self._lock:
            self._raised.pop(key, None)
            self._raised[key] = latest
            while len(self._raised) > KEPT:
                self._raised.popitem(last=False)

    def fail_if_quarantined(self, progress: Progress, ready: ReadyTasks) -> None:
        """Fail ``ready`` if the master's ``progress`` lists a quarantined task: the sampler
        would otherwise wait for its records for ever."""
        if progress.quarantined:
            ready.fail(self.quarantine_error(progress.quarantined[0]))

    def quarantine_error(self, quarantined: QuarantinedTask) -> BaseException:
        """The error the loop raises for a ``QuarantinedTask`` of the master's progress."""
        task = quarantined.task
        with self._lock:
            latest = self._raised.get((quarantined.epoch, task.task_id), (None, True))
        if isinstance(latest, ReaderDeath):
            # The master's last error is the text of the death this trainer told it, unless
            # another trainer's try came after.
            if quarantined.error == str(latest):
                return TaskQuarantinedError(
                    f"{latest}, on the task's last try: the task is quarantined, its records "
                    "cannot be delivered, so this epoch cannot be whole and the training loop "
                    f"stops here. Fix: {latest.fix}"
                )
            latest = (None, True)
        exc, retry = latest
        if exc is not None and not retry:
            return exc  # the reader's own error, as if its Failed message came first
        error = TaskQuarantinedError(
            f"task {task.task_id} ({task.path}, records {task.start}..{task.stop}) of epoch "
            f"{quarantined.epoch} failed on every try and was quarantined: its records "
            "cannot be delivered, so this epoch cannot be whole and the training loop stops "
            f"here. Last error: {quarantined.error}"
        )
        error.__cause__ = exc
        return error
