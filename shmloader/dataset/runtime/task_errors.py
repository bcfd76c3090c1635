"""What the training loop raises for a task that could not be read.

Two ways a task fails for good, both ending the loop (the epoch cannot be delivered whole):

* a reader's error that a retry cannot fix (a record ``decode`` rejects, a record that does not
  fit the schema, a corrupt frame, a segment larger than the budget): the loop raises that
  very exception (``DecodeError``, ``SchemaMismatchError``, ``CorruptRecordError``,
  ``ShmSpaceError``), the user's own exception chained, as soon as the reader reports it; the
  master quarantines the task at once instead of retrying it;
* a task that failed ``max_retries + 1`` times (I/O errors, readers that died on it): the loop
  raises ``TaskQuarantinedError``, chained to the last exception this trainer's readers
  raised on it, if any (readers that died, or another trainer's readers, raise nothing here).

:class:`TaskErrors` keeps the exceptions readers raised, by task, for both: the reader pool's
thread records them, the maintenance thread asks for the error of a quarantined task.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from ...errors import TaskQuarantinedError
from ...master.progress import Progress, QuarantinedTask
from ...reader.failure import unpack_exception
from ...reader.messages import Failed
from ..waiting.ready import ReadyTasks

KEPT = 1000  # tasks whose last error is kept: a long job's I/O retries must not pile up


class TaskErrors:
    """The exceptions this trainer's readers raised, by (epoch, task id)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._raised: OrderedDict[tuple[int, int], tuple[BaseException, bool]] = OrderedDict()

    def reader_failed(self, failed: Failed, reader: int, ready: ReadyTasks) -> None:
        """Keep the exception ``failed`` carries (the last one of each of the latest ``KEPT``
        tasks); a permanent one fails ``ready`` now (the loop raises it)."""
        where = (
            f"in reader {reader}, reading task {failed.task_id} of epoch {failed.epoch} "
            f"({failed.path})"
        )
        exc = unpack_exception(failed.raised, where)
        key = (failed.epoch, failed.task_id)
        with self._lock:
            self._raised.pop(key, None)
            self._raised[key] = (exc, failed.retry)
            while len(self._raised) > KEPT:
                self._raised.popitem(last=False)
        if not failed.retry:
            ready.fail(exc)

    def fail_if_quarantined(self, progress: Progress, ready: ReadyTasks) -> None:
        """Fail ``ready`` if the master's ``progress`` lists a quarantined task: the sampler
        would otherwise wait for its records for ever."""
        if progress.quarantined:
            ready.fail(self.quarantine_error(progress.quarantined[0]))

    def quarantine_error(self, quarantined: QuarantinedTask) -> BaseException:
        """The error the loop raises for a ``QuarantinedTask`` of the master's progress."""
        task = quarantined.task
        with self._lock:
            exc, retry = self._raised.get((quarantined.epoch, task.task_id), (None, True))
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
