"""Two nodes simulated on one machine: one standalone master serving TLS with a token and a
journal; two "nodes", each its own shared-memory root (``shm_dir``) with two trainers and
their reader pools, connecting as trainers on other machines would (``tls_ca=``, the token).
Mid-epoch, while all four train, the master is SIGKILLed and started again on its journal:
they carry on, and every record is delivered once per epoch across all ranks, in DDP
(``rank``/``world_size``) and in elastic mode (trainers share each epoch)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from _dataset_helpers import Trainer, shm_entries, subprocess_env, wait_gone, write_dataset
from _tls import make_pki

pytestmark = pytest.mark.long  # the long tier: .ci/run runs it after the README's command

TOKEN = "two-nodes-token"
# 3,200 records: 800 per rank, 160 tasks of 20 an epoch. Many tasks, so that in elastic mode
# the trainers that start first cannot hold all of epoch 0 before the last one starts.
SIZES = [800, 800, 800, 800]
RECORDS_PER_TASK = 20
RECORDS = sum(SIZES)
EPOCHS = 2
NODES = ("node-a", "node-b")
TRAINERS_PER_NODE = 2


def _free_port() -> int:
    """A port free now, for a master that must come back on the same one after its kill."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MasterProcess:
    """``shmloader master`` with TLS, a token and a journal, started again on demand."""

    def __init__(self, tmp_path: Path, data: Path, world_size: int | None) -> None:
        pki = make_pki(tmp_path / "pki")
        self.ca = str(pki.ca)
        self.port = _free_port()
        self.cmd = [sys.executable, "-m", "shmloader", "master", str(data / "*.tfrecord")]
        self.cmd += ["--records-per-task", str(RECORDS_PER_TASK), "--epochs", str(EPOCHS)]
        self.cmd += ["--seed", "7"]
        self.cmd += ["--port", str(self.port), "--journal", str(tmp_path / "journal")]
        self.cmd += ["--tls-cert", str(pki.cert), "--tls-key", str(pki.key)]
        self.cmd += ["--lease-timeout", "5", "--consumer-timeout", "15"]
        if world_size is not None:
            self.cmd += ["--world-size", str(world_size)]
        self.log = tmp_path / "master.log"
        self.proc = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        env = {**subprocess_env(), "SHMLOADER_TOKEN": TOKEN}
        listening = f"listening on 127.0.0.1:{self.port}"
        before = self.output().count(listening)  # the log is shared by every start
        with open(self.log, "ab") as log:
            proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 60
        while self.output().count(listening) == before:
            assert proc.poll() is None and time.monotonic() < deadline, self.output()
            time.sleep(0.05)
        return proc

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill_and_restart(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.proc = self._start()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.mark.parametrize("mode", ["ddp", "elastic"])
def test_two_nodes_carry_on_through_a_master_killed_mid_epoch(tmp_path: Path, mode: str) -> None:
    data = tmp_path / "data"
    write_dataset(data, SIZES)
    world = len(NODES) * TRAINERS_PER_NODE
    master = MasterProcess(tmp_path, data, world if mode == "ddp" else None)
    trainers: list[Trainer] = []
    try:
        for n, node in enumerate(NODES):
            for t in range(TRAINERS_PER_NODE):
                rank = n * TRAINERS_PER_NODE + t
                dataset: dict[str, object] = {
                    # The name in the master's certificate, as a trainer elsewhere would use.
                    "master": f"localhost:{master.port}",
                    "token": TOKEN,
                    "tls_ca": master.ca,
                    "records_per_task": RECORDS_PER_TASK,
                    "epochs": EPOCHS,
                    "shuffle_window": 4,
                }
                if mode == "ddp":
                    dataset.update(rank=rank, world_size=world)
                trainers.append(
                    Trainer(
                        tmp_path,
                        f"{node}-trainer-{t}",
                        data=str(data),
                        shm_dir=str(tmp_path / node),  # each node's own shared memory
                        dataset=dataset,
                        batch_size=10,
                        passes=EPOCHS,
                        sleep=0.04,  # a training step
                        # After 2 batches, wait: the master dies once all four are under way.
                        pause_at=[0, 2, str(tmp_path / "go")],
                    )
                )
        for trainer in trainers:
            trainer.wait_for("paused")
        (tmp_path / "go").touch()  # all four train on, with about 78 steps of epoch 0 left each
        time.sleep(0.3)
        master.kill_and_restart()
        codes = [trainer.finish(timeout=240) for trainer in trainers]
        outputs = "\n".join(t.output() for t in trainers)
        assert codes == [0] * world, outputs + master.output()
        for epoch in range(EPOCHS):
            delivered = Counter(i for t in trainers for i in t.ids(epoch))
            assert delivered == Counter(range(RECORDS)), (epoch, outputs)
            if mode == "ddp":  # every rank its equal share
                assert [len(t.ids(epoch)) for t in trainers] == [RECORDS // world] * world
        readers = [pid for t in trainers for pid in t.wait_for("info")["info"]["readers"]]
        assert wait_gone(readers) == []
        for node in NODES:
            assert shm_entries(tmp_path / node) == [], node
        assert "Handshake failed" not in master.output()
    finally:
        for trainer in trainers:
            if trainer.proc.poll() is None:
                trainer.proc.kill()
                trainer.proc.wait()
        master.stop()
    assert os.path.exists(tmp_path / "journal")
