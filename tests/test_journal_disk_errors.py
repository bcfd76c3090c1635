"""The journal when the disk says no: a commit on a full disk, a snapshot that cannot be
written, a close whose sync fails.

The full disk is a real OS error: a child process with a low ``RLIMIT_FSIZE`` gets what a full
disk gives (the part of a write that fits, then an error; Python ignores SIGXFSZ), and SQLite
gets it in the middle of writing its log.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_journal import CHILD_ENV, TESTS, _comparable, _drive, _open, _open_with_database

from shmloader.master.journal import DATABASE

# Drives a journal, then leases with every file write past byte 10 refused (SQLite's commit
# fails mid-write), then heartbeats (refused: the lease's updates are still unwritten), then,
# the limit lifted, goes on; prints what happened and its state.
_CHILD = textwrap.dedent(
    """
    import json, resource, sys
    from test_journal import _drive, _open
    j = _open(sys.argv[1])
    d = j.dispatcher
    _drive(d)
    seen = d.consumer_state("b").last_seen
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (10, hard))
    errors = []
    for call in (lambda: d.lease("a", 1, 5.0), lambda: d.heartbeat("b", 5.5)):
        try:
            call()
        except OSError as exc:
            errors.append(str(exc))
        else:
            errors.append(None)
    refused = d.consumer_state("b").last_seen == seen
    leased = [x.lease_id for x in d.leases_of("a")]
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    d.lease("a", 1, 6.0)
    d.heartbeat("b", 7.0)
    print(json.dumps({"errors": errors, "refused": refused, "leased": leased,
                      "state": d.state_dict()}))
    j.close()
    """
)


def test_a_commit_on_a_full_disk_keeps_its_updates_and_refuses_later_ones(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=CHILD_ENV,
        cwd=TESTS,
        check=True,
    )
    child = json.loads(done.stdout)
    commit_error, refused_error = child["errors"]
    path = str(tmp_path / DATABASE)
    # The lease's updates were applied when its commit failed: it says so, and keeps them
    # to write with the next update that can be written.
    assert commit_error is not None and path in commit_error
    assert "cannot commit updates" in commit_error and "every update is refused" in commit_error
    # Until then a new update is not applied (the heartbeat changed nothing).
    assert refused_error is not None and path in refused_error
    assert "it was not applied" in refused_error and child["refused"]
    # Once there is room the master goes on, and a restart recovers the state the child had:
    # the lease granted as the disk filled up included.
    with _open(tmp_path, now=8.0) as j:
        assert j.recovery is not None
        assert _comparable(j.dispatcher.state_dict()) == _comparable(child["state"])
        assert set(child["leased"]) <= {x.lease_id for x in j.dispatcher.leases_of("a")}


def test_a_snapshot_that_cannot_be_written_does_not_fail_the_request(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    j, database = _open_with_database(tmp_path, snapshot_every=3)
    with j:
        d = j.dispatcher
        d.register("a", 1.0)
        d.register("b", 1.0)
        j.snapshot()
        # SQLite refuses the snapshot's row, as a disk with no room for it would.
        database.execute(
            "CREATE TEMP TRIGGER no_room BEFORE INSERT ON main.snapshot "
            "BEGIN SELECT RAISE(ABORT, 'no room for the snapshot'); END"
        )
        # leasing 2 writes 3 updates (the epoch starts, 2 grants): a compaction is due, and
        # cannot write its snapshot
        leases = d.lease("a", 2, 2.0)  # the request's updates are committed: it succeeds
        assert len(leases) == 2
        assert "compaction failed" in caplog.text and "no room for the snapshot" in caplog.text
        database.execute("DROP TRIGGER temp.no_room")
        d.complete(leases[0].lease_id, 3.0)
        d.register("d", 3.0)
        d.register("e", 3.0)  # the third update since: the next compaction goes through
        assert j.updates_since_snapshot == 0
        d.lease("b", 1, 4.0)
        before = d.state_dict()
    with _open(tmp_path, now=5.0) as j:
        assert j.recovery is not None and j.recovery.snapshot_seq == j.recovery.next_seq - 1
        assert _comparable(j.dispatcher.state_dict()) == _comparable(before)


def test_closing_releases_the_lock_even_when_the_final_sync_fails(tmp_path: Path) -> None:
    j, database = _open_with_database(tmp_path)
    _drive(j.dispatcher)
    database.close()  # the sync at close now fails, as on a disk gone read-only
    with pytest.raises(OSError, match="cannot sync it"):
        j.close()
    _open(tmp_path).close()  # not "in use by another master"
