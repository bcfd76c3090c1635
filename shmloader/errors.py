"""Exceptions of shmloader.

Every error about data names where it happened (file, byte offset or record index) so that a
user with a terabyte of shards can find the bad one; the original exception is chained with
``raise ... from``. Catch :class:`ShmloaderError` to catch all of ours.
"""

from __future__ import annotations

from typing import Literal, get_args

# What a source does with a bad record: raise it (the loop stops), or skip it and count it.
OnError = Literal["raise", "skip"]
ON_ERROR_CHOICES: tuple[str, ...] = get_args(OnError)


class ShmloaderError(Exception):
    """Base class of every exception raised by shmloader."""


class DataError(ShmloaderError):
    """Bad input data; ``path`` and, where known, ``offset`` / ``index`` say where."""

    #: What to do about it, said after the error (``fix=`` gives another, ``""`` none). Once:
    #: an error restated (naming its record, or rebuilt in the trainer from a reader's) is
    #: made from ``reason``, which lacks it.
    fix = ""

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        offset: int | None = None,
        index: int | None = None,
        fix: str | None = None,
    ) -> None:
        self.path = path
        self.offset = offset
        self.index = index
        self.reason = message
        if fix is not None:
            self.fix = fix
        where = []
        if path is not None:
            where.append(str(path))
        if index is not None:
            where.append(f"record {index}")
        if offset is not None:
            where.append(f"byte offset {offset}")
        text = f"{', '.join(where)}: {message}" if where else message
        super().__init__(f"{text}. {self.fix}" if self.fix else text)

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only fields survive pickling (errors travel from reader processes).
        fields = (self.reason, self.path, self.offset, self.index, self.fix)
        return (_rebuild_data_error, (type(self), *fields))


def _rebuild_data_error(
    cls: type[DataError],
    message: str,
    path: str | None,
    offset: int | None,
    index: int | None,
    fix: str = "",
) -> DataError:
    return cls(message, path=path, offset=offset, index=index, fix=fix)


class CorruptRecordError(DataError):
    """A record's framing is broken: bad length or payload CRC, or the file ends mid-record."""


class TruncatedRecordError(CorruptRecordError):
    """The file ends inside a record (often a writer that crashed)."""


class IndexMismatchError(DataError):
    """A sidecar index does not describe its data file (stale, foreign or damaged)."""


class DecodeError(DataError):
    """The user's decode function raised, or returned something that cannot be stored."""

    fix = (
        'To leave such records out, give the source on_error="skip": each is logged and '
        "counted (ds.stats().records_skipped), and its epoch is shorter by it"
    )


class SchemaMismatchError(DecodeError):
    """A decoded record does not fit the dataset's schema (missing/extra column, other shape)."""


class ConfigError(ShmloaderError, ValueError):
    """An argument or setting is invalid; the message says which and what is accepted."""


class ShmSpaceError(ShmloaderError):
    """/dev/shm cannot hold the configured budget, or a segment cannot fit in it.

    ``never_fits``: the segment is larger than the whole budget, so waiting or reading the
    task again cannot help (the reader reports it as permanent); otherwise the space may come
    free (other programs' files in /dev/shm, segments released soon)."""

    def __init__(self, message: str, *, never_fits: bool = False) -> None:
        super().__init__(message)
        self.never_fits = never_fits

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_space_error, (type(self), str(self), self.never_fits))


def _rebuild_space_error(cls: type[ShmSpaceError], message: str, never_fits: bool) -> ShmSpaceError:
    return cls(message, never_fits=never_fits)


class StoreClosedError(ShmloaderError, FileNotFoundError):
    """A shared-memory segment store is gone: its owner closed it or exited."""


class MasterError(ShmloaderError):
    """The master refused a request or could not be reached."""


class LeaseError(MasterError):
    """A lease is unknown, expired or already completed.

    ``handed_to`` / ``handed_as``: when the lease lapsed (its holder stalled past the lease
    timeout, or was declared dead) and the master handed its task out again, the consumer that
    got it and that lease's id; None otherwise. The old holder may still be delivering the
    task's rows, and so does the new one: they may reach training twice (docs/trainers.md, "A
    trainer that stalls").
    """

    handed_to: str | None = None
    handed_as: int | None = None


class NotActive(str):
    """Why a lease is not active (a :class:`LeaseError`'s message), as the value of the dicts
    that calls on many leases return (renew, complete, mark taken); a ``str`` so that code that
    reads them as messages is unchanged. ``handed_to`` / ``handed_as`` as in LeaseError."""

    handed_to: str | None = None
    handed_as: int | None = None

    @classmethod
    def of(cls, why: str, handed_to: str | None = None, handed_as: int | None = None) -> NotActive:
        out = cls(why)
        out.handed_to = handed_to or None
        out.handed_as = handed_as if handed_to else None
        return out

    @classmethod
    def of_error(cls, exc: LeaseError) -> NotActive:
        return cls.of(str(exc), exc.handed_to, exc.handed_as)


class TaskQuarantinedError(MasterError):
    """A task failed for good (its retries exhausted, or an error a retry cannot fix): the
    epoch cannot be delivered whole, and the training loop raises this. The last error of
    the task is chained as ``__cause__`` where this trainer's reader raised it."""
