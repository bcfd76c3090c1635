"""The dispatcher's write-ahead journal: one SQLite database of update records and a snapshot.

A journal directory holds::

    journal.sqlite3       tables config (the schedule key and settings it was made for),
                          updates (seq, body: one update as JSON, crc32) and snapshot (one row:
                          the state after the first <seq> updates)
    journal.sqlite3-wal   SQLite's write-ahead log, there while the journal is open (and after
                          a crash, until the next open replays it)
    lock                  flock()ed by the master that owns the directory

Files are created 0600, and the directory 0700 where the journal creates it.

:class:`Journal` is the dispatcher's :class:`~shmloader.master.updates.UpdateSink`: each
update is inserted into the request's open transaction before the dispatcher applies it, and
the dispatcher calls :meth:`Journal.commit` at the end of every request, which commits that
transaction (the server replies only after it), syncs as the fsync policy says and, every
``snapshot_every`` updates, replaces the updates by a snapshot of the state. SQLite makes each
commit atomic: a crash, even mid-write, loses the uncommitted transaction and nothing else.
The database is local on purpose (SQLite's locking and fsync need a local file system).
docs/master.md has the details.
"""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import os
import re
import sqlite3
import weakref
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, get_args

from .. import _flock
from ..errors import ConfigError, CorruptRecordError, MasterError
from ..sources.base import Shard
from .config import JobConfig
from .dispatcher import Dispatcher
from .snapshot import check_schedule_key, schedule_key
from .updates import Update, update_from_dict, update_to_dict

log = logging.getLogger(__name__)

# When the journal syncs: at every commit (once per request), once per batch of updates, or
# at SQLite's own checkpoints only (see _SYNCHRONOUS and docs/master.md).
Fsync = Literal["always", "batch", "never"]
FSYNC_POLICIES: tuple[str, ...] = get_args(Fsync)
JOURNAL_FORMAT = 2
DATABASE = "journal.sqlite3"
# In WAL mode "NORMAL" commits without syncing and syncs the log at every checkpoint (before
# copying it into the database, which is synced after): a power loss may lose the latest
# commits, never the database's consistency. "OFF" would skip those syncs too and could leave
# a damaged database after a power loss, so even "never" keeps NORMAL; it costs nothing per
# commit. "FULL" syncs the log at every commit.
_SYNCHRONOUS: dict[str, str] = {"always": "FULL", "batch": "NORMAL", "never": "NORMAL"}
# The files of the journal format before SQLite (segments of framed records, snapshot files).
_OLD_FORMAT = re.compile(r"^(config\.json|journal-\d{20}\.log|snapshot-\d{20}\.json(\.tmp)?)$")
# The owner's alone: the state names the job's files and its trainers, no business of the
# machine's other users. A directory that exists already keeps its mode. SQLite gives its
# -wal file the database file's mode.
_FILE_MODE = 0o600
_DIR_MODE = 0o700
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS config (id INTEGER PRIMARY KEY CHECK (id = 1),"
    " format INTEGER NOT NULL, schedule TEXT NOT NULL, settings TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS updates (seq INTEGER PRIMARY KEY, body TEXT NOT NULL,"
    " crc32 INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS snapshot (id INTEGER PRIMARY KEY CHECK (id = 1),"
    " seq INTEGER NOT NULL, state TEXT NOT NULL, crc32 INTEGER NOT NULL)",
)
# OR REPLACE: a commit that failed may have reached the log all the same (its sync failed);
# the same rows are then written again, unchanged.
_INSERT = "INSERT OR REPLACE INTO updates (seq, body, crc32) VALUES (?, ?, ?)"
# SQLite's primary result codes that say the file is damaged, or that the disk said no.
_SQLITE_CORRUPT, _SQLITE_NOTADB = 11, 26
_SQLITE_ERRNO = {13: errno.ENOSPC, 8: errno.EROFS}  # SQLITE_FULL, SQLITE_READONLY; else EIO
# Python 3.10's sqlite3 errors carry no result code: their messages are SQLite's own texts.
_SQLITE_TEXTS = (
    ("file is not a database", _SQLITE_NOTADB),
    ("malformed", _SQLITE_CORRUPT),
    ("disk is full", 13),
    ("readonly database", 8),
)
_DAMAGED_FIX = (
    "The master will not start on it and lose what it recorded (completions, leases): restore "
    f"{DATABASE} (with its -wal file, if any) from a backup, or start the master without this "
    "journal, e.g. on an empty directory (the job's progress is then lost)"
)

Row = tuple[int, str, int]


def _dumps(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), sort_keys=True)


