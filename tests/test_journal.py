"""The write-ahead journal: recovery, crashes mid-write, snapshots, damage, config checks, fsync
policies."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import shmloader
from shmloader.errors import ConfigError, CorruptRecordError
from shmloader.master import Dispatcher, JobConfig
from shmloader.master.journal import DATABASE, Journal
from shmloader.sources.base import Shard

PLAN = [Shard("a", 10), Shard("b", 5), Shard("d", 7)]
# A restart gives leases max(lease_timeout, consumer_timeout): both 10 s here.
CONFIG = JobConfig(
    records_per_task=4, epochs=2, lease_timeout=10.0, consumer_timeout=10.0, max_retries=1
)
TESTS = Path(__file__).resolve().parent
CHILD_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "PYTHONUNBUFFERED": "1"}


def _open(path: Path, **kw: object) -> Journal:
    config = kw.pop("config", CONFIG)
    return Journal.open(path, PLAN, config, kw.pop("now", 0.0), **kw)  # type: ignore[arg-type]


def _open_with_database(path: Path, **kw: object) -> tuple[Journal, sqlite3.Connection]:
    """A journal, and the SQLite connection it opened its database with (its one connection:
    the database is locked exclusively), to set a fault in the database as SQLite allows (a
    trigger, a PRAGMA, the connection closed under the journal)."""
    opened: list[sqlite3.Connection] = []
    connect = sqlite3.connect

    def recording(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        opened.append(connect(*args, **kwargs))
        return opened[-1]

    sqlite3.connect = recording  # type: ignore[assignment]
    try:
        journal = _open(path, **kw)
    finally:
        sqlite3.connect = connect
    (database,) = opened
    return journal, database


def _drive(d: Dispatcher, t: float = 1.0) -> None:
    d.register("a", t)
    d.register("b", t)
    x = d.lease("a", 3, t)
    y = d.lease("b", 2, t)
    d.complete(x[0].lease_id, t + 1)
    d.fail(x[1].lease_id, "oops", t + 1)
    d.renew(y[0].lease_id, t + 2)


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


def _sql(directory: Path, statement: str, *args: Any) -> list[tuple[Any, ...]]:
    """Run one statement on a closed journal's database, as a person repairing (or a disk
    damaging) it would."""
    db = sqlite3.connect(directory / DATABASE, isolation_level=None)
    try:
        return db.execute(statement, args).fetchall()
    finally:
        db.close()


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


# Drives a journal and says what it committed, then records heartbeats without committing
# them, in a page cache so small that SQLite writes them into its log uncommitted; says so,
# and waits to be killed.
_UNCOMMITTED = textwrap.dedent(
    """
    import json, os, sys, time
    from test_journal import _drive, _open_with_database
    from shmloader.master.updates import ConsumerHeartbeat
    j, database = _open_with_database(sys.argv[1], fsync="never")
    _drive(j.dispatcher)
    wal = j.path + "-wal"
    print(json.dumps({"state": j.dispatcher.state_dict(), "seq": j.seq,
                      "wal": os.path.getsize(wal)}), flush=True)
    database.execute("PRAGMA cache_size=8")  # pages spill into the log long before a commit
    for i in range(3000):
        j.dispatcher.apply(ConsumerHeartbeat(5.0 + i, "a"))
    print(json.dumps({"seq": j.seq, "wal": os.path.getsize(wal)}), flush=True)
    time.sleep(600)
    """
)


def test_a_transaction_killed_before_its_commit_is_rolled_back(tmp_path: Path) -> None:
    """A master SIGKILLed with a request's updates written but not committed (the old torn
    tail): they are gone after the restart, and nothing committed before them is lost."""
    child = subprocess.Popen(
        [sys.executable, "-c", _UNCOMMITTED, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=TESTS,
        env=CHILD_ENV,
    )
    try:
        assert child.stdout is not None
        committed = json.loads(child.stdout.readline())
        written = json.loads(child.stdout.readline())
    finally:
        child.kill()
        child.wait(timeout=30)
    assert written["seq"] == committed["seq"] + 3000
    assert written["wal"] > committed["wal"]  # the uncommitted pages reached the disk
    with _open(tmp_path, now=9000.0) as j:
        assert j.recovery is not None and j.recovery.next_seq == committed["seq"]
        assert _comparable(j.dispatcher.state_dict()) == _comparable(committed["state"])


# Leases and completes one task per loop, saying after each request what is committed;
# compacts every 64 updates, so that kills land in compactions too.
_LOOP = textwrap.dedent(
    """
    import sys
    from shmloader.master import JobConfig
    from shmloader.master.journal import Journal
    from shmloader.sources.base import Shard
    config = JobConfig(records_per_task=1, epochs=None)
    j = Journal.open(
        sys.argv[1], [Shard("s", 100_000)], config, 0.0, fsync=sys.argv[2], snapshot_every=64
    )
    d = j.dispatcher
    d.register("c", 0.0)
    t, completed = 1.0, 0
    while True:
        (lease,) = d.lease("c", 1, t)
        print(j.seq, completed, flush=True)
        d.complete(lease.lease_id, t)
        completed += 1
        print(j.seq, completed, flush=True)
        t += 0.001
    """
)


@pytest.mark.parametrize("fsync", ["always", "batch", "never"])
def test_a_master_killed_mid_write_recovers_every_commit_and_nothing_more(
    tmp_path: Path, fsync: str
) -> None:
    """SIGKILL at a random moment of a loop of requests (and compactions): the journal
    recovers exactly a committed prefix, at least up to the last request whose commit
    returned (at most one request more: killed after its commit, before it could say so)."""
    rng = random.Random(fsync)
    child = subprocess.Popen(
        [sys.executable, "-c", _LOOP, str(tmp_path), fsync],
        stdout=subprocess.PIPE,
        text=True,
        cwd=TESTS,
        env=CHILD_ENV,
    )
    reported: dict[int, int] = {}
    try:
        assert child.stdout is not None
        for _ in range(rng.randrange(50, 400)):
            seq, completed = map(int, child.stdout.readline().split())
            reported[seq] = completed
        child.send_signal(signal.SIGKILL)
        for line in child.stdout:  # what it said before it died
            if line.endswith("\n"):
                seq, completed = map(int, line.split())
                reported[seq] = completed
    finally:
        child.kill()
        child.wait(timeout=30)
    last = max(reported)
    config = JobConfig(records_per_task=1, epochs=None)
    with Journal.open(tmp_path, [Shard("s", 100_000)], config, 10_000.0) as j:
        assert j.recovery is not None
        recovered = j.recovery.next_seq
        # a lease request writes up to 2 updates (the epoch's start, the grant), a completion 1
        assert last <= recovered <= last + 2
        completed = j.dispatcher.progress().counters["completed"]
        if recovered in reported:
            assert completed == reported[recovered]
        else:
            assert completed in (reported[last], reported[last] + 1)


def test_a_damaged_row_is_refused_naming_the_file_and_the_update(tmp_path: Path) -> None:
    """A row changed on disk (here, a completion's lease id) is not replayed as if it were
    what was acknowledged: SQLite checks its pages' structure, each row's CRC-32 its content."""
    with _open(tmp_path) as j:
        _drive(j.dispatcher)
    ((seq, body),) = _sql(
        tmp_path, "SELECT seq, body FROM updates WHERE body LIKE '%LeaseCompleted%'"
    )
    update = json.loads(body)
    update["lease_id"] += 1
    _sql(tmp_path, "UPDATE updates SET body = ? WHERE seq = ?", json.dumps(update), seq)
    damaged = (tmp_path / DATABASE).read_bytes()
    with pytest.raises(CorruptRecordError, match=f"update {seq} is damaged") as info:
        _open(tmp_path)
    assert info.value.path == str(tmp_path / DATABASE) and info.value.index == seq
    assert "restore" in str(info.value) and "without this journal" in str(info.value)
    assert (tmp_path / DATABASE).read_bytes() == damaged  # nothing written over it


@pytest.mark.parametrize("damage", ["header", "table"])
def test_a_damaged_database_file_is_named_with_the_fix(tmp_path: Path, damage: str) -> None:
    with _open(tmp_path) as j:
        _drive(j.dispatcher)
    ((root,),) = _sql(tmp_path, "SELECT rootpage FROM sqlite_master WHERE name = 'updates'")
    ((page_size,),) = _sql(tmp_path, "PRAGMA page_size")
    data = bytearray((tmp_path / DATABASE).read_bytes())
    if damage == "header":  # "file is not a database"
        data[:16] = b"\xff" * 16
    else:  # the updates table's page: "database disk image is malformed"
        start = (root - 1) * page_size
        data[start : start + page_size] = b"\xa5" * page_size
    (tmp_path / DATABASE).write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match="the journal's database is damaged") as info:
        _open(tmp_path)
    assert info.value.path == str(tmp_path / DATABASE)
    assert "restore" in str(info.value) and "without this journal" in str(info.value)
    _open(tmp_path / "elsewhere").close()  # the fix it gives: another directory starts afresh


def test_snapshots_compact_the_journal(tmp_path: Path) -> None:
    with _open(tmp_path, snapshot_every=3) as j:
        _drive(j.dispatcher)
        before = j.dispatcher.state_dict()
        seq = j.seq
    ((snapshot_seq,),) = _sql(tmp_path, "SELECT seq FROM snapshot")
    kept = [s for (s,) in _sql(tmp_path, "SELECT seq FROM updates ORDER BY seq")]
    assert kept == list(range(snapshot_seq, seq)) and len(kept) < 3
    with _open(tmp_path, now=4.0) as j:
        rec = j.recovery
        assert rec is not None and rec.snapshot_seq == snapshot_seq and rec.next_seq == seq
        assert rec.replayed == seq - rec.snapshot_seq < 3
        assert _comparable(j.dispatcher.state_dict()) == _comparable(before)


def test_a_damaged_snapshot_is_refused(tmp_path: Path) -> None:
    """The snapshot replaced the updates before it: without it they are gone."""
    with _open(tmp_path, snapshot_every=3) as j:
        _drive(j.dispatcher)
    ((snapshot_seq, state),) = _sql(tmp_path, "SELECT seq, state FROM snapshot")
    _sql(tmp_path, "UPDATE snapshot SET state = ?", state.replace(",", ", ", 1))
    with pytest.raises(CorruptRecordError, match=f"state after {snapshot_seq} updates") as info:
        _open(tmp_path)
    assert info.value.path == str(tmp_path / DATABASE)


@pytest.mark.parametrize("updates_after_it", [True, False])
def test_a_deleted_snapshot_is_detected_not_taken_for_a_new_journal(
    tmp_path: Path, updates_after_it: bool
) -> None:
    """Without the check, a journal whose updates were all compacted looked new: the job
    would start again from scratch, handing out what was delivered."""
    with _open(tmp_path) as j:
        _drive(j.dispatcher)
        j.snapshot()
        if updates_after_it:
            _drive(j.dispatcher, 5.0)
    _sql(tmp_path, "DELETE FROM snapshot")
    missing = r"updates 0\.\.\d+ are missing" if updates_after_it else "snapshot is missing"
    with pytest.raises(CorruptRecordError, match=missing):
        _open(tmp_path)


def test_a_gap_in_the_updates_is_an_error_naming_it(tmp_path: Path) -> None:
    """A row gone from the middle: replaying around it would undo what it recorded."""
    with _open(tmp_path) as j:
        _drive(j.dispatcher)
    (middle,) = _sql(tmp_path, "SELECT seq FROM updates ORDER BY seq LIMIT 1 OFFSET 4")[0]
    _sql(tmp_path, "DELETE FROM updates WHERE seq = ?", middle)
    with pytest.raises(CorruptRecordError, match=f"updates {middle}..{middle} are missing") as e:
        _open(tmp_path)
    assert e.value.path == str(tmp_path / DATABASE) and e.value.index == middle + 1


def test_a_journal_in_the_old_format_is_refused_saying_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / f"journal-{0:020d}.log").write_bytes(b"")
    (tmp_path / f"snapshot-{0:020d}.json").write_text("{}")
    with pytest.raises(ConfigError, match="format of earlier shmloader versions") as info:
        _open(tmp_path)
    assert f"journal-{0:020d}.log" in str(info.value)
    assert "shmloader version that wrote it" in str(info.value)
    assert not (tmp_path / DATABASE).exists()  # nothing written beside it


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
    assert not (tmp_path / f"{DATABASE}-wal").exists()  # all of it in the database
    with _open(tmp_path, fsync=fsync, now=5.0) as j:
        assert _comparable(j.dispatcher.state_dict()) == _comparable(before)


def test_batch_syncs_after_batch_records_updates_or_batch_seconds(tmp_path: Path) -> None:
    with _open(tmp_path, fsync="batch", batch_records=4, batch_seconds=10.0, now=1.0) as j:
        d = j.dispatcher
        d.register("a", 1.0)  # the open synced
        d.register("b", 2.0)
        d.register("c", 2.0)
        assert j.updates_unsynced == 3
        d.register("d", 3.0)  # the fourth update since
        assert j.updates_unsynced == 0
        d.register("e", 4.0)
        assert j.updates_unsynced == 1
        d.heartbeat("e", 13.0)  # 10 s since the last sync
        assert j.updates_unsynced == 0


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
        open_names = set(os.listdir(directory))
        assert {DATABASE, f"{DATABASE}-wal", "lock"} == open_names
        open_modes = {n: oct(os.stat(directory / n).st_mode & 0o777) for n in open_names}
    names = set(os.listdir(directory))
    assert {DATABASE, "lock"} == names
    modes = {name: oct(os.stat(directory / name).st_mode & 0o777) for name in names}
    assert modes == dict.fromkeys(names, oct(0o600))
    assert open_modes == dict.fromkeys(open_names, oct(0o600))
    assert oct(directory.stat().st_mode & 0o777) == oct(0o700)


# Forks a child that tries the journal and then exits as any Python program does (finalizing
# what it has); the parent records more, and dies without closing.
_FORKS = textwrap.dedent(
    """
    import gc, os, sys
    from test_journal import _drive, _open
    from shmloader.errors import MasterError
    j = _open(sys.argv[1], fsync="never")
    _drive(j.dispatcher)
    wal = os.stat(j.path + "-wal").st_ino
    pid = os.fork()
    if pid == 0:
        try:
            j.dispatcher.register("child", 3.0)
        except MasterError as exc:
            print("child:", exc, flush=True)
        del j
        gc.collect()
        sys.exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    j.dispatcher.register("parent", 4.0)
    print(os.stat(j.path + "-wal").st_ino == wal, flush=True)
    os._exit(0)
    """
)


def test_a_forked_child_neither_writes_nor_closes_the_parents_journal(tmp_path: Path) -> None:
    """Closing the copy of the connection in a child (at its exit) checkpointed and deleted
    the parent's -wal file, which the parent went on writing: lost at its next crash."""
    done = subprocess.run(
        [sys.executable, "-c", _FORKS, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=TESTS,
        env=CHILD_ENV,
        check=True,
    )
    refused, same_log = done.stdout.splitlines()
    assert "is closed" in refused and same_log == "True"
    with _open(tmp_path, now=5.0) as j:
        consumers = j.dispatcher.state_dict()["consumers"]
        assert "parent" in str(consumers) and "child" not in str(consumers)
