"""A long job's readers die now and then (OOM killer, a node's hiccup): each death is
restarted and the epoch still delivers every record once. The pool gives up only on deaths in
a row with no task read in between (a crash loop); it counted every death of the run and gave
up at the 11th, however far apart they were. A death is seen even when the reader's pipe
outlives it.

A decode that kills its reader (``os._exit``, a segfault) raises nothing: the death itself is
logged and reported to the master as the task's failure, so the loop's error names the reader, how
it died, the file and the record (was: "lease N ... expired", after lease_timeout a try). A
reader whose trainer is gone exits without a traceback."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _dataset_helpers import (
    Trainer,
    dataset,
    ids_of,
    reader_pid,
    wait_gone,
    write_dataset,
)
from _decoders import HOLDERS_ENV, SCHEMA, decode_holding_fds, decode_or_crash, decode_or_segfault

import shmloader


def test_readers_that_die_now_and_then_are_restarted_past_the_cap(tmp_path: Path) -> None:
    expected = write_dataset(tmp_path / "data", [300, 200])
    options = {"epochs": None, "num_readers": 1, "lease_timeout": 1.0}
    with dataset(tmp_path / "data", tmp_path / "shm", **options) as ds:
        ds.start()
        pool = ds.runtime.pool
        pool.max_restarts = 2  # the cap (10 by default), low to keep the test short
        info = pool.readers[0]
        dl = shmloader.DataLoader(ds, batch_size=50)
        kills, read_at_kill, killed = 0, -1, 0
        for epoch in range(40):
            got: list[int] = []
            for i, batch in enumerate(dl):
                got += ids_of(batch)
                # A death once the reader read a task since the last one (not a crash loop),
                # and only of a reader started since: a task the dead one announced as it
                # died counts too, and its pid stays until the pool has started another.
                if i == 1 and kills < 5 and info.tasks > read_at_kill:
                    pid = reader_pid(ds, 0)  # the running one's, known
                    if pid != killed:
                        read_at_kill, killed = info.tasks, pid
                        os.kill(pid, signal.SIGKILL)
                        kills += 1
            assert sorted(got) == expected, f"epoch {epoch}"
            if kills == 5 and info.restarts == 5:
                break
        assert kills == 5 and info.restarts == 5  # more than the cap, none in a row


@pytest.mark.timeout(120)
def test_a_reader_whose_pipe_outlives_it_is_seen_dead_and_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader SIGKILLed while a child of it holds its pipe open: no end of file reaches the
    trainer, and only the pool's look at the process (``EXIT_CHECK_SECONDS``, also while
    messages keep coming) tells it the reader died."""
    holders = tmp_path / "holders"
    holders.mkdir()
    (tmp_path / "shm").mkdir()
    monkeypatch.setenv(HOLDERS_ENV, str(holders))
    expected = write_dataset(tmp_path / "data", [300, 200])
    src = shmloader.RecordFileSource(
        str(tmp_path / "data" / "*.tfrecord"), decode=decode_holding_fds, schema=SCHEMA
    )
    try:
        with shmloader.SharedTaskDataset(
            src,
            num_readers=1,
            records_per_task=100,
            seed=7,
            shm_budget="16MiB",
            epochs=1,
            lease_timeout=1.0,
            shm_dir=str(tmp_path / "shm"),
        ) as ds:
            ds.start()
            info = ds.runtime.pool.readers[0]
            got: list[int] = []
            for i, batch in enumerate(shmloader.DataLoader(ds, batch_size=50)):
                got += ids_of(batch)
                if i == 1:
                    os.kill(reader_pid(ds, 0), signal.SIGKILL)
            assert sorted(got) == expected
            assert info.restarts == 1 and info.exit_codes == [-signal.SIGKILL]
            assert len(os.listdir(holders)) == 2  # the pipe of the first was held open
    finally:
        for name in os.listdir(holders):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(name), signal.SIGKILL)


