"""The journal when the disk says no: a full disk mid-record, a snapshot that cannot be written.

Real OS errors, no mocks: a child process with a low ``RLIMIT_FSIZE`` gets what a full disk
gives (the part of a write that fits, then an error; Python ignores SIGXFSZ), and a directory
squatting on the snapshot's temporary name makes writing the snapshot fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_journal import CONFIG, PLAN, _comparable, _drive, _files, _open

from shmloader.errors import CorruptRecordError
from shmloader.master.journal import Journal

# Drives a journal, then leases with the segment's size limit a few bytes past its end (the
# frame is written in part, then EFBIG), then, the limit lifted, goes on; prints its state.
_CHILD = textwrap.dedent(
    """
    import json, os, resource, sys
    from test_journal import _drive, _open
    j = _open(sys.argv[1])
    d = j.dispatcher
    _drive(d)
    (name,) = [n for n in os.listdir(j.directory) if n.startswith("journal-")]
    segment = os.path.join(j.directory, name)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(segment) + 10, hard))
    try:
        d.lease("a", 1, 5.0)
    except OSError as exc:
        error = str(exc)
    else:
        error = None
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    d.lease("a", 1, 6.0)
    d.heartbeat("b", 7.0)
    print(json.dumps({"error": error, "state": d.state_dict(), "segment": segment}))
    j.close()
    """
)


def test_a_record_cut_short_by_a_full_disk_leaves_the_journal_recoverable(
    tmp_path: Path,
) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=True,
    )
    child = json.loads(done.stdout)
    # the failed write says where, and that the update did not happen
    assert child["error"] is not None
    assert child["segment"] in child["error"] and "it was not applied" in child["error"]
    # the torn frame was cut off, so the records written after it are readable: the
    # master restarts with the state the child had (not CorruptRecordError at the tear)
    with _open(tmp_path, now=8.0) as j:
        assert j.recovery is not None and j.recovery.torn_bytes == 0
        assert _comparable(j.dispatcher.state_dict()) == _comparable(child["state"])


def test_a_snapshot_that_cannot_be_written_does_not_fail_the_request(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with _open(tmp_path, snapshot_every=3) as j:
        d = j.dispatcher
        d.register("a", 1.0)
        d.register("b", 1.0)
        j.snapshot()
        # leasing 2 writes 3 updates (the epoch starts, 2 grants): a compaction is due, and
        # cannot write its snapshot
        squatter = tmp_path / f"snapshot-{j.seq + 3:020d}.json.tmp"
        squatter.mkdir()
        leases = d.lease("a", 2, 2.0)  # the request's updates are journaled: it succeeds
        assert len(leases) == 2
        assert "compaction failed" in caplog.text and str(squatter) in caplog.text
        squatter.rmdir()
        d.complete(leases[0].lease_id, 3.0)
        d.register("d", 3.0)
        d.register("e", 3.0)  # the third update since: the next compaction goes through
        assert not squatter.exists() and _files(tmp_path, "snapshot-") == [
            f"snapshot-{j.seq:020d}.json"
        ]
        d.lease("b", 1, 4.0)
        before = d.state_dict()
    assert len(_files(tmp_path, "snapshot-")) == 1
    with _open(tmp_path, now=5.0) as j:
        assert _comparable(j.dispatcher.state_dict()) == _comparable(before)


def test_closing_releases_the_lock_even_when_the_final_fsync_fails(tmp_path: Path) -> None:
    j = Journal.open(tmp_path, PLAN, CONFIG, 0.0)
    _drive(j.dispatcher)
    assert j._fd is not None
    os.close(j._fd)  # the fsync at close now fails (EBADF), as on a disk gone read-only
    with pytest.raises(OSError):
        j.close()
    _open(tmp_path).close()  # not "in use by another master"


def test_records_missing_behind_a_damaged_snapshot_name_it(tmp_path: Path) -> None:
    with _open(tmp_path, snapshot_every=3) as j:
        _drive(j.dispatcher)
    (snap,) = _files(tmp_path, "snapshot-")
    (tmp_path / snap).write_text("{")  # the only snapshot: the records before it are gone
    with pytest.raises(CorruptRecordError, match=f"damaged, so skipped: {snap}"):
        _open(tmp_path)