def _crc(text: str) -> int:
    """CRC-32 of a row's JSON: SQLite checks its pages' structure, not what the rows hold."""
    return zlib.crc32(text.encode())


@dataclass(frozen=True)
class Recovery:
    """What opening the journal found: the snapshot the state came from (None: none yet),
    how many updates were replayed after it, and the sequence number of the next update."""

    snapshot_seq: int | None
    replayed: int
    next_seq: int


class Journal:
    """Durable log of one dispatcher; build it with :meth:`open`, which also recovers."""

    def __init__(
        self,
        directory: str,
        dispatcher: Dispatcher,
        *,
        fsync: Fsync,
        snapshot_every: int,
        batch_records: int,
        batch_seconds: float,
    ) -> None:
        self.directory = directory
        self.path = os.path.join(directory, DATABASE)
        self.dispatcher = dispatcher
        self.fsync = fsync
        self.snapshot_every = snapshot_every
        self.batch_records = batch_records
        self.batch_seconds = batch_seconds
        self.seq = 0  # the next update's sequence number
        self.recovery: Recovery | None = None
        self._db: sqlite3.Connection | None = None
        # Updates recorded since the last commit that went through. A transaction, when one is
        # open, holds exactly these; after a failed commit none is, and they wait here to be
        # written again (they are applied: the journal must not go on without them).
        self._pending: list[Row] = []
        self._failed_commit = ""  # why the last commit failed, while its updates wait
        self._lock_fd: int | None = None
        self._unsynced = 0
        self._last_sync = float("-inf")
        self._since_snapshot = 0

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        plan: Sequence[Shard],
        config: JobConfig,
        now: float,
        *,
        fsync: Fsync = "batch",
        snapshot_every: int = 10_000,
        batch_records: int = 256,
        batch_seconds: float = 1.0,
    ) -> Journal:
        """Open (creating if needed) a journal directory and recover its dispatcher.

        The recovered dispatcher is ``journal.dispatcher``; its sink is this journal, and a
        :class:`~.updates.MasterStarted` record marks the restart. ConfigError if the directory
        was written for another plan or schedule settings, in an older format, or is used by
        another master; CorruptRecordError if the database is damaged.
        """
        if fsync not in FSYNC_POLICIES:
            raise ConfigError(f"fsync must be one of {FSYNC_POLICIES}, got {fsync!r}")
        if isinstance(snapshot_every, bool) or not isinstance(snapshot_every, int):
            raise ConfigError(f"snapshot_every must be an int >= 1, got {snapshot_every!r}")
        if snapshot_every < 1 or batch_records < 1 or not batch_seconds >= 0:
            raise ConfigError(
                "snapshot_every and batch_records must be >= 1 and batch_seconds >= 0, got "
                f"{snapshot_every}, {batch_records}, {batch_seconds}"
            )
        path = os.path.abspath(os.fspath(directory))
        os.makedirs(path, mode=_DIR_MODE, exist_ok=True)
        journal = cls(
            path,
            Dispatcher(plan, config),
            fsync=fsync,
            snapshot_every=snapshot_every,
            batch_records=batch_records,
            batch_seconds=batch_seconds,
        )
        journal._lock()
        try:
            journal._refuse_the_old_format()
            try:
                journal._connect()
                fresh = journal._check_config()
                journal.recovery = journal._recover(fresh)
                if fresh or journal.recovery.replayed:
                    journal._compact(with_config=fresh)
            except sqlite3.Error as exc:
                raise journal._failure(exc, "cannot open it") from exc
            journal.dispatcher.sink = journal
            journal.dispatcher.restart(now)
            journal.sync()
        except BaseException:
            journal._abandon()
            raise
        return journal

    # ---------------------------------------------------------- UpdateSink

    def record(self, update: Update) -> None:
        """Put ``update`` into the request's transaction; the dispatcher applies it only if
        this returns. OSError if it cannot (a full disk, an I/O error)."""
        db = self._db
        if db is None:
            raise MasterError(f"journal {self.directory} is closed; the update was not applied")
        if self._failed_commit:
            try:
                self._commit_pending(db)
            except sqlite3.Error as exc:
                first = self._pending[0][0]
                raise self._failure(
                    exc,
                    f"cannot write update {self.seq}: updates {first}..{self.seq - 1}, applied "
                    f"by a request whose commit failed ({self._failed_commit}), cannot be "
                    "written either",
                    "it was not applied",
                ) from exc
        body = _dumps(update_to_dict(update))
        row = (self.seq, body, _crc(body))
        try:
            self._begin(db)
            db.execute(_INSERT, row)
        except sqlite3.Error as exc:
            self._rollback(db)
            raise self._failure(
                exc, f"cannot write update {self.seq}", "it was not applied"
            ) from exc
        self._pending.append(row)
        self.seq += 1
        self._since_snapshot += 1

    def commit(self, now: float) -> None:
        """End of a request: commit its updates, sync as the policy says, and compact when a
        snapshot is due. If the commit fails its updates (applied already) stay pending, and
        every later update is refused until they are written: OSError either way."""
        db = self._db
        if db is None:
            return
        if self._pending:
            try:
                self._commit_pending(db)
            except sqlite3.Error as exc:
                first = self._pending[0][0]
                self._failed_commit = str(exc)
                raise self._failure(
                    exc,
                    f"cannot commit updates {first}..{self.seq - 1}",
                    "they are applied, but journaled only once a later update can be written; "
                    "until then every update is refused",
                ) from exc
        if self._unsynced and (
            self._unsynced >= self.batch_records or now - self._last_sync >= self.batch_seconds
        ):
            self.sync(now)
        if self._since_snapshot >= self.snapshot_every:
            try:
                self._compact()
            except sqlite3.Error as exc:
                # The request's updates are committed, and applied: failing the request would
                # tell its caller a lease it holds was refused, or a completion counted was
                # not. Compaction only bounds the journal's size; try again later.
                self._since_snapshot = 0
                log.warning(
                    "journal %s: compaction failed (%s); the updates are safe in the "
                    "journal, which keeps growing; trying again after %d more updates",
                    self.path,
                    exc,
                    self.snapshot_every,
                )

    # -------------------------------------------------------------- control

    def sync(self, now: float | None = None) -> None:
        """Make every committed update durable now, whatever the policy: a checkpoint, which
        syncs SQLite's log, copies it into the database and syncs that."""
        db = self._open_db()
        try:
            if self._pending:
                self._commit_pending(db)
            db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:
            raise self._failure(exc, "cannot sync it") from exc
        self._unsynced = 0
        if now is not None:
            self._last_sync = now

    def snapshot(self) -> None:
        """Compact now: store the state as the snapshot and delete the updates it holds."""
        db = self._open_db()
        try:
            if self._pending:
                self._commit_pending(db)
            self._compact()
        except sqlite3.Error as exc:
            raise self._failure(exc, "cannot write a snapshot") from exc

    def close(self) -> None:
        """Commit what is pending, sync, and close; the dispatcher stays usable in memory but
        journals nothing more. The directory's lock is released even if the sync fails."""
        if self.dispatcher.sink is self:
            self.dispatcher.sink = None
        try:
            if self._db is not None:
                self.sync()
        finally:  # a failed sync (a disk gone read-only) must not keep the directory locked
            self._abandon()

    @property
    def updates_unsynced(self) -> int:
        """Updates committed since the last sync: what a power loss may take back under
        ``fsync="batch"`` (at most ``batch_records``, or ``batch_seconds`` of them) or
        ``"never"``; 0 right after :meth:`sync`."""
        return self._unsynced

    @property
    def updates_since_snapshot(self) -> int:
        """Updates recorded since the last compaction, or since one failed: the journal's
        growth the next one (due at ``snapshot_every``) folds into the snapshot."""
        return self._since_snapshot

    def __enter__(self) -> Journal:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------ internals

    def _open_db(self) -> sqlite3.Connection:
        if self._db is None:
            raise MasterError(f"journal {self.directory} is closed")
        return self._db

    def _lock(self) -> None:
        fd = _flock.hold(os.path.join(self.directory, "lock"))
        if fd is None:
            raise ConfigError(
                f"journal {self.directory} is in use by another master (its lock file is held)"
            )
        self._lock_fd = fd

    def _abandon(self) -> None:
        """Close without syncing (sync first where that matters) and release the lock."""
        if self.dispatcher.sink is self:
            self.dispatcher.sink = None
        db, self._db = self._db, None
        _open_journals.discard(self)
        try:
            if db is not None:
                db.close()  # SQLite checkpoints here too, where it can
        except sqlite3.Error as exc:
            log.warning("journal %s: closing it failed: %s", self.path, exc)
        finally:
            if self._lock_fd is not None:
                _flock.release(self._lock_fd)
                self._lock_fd = None

    def _refuse_the_old_format(self) -> None:
        old = sorted(n for n in os.listdir(self.directory) if _OLD_FORMAT.match(n))
        if old:
            shown = ", ".join(old[:4]) + (", ..." if len(old) > 4 else "")
            raise ConfigError(
                f"journal {self.directory} holds a journal in the format of earlier shmloader "
                f"versions ({shown}: segments of framed records and snapshot files), which "
                f"this version does not read: it keeps its journal in {DATABASE}. Finish the "
                "job with the shmloader version that wrote it, or give this master another "
                "directory (the job then starts afresh)"
            )

    def _connect(self) -> None:
        """Open the database (created 0600 where missing), in WAL mode with exclusive locking:
        one connection, the master's, so SQLite keeps the log's index in memory rather than
        in a shared -shm file, and no other process reads a half-recovered journal."""
        created = False
        if not os.path.exists(self.path):
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, _FILE_MODE))
            created = True
        # The master's lock serializes every use; its threads take turns.
        db = self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        _open_journals.add(self)
        db.execute("PRAGMA locking_mode=EXCLUSIVE")
        (mode,) = db.execute("PRAGMA journal_mode=WAL").fetchone()
        if mode != "wal":
            raise MasterError(f"journal {self.path}: SQLite cannot use WAL mode here ({mode})")
        db.execute(f"PRAGMA synchronous={_SYNCHRONOUS[self.fsync]}")
        db.execute("BEGIN")
        for statement in _SCHEMA:
            db.execute(statement)
        db.execute("COMMIT")
        if created:
            _fsync_directory(self.directory)  # the new file's name, durable

    def _check_config(self) -> bool:
        """ConfigError unless the database was made for this schedule; True if it is new (no
        config row: its first transaction, config and snapshot together, is still to come)."""
        db = self._open_db()
        where = f"journal {self.path}"
        found = db.execute("SELECT format, schedule FROM config").fetchone()
        if found is None:
            if db.execute("SELECT EXISTS (SELECT 1 FROM updates)").fetchone()[0]:
                raise ConfigError(f"{where} has no config row but holds updates")
            return True
        stored_format, stored_schedule = found
        if stored_format != JOURNAL_FORMAT:
            raise ConfigError(
                f"{where} has format {stored_format}; this version reads format "
                f"{JOURNAL_FORMAT}. Use the shmloader version that wrote it"
            )
        try:
            schedule = json.loads(stored_schedule)
            if not isinstance(schedule, dict):
                raise ValueError(f"a {type(schedule).__name__}, not an object")
        except ValueError as exc:
            raise CorruptRecordError(
                f"its config row is damaged: {exc}", path=self.path, fix=_DAMAGED_FIX
            ) from exc
        check_schedule_key(
            schedule_key(self.dispatcher.table, self.dispatcher.config), schedule, where
        )
        db.execute("UPDATE config SET settings = ?", (self._config_row()[2],))
        return False

    def _config_row(self) -> tuple[int, str, str]:
        """The format, schedule key and settings this journal is opened with."""
        d = self.dispatcher
        return JOURNAL_FORMAT, _dumps(schedule_key(d.table, d.config)), _dumps(d.config.to_dict())

    def _recover(self, fresh: bool) -> Recovery:
        """Load the snapshot, then replay the updates after it in sequence."""
        db = self._open_db()
        d = self.dispatcher
        snapshot_seq: int | None = None
        found = db.execute("SELECT seq, state, crc32 FROM snapshot").fetchone()
        if found is not None:
            snapshot_seq, text, crc = found
            try:
                if not isinstance(text, str) or _crc(text) != crc:
                    raise ValueError("its CRC-32 does not match")
                state = json.loads(text)
            except ValueError as exc:
                raise CorruptRecordError(
                    f"the snapshot (the state after {snapshot_seq} updates, which it replaced) "
                    f"is damaged: {exc}",
                    path=self.path,
                    fix=_DAMAGED_FIX,
                ) from exc
            d.load_state_dict(state)
        elif not fresh and not db.execute("SELECT EXISTS (SELECT 1 FROM updates)").fetchone()[0]:
            # Written with the config row: gone, it looked like a new journal (progress lost).
            raise CorruptRecordError(
                "the snapshot is missing, and no updates are there to replay instead",
                path=self.path,
                fix=_DAMAGED_FIX,
            )
        expected = snapshot_seq or 0
        replayed = 0
        for seq, body, crc in db.execute("SELECT seq, body, crc32 FROM updates ORDER BY seq"):
            if seq < expected:
                continue  # in the snapshot already
            if seq > expected:
                raise CorruptRecordError(
                    f"journal updates {expected}..{seq - 1} are missing (the next one there is "
                    f"{seq})",
                    path=self.path,
                    index=seq,
                    fix=_DAMAGED_FIX,
                )
            self._replay(seq, body, crc)
            expected += 1
            replayed += 1
        self.seq = expected
        return Recovery(snapshot_seq, replayed, expected)

    def _replay(self, seq: int, body: str, crc: int) -> None:
        try:
            if not isinstance(body, str) or _crc(body) != crc:
                raise ValueError("its CRC-32 does not match")
            update = update_from_dict(json.loads(body))
        except (ValueError, TypeError, CorruptRecordError) as exc:
            raise CorruptRecordError(
                f"journal update {seq} is damaged: {exc}",
                path=self.path,
                index=seq,
                fix=_DAMAGED_FIX,
            ) from exc
        try:
            self.dispatcher.apply(update)
        except MasterError as exc:
            raise CorruptRecordError(
                f"journal update {seq} does not apply to the recovered state: {exc}",
                path=self.path,
                index=seq,
                fix=_DAMAGED_FIX,
            ) from exc

    def _compact(self, *, with_config: bool = False) -> None:
        """In one transaction: the state at ``seq`` as the snapshot, the updates before it
        deleted. A crash leaves either, never neither. Nothing may be pending. A new journal's
        config row comes in the same transaction: a config row without a snapshot is damage."""
        db = self._open_db()
        assert not self._pending
        state = _dumps(self.dispatcher.state_dict())
        try:
            db.execute("BEGIN")
            if with_config:
                db.execute(
                    "INSERT INTO config (id, format, schedule, settings) VALUES (1, ?, ?, ?)",
                    self._config_row(),
                )
            db.execute(
                "INSERT OR REPLACE INTO snapshot (id, seq, state, crc32) VALUES (1, ?, ?, ?)",
                (self.seq, state, _crc(state)),
            )
            db.execute("DELETE FROM updates WHERE seq < ?", (self.seq,))
            db.execute("COMMIT")
        except sqlite3.Error:
            self._rollback(db)
            raise
        self._since_snapshot = 0

    def _begin(self, db: sqlite3.Connection) -> None:
        """Open the request's transaction where none is: with the updates still pending from
        a commit that failed, if any."""
        if not db.in_transaction:
            db.execute("BEGIN")
            if self._pending:
                db.executemany(_INSERT, self._pending)

    def _commit_pending(self, db: sqlite3.Connection) -> None:
        try:
            self._begin(db)
            db.execute("COMMIT")
        except sqlite3.Error:
            self._rollback(db)
            raise
        if self.fsync == "batch":  # "always" commits synced; "never" leaves it to checkpoints
            self._unsynced += len(self._pending)
        self._pending.clear()
        self._failed_commit = ""

    def _rollback(self, db: sqlite3.Connection) -> None:
        """End a transaction that failed, so that the next one starts from the pending updates
        alone (SQLite may have undone one statement of it or all of it)."""
        try:
            if db.in_transaction:
                db.execute("ROLLBACK")
        except sqlite3.Error as exc:
            log.warning("journal %s: rollback failed: %s", self.path, exc)

    def _failure(self, exc: sqlite3.Error, what: str, outcome: str = "") -> Exception:
        """The exception to raise for SQLite's ``exc``: CorruptRecordError for a damaged
        database, OSError (with the errno the disk's answer maps to) otherwise."""
        code = _result_code(exc)
        if code in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
            return CorruptRecordError(
                f"the journal's database is damaged ({exc}); {what}",
                path=self.path,
                fix=_DAMAGED_FIX,
            )
        number = _SQLITE_ERRNO.get(code, errno.EIO) if code is not None else errno.EIO
        return OSError(
            number, f"journal {self.path}: {what} ({exc})" + (f"; {outcome}" if outcome else "")
        )


# Journals open in this process, for _forget_in_a_forked_child.
_open_journals: weakref.WeakSet[Journal] = weakref.WeakSet()


def _forget_in_a_forked_child() -> None:
    """A forked child (a DataLoader worker of a trainer that embeds the master) must neither
    write through the parent's connections nor close them: SQLite's close would checkpoint
    and delete the parent's -wal file, which the parent goes on writing, unlinked (its commits
    lost at the next crash). So the child keeps each connection for ever (one reference more,
    never given back: nothing closes it, not even the interpreter's exit), and its copies of
    the journals refuse updates as closed ones do. The lock is ``_flock``'s business."""
    for journal in list(_open_journals):
        db, journal._db = journal._db, None
        journal._lock_fd = None
        if db is not None:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(db))
    _open_journals.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_a_forked_child)


def _result_code(exc: sqlite3.Error) -> int | None:
    """SQLite's primary result code for ``exc`` (from its message before Python 3.11)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF
    text = str(exc)
    return next((code for words, code in _SQLITE_TEXTS if words in text), None)


def _fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["FSYNC_POLICIES", "Journal", "Recovery"]
