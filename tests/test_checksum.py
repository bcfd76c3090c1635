"""CRC32C and TFRecord's masking against published vectors and TensorFlow's definitions."""

from __future__ import annotations

import struct

import pytest

from shmloader.formats.checksum import MASK_DELTA, crc32c, mask, masked_crc32c, unmask_crc32c

# RFC 3720 (iSCSI), appendix B.4, plus the common "123456789" check value.
VECTORS = [
    (bytes(32), 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
    (b"123456789", 0xE3069283),
    (b"", 0x00000000),
]


@pytest.mark.parametrize(("data", "expected"), VECTORS)
def test_crc32c_vectors(data: bytes, expected: int) -> None:
    assert crc32c(data) == expected
    assert crc32c(memoryview(data)) == expected
    assert crc32c(bytearray(data)) == expected


def _tf_mask(crc: int) -> int:
    # TensorFlow's crc32c::Mask, written out independently of the module under test.
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


@pytest.mark.parametrize(("data", "expected"), VECTORS)
def test_masked_matches_tensorflow_definition(data: bytes, expected: int) -> None:
    assert masked_crc32c(data) == _tf_mask(expected)
    assert mask(expected) == _tf_mask(expected)
    assert unmask_crc32c(masked_crc32c(data)) == expected


def test_mask_of_zero_is_the_delta() -> None:
    assert masked_crc32c(b"") == MASK_DELTA == 0xA282EAD8


@pytest.mark.parametrize("crc", [0, 1, 0x7FFF, 0x8000, 0xDEADBEEF, 0xFFFFFFFF, 0x5D7E0A62])
def test_unmask_inverts_mask(crc: int) -> None:
    assert 0 <= mask(crc) <= 0xFFFFFFFF
    assert unmask_crc32c(mask(crc)) == crc


@pytest.mark.parametrize("data", [b"", b"a", struct.pack("<Q", 5), bytes(range(256)) * 9])
def test_masked_matches_the_tfrecord_package(data: bytes) -> None:
    from tfrecord.writer import TFRecordWriter

    assert struct.pack("<I", masked_crc32c(data)) == TFRecordWriter.masked_crc(data)
