"""parse_size / format_size, the base-directory choice and the /dev/shm space check."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shmloader.errors import ConfigError, ShmSpaceError
from shmloader.shm import BASE_DIR_ENV, SegmentStore, check_space, resolve_base_dir, space
from shmloader.shm.sizes import format_size, parse_size
from shmloader.shm.space import mount_point


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (0, 0),
        (4096, 4096),
        ("4096", 4096),
        ("1GiB", 1024**3),
        ("1gib", 1024**3),
        ("512MB", 512 * 1000**2),
        ("512 MiB", 512 * 1024**2),
        ("1.5G", 3 * 1024**3 // 2),
        ("64M", 64 * 1024**2),
        ("2k", 2048),
        ("2kB", 2000),
        ("4.35K", 4454),  # 4454.4 rounds down; exact in decimal
        (".5KiB", 512),
        ("3T", 3 * 1024**4),
        ("10b", 10),
        (" 7 ", 7),
    ],
)
def test_parse_size(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "cannot read"),
        ("GiB", "cannot read"),
        ("-1G", "cannot read"),
        ("1.2.3G", "cannot read"),
        ("12XB", "unknown unit 'XB'"),
        ("1 G B", "cannot read"),
        (-5, "must not be negative"),
        (1.5, "got float"),
        (True, "got bool"),
        (None, "got NoneType"),
    ],
)
def test_parse_size_errors_name_the_setting(value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_size(value, what="shm_budget")  # type: ignore[arg-type]
    assert str(info.value).startswith("shm_budget: ")


def test_format_size() -> None:
    assert format_size(0) == "0 B"
    assert format_size(1023) == "1023 B"
    assert format_size(1536) == "1.5 KiB"
    assert format_size(64 * 1024**2) == "64.0 MiB"
    assert format_size(3 * 1024**5) == "3072.0 TiB"


def test_base_dir_argument_env_and_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BASE_DIR_ENV, raising=False)
    assert resolve_base_dir() == "/dev/shm"
    monkeypatch.setenv(BASE_DIR_ENV, str(tmp_path))
    assert resolve_base_dir() == str(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    assert resolve_base_dir(other) == str(other)
    with pytest.raises(ConfigError, match=r"missing.*not a directory"):
        resolve_base_dir(tmp_path / "missing")


def test_budget_larger_than_free_space_fails_with_the_fix(tmp_path: Path) -> None:
    free = space(str(tmp_path)).free
    budget = free + 1024**3
    with pytest.raises(ShmSpaceError) as info:
        SegmentStore.create(budget, base_dir=tmp_path)
    message = str(info.value)
    assert f"{tmp_path} has " in message and " free of " in message  # how much is free
    assert f"({budget} bytes)" in message  # how much the budget needs
    assert "docker run --shm-size=" in message
    assert "mount -o remount,size=" in message
    # The mount point to remount, not the folder in it (tmp_path is no mount point).
    assert f"G {mount_point(str(tmp_path))}`" in message and not os.path.ismount(tmp_path)
    assert "lower shm_budget" in message
    assert os.listdir(tmp_path) == []  # nothing created
    assert check_space(str(tmp_path), 1).free > 0


def test_budget_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="shm_budget must be positive"):
        SegmentStore.create(0, base_dir=tmp_path)
    with pytest.raises(ConfigError, match="shm_budget: unknown unit"):
        SegmentStore.create("3 parsecs", base_dir=tmp_path)
