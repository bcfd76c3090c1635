"""Shared helpers of the dataset tests: record files whose records carry int64 ids.

Every record's id is unique across the dataset, so a test can check exactly which records
reached the training loop (each once, none lost) by collecting the ``id`` column.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from _decoders import GOOD, POISON, SCHEMA, decode_or_crash, decode_slow, encode
from _decoders import decode as plain_decode

import shmloader
from shmloader.shm.names import start_token

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent


def write_dataset(
    directory: Path,
    sizes: Sequence[int],
    *,
    poison: Iterable[int] = (),
    first_id: int = 0,
    encoder: Callable[[int, int], bytes] = encode,
) -> list[int]:
    """One record file per entry of ``sizes`` (``part-00000.tfrecord``, ...) with consecutive
    ids from ``first_id``; records whose id is in ``poison`` fail to decode. Returns the ids.
    ``encoder(id, flag)``: the payload of a record (``_decoders.encode_padded`` for large)."""
    bad = set(poison)
    directory.mkdir(parents=True, exist_ok=True)
    next_id = first_id
    for i, size in enumerate(sizes):
        ids = range(next_id, next_id + size)
        shmloader.write_records(
            directory / f"part-{i:05d}.tfrecord",
            (encoder(r, POISON if r in bad else GOOD) for r in ids),
        )
        next_id += size
    return list(range(first_id, next_id))


def source(
    directory: Path,
    *,
    on_error: str = "raise",
    slow: bool = False,
    crash: bool = False,
    decode: Callable[[bytes], Any] | None = None,
) -> Any:
    """The files' source; ``slow``: 2 ms per record; ``crash``: poison records kill the reader
    (``os._exit(3)``); ``decode``: another decode function of ``_decoders``."""
    return shmloader.RecordFileSource(
        str(directory / "*.tfrecord"),
        decode=decode or (decode_or_crash if crash else decode_slow if slow else plain_decode),
        schema=SCHEMA,
        on_error=on_error,
    )


def dataset(directory: Path, shm_dir: Path, **kwargs: Any) -> Any:
    """A small, fast dataset: short leases, small tasks, a tmp_path store. ``on_error``,
    ``slow`` (2 ms per record), ``crash`` and ``decode`` go to the source (:func:`source`), the
    rest to SharedTaskDataset; ``src``: a source of the test's own over the files instead
    (another schema)."""
    shm_dir.mkdir(parents=True, exist_ok=True)
    options: dict[str, Any] = {
        "num_readers": 2,
        "records_per_task": 100,
        "shuffle": True,
        "seed": 7,
        "shm_budget": "16MiB",
        "epochs": 1,
        "lease_timeout": 5.0,
        "shm_dir": str(shm_dir),
    }
    src = kwargs.pop("src", None) or source(
        directory,
        on_error=kwargs.pop("on_error", "raise"),
        slow=kwargs.pop("slow", False),
        crash=kwargs.pop("crash", False),
        decode=kwargs.pop("decode", None),
    )
    options.update(kwargs)
    return shmloader.SharedTaskDataset(src, **options)


def data_loader(
    ds: Any, kind: str, batch_size: int, num_workers: int = 0, *, drop_last: bool = False
) -> Any:
    """The loaders docs/dataset.md shows: ``"shmloader"`` (shmloader.DataLoader),
    ``"batch_sampler"`` (a plain DataLoader given ``ds.batch_sampler(...)``), ``"torch"`` (a
    plain DataLoader given the dataset's sampler and collate) or ``"natural"`` (a plain
    DataLoader as a torch user first writes it: its own sampler, default collate) or
    ``"stateful"`` (torchdata's StatefulDataLoader given ``ds.batch_sampler(...)``)."""
    import torch.utils.data

    if kind == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader

        batches = ds.batch_sampler(batch_size, drop_last=drop_last)
        return StatefulDataLoader(ds, batch_sampler=batches, num_workers=num_workers)
    if kind == "natural":
        return torch.utils.data.DataLoader(
            ds, batch_size=batch_size, num_workers=num_workers, drop_last=drop_last
        )

    if kind == "shmloader":
        return shmloader.DataLoader(
            ds, batch_size=batch_size, num_workers=num_workers, drop_last=drop_last
        )
    if kind == "batch_sampler":
        batches = ds.batch_sampler(batch_size, drop_last=drop_last)
        return torch.utils.data.DataLoader(
            ds, batch_sampler=batches, collate_fn=ds.collate, num_workers=num_workers
        )
    return torch.utils.data.DataLoader(
        ds,
        batch_size=batch_size,
        sampler=ds.sampler(),
        collate_fn=ds.collate,
        num_workers=num_workers,
        drop_last=drop_last,
    )


def reader_pid(ds: Any, index: int) -> int:
    """The pid of reader ``index`` of ``ds``, waiting for it if the reader was just forked
    (its ``ReaderInfo.pid`` is 0 until the fork server says: ``os.kill(0, ...)`` would signal
    the whole process group, this test's process included)."""
    ds.runtime.pool.pids()
    pid = int(ds.runtime.pool.readers[index].pid)
    assert pid > 0, f"reader {index} has no pid"
    return pid


def ids_of(batch: dict[str, Any]) -> list[int]:
    """The batch's record ids, after checking its columns are aligned."""
    ids = batch["id"].numpy()
    assert np.array_equal(batch["x"].numpy(), (2 * ids).astype(np.float32))
    return [int(i) for i in ids]


def subprocess_env() -> dict[str, str]:
    """Environment for a trainer subprocess: imports shmloader (repo) and the test helpers."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), str(TESTS_DIR)])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def finish_group(proc: subprocess.Popen[str], timeout: float) -> str:
    """The output of ``proc`` (started with ``start_new_session=True``: a launcher and what it
    started) once it exits; past ``timeout``, its whole group is SIGKILLed, and the wait's
    TimeoutExpired goes on."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return out


def shm_entries(shm_dir: str | Path) -> list[str]:
    """Our entries (names starting with "shmloader") in a store base directory."""
    if not os.path.isdir(shm_dir):
        return []
    return sorted(n for n in os.listdir(shm_dir) if n.startswith("shmloader"))


PYTHON = sys.executable
# torchrun, without relying on the script being on PATH.
TORCHRUN = [PYTHON, "-m", "torch.distributed.run"]


class Trainer:
    """``tests/_dataset_trainer.py`` (or ``script``, started by the ``launcher`` command, as
    ``accelerate launch``) running in a subprocess, and what it reported: its lines, and those
    of each rank beside rank 0's (``OUT.RANK``)."""

    def __init__(
        self,
        tmp_path: Path,
        name: str,
        *,
        script: Path = TESTS_DIR / "_dataset_trainer.py",
        launcher: Sequence[str] = (PYTHON,),
        **config: Any,
    ) -> None:
        self.out = tmp_path / f"{name}.jsonl"
        self.log = tmp_path / f"{name}.log"
        config_path = tmp_path / f"{name}.json"
        config["out"] = str(self.out)
        config_path.write_text(json.dumps(config))
        # A file, not a pipe: reader processes inherit it and may outlive the trainer.
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [*launcher, str(script), str(config_path)],
                cwd=str(REPO_ROOT),
                env=subprocess_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def lines(self, rank: int = 0) -> list[dict[str, Any]]:
        path = self.out if rank == 0 else Path(f"{self.out}.{rank}")
        if not path.exists():
            return []
        text = path.read_text()
        return [json.loads(line) for line in text.splitlines() if line.endswith("}")]

    def wait_for(self, key: str, timeout: float = 120.0) -> dict[str, Any]:
        """The first line with ``key``; fails if the process exits or times out first (a bound
        for a loaded machine, where starting torch and the readers takes many seconds)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines():
                if key in line:
                    return line
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise AssertionError(f"trainer never reported {key!r}; output:\n{self.output()}")

    def finish(self, timeout: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"trainer did not finish; output:\n{self.output()}") from None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def ids(self, pass_: int | None = None, rank: int = 0) -> list[int]:
        """The ids its loop got, in pass ``pass_`` (None: in every pass)."""
        return [
            i
            for line in self.lines(rank)
            if "ids" in line and pass_ in (None, line["pass"])
            for i in line["ids"]
        ]


def saved_killed_resumed(
    tmp_path: Path, common: dict[str, Any], step: int, **resumed: Any
) -> tuple[Trainer, Trainer]:
    """A trainer that saves its state after ``step`` batches of its first pass and is
    SIGKILLed there, and one that resumes from the state in a fresh process, run to its end
    (``resumed``: what the second's config adds); both, for their ids."""
    state = tmp_path / "state.json"
    first = Trainer(
        tmp_path, "first", **common, stop_at=[0, step], save_state=str(state), then="wait"
    )
    readers = first.wait_for("info")["info"]["readers"]
    first.wait_for("stopped")
    os.kill(first.proc.pid, signal.SIGKILL)
    first.finish()
    assert wait_gone(readers) == []
    second = Trainer(tmp_path, "second", **common, load_state=str(state), **resumed)
    assert second.finish(timeout=120) == 0, second.output()
    assert len(first.ids(0)) == step * common.get("batch_size", 64)
    return first, second


def wait_gone(pids: Iterable[int], timeout: float = 60.0) -> list[int]:
    """Wait for processes to end; returns those still running after ``timeout`` (a bound, not
    a measurement: they end within a second or so unless something is wrong)."""
    deadline = time.monotonic() + timeout
    left = list(pids)
    while left and time.monotonic() < deadline:
        left = [p for p in left if start_token(p) is not None]
        time.sleep(0.02)
    return left


# A standalone master over write_dataset(directory, STANDALONE_SIZES): 33 tasks of 20.
STANDALONE_SIZES = [300, 200, 160]
STANDALONE_BATCH = 32


@contextlib.contextmanager
def standalone_master(
    directory: Path, tmp_path: Path, *, lease_timeout: float, consumer_timeout: float
) -> Iterator[tuple[shmloader.Master, dict[str, Any]]]:
    """A standalone master (one epoch of tasks of 20, seed 7) over ``directory``, and the
    configuration its ``Trainer``s share (add ``stop_at``, ``save_state``, ...)."""
    with shmloader.Master(
        source(directory),
        records_per_task=20,
        epochs=1,
        seed=7,
        lease_timeout=lease_timeout,
        consumer_timeout=consumer_timeout,
    ) as master:
        yield (
            master,
            {
                "data": str(directory),
                "shm_dir": str(tmp_path / "shm"),
                "dataset": {"records_per_task": 20, "shuffle_window": 4, "master": master.address},
                "batch_size": STANDALONE_BATCH,
            },
        )
