"""Encoding and decoding of the main job's records, in a module the examples share.

Readers import these functions by name (a function of an importable module goes by reference);
a decode written in the training script itself would reach them by value just as well
(docs/sources.md, "Where functions may live").
"""

from __future__ import annotations

import numpy as np

FEATURES = 64
RECORD_BYTES = FEATURES * 4 + 8


def encode(x: np.ndarray, label: int) -> bytes:
    return bytes(x.astype("<f4").tobytes()) + int(label).to_bytes(8, "little", signed=True)


def decode(payload: bytes) -> dict[str, object]:
    """One record -> columns (the simple way)."""
    x = np.frombuffer(payload, dtype="<f4", count=FEATURES)
    label = int(np.frombuffer(payload, dtype="<i8", offset=FEATURES * 4)[0])
    return {"x": x, "label": label}


def decode_batch(payloads: list[bytes]) -> dict[str, np.ndarray]:
    """Many records at once -> columns with one numpy call each (the fast way).

    RecordFileSource calls it with at most one block of about 2 MiB of a task's records
    (docs/sources.md, "decode_batch a block at a time"), and with a single record to infer
    the schema: never assume a call holds a whole task.
    """
    raw = np.frombuffer(b"".join(payloads), dtype=np.uint8).reshape(len(payloads), RECORD_BYTES)
    x = raw[:, : FEATURES * 4].copy().view("<f4")
    label = raw[:, FEATURES * 4 :].copy().view("<i8").reshape(-1)
    return {"x": x, "label": label}
