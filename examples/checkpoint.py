"""Checkpoint mid-epoch and resume, also with another number of trainers.

    python examples/checkpoint.py

Two DDP ranks (simulated in one process: ``rank``/``world_size``, each with its own embedded
master, which gives each its equal share) train part of epoch 0 and save their loader states.
Then one trainer, with no ``world_size``, loads ``shmloader.merge_states`` of both and finishes
the epoch. Every record comes exactly once over the two jobs: the script checks it.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path

import shmloader

RECORDS = 6000


def decode(payload: bytes) -> dict[str, object]:
    return {"id": int.from_bytes(payload, "little")}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ids.tfrecord"
        shmloader.write_records(path, (i.to_bytes(8, "little") for i in range(RECORDS)))
        source = shmloader.RecordFileSource(str(path), decode=decode)

        def job(
            rank: int | None = None, world_size: int | None = None
        ) -> shmloader.SharedTaskDataset:
            return shmloader.SharedTaskDataset(
                source, records_per_task=500, seed=1, epochs=1, rank=rank, world_size=world_size
            )

        seen: Counter[int] = Counter()

        # The first job: two ranks, each stops after 5 batches and saves its state.
        states = []
        for rank in range(2):
            with job(rank, world_size=2) as ds:
                loader = shmloader.DataLoader(ds, batch_size=100)
                for step, batch in enumerate(loader):
                    seen.update(batch["id"].tolist())
                    if step == 4:
                        break
                states.append(json.loads(json.dumps(loader.state_dict())))  # JSON values
        print(f"first job: {sum(seen.values())} records delivered by 2 ranks")

        # The second job: one trainer resumes from the merged states.
        with job() as ds:
            loader = shmloader.DataLoader(ds, batch_size=100)
            loader.load_state_dict(shmloader.merge_states(states))
            print(f"second job: {len(loader)} batches left of epoch 0")
            for batch in loader:
                seen.update(batch["id"].tolist())

        assert sorted(seen) == list(range(RECORDS)) and max(seen.values()) == 1
        print(f"every one of the {RECORDS} records came exactly once")


if __name__ == "__main__":
    main()
