"""Every documented loop form, several epochs each, in a process of its own.

``python tests/_epochs_trainer.py CONFIG.json`` (the repo and tests/ on PYTHONPATH). The
config names the data, a store directory, the batch size, ``num_workers``, the epochs and the
forms to run (:data:`FORMS`), each over a dataset of its own with ``epochs`` epochs, one pass
per epoch (and one more for a form that leaves its first pass early). It appends a JSON line
to ``config["out"]`` per pass: ``{"form": f, "pass": p, "len": len(loader) before the pass,
"batches": n, "ids": [...]}``, and ``{"form": f, "error": "..."}`` where a form raised.

accelerate keeps its state in one object per process, which is why the forms under it run
here and not in the test's process.
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from _dataset_helpers import data_loader, dataset, ids_of

#: A form: (the loader's kind for data_loader(), its wrapper, what the loop does).
#: wrapper: "" (none), "accelerate", "fabric". loop: "plain", "save_every_5" (save_state every 5
#: batches), "break_before_last" / "break_after_last" (the first pass is left by a break
#: before / right after its last batch), "islice_zip" (each epoch taken as islice(dl, 4),
#: zip(range(3), dl) and the rest), "iterator_kept" (the first pass taken with next() on an
#: iterator the loop keeps past the pass, the next pass begun without a len() in between).
FORMS: dict[str, tuple[str, str, str]] = {
    "shmloader": ("shmloader", "", "plain"),
    "batch_sampler": ("batch_sampler", "", "plain"),
    "stateful": ("stateful", "", "plain"),
    "islice_zip": ("shmloader", "", "islice_zip"),
    "fabric": ("shmloader", "fabric", "plain"),
    "accelerate": ("shmloader", "accelerate", "plain"),
    "accelerate_batch_sampler": ("batch_sampler", "accelerate", "plain"),
    "accelerate_save_state": ("shmloader", "accelerate", "save_every_5"),
    "accelerate_batch_sampler_save_state": ("batch_sampler", "accelerate", "save_every_5"),
    "accelerate_break_before_last": ("shmloader", "accelerate", "break_before_last"),
    "accelerate_break_after_last": ("shmloader", "accelerate", "break_after_last"),
    "accelerate_iterator_kept": ("shmloader", "accelerate", "iterator_kept"),
}


def accelerator() -> Any:
    """An Accelerator of its own for a form (its checkpointed objects are that form's);
    accelerate's process-wide state is shared by all."""
    from accelerate import Accelerator

    made = Accelerator(cpu=True)
    made.prepare(torch.nn.Linear(1, 1))
    return made


def fabric() -> Any:
    from lightning.fabric import Fabric

    made = Fabric(accelerator="cpu", devices=1)
    made.launch()
    return made


def passes(
    loop: str, dl: Any, epochs: int, save: Callable[[], None]
) -> Iterator[tuple[int | None, list[Any]]]:
    """The passes of ``loop`` over ``dl``: each ``len(dl)`` as it began (None where the loop
    takes several slices of it) and the batches the loop got."""
    if loop == "islice_zip":
        for _ in range(epochs):
            yield (
                None,
                [
                    *itertools.islice(dl, 4),
                    *(batch for _, batch in zip(range(3), dl, strict=False)),
                    *dl,
                ],
            )
        return
    if loop == "iterator_kept":
        batches = len(dl)
        kept = iter(dl)  # alive until this generator ends: past the next pass's start
        yield batches, [next(kept) for _ in range(batches)]
    stops: list[int | None] = [None] * epochs
    if loop.startswith("break_"):
        last = len(dl)
        stops.insert(0, last - 1 if loop == "break_before_last" else last)
    step = 0
    for p, stop in enumerate(stops):
        # After an iterator kept, the pass begins at once: len() would resolve the doubt.
        length = None if loop == "iterator_kept" and p == 0 else len(dl)
        got = []
        for batch in dl:
            got.append(batch)
            step += 1
            if loop == "save_every_5" and step % 5 == 0:
                save()
            if stop == len(got):
                break
        yield length, got


def run_form(name: str, cfg: dict[str, Any], emit: Callable[..., None]) -> None:
    kind, wrapper, loop = FORMS[name]
    shm_dir = Path(cfg["shm_dir"]) / name
    epochs = cfg["epochs"]
    with dataset(Path(cfg["data"]), shm_dir, epochs=epochs) as ds:
        dl = data_loader(ds, kind, cfg["batch_size"], cfg["num_workers"])
        save: Callable[[], None] = lambda: None  # noqa: E731
        if wrapper == "accelerate":
            acc = accelerator()
            acc.register_for_checkpointing(ds)
            dl = acc.prepare(dl)
            state = str(Path(cfg["shm_dir"]) / "states" / name)
            save = lambda: acc.save_state(state)  # noqa: E731
        elif wrapper == "fabric":
            dl = fabric().setup_dataloaders(dl)
        for p, (length, batches) in enumerate(passes(loop, dl, epochs, save)):
            ids = [i for batch in batches for i in ids_of(batch)]
            emit(form=name, **{"pass": p}, len=length, batches=len(batches), ids=ids)


def main(config_path: str) -> int:
    with open(config_path) as f:
        cfg: dict[str, Any] = json.load(f)
    out = open(cfg["out"], "a", buffering=1)  # noqa: SIM115 - lines must reach the test at once

    def emit(**line: Any) -> None:
        out.write(json.dumps(line) + "\n")

    for name in cfg["forms"]:
        try:
            run_form(name, cfg, emit)
        except Exception as exc:  # reported: the test names the form that failed
            emit(form=name, error=f"{type(exc).__name__}: {exc}")
    emit(done=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
