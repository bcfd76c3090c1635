"""A Hugging Face ``datasets.Dataset`` object as a source: read from its own Arrow files when
they hold it as it is, else from one file written for it once; every record once per epoch;
a DatasetDict or a streaming dataset refused with what to give instead."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import shmloader

datasets = pytest.importorskip("datasets")


@pytest.fixture(autouse=True)
def quiet() -> None:
    datasets.disable_progress_bars()


def one_epoch(source: object, shm: Path) -> Counter[int]:
    shm.mkdir(exist_ok=True)
    with shmloader.SharedTaskDataset(
        source,  # type: ignore[arg-type]
        num_readers=2,
        records_per_task=100,
        epochs=1,
        shm_dir=str(shm),
    ) as ds:
        seen: Counter[int] = Counter()
        for batch in shmloader.DataLoader(ds, batch_size=64):
            assert (batch["x"] == 2 * batch["id"]).all()
            seen.update(batch["id"].tolist())
        return seen


def in_memory(n: int) -> object:
    return datasets.Dataset.from_dict({"id": list(range(n)), "x": [2 * i for i in range(n)]})


def test_a_dataset_in_memory_is_written_once_and_read_from_there(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    dataset = in_memory(1000)
    source = shmloader.ArrowSource(dataset, cache_dir=str(cache))
    (written,) = source.paths
    assert Path(written).parent == cache and written.endswith(".arrow")
    stamp = Path(written).stat().st_mtime_ns
    assert one_epoch(source, tmp_path / "shm") == Counter(range(1000))
    again = shmloader.ArrowSource(dataset, cache_dir=str(cache))
    assert again.paths == [written] and Path(written).stat().st_mtime_ns == stamp


def test_a_dataset_loaded_from_disk_is_read_from_its_own_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHMLOADER_DATASETS_DIR", str(tmp_path / "cache"))
    in_memory(1000).save_to_disk(str(tmp_path / "disk"))  # type: ignore[attr-defined]
    loaded = datasets.load_from_disk(str(tmp_path / "disk"))
    assert shmloader.ArrowSource(loaded).paths == [c["filename"] for c in loaded.cache_files]
    assert one_epoch(loaded, tmp_path / "shm") == Counter(range(1000))  # given as it is
    assert not (tmp_path / "cache").exists()  # nothing was copied


def test_a_filtered_or_projected_dataset_gives_its_own_rows_and_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHMLOADER_DATASETS_DIR", str(tmp_path / "cache"))
    in_memory(1000).save_to_disk(str(tmp_path / "disk"))  # type: ignore[attr-defined]
    loaded = datasets.load_from_disk(str(tmp_path / "disk"))
    even = loaded.filter(lambda row: row["id"] % 2 == 0)  # an indices mapping over the files
    assert one_epoch(even, tmp_path / "shm") == Counter(range(0, 1000, 2))
    assert len(list((tmp_path / "cache").iterdir())) == 1
    only_ids = shmloader.ArrowSource(loaded.select_columns(["id"]))
    assert only_ids.columns == ["id"]


def test_a_dataset_dict_and_a_streaming_dataset_are_refused_with_what_to_give(
    tmp_path: Path,
) -> None:
    splits = datasets.DatasetDict({"train": in_memory(10), "test": in_memory(10)})
    with pytest.raises(shmloader.ConfigError, match=r"give one split, e\.g\. dataset\['train'\]"):
        shmloader.SharedTaskDataset(splits)  # type: ignore[arg-type]
    streaming = in_memory(10).to_iterable_dataset()  # type: ignore[attr-defined]
    with pytest.raises(shmloader.ConfigError, match="streams records and has no files"):
        shmloader.ArrowSource(streaming)
