"""Writers write segments through mappings they keep of the files they wrote (shm/written.py)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from shmloader.errors import ShmSpaceError
from shmloader.shm import SegmentInfo, SegmentStore, StoreHandle, ipc_file_size
from shmloader.shm import written as written_module
from shmloader.shm.written import WrittenMappings


def make_batch(rows: int, seed: int) -> pa.RecordBatch:
    rng = np.random.default_rng(seed)
    return pa.record_batch(
        {
            "id": pa.array(np.arange(rows, dtype=np.int64) + seed * 10_000),
            "x": pa.FixedShapeTensorArray.from_numpy_ndarray(
                rng.standard_normal((rows, 8), dtype=np.float32)
            ),
        }
    )


def _mapped_writable(inode: int) -> int:
    """How many shared writable mappings of file ``inode`` this process has."""
    count = 0
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and int(fields[4]) == inode and fields[1].startswith("rw"):
                count += 1
    return count


def _inode(store: StoreHandle, name: str) -> int:
    return os.stat(os.path.join(store.path, name)).st_ino


def _write(writer: StoreHandle, rows: int, seed: int) -> tuple[SegmentInfo, int]:
    """Write a batch; its segment's info and file inode."""
    info = writer.write(make_batch(rows, seed))
    assert info is not None
    return info, _inode(writer, info.name)


pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc")


def test_a_spare_is_written_again_through_the_writers_kept_mapping(tmp_path: Path) -> None:
    with SegmentStore.create("8MiB", base_dir=tmp_path) as store:
        writer = store.handle()
        first, inode = _write(writer, 2000, seed=1)
        assert _mapped_writable(inode) == 1 and writer.written.reused == 0
        store.release(first.name)
        second = writer.write(make_batch(2000, seed=2))
        assert second is not None
        assert _inode(store, second.name) == inode  # the spare, taken over
        assert writer.written.reused == 1 and _mapped_writable(inode) == 1
        assert store.open(second.name).equals(make_batch(2000, seed=2))
        # Another writer has no mapping of it: it maps the file anew, and reads back right.
        store.release(second.name)
        other = store.handle()
        third = other.write(make_batch(2000, seed=3))
        assert third is not None and other.written.reused == 0
        assert store.open(third.name).equals(make_batch(2000, seed=3))


def test_pages_are_allocated_before_a_grown_spare_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A store into a page tmpfs cannot allocate is SIGBUS: pages must exist first.
    calls: list[int] = []
    real = os.posix_fallocate

    def fallocate(fd: int, offset: int, length: int) -> None:
        calls.append(length)
        real(fd, offset, length)

    monkeypatch.setattr(written_module.os, "posix_fallocate", fallocate)
    with SegmentStore.create("8MiB", base_dir=tmp_path) as store:
        writer = store.handle()
        sizes = []
        for rows, seed in ((3000, 1), (3000, 2), (100, 3), (3000, 4)):
            info = writer.write(make_batch(rows, seed))
            assert info is not None
            sizes.append(info.nbytes)
            path = os.path.join(store.path, info.name)
            assert os.stat(path).st_blocks * 512 >= info.nbytes
            assert store.open(info.name).equals(make_batch(rows, seed))
            store.release(info.name)
        # New file: allocated. Same size again: nothing to do. Cut down: nothing. Grown back
        # (its tail pages were dropped with the cut): allocated again.
        assert calls == [sizes[0], sizes[3]]


def test_a_removed_spare_is_unmapped_before_the_next_write(tmp_path: Path) -> None:
    with SegmentStore.create("8MiB", base_dir=tmp_path) as store:
        writer = store.handle()
        info, inode = _write(writer, 2000, seed=1)
        store.release(info.name)
        (spare,) = [n for n in os.listdir(store.path) if n.startswith("spare-")]
        os.unlink(os.path.join(store.path, spare))  # as a writer making room does
        assert _mapped_writable(inode) == 1  # its memory is still held, until...
        again = writer.write(make_batch(10, seed=2))
        assert again is not None
        # (a filesystem may give the new file the freed inode number: then it is mapped once)
        assert _mapped_writable(inode) == int(_inode(store, again.name) == inode)
        assert len(writer.written) == 1 and writer.written.nbytes == again.nbytes


def test_an_idle_writer_sweeps_on_request(tmp_path: Path) -> None:
    with SegmentStore.create("8MiB", base_dir=tmp_path) as store:
        writer = store.handle()
        info, inode = _write(writer, 500, seed=1)
        writer.sweep_written()
        assert _mapped_writable(inode) == 1  # still in the store: kept
        store.release(info.name)
        for name in os.listdir(store.path):
            if name.startswith("spare-"):
                os.unlink(os.path.join(store.path, name))
        writer.sweep_written()
        assert _mapped_writable(inode) == 0


def test_a_full_filesystem_is_a_clear_error_and_gives_the_room_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(written_module.os, "posix_fallocate", full)
    with SegmentStore.create("8MiB", base_dir=tmp_path) as store:
        batch = make_batch(100, seed=1)
        with pytest.raises(ShmSpaceError, match=r"is full while writing a segment of .* into "):
            store.write(batch)
        assert store.in_use() == 0 and store.held() == 0
        assert not [n for n in os.listdir(store.path) if not n.startswith(".")]
        assert len(store.written) == 0
    assert ipc_file_size(batch) > 0


def test_kept_mappings_are_capped_oldest_first(tmp_path: Path) -> None:
    with SegmentStore.create("8MiB", base_dir=tmp_path) as store:
        writer = store.handle()
        writer.written = WrittenMappings(max_count=2, max_bytes=store.budget)
        infos = [writer.write(make_batch(200, seed=s)) for s in range(3)]
        inodes = [_inode(store, i.name) for i in infos if i is not None]
        assert [_mapped_writable(i) for i in inodes] == [0, 1, 1]
        one = infos[0].nbytes if infos[0] is not None else 0
        writer.written = WrittenMappings(max_count=10, max_bytes=one)
        more = [writer.write(make_batch(200, seed=s)) for s in (4, 5)]
        assert [_mapped_writable(_inode(store, i.name)) for i in more if i is not None] == [0, 1]


def test_without_fallocate_pages_are_written_once_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(written_module.os, "posix_fallocate")  # as on macOS
    with SegmentStore.create("8MiB", base_dir=tmp_path) as store:
        info, _ = _write(store.handle(), 3000, seed=5)
        path = os.path.join(store.path, info.name)
        assert os.stat(path).st_size == info.nbytes
        assert os.stat(path).st_blocks * 512 >= info.nbytes
        assert store.open(info.name).equals(make_batch(3000, seed=5))