@pytest.mark.long
@pytest.mark.parametrize(
    ("decode", "how", "fix"),
    [
        (decode_or_crash, "exited with code 3", "os._exit(3)"),
        (decode_or_segfault, "was killed by SIGSEGV", "PYTHONFAULTHANDLER=1"),
    ],
)
def test_a_decode_that_kills_its_reader_is_named_with_its_record(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    decode: Callable[[bytes], Any],
    how: str,
    fix: str,
) -> None:
    """Record 137 kills every reader that decodes it. The first try's death names the task's
    records (a first try is not watched record by record), the retry's the record; the master
    hears of each death at once (a lease_timeout longer than the test: nothing waits for it)."""
    directory = tmp_path / "data"
    write_dataset(directory, [300], poison=[137])
    path = directory / "part-00000.tfrecord"
    options = {"num_readers": 1, "max_retries": 1, "lease_timeout": 60.0, "decode": decode}
    caplog.set_level(logging.WARNING, logger="shmloader")
    with dataset(directory, tmp_path / "shm", **options) as ds:
        with pytest.raises(shmloader.TaskQuarantinedError) as raised:
            for _ in shmloader.DataLoader(ds, batch_size=50):
                pass
        info = ds.runtime.pool.readers[0]
        progress = ds.runtime.client.progress()
    text = str(raised.value)
    # The cause first: reader, pid, how, the record and its file; then the consequence, then
    # the fix, each once.
    cause = re.match(
        rf"reader 0 \(pid (\d+)\) {re.escape(how)}.* while decoding record 137 of ", text
    )
    assert cause is not None and int(cause.group(1)) > 0, text
    assert f" while decoding record 137 of {path} (task " in text
    assert "records 100..200), on the task's last try: the task is quarantined" in text
    assert text.count(str(path)) == 1 and text.count(fix) == 1
    assert "expired" not in text
    assert progress.counters["expired"] == 0  # reported as failures, not left to lapse
    # Each death logged once, as it happened: the first try's names the records, the retry's
    # the record.
    deaths = [r.getMessage() for r in caplog.records if how in r.getMessage()]
    assert len(deaths) == 2 == info.restarts, deaths
    assert f"while reading records 100..200 of {path}" in deaths[0]
    assert f"while decoding record 137 of {path}" in deaths[1] and fix in deaths[1]


def test_a_reader_whose_trainer_is_gone_exits_quietly(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """What a reader sees of its trainer's death: its pipe's far end closed (end of file, a
    broken or reset pipe). Done here by shutting the trainer's end, as a SIGKILLed trainer's
    readers are killed a moment after (their fork server dies with it): the reader exits with
    code 0 and prints nothing (was: an EOFError or ConnectionResetError traceback)."""
    write_dataset(tmp_path / "data", [3000])
    options = {"epochs": None, "num_readers": 1, "slow": True}
    with dataset(tmp_path / "data", tmp_path / "shm", **options) as ds:
        batches = iter(shmloader.DataLoader(ds, batch_size=50))
        next(batches)
        pid = reader_pid(ds, 0)
        info = ds.runtime.pool.readers[0]
        proc = ds.runtime.pool.reader_process(0)
        assert proc is not None
        pipe = proc.conn  # the trainer's end
        with socket.socket(fileno=os.dup(pipe.fileno())) as end:
            end.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + 60  # a bound: it exits within a task's decode
        while not info.exit_codes and time.monotonic() < deadline:
            time.sleep(0.01)
        assert info.exit_codes == [0]
        assert wait_gone([pid]) == []
        for _ in range(3):  # the reader started in its place reads on
            ids_of(next(batches))
    err = capfd.readouterr().err
    for noise in ("Traceback", "EOFError", "BrokenPipeError", "ConnectionResetError"):
        assert noise not in err, err


def test_a_sigkilled_trainers_readers_leave_no_traceback(tmp_path: Path) -> None:
    """The whole of it, with readers busy: they die a moment after their trainer, and a reader
    that meets the closed pipe first says nothing (which of the two comes first is the
    kernel's choice: the test above makes the pipe close first)."""
    write_dataset(tmp_path / "data", [3000])
    trainer = Trainer(
        tmp_path,
        "trainer",
        data=str(tmp_path / "data"),
        shm_dir=str(tmp_path / "shm"),
        dataset={"epochs": None, "slow": True},
        batch_size=50,
        sleep=0.01,  # the readers stay busy while the trainer is killed
    )
    readers = trainer.wait_for("info")["info"]["readers"]
    trainer.wait_for("ids")
    os.kill(trainer.proc.pid, signal.SIGKILL)
    assert trainer.finish() == -signal.SIGKILL
    assert wait_gone(readers) == []
    output = trainer.output()
    for noise in ("Traceback", "EOFError", "BrokenPipeError", "ConnectionResetError"):
        assert noise not in output, output
