"""FileSource over a real image folder (``train/<class>/<id>.jpg`` and ``.png``, mixed),
decoded with Pillow in real reader processes: every file once per epoch with the label of
its folder, a resumed epoch exactly once, and a file deleted in the middle of an epoch named
in the error. tests/test_file_source.py covers the rest of the source with ``.npy`` files.
"""

from __future__ import annotations

import io
import json
import os
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_file_source import open_dataset

import shmloader

Image = pytest.importorskip("PIL.Image")

CLASSES = ("bird", "cat", "dog")
PER_CLASS = 20
SIZE = 16  # images of SIZE x SIZE RGB
JPEG_ERROR = 4  # the most a pixel of these one-colour JPEGs moves (quality 95)


def colour_of(file_id: int) -> tuple[int, int, int]:
    """Each file's own colour: its image is that colour, so a row shows which file it is."""
    return (file_id * 37 % 256, file_id * 11 % 256, 40 + file_id % 7 * 30)


def write_folder(root: Path) -> dict[str, int]:
    """``root/train/<class>/<id>.jpg`` and ``.png`` (every other file), ids unique across
    classes; path -> label (the class's index)."""
    labels = {}
    for label, name in enumerate(CLASSES):
        folder = root / "train" / name
        folder.mkdir(parents=True)
        for n in range(PER_CLASS):
            file_id = label * PER_CLASS + n
            image = Image.new("RGB", (SIZE, SIZE), colour_of(file_id))
            path = folder / f"{file_id:03d}.{'png' if n % 2 else 'jpg'}"
            if path.suffix == ".jpg":
                image.save(path, format="JPEG", quality=95)
            else:
                image.save(path, format="PNG")
            labels[str(path)] = label
    return labels


def decode(data: bytes, path: str) -> Mapping[str, Any]:
    """The decoded image (uint8 H x W x 3), the label from the folder's name, the path."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    return {
        "image": np.asarray(image),
        "label": CLASSES.index(os.path.basename(os.path.dirname(path))),
        "path": path,
    }


@pytest.fixture
def folder(tmp_path: Path) -> tuple[Path, dict[str, int]]:
    labels = write_folder(tmp_path)
    return tmp_path / "train", labels


def paths_checked(batch: Mapping[str, Any], labels: dict[str, int]) -> list[str]:
    """The batch's paths, after checking each row's label is its folder's and its pixels are
    its file's colour (PNG exactly, JPEG within its loss)."""
    paths = list(batch["path"])
    assert batch["image"].shape[1:] == (SIZE, SIZE, 3)
    for row, path in enumerate(paths):
        assert int(batch["label"][row]) == labels[path], path
        file_id = int(os.path.basename(path).partition(".")[0])
        expected = np.broadcast_to(np.array(colour_of(file_id), np.int16), (SIZE, SIZE, 3))
        moved = np.abs(batch["image"][row].numpy().astype(np.int16) - expected).max()
        assert moved <= (JPEG_ERROR if path.endswith(".jpg") else 0), (path, moved)
    return paths


def test_the_folder_holds_real_jpeg_and_png(folder: tuple[Path, dict[str, int]]) -> None:
    _, labels = folder
    kinds: Counter[str] = Counter()
    for path in labels:
        with Image.open(path) as image:
            kinds[image.format] += 1
    assert kinds == {"JPEG": len(labels) // 2, "PNG": len(labels) // 2}
    assert Counter(labels.values()) == dict.fromkeys(range(len(CLASSES)), PER_CLASS)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_image_once_per_epoch_with_its_folders_label(
    folder: tuple[Path, dict[str, int]], tmp_path: Path, num_workers: int
) -> None:
    root, labels = folder
    src = shmloader.FileSource(str(root / "*" / "*"), decode=decode)
    assert src.num_files == len(labels)
    shm = tmp_path / "shm"
    with open_dataset(src, shm, epochs=2) as ds:
        loader = shmloader.DataLoader(ds, batch_size=8, num_workers=num_workers)
        for _ in range(2):
            got = [p for batch in loader for p in paths_checked(batch, labels)]
            assert Counter(got) == Counter(list(labels))
    assert not list(shm.iterdir())


def test_a_break_and_its_state_resume_the_epoch_exactly_once(
    folder: tuple[Path, dict[str, int]], tmp_path: Path
) -> None:
    root, labels = folder
    shm = tmp_path / "shm"
    with open_dataset(shmloader.FileSource(root, decode=decode), shm, epochs=2) as ds:
        loader = shmloader.DataLoader(ds, batch_size=8, num_workers=2)
        before: list[str] = []
        for batch in loader:
            before += paths_checked(batch, labels)
            if len(before) == 24:
                break
        state = json.loads(json.dumps(loader.state_dict()))
    with open_dataset(shmloader.FileSource(root, decode=decode), shm, epochs=2) as ds:
        loader = shmloader.DataLoader(ds, batch_size=8, num_workers=2)
        loader.load_state_dict(state)
        rest = [p for batch in loader for p in paths_checked(batch, labels)]
        following = [p for batch in loader for p in paths_checked(batch, labels)]
    assert not set(before) & set(rest)
    assert Counter(before + rest) == Counter(list(labels))
    assert Counter(following) == Counter(list(labels))
    assert not list(shm.iterdir())


def test_an_image_deleted_in_the_middle_of_an_epoch_is_an_error_naming_it(
    folder: tuple[Path, dict[str, int]], tmp_path: Path
) -> None:
    """A break in epoch 1, one image not delivered yet deleted, and the epoch resumed from
    its state by a new dataset over the same source (listed before the deletion): the rest of
    the epoch stops at that image with an error that names it."""
    root, labels = folder
    src = shmloader.FileSource(root, decode=decode)
    shm = tmp_path / "shm"
    with open_dataset(src, shm, epochs=1) as ds:
        loader = shmloader.DataLoader(ds, batch_size=8)
        before: list[str] = []
        for batch in loader:
            before += paths_checked(batch, labels)
            if len(before) == 16:
                break
        state = loader.state_dict()
    gone = next(p for p in sorted(labels) if p not in before and p.endswith(".png"))
    os.remove(gone)
    with open_dataset(src, shm, epochs=1) as ds:
        loader = shmloader.DataLoader(ds, batch_size=8)
        loader.load_state_dict(state)
        rest: list[str] = []
        with pytest.raises(shmloader.DataError, match="the file is gone") as info:
            for batch in loader:
                rest += paths_checked(batch, labels)
        assert info.value.path == gone
        assert gone in str(info.value) and "make the source again" in str(info.value)
    assert gone not in rest and not set(before) & set(rest)
    assert len(rest) == len(set(rest))
    assert not list(shm.iterdir())
