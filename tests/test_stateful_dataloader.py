"""torchdata's ``StatefulDataLoader`` given ``ds.batch_sampler(B)``: exactly once.

It saves its batch sampler's state as it asks for each batch and gives back the one taken with
the last batch the loop got; ``TaskBatchSampler.state_dict`` is the dataset's state counting
the batches handed out so far, so that state is exact. It also asks each worker for its
dataset's state (a worker's copy has none: ``{}``). Real processes: a save at a step, SIGKILL,
and a resume from the loader's own ``load_state_dict`` in a fresh process.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _dataset_helpers import dataset, ids_of, saved_killed_resumed, shm_entries, write_dataset

pytest.importorskip("torchdata")
from torchdata.stateful_dataloader import StatefulDataLoader

BATCH = 32


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    directory = tmp_path_factory.mktemp("data")
    return directory, write_dataset(directory, [230, 170])


@pytest.mark.timeout(180)
@pytest.mark.parametrize("workers", [0, 2])
def test_break_then_the_next_pass_lose_nothing(
    tmp_path: Path, data: tuple[Path, list[int]], workers: int
) -> None:
    directory, expected = data
    with dataset(directory, tmp_path, epochs=1) as ds:
        dl = StatefulDataLoader(ds, batch_sampler=ds.batch_sampler(BATCH), num_workers=workers)
        got: list[int] = []
        for step, batch in enumerate(dl):
            got += ids_of(batch)
            if step + 1 == 5:
                break
        got += [i for batch in dl for i in ids_of(batch)]
    assert Counter(got) == Counter(expected)
    assert shm_entries(tmp_path) == []


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("workers", "step"), [(0, 3), (2, 1), (2, 8)])
def test_its_state_saved_then_killed_resumes_exactly(
    tmp_path: Path, data: tuple[Path, list[int]], workers: int, step: int
) -> None:
    directory, expected = data
    common: dict[str, Any] = {
        "data": str(directory),
        "shm_dir": str(tmp_path / "shm"),
        "kind": "stateful",
        "batch_size": BATCH,
        "loader": {"num_workers": workers},
        "dataset": {"epochs": 1},
    }
    first, second = saved_killed_resumed(tmp_path, common, step)
    assert Counter(first.ids(0) + second.ids(0)) == Counter(expected)
    assert shm_entries(tmp_path / "shm") == []
