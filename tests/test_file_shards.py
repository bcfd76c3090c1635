"""A folder of files written as WebDataset tar shards, and read back through the dataset.

Every file lands in exactly one shard under a key made of its path, every shard holds files
of every class folder (the source's spread order, not the listing's), and the shards read
through ``WebDatasetSource`` deliver each file's bytes once per epoch. A run that fails
leaves nothing in the output folder.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import shmloader
from shmloader.sources import file_shards

CLASSES = ("cat", "dog", "owl")
PER_CLASS = 20


def _folder(root: Path) -> dict[str, bytes]:
    """train/<class>/<n>.jpg (some with a dot in the stem, one without an ending): key ->
    bytes, keyed as the shards name them."""
    made = {}
    for label in CLASSES:
        (root / label).mkdir(parents=True)
        for n in range(PER_CLASS):
            name, key = (
                (f"{n}.v2.jpg", f"{label}/{n}_v2") if n % 5 == 0 else (f"{n}.jpg", f"{label}/{n}")
            )
            if label == "owl" and n == 1:
                name, key = "1", "owl/1"  # no ending: stored as .bin
            data = f"{label}-{n}".encode() * (n + 1)
            (root / label / name).write_bytes(data)
            made[key] = data
    return made


def _decode(sample: dict) -> dict:
    (field,) = [k for k in sample if k != "__key__"]
    return {"key": sample["__key__"], "data": sample[field]}


def test_the_shards_hold_every_file_once_spread_over_the_classes(tmp_path: Path) -> None:
    made = _folder(tmp_path / "train")
    written = shmloader.write_file_shards(
        str(tmp_path / "train"), str(tmp_path / "out"), files_per_shard=7
    )
    assert [w.files for w in written] == [7] * 8 + [4]
    assert os.path.basename(written[0].path) == "part-00000-of-00009.tar"
    for shard in written:
        with tarfile.open(shard.path) as tar:
            names = tar.getnames()
        assert len({name.split("/")[0] for name in names}) >= 2, names  # not one class each
        assert all(name.endswith((".jpg", ".bin")) for name in names)
    source = shmloader.WebDatasetSource(str(tmp_path / "out" / "part-*.tar"), decode=_decode)
    with shmloader.SharedTaskDataset(source, epochs=2, records_per_task=5) as ds:
        for _ in range(2):
            seen: collections.Counter[str] = collections.Counter()
            for batch in shmloader.DataLoader(ds, batch_size=8, num_workers=2):
                for key, data in zip(batch["key"], batch["data"], strict=True):
                    seen[key] += 1
                    assert data == made[key]
            assert seen == collections.Counter(list(made)), "not every file exactly once"
    assert sorted(os.listdir(tmp_path / "out")) == sorted(
        name
        for w in written
        for name in (os.path.basename(w.path), os.path.basename(w.path) + ".wds.shmidx")
    )


def _convert(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``shmloader convert train --output-dir out``, as a user runs it."""
    command = ["convert", str(tmp_path / "train"), "--output-dir", str(tmp_path / "out")]
    return subprocess.run(
        [sys.executable, "-m", "shmloader", *command], capture_output=True, text=True, check=False
    )


def test_the_command_converts_a_folder_and_says_how_to_read_it(tmp_path: Path) -> None:
    made = _folder(tmp_path / "train")
    done = _convert(tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"wrote {len(made)} files to 1 tar shard:" in done.stdout
    assert f'shmloader.WebDatasetSource("{tmp_path}/out/part-*.tar", decode=decode)' in done.stdout
    again = _convert(tmp_path)
    assert again.returncode == 2 and "already holds shards named part-*" in again.stderr


def test_two_files_of_one_key_are_refused_and_nothing_is_left(tmp_path: Path) -> None:
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "a.b.jpg").write_bytes(b"1")
    (tmp_path / "train" / "a_b.png").write_bytes(b"2")
    with pytest.raises(
        shmloader.ConfigError, match=r"a\.b\.jpg and .*a_b\.png would be one sample"
    ):
        shmloader.write_file_shards(str(tmp_path / "train"), str(tmp_path / "out"))
    assert os.listdir(tmp_path / "out") == []


def test_a_file_gone_since_the_listing_is_named_and_nothing_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _folder(tmp_path / "train")
    # The second shard's first read finds the dog folder deleted after it was listed.
    real_read = shmloader.FileSource.read

    def read_then_delete(self, shard, start, stop):  # type: ignore[no-untyped-def]
        if start >= 10:
            for file in (tmp_path / "train" / "dog").glob("*"):
                file.unlink()
        return real_read(self, shard, start, stop)

    monkeypatch.setattr(shmloader.FileSource, "read", read_then_delete)
    with pytest.raises(shmloader.DataError, match=r"/dog/\d+(\.v2)?\.jpg: the file is gone"):
        shmloader.write_file_shards(
            str(tmp_path / "train"), str(tmp_path / "out"), files_per_shard=10
        )
    assert os.listdir(tmp_path / "out") == []


def test_shards_aim_at_a_size_when_no_count_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = _folder(tmp_path / "train")
    monkeypatch.setattr(file_shards, "SHARD_BYTES", 200)  # about 6 files of the mean size
    written = shmloader.write_file_shards(str(tmp_path / "train"), str(tmp_path / "out"))
    assert sum(w.files for w in written) == len(made)
    assert 1 < len(written) < len(made)
