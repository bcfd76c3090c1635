"""The dispatcher's write-ahead journal: update records in TFRecord frames, plus snapshots.

A journal directory holds::

    config.json                   the dispatcher settings and schedule key it was made for
    snapshot-<seq>.json           state_dict after the first <seq> updates (newest one kept)
    journal-<seq>.log             frames of {"seq": n, "update": {...}} from update <seq> on
    lock                          flock()ed by the master that owns the directory

Files are created 0600, and the directory 0700 where the journal creates it.

:class:`Journal` is the dispatcher's :class:`~shmloader.master.updates.UpdateSink`: each
update is written (one ``os.write`` of one frame) before the dispatcher applies it, and the
dispatcher calls :meth:`Journal.commit` at the end of every request, where the fsync policy
acts and, every ``snapshot_every`` updates, the state is compacted into a snapshot. The files
are local on purpose (and so use ``os`` rather than ``pyarrow.fs``): durability needs fsync,
atomic rename and truncate, which object stores do not offer. docs/master.md has the details.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, get_args

from .. import _flock
from ..errors import ConfigError, CorruptRecordError, MasterError
from ..formats._framing import FRAME_OVERHEAD, HEADER
from ..formats.checksum import masked_crc32c
from ..formats.tfrecord import decode_frames, encode_frame
from ..sources.base import Shard
from .config import JobConfig
from .dispatcher import Dispatcher
from .snapshot import check_schedule_key, schedule_key
from .updates import Update, update_from_dict, update_to_dict

log = logging.getLogger(__name__)

# When the journal fsyncs: every record, once per batch of records, or never (the OS decides).
Fsync = Literal["always", "batch", "never"]
FSYNC_POLICIES: tuple[str, ...] = get_args(Fsync)
JOURNAL_FORMAT = 1
_SEGMENT = re.compile(r"^journal-(\d{20})\.log$")
_SNAPSHOT = re.compile(r"^snapshot-(\d{20})\.json$")
# The owner's alone: the state names the job's files and its trainers, no business of the
# machine's other users. A directory that exists already keeps its mode.
_FILE_MODE = 0o600
_DIR_MODE = 0o700


def _dumps(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":"), sort_keys=True).encode()


@dataclass(frozen=True)
class Recovery:
    """What opening the directory found: where state came from and what was cut off."""

    snapshot_seq: int | None
    replayed: int
    next_seq: int
    torn_path: str | None
    torn_bytes: int
    skipped_snapshots: tuple[str, ...]


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
        self.dispatcher = dispatcher
        self.fsync = fsync
        self.snapshot_every = snapshot_every
        self.batch_records = batch_records
        self.batch_seconds = batch_seconds
        self.seq = 0
        self.recovery: Recovery | None = None
        self._fd: int | None = None
        self._segment = ""  # the segment _fd writes, and its length
        self._size = 0
        self._broken = ""  # why _fd was closed while the journal is open, if it was
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
        was written for another plan or schedule settings, or is used by another master.
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
            journal._check_config()
            journal.recovery = journal._recover()
            journal._rotate()
            journal.dispatcher.sink = journal
            journal.dispatcher.restart(now)
            journal.sync()
        except BaseException:
            journal.close()
            raise
        return journal

    # ---------------------------------------------------------- UpdateSink

    def record(self, update: Update) -> None:
        if self._fd is None:
            raise MasterError(
                f"journal {self.directory} is closed{self._broken}; the update was not applied"
            )
        frame = encode_frame(_dumps({"seq": self.seq, "update": update_to_dict(update)}))
        try:
            _write_all(self._fd, frame)
        except OSError as exc:
            self._undo_torn_write(exc)
            raise OSError(
                exc.errno,
                f"journal {self._file(self._segment)}: cannot write update {self.seq} at byte "
                f"{self._size} ({exc.strerror or exc}); it was not applied",
            ) from exc
        self._size += len(frame)
        self.seq += 1
        self._unsynced += 1
        self._since_snapshot += 1

    def commit(self, now: float) -> None:
        """End of a request: fsync as the policy says, and compact when a snapshot is due."""
        if self._unsynced and (
            self.fsync == "always"
            or (
                self.fsync == "batch"
                and (
                    self._unsynced >= self.batch_records
                    or now - self._last_sync >= self.batch_seconds
                )
            )
        ):
            self._sync(now)
        if self._since_snapshot >= self.snapshot_every:
            try:
                self._rotate()
            except OSError as exc:
                # The request's updates are in the segment already, and applied: failing the
                # request would tell its caller a lease it holds was refused, or a completion
                # counted was not. Compaction only bounds the segment's size; try again later.
                self._since_snapshot = 0
                log.warning(
                    "journal %s: compaction failed (%s); the updates are safe in %s, which "
                    "keeps growing; trying again after %d more updates",
                    self.directory,
                    exc,
                    self._segment,
                    self.snapshot_every,
                )

    # -------------------------------------------------------------- control

    def sync(self, now: float | None = None) -> None:
        """Make every written update durable now, whatever the policy."""
        self._sync(self._last_sync if now is None else now)

    def snapshot(self) -> None:
        """Compact now: snapshot the state, start a new segment, delete older files."""
        self._rotate()

    def close(self) -> None:
        """fsync and close; the dispatcher stays usable in memory but journals nothing more."""
        fd, self._fd = self._fd, None
        if self.dispatcher.sink is self:
            self.dispatcher.sink = None
        try:
            if fd is not None:
                _close(fd)
        finally:  # a failed fsync (a disk gone read-only) must not keep the directory locked
            if self._lock_fd is not None:
                _flock.release(self._lock_fd)
                self._lock_fd = None

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

    def _file(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def _lock(self) -> None:
        fd = _flock.hold(self._file("lock"))
        if fd is None:
            raise ConfigError(
                f"journal {self.directory} is in use by another master (its lock file is held)"
            )
        self._lock_fd = fd

    def _check_config(self) -> None:
        d = self.dispatcher
        key = schedule_key(d.table, d.config)
        path = self._file("config.json")
        if os.path.exists(path):
            try:
                with open(path, "rb") as f:
                    stored = json.loads(f.read())
                found = stored["schedule"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise ConfigError(f"{path}: unreadable journal config: {exc}") from exc
            check_schedule_key(key, found, f"journal {self.directory}")
        elif any(_SEGMENT.match(n) or _SNAPSHOT.match(n) for n in os.listdir(self.directory)):
            raise ConfigError(f"{path} is missing but the directory holds journal files")
        config = {"format": JOURNAL_FORMAT, "schedule": key, "config": d.config.to_dict()}
        self._write_atomic("config.json", _dumps(config))

    def _listing(self, pattern: re.Pattern[str]) -> list[tuple[int, str]]:
        found = [(m, n) for n in os.listdir(self.directory) if (m := pattern.match(n))]
        return sorted((int(m.group(1)), n) for m, n in found)

    def _recover(self) -> Recovery:
        d = self.dispatcher
        snapshot_seq: int | None = None
        skipped: list[str] = []
        for seq, name in reversed(self._listing(_SNAPSHOT)):
            state = self._read_snapshot(name, seq)
            if state is None:
                skipped.append(name)
                continue
            d.load_state_dict(state)
            snapshot_seq = seq
            break
        expected = snapshot_seq or 0
        replayed, torn_path, torn_bytes = 0, None, 0
        segments = self._listing(_SEGMENT)
        self._check_segment_follows(snapshot_seq, segments)
        for i, (_, name) in enumerate(segments):
            path = self._file(name)
            with open(path, "rb") as f:
                data = f.read()
            payloads, end = decode_frames(data, path=path)
            if end < len(data) and i == len(segments) - 1:
                _refuse_a_damaged_last_record(data, end, path)
                torn_path, torn_bytes = path, len(data) - end
                os.truncate(path, end)
            offset = 0
            for payload in payloads:
                expected, applied = self._replay(payload, expected, path, offset, skipped)
                replayed += applied
                offset += len(payload) + 16
        self.seq = expected
        return Recovery(snapshot_seq, replayed, expected, torn_path, torn_bytes, tuple(skipped))

    def _check_segment_follows(
        self, snapshot_seq: int | None, segments: list[tuple[int, str]]
    ) -> None:
        """CorruptRecordError if the segment a snapshot started is gone. ``_rotate`` creates
        ``journal-<seq>.log`` right after ``snapshot-<seq>.json`` and deletes older segments
        only after that, so one of them is always there; without this check a deleted newest
        segment looked like a clean compaction, and its updates (tasks completed since) were
        silently undone: handed out again, so delivered twice. Snapshot 0 is the exception
        (the very first start may stop before its first segment, with nothing to lose)."""
        if not snapshot_seq or any(seq <= snapshot_seq for seq, _ in segments):
            return
        name = f"journal-{snapshot_seq:020d}.log"
        raise CorruptRecordError(
            f"{name} is missing: the updates after snapshot {snapshot_seq} (leases, tasks "
            "completed since) are lost, and starting from the snapshot would hand out again "
            "what was delivered. Restore the file; to start from the snapshot anyway, create "
            "it empty",
            path=self._file(name),
        )

    def _replay(
        self, payload: bytes, expected: int, path: str, offset: int, skipped: list[str]
    ) -> tuple[int, int]:
        try:
            record = json.loads(payload)
            seq = int(record["seq"])
            update = update_from_dict(record["update"])
        except (ValueError, KeyError, TypeError, CorruptRecordError) as exc:
            raise CorruptRecordError(
                f"bad journal record: {exc}", path=path, offset=offset
            ) from exc
        if seq < expected:
            return expected, 0  # already in the snapshot
        if seq > expected:
            raise CorruptRecordError(
                f"journal record {seq} follows {expected - 1}: updates {expected}..{seq - 1} are "
                "missing (a lost segment, or a deleted or damaged snapshot"
                + (f"; damaged, so skipped: {', '.join(skipped)}" if skipped else "")
                + ")",
                path=path,
                offset=offset,
            )
        try:
            self.dispatcher.apply(update)
        except MasterError as exc:
            raise CorruptRecordError(
                f"journal record {seq} does not apply to the recovered state: {exc}",
                path=path,
                offset=offset,
            ) from exc
        return expected + 1, 1

    def _read_snapshot(self, name: str, seq: int) -> dict[str, Any] | None:
        """The state in a snapshot, or None if it is damaged (an older one is tried next)."""
        try:
            with open(self._file(name), "rb") as f:
                data = json.loads(f.read())
            state = data["state"]
            ok = data["seq"] == seq and data["crc32c"] == masked_crc32c(_dumps(state))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return state if ok and isinstance(state, dict) else None

    def _rotate(self) -> None:
        """Snapshot at ``seq``, then switch to a fresh segment and delete what it replaces."""
        state = self.dispatcher.state_dict()
        snap: dict[str, Any] = {"format": JOURNAL_FORMAT, "seq": self.seq, "state": state}
        snap["crc32c"] = masked_crc32c(_dumps(state))
        name = f"snapshot-{self.seq:020d}.json"
        self._write_atomic(name, _dumps(snap))
        segment = f"journal-{self.seq:020d}.log"
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND
        # The new segment opens before the old one closes: if it cannot, records go on into
        # the old one (recovery skips those the snapshot holds), not nowhere.
        new_fd = os.open(self._file(segment), flags, _FILE_MODE)
        old_fd, self._fd = self._fd, new_fd
        self._segment, self._size = segment, 0
        if old_fd is not None:
            _close(old_fd)
        self._fsync_dir()
        for _, old in self._listing(_SEGMENT) + self._listing(_SNAPSHOT):
            if old not in (name, segment):
                os.unlink(self._file(old))
        self._fsync_dir()
        self._since_snapshot = 0

    def _undo_torn_write(self, exc: OSError) -> None:
        """Cut a frame that was only partly written (a full disk writes what fits, then fails)
        back off the segment. Left there, the next record would follow a torn frame, and
        recovery would take it for corruption: after the disk has room again, the master
        would run on, and could never be restarted. If the cut fails too (a read-only file
        system), the segment is closed: a torn tail with nothing after it is what recovery
        expects from a crash, and cuts away itself."""
        assert self._fd is not None
        try:
            os.ftruncate(self._fd, self._size)
        except OSError as cut:
            os.close(self._fd)
            self._fd = None
            self._broken = (
                f" (writing to {self._file(self._segment)} failed: {exc}; cutting its torn "
                f"tail off at byte {self._size} failed too: {cut}; restart the master once "
                "the disk is writable)"
            )

    def _sync(self, now: float) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
        self._unsynced = 0
        self._last_sync = now

    def _write_atomic(self, name: str, data: bytes) -> None:
        tmp = self._file(name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, _FILE_MODE)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        except OSError:
            os.unlink(tmp)  # a half-written file on a full disk only takes more room
            raise
        finally:
            os.close(fd)
        os.replace(tmp, self._file(name))
        self._fsync_dir()

    def _fsync_dir(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _refuse_a_damaged_last_record(data: bytes, end: int, path: str) -> None:
    """CorruptRecordError if what follows the valid records at ``end`` is a complete last
    record whose checksum fails, rather than a torn write. A crash mid-write leaves a frame
    cut short, or one whose bytes never landed (zeros: the file grew before its data was
    written); a complete frame of written bytes (a JSON payload has no NUL byte, and its CRC
    is not four zero bytes) whose CRC fails was acknowledged and then damaged on disk.
    Truncated as a torn write, that completion would be lost without a word."""
    if len(data) - end < HEADER.size:
        return
    length, length_crc = HEADER.unpack_from(data, end)
    if masked_crc32c(data[end : end + 8]) != length_crc:
        return  # a header that never landed whole (decode_frames allows only zeros after)
    frame_end = end + length + FRAME_OVERHEAD
    if frame_end > len(data):
        return  # cut short
    payload = data[end + HEADER.size : frame_end - 4]
    if b"\x00" in payload or data[frame_end - 4 : frame_end] == b"\x00" * 4:
        return  # bytes that never landed
    raise CorruptRecordError(
        f"the journal's last record ({length} bytes) is complete but its checksum fails: it "
        "was written whole and then damaged, not cut short by a crash, so the master will "
        "not start and lose what it recorded (a completion, a lease). Restore the file from "
        "a backup, or start the master without this journal (its progress is then lost)",
        path=path,
        offset=end,
    )


def _close(fd: int) -> None:
    """fsync and close; closed even if the fsync fails (whose error is raised)."""
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


__all__ = ["FSYNC_POLICIES", "Journal", "Recovery"]
