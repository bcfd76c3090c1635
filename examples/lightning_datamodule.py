"""A Lightning ``LightningDataModule`` over ``SharedTaskDataset``, whose loader's position goes
into Lightning's checkpoint and back (docs/how-to/checkpoints.md).

    python examples/lightning_datamodule.py

It writes 4,000 records, trains a linear model for part of an epoch, saves a checkpoint and
stops (as a preempted job would), then resumes from the checkpoint in a new Trainer, which
finishes the epoch and trains one more: every record is seen once in each epoch, the first
epoch counted across the two runs.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch

import shmloader

FEATURES = 8
RECORDS = 4_000
BATCH = 100


def decode(payload: bytes) -> dict[str, Any]:
    """One record: its id (int64), then 8 float32 features."""
    record_id = int(np.frombuffer(payload, dtype="<i8", count=1)[0])
    return {"id": record_id, "x": np.frombuffer(payload, dtype="<f4", offset=8)}


def write_data(folder: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((RECORDS, FEATURES)).astype("<f4")
    shmloader.write_records(
        folder / "train.tfrecord",
        (np.int64(i).tobytes() + x[i].tobytes() for i in range(RECORDS)),
    )


# --8<-- [start:datamodule]
class SharedDataModule(L.LightningDataModule):
    """The dataset lives from ``setup`` to ``teardown``. ``shmloader.DataLoader`` has
    ``state_dict`` and ``load_state_dict``, so Lightning keeps its position in every checkpoint
    and gives it back on ``fit(ckpt_path=...)``: nothing to save here. ``length="epoch"``:
    Lightning counts a resumed epoch's steps from where it stopped, up to ``len()``."""

    def __init__(self, folder: Path, batch_size: int) -> None:
        super().__init__()
        self.folder = folder
        self.batch_size = batch_size
        self.dataset: shmloader.SharedTaskDataset | None = None

    def setup(self, stage: str) -> None:
        source = shmloader.RecordFileSource(str(self.folder / "*.tfrecord"), decode=decode)
        self.dataset = shmloader.SharedTaskDataset(source, num_readers=2, seed=0)

    def train_dataloader(self) -> shmloader.DataLoader:
        assert self.dataset is not None
        return shmloader.DataLoader(self.dataset, batch_size=self.batch_size, length="epoch")

    def teardown(self, stage: str) -> None:
        if self.dataset is not None:
            self.dataset.close()


# --8<-- [end:datamodule]


class LinearModel(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(FEATURES, 1)
        self.seen: Counter[tuple[int, int]] = Counter()  # (epoch, record id) this run trained on

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.seen.update((self.current_epoch, i) for i in batch["id"].tolist())
        loss: torch.Tensor = self.layer(batch["x"]).pow(2).mean()
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Preempted(Exception):
    """What stops the first run part way through its epoch, as a preemption would."""


class SaveThenStop(L.Callback):
    """Saves a checkpoint after ``steps`` steps, then stops the run with an error."""

    def __init__(self, steps: int, path: Path) -> None:
        self.steps = steps
        self.path = path

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.steps:
            trainer.save_checkpoint(self.path)
            raise Preempted(f"stopped after {self.steps} steps")


def trainer(**options: Any) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **options,
    )


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_data(folder)
        checkpoint = folder / "part.ckpt"

        first = LinearModel()
        try:
            run = trainer(max_epochs=1, callbacks=[SaveThenStop(15, checkpoint)])
            run.fit(first, datamodule=SharedDataModule(folder, BATCH))
        except Preempted as stopped:
            print(f"first run: {stopped}, {sum(first.seen.values())} records")

        saved = torch.load(checkpoint, weights_only=False)
        (state,) = saved["loops"]["fit_loop"]["state_dict"]["combined_loader"]
        print(f"in the checkpoint: epoch {state['epoch']}, {len(state['consumed'])} tasks begun")

        second = LinearModel()
        trainer(max_epochs=2).fit(
            second, datamodule=SharedDataModule(folder, BATCH), ckpt_path=str(checkpoint)
        )
        print(f"resumed run: {sum(second.seen.values())} records")
        both = first.seen + second.seen
        for epoch in range(2):
            seen = Counter(i for (e, i) in both.elements() if e == epoch)
            once = seen == Counter(range(RECORDS))
            print(f"epoch {epoch}: {sum(seen.values())} records, each once: {once}")


if __name__ == "__main__":
    main()
