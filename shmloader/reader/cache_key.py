"""Which decoded task a cached segment holds (``cache=True``): its key.

A reader that decoded a task names its segment's content with a key made of the task's file,
its range of records and the file's identity when the dataset started (``unchanged.py``: size,
modification time, inode, device). The trainer keeps the released segment under that key
(``StoreHandle.release(cache_as=)``), and the next reader of the same task takes it back
instead of reading and decoding (``StoreHandle.take_cached``). A store lives as long as one
dataset, whose source and decode never change, so those need no part in the key.

A file changed since the dataset started is refused before the cache is looked at
(``check_unchanged``), so a cached segment never stands for another version of its file.
Files of remote stores have no identity here (as for that check): their key is the path and
the range.
"""

from __future__ import annotations

import hashlib

from .unchanged import FileIdentity


def cache_key(path: str, start: int, stop: int, identity: FileIdentity | None) -> str:
    """The key of the segment holding records ``[start, stop)`` of ``path`` (32 hex digits)."""
    stamp = (
        None
        if identity is None
        else (identity.size, identity.mtime_ns, identity.inode, identity.device)
    )
    digest = hashlib.blake2b(repr((path, start, stop, stamp)).encode(), digest_size=16)
    return digest.hexdigest()
