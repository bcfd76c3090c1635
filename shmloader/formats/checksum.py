"""CRC32C as TFRecord uses it: plain, masked, unmasked.

TFRecord stores *masked* CRCs because a CRC of data that itself contains CRCs is weak (a
record holding a framed record would checksum to a predictable value); masking rotates the CRC
and adds a constant. The arithmetic is TensorFlow's ``crc32c::Mask`` / ``Unmask``. The CRC
itself comes from the ``crc32c`` package (SSE4.2 / ARMv8 instructions where the CPU has them),
because every record is checksummed twice and a pure-Python CRC would dominate reading.
"""

from __future__ import annotations

import crc32c as _crc32c_impl

MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF

Buffer = bytes | bytearray | memoryview


def crc32c(data: Buffer) -> int:
    """The CRC32C (Castagnoli) of ``data`` (any object exposing the buffer protocol)."""
    return int(_crc32c_impl.crc32c(data))


def mask(crc: int) -> int:
    """TensorFlow's mask of an already computed CRC: rotate right by 15, add a constant."""
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & _U32


def masked_crc32c(data: Buffer) -> int:
    """The masked CRC32C that TFRecord stores after the length and after the payload."""
    crc = _crc32c_impl.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & _U32


def unmask_crc32c(masked: int) -> int:
    """Invert :func:`masked_crc32c`'s masking, giving back the plain CRC32C."""
    rot = (masked - MASK_DELTA) & _U32
    return ((rot >> 17) | (rot << 15)) & _U32
