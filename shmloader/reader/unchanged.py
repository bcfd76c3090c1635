"""The dataset's files must not change under it: each local file's identity, taken when the
trainer starts its dataset, is checked by a reader before it reads a task of that file.

A file replaced (renamed over) by another valid file of the same size and record count passes
every other check, and an epoch then held records of both versions without a word. The
identity is the file's size, modification time, inode and device: a new file has another
inode, one rewritten in place another modification time. Files of remote stores (``s3://``
...) are not checked: their listing gives no inode, and a look per task would be a request.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterable
from dataclasses import dataclass

from .._fs import local_path
from ..errors import DataError


@dataclass(frozen=True)
class FileIdentity:
    size: int
    mtime_ns: int
    inode: int
    device: int

    @classmethod
    def of(cls, path: str) -> FileIdentity | None:
        """The identity of the local file ``path`` now; None if it is not there."""
        try:
            st = os.stat(path)
        except OSError:
            return None
        return cls(st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)

    def describe(self) -> str:
        when = datetime.datetime.fromtimestamp(self.mtime_ns / 1e9).isoformat(sep=" ")
        return f"{self.size:,} bytes, inode {self.inode}, modified {when}"


def identities(paths: Iterable[str]) -> dict[str, FileIdentity]:
    """The identity of each local file of ``paths`` (remote ones and missing ones left out)."""
    found: dict[str, FileIdentity] = {}
    for path in paths:
        local = local_path(path)
        identity = FileIdentity.of(local) if local is not None else None
        if identity is not None:
            found[path] = identity
    return found


def check_unchanged(path: str, planned: FileIdentity | None) -> None:
    """DataError naming ``path`` if it is no longer the file it was when the dataset started."""
    if planned is None:
        return
    local = local_path(path)
    now = FileIdentity.of(local) if local is not None else None
    if now == planned:
        return
    what = "is gone" if now is None else f"is now {now.describe()}"
    raise DataError(
        f"the file changed while the dataset ran: it was {planned.describe()} when the "
        f"dataset started, and {what}. Its records would mix two versions of the file in one "
        "epoch; replace data files between runs, or write new ones under new names",
        path=path,
    )
