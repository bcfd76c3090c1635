"""The write-ahead journal: recovery, torn tails, snapshots, config checks, fsync policies."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

import shmloader
from shmloader.errors import ConfigError, CorruptRecordError
from shmloader.formats.tfrecord import decode_frames
from shmloader.master import Dispatcher, JobConfig
from shmloader.master.journal import Journal
from shmloader.sources.base import Shard

PLAN = [Shard("a", 10), Shard("b", 5), Shard("d", 7)]
# A restart gives leases max(lease_timeout, consumer_timeout): both 10 s here.
CONFIG = JobConfig(
    records_per_task=4, epochs=2, lease_timeout=10.0, consumer_timeout=10.0, max_retries=1
)


def _open(path: Path, **kw: object) -> Journal:
    config = kw.pop("config", CONFIG)
    return Journal.open(path, PLAN, config, kw.pop("now", 0.0), **kw)  # type: ignore[arg-type]


def _drive(d: Dispatcher, t: float = 1.0) -> None:
    d.register("a", t)
    d.register("b", t)
    x = d.lease("a", 3, t)
    y = d.lease("b", 2, t)
    d.complete(x[0].lease_id, t + 1)
    d.fail(x[1].lease_id, "oops", t + 1)
    d.renew(y[0].lease_id, t + 2)


def _files(path: Path, prefix: str) -> list[str]:
    return sorted(n for n in os.listdir(path) if n.startswith(prefix))


def _comparable(state: dict) -> dict:
    # A reopen records one MasterStarted: new incarnation, new lease id range, consumers' grace,
    # leases' fresh deadlines.
    out = {
        k: v
        for k, v in state.items()
        if k not in ("incarnation", "next_lease_id", "consumers", "leases")
    }
    out["leases"] = [{k: v for k, v in x.items() if k != "deadline"} for x in state["leases"]]
    return out


def test_reopen_recovers_completed_leased_and_failed_work(tmp_path: Path) -> None:
    with _open(tmp_path, fsync="always") as j:
        _drive(j.dispatcher)
        before = j.dispatcher.state_dict()
        held = j.dispatcher.leases_of("b")
        counts = j.dispatcher.progress().epochs
    with _open(tmp_path, now=5.0) as j:
        d = j.dispatcher
        assert _comparable(d.state_dict()) == _comparable(before)
        # leased stays leased, until at least now + the restart grace (15.0)
        assert d.leases_of("b") == [replace(x, deadline=15.0) for x in held]
        assert d.progress().epochs == counts
        assert counts[0].done_units == 1 and counts[0].leased_units == 3
        d.heartbeat("a", 13.0)
        d.heartbeat("b", 13.0)
        expired = {u.lease_id for u in d.expire(15.5)}  # type: ignore[attr-defined]
        assert {x.lease_id for x in held} <= expired
        assert j.recovery is not None and j.recovery.replayed > 0


def test_leases_held_across_a_long_outage_stay_valid_for_their_holders(tmp_path: Path) -> None:
    # The master is down from t=3 to t=50, past every deadline (<= 13): nobody could renew.
    with _open(tmp_path, fsync="always") as j:
        _drive(j.dispatcher)
        held = [x.lease_id for x in j.dispatcher.leases_of("b")]
    with _open(tmp_path, now=50.0) as j:
        d = j.dispatcher
        assert [x.deadline for x in d.leases_of("b")] == [60.0, 60.0]
        d.heartbeat("a", 54.0)
        d.heartbeat("b", 54.0)
        assert d.expire(55.0) == []
        again = {(x.epoch, x.task.task_id) for x in d.lease("a", 20, 55.0)}
        assert not again & {(x.epoch, x.task.task_id) for x in d.leases_of("b")}
        d.complete(held[0], 56.0)
    with _open(tmp_path, now=57.0) as j:  # the replayed restart keeps the fresh deadline
        assert [x.deadline for x in j.dispatcher.leases_of("b")] == [67.0]
        assert j.dispatcher.progress().counters["late_completed"] == 0


def test_a_torn_last_record_is_ignored_and_truncated(tmp_path: Path) -> None:
    with _open(tmp_path) as j:
        _drive(j.dispatcher)
        before = j.dispatcher.state_dict()
        (segment,) = _files(tmp_path, "journal-")
    with open(tmp_path / segment, "ab") as f:
        f.write(b"\x40\x00\x00\x00\x00\x00\x00\x00\x01\x02")  # a header cut short by a crash
    with _open(tmp_path, now=5.0) as j:
        assert j.recovery is not None and j.recovery.torn_bytes == 10
        assert j.recovery.torn_path == str(tmp_path / segment)
        assert _comparable(j.dispatcher.state_dict()) == _comparable(before)
    # what remains on disk decodes cleanly: the torn bytes are gone
    for name in _files(tmp_path, "journal-"):
        data = (tmp_path / name).read_bytes()
        assert decode_frames(data)[1] == len(data)


def test_a_damaged_complete_last_record_is_refused_not_taken_for_a_torn_write(
    tmp_path: Path,
) -> None:
    """A bit flip in the last record, complete on disk: truncating it as a torn write lost
    an acknowledged completion after the restart. Bytes that never landed (zeros) still are
    a torn write."""
    with _open(tmp_path) as j:
        _drive(j.dispatcher)
        (segment,) = _files(tmp_path, "journal-")
    whole = (tmp_path / segment).read_bytes()
    payloads, _ = decode_frames(whole)
    last = len(whole) - len(payloads[-1]) - 16
    damaged = bytearray(whole)
    damaged[last + 12 + 5] ^= 0x01  # a payload byte of the last record
    (tmp_path / segment).write_bytes(bytes(damaged))
    with pytest.raises(CorruptRecordError, match="complete but its checksum fails") as info:
        _open(tmp_path)
    assert info.value.path == str(tmp_path / segment) and info.value.offset == last
    assert (tmp_path / segment).read_bytes() == bytes(damaged)  # nothing truncated
    never_landed = bytearray(whole)
    never_landed[last + 12 + 20 :] = bytes(len(whole) - last - 32)  # zeros from there on
    (tmp_path / segment).write_bytes(bytes(never_landed))
    with _open(tmp_path, now=5.0) as j:
        assert j.recovery is not None and j.recovery.torn_bytes == len(whole) - last


def test_corruption_before_more_records_is_an_error_naming_the_file(tmp_path: Path) -> None:
    with _open(tmp_path) as j:
        _drive(j.dispatcher)
        (segment,) = _files(tmp_path, "journal-")
    data = bytearray((tmp_path / segment).read_bytes())
    data[20] ^= 0xFF  # inside the first record's payload
    (tmp_path / segment).write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match=segment):
        _open(tmp_path)


def test_snapshots_compact_the_journal(tmp_path: Path) -> None:
    with _open(tmp_path, snapshot_every=3) as j:
        _drive(j.dispatcher)
        before = j.dispatcher.state_dict()
        seq = j.seq
    assert len(_files(tmp_path, "snapshot-")) == 1 and len(_files(tmp_path, "journal-")) == 1
    with _open(tmp_path, now=4.0) as j:
        rec = j.recovery
        assert rec is not None and rec.snapshot_seq is not None and rec.next_seq == seq
        assert rec.replayed == seq - rec.snapshot_seq < 3
        assert _comparable(j.dispatcher.state_dict()) == _comparable(before)


def test_a_damaged_snapshot_is_skipped_and_reported(tmp_path: Path) -> None:
    with _open(tmp_path) as j:
        _drive(j.dispatcher)
        before = j.dispatcher.state_dict()
    (snap,) = _files(tmp_path, "snapshot-")
    # keep the records the snapshot covered by writing a newer, damaged snapshot instead
    newer = snap.replace("snapshot-0", "snapshot-9")
    (tmp_path / newer).write_text('{"state": {}, "seq": 1, "crc32c": 0}')
    with _open(tmp_path, now=4.0) as j:
        assert j.recovery is not None and j.recovery.skipped_snapshots == (newer,)
        assert _comparable(j.dispatcher.state_dict()) == _comparable(before)


def test_missing_records_are_detected(tmp_path: Path) -> None:
    with _open(tmp_path, snapshot_every=3) as j:
        _drive(j.dispatcher)
    for name in _files(tmp_path, "snapshot-"):
        os.unlink(tmp_path / name)
    with pytest.raises(CorruptRecordError, match=r"updates 0\.\.\d+ are missing"):
        _open(tmp_path)


def test_a_deleted_newest_segment_is_an_error_not_a_silent_rewind(tmp_path: Path) -> None:
    """It used to look like a clean compaction: the snapshot's older state came back, and the
    tasks completed since went out again."""
    with _open(tmp_path, snapshot_every=3) as j:
        _drive(j.dispatcher)
        _drive(j.dispatcher, 5.0)
    (segment,) = _files(tmp_path, "journal-")
    (snapshot,) = _files(tmp_path, "snapshot-")
    assert segment[len("journal-") : -4] == snapshot[len("snapshot-") : -5] != "0" * 20
    os.unlink(tmp_path / segment)
    with pytest.raises(CorruptRecordError, match=f"{segment} is missing") as info:
        _open(tmp_path)
    assert info.value.path == str(tmp_path / segment)
    # The way out the message gives: an empty segment starts from the snapshot.
    (tmp_path / segment).write_bytes(b"")
    with _open(tmp_path) as j:
        assert j.recovery is not None and j.recovery.snapshot_seq == int(segment[8:-4])


def test_the_journal_refuses_another_schedule(tmp_path: Path) -> None:
    _open(tmp_path).close()
    other = JobConfig(records_per_task=5, epochs=2)
    with pytest.raises(ConfigError, match="records_per_task: 4 there, 5 here"):
        _open(tmp_path, config=other)
    with pytest.raises(ConfigError, match="the plan differs"):
        Journal.open(tmp_path, [Shard("a", 11)], CONFIG, 0.0)
    # settings outside the schedule may change between restarts
    _open(tmp_path, config=JobConfig(records_per_task=4, epochs=5, max_retries=7)).close()


def test_one_master_per_directory(tmp_path: Path) -> None:
    with _open(tmp_path), pytest.raises(ConfigError, match="in use by another master"):
        _open(tmp_path)


@pytest.mark.parametrize("fsync", ["always", "batch", "never"])
def test_every_fsync_policy_recovers_after_a_clean_close(tmp_path: Path, fsync: str) -> None:
    with _open(tmp_path, fsync=fsync, batch_records=2) as j:
        _drive(j.dispatcher)
        before = j.dispatcher.state_dict()
    with _open(tmp_path, fsync=fsync, now=5.0) as j:
        assert _comparable(j.dispatcher.state_dict()) == _comparable(before)


def test_bad_journal_settings_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="fsync must be one of"):
        _open(tmp_path, fsync="sometimes")
    with pytest.raises(ConfigError, match="snapshot_every and batch_records must be >= 1"):
        _open(tmp_path, snapshot_every=0)


def test_a_closed_journal_refuses_to_record(tmp_path: Path) -> None:
    j = _open(tmp_path)
    d = j.dispatcher
    j.close()
    assert d.sink is None  # the dispatcher goes on in memory, journaling nothing
    d.register("x", 1.0)


def test_a_journaled_master_writes_files_only_its_owner_may_read(tmp_path: Path) -> None:
    """The state names the job's files and trainers: 0600 files in a 0700 directory (the one
    the master creates; its parents are the user's business)."""
    directory = tmp_path / "state" / "journal"
    with shmloader.Master(PLAN, records_per_task=4, journal=directory):
        pass
    with _open(directory, snapshot_every=3) as j:  # a restart, and compactions, rewrite them
        _drive(j.dispatcher)
    names = set(os.listdir(directory))
    assert {"config.json", "lock"} < names
    assert _files(directory, "journal-") and _files(directory, "snapshot-")
    modes = {name: oct(os.stat(directory / name).st_mode & 0o777) for name in names}
    assert modes == dict.fromkeys(names, oct(0o600))
    assert oct(directory.stat().st_mode & 0o777) == oct(0o700)
