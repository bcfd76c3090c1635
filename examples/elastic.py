"""Several trainers share one master's epochs (elastic mode): they join late, and one dies.

One process here plays the standalone master (``shmloader master`` on a real cluster). Trainer
processes connect to it without ``world_size``, each with its own readers, and split every
epoch between them as their readers lease tasks. Trainer 0 starts at once, the others join a
little later. With ``--kill``, the first trainer whose loop has received 1,000 records is
killed (SIGKILL; usually trainer 0, but on a busy machine another may get there first): its
tasks go back to the queue and the others deliver them. At the end, every
record must have reached some trainer's loop once per epoch (the killed trainer's rows count,
and the rows of a task it was in the middle of come again), and the master reports both epochs
finished.

    python examples/elastic.py [--trainers 3] [--records 40000] [--kill]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import tempfile
import time
from collections import Counter
from multiprocessing.connection import Connection, wait
from typing import cast

import numpy as np
from tabular import decode_batch, encode

import shmloader
from shmloader.shm import reap_stale

EPOCHS = 2


def train(index: int, path: str, address: str, start_after: float, out: Connection) -> None:
    """One trainer: join the master after ``start_after`` s, run the epochs, report each
    batch's labels as the loop receives it (so a killed trainer's rows are known). Reports go
    through a pipe of its own: a process killed while writing to a shared queue would leave
    the queue's lock held."""
    time.sleep(start_after)
    source = shmloader.RecordFileSource(path, decode_batch=decode_batch)
    with shmloader.SharedTaskDataset(
        source, num_readers=1, master=address, shm_budget="64MiB"
    ) as ds:
        loader = shmloader.DataLoader(ds, batch_size=256)
        for epoch in range(EPOCHS):
            for batch in loader:
                out.send((epoch, batch["label"].numpy()))
                time.sleep(0.01)  # the training step
        out.send((EPOCHS, None))  # done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trainers", type=int, default=3)
    parser.add_argument("--records", type=int, default=40_000)
    parser.add_argument("--kill", action="store_true", help="kill a trainer mid-epoch")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "data.tfrecord")
        rng = np.random.default_rng(0)
        x = rng.standard_normal((args.records, 64), dtype=np.float32)
        shmloader.write_records(path, (encode(x[i], i) for i in range(args.records)))
        source = shmloader.RecordFileSource(path, decode_batch=decode_batch)

        with shmloader.Master(
            source, records_per_task=500, epochs=EPOCHS, lease_timeout=3.0, consumer_timeout=3.0
        ) as master:
            ctx = mp.get_context("spawn")
            pipes = [ctx.Pipe(duplex=False) for _ in range(args.trainers)]
            trainers = [
                ctx.Process(target=train, args=(i, path, master.address, 0.5 * i, pipes[i][1]))
                for i in range(args.trainers)
            ]
            for p in trainers:
                p.start()
            open_pipes = {pipes[i][0]: i for i in range(args.trainers)}
            for _, sender in pipes:
                sender.close()  # ours: each pipe then ends when its trainer does
            delivered: list[Counter[int]] = [Counter() for _ in range(args.trainers)]
            times: Counter[int] = Counter()  # record -> how often a loop received it
            killed = False
            while open_pipes:
                ready = cast(list[Connection], wait(list(open_pipes), timeout=120))
                if not ready:
                    raise SystemExit("no trainer reported for 120 s")
                for pipe in ready:
                    index = open_pipes[pipe]
                    try:
                        epoch, labels = pipe.recv()
                    except EOFError:  # it exited, or was killed
                        del open_pipes[pipe]
                        continue
                    if labels is None:
                        continue
                    delivered[index][epoch] += len(labels)
                    times.update(labels.tolist())
                    received = sum(delivered[index].values())
                    if args.kill and not killed and received >= 1000:
                        pid = trainers[index].pid
                        assert pid is not None  # started
                        os.kill(pid, signal.SIGKILL)
                        print(f"killed trainer {index} after {received} records")
                        killed = True
            for p in trainers:
                p.join(30)
            progress = master.progress()
        # The killed trainer left its shared memory behind: reaped here, as the next dataset
        # created on this machine or `shmloader clean` would.
        for entry in reap_stale().removed:
            print(f"reaped {entry.path} ({entry.reason})")

    # A trainer's pass is its share of an epoch; a task a dead trainer held may come in a later
    # pass of another trainer, so the count is over all epochs: EPOCHS times each record.
    for i, counts in enumerate(delivered):
        shares = ", ".join(f"pass {e}: {counts[e]:,}" for e in range(EPOCHS))
        print(f"trainer {i} delivered {shares}")
    short = sum(1 for r in range(args.records) if times[r] < EPOCHS)
    again = sum(times.values()) - EPOCHS * args.records + short
    print(
        f"{args.records:,} records x {EPOCHS} epochs: {short} records short, "
        f"{again} deliveries more (rows of a task a killed trainer was in the middle of)"
    )
    if short or (again and not killed):
        raise SystemExit("not every record once per epoch")
    print(
        f"master: {progress.epochs_finished} of {EPOCHS} epochs finished, "
        f"{progress.counters['expired']} leases expired"
    )


if __name__ == "__main__":
    main()
