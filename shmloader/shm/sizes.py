"""Byte sizes as users write them ("1GiB", "512MB", "1.5G") and as we print them."""

from __future__ import annotations

import math
import re
from decimal import Decimal

from ..errors import ConfigError

# IEC suffixes and bare letters are powers of 1024 (bare letters follow `docker --shm-size` and
# `mount -o size=`, the two places users copy sizes from); SI suffixes are powers of 1000.
_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kib": 1024,
    "kb": 1000,
    "m": 1024**2,
    "mib": 1024**2,
    "mb": 1000**2,
    "g": 1024**3,
    "gib": 1024**3,
    "gb": 1000**3,
    "t": 1024**4,
    "tib": 1024**4,
    "tb": 1000**4,
}

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")

_EXAMPLES = "e.g. 1GiB, 512MB, 1.5G, 64M or a number of bytes"


def parse_size(value: str | int, *, what: str = "size") -> int:
    """Return ``value`` in bytes; ``what`` names the setting in error messages.

    Fractions round down to whole bytes, computed in decimal so "4.35K" is not off by one.
    Floats are refused on purpose: a float byte count is almost always a unit mix-up.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(
            f"{what}: expected a byte count or a string like '1GiB', got {type(value).__name__} "
            f"{value!r}"
        )
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{what}: must not be negative, got {value}")
        return value
    match = _SIZE_RE.match(value)
    if match is None:
        raise ConfigError(f"{what}: cannot read {value!r} as a size; use {_EXAMPLES}")
    number, unit = match.groups()
    factor = _UNITS.get(unit.lower())
    if factor is None:
        known = "B, K/KiB/KB, M/MiB/MB, G/GiB/GB, T/TiB/TB"
        raise ConfigError(f"{what}: unknown unit {unit!r} in {value!r}; known units: {known}")
    return math.floor(Decimal(number) * factor)


def format_size(nbytes: int) -> str:
    """Human-readable binary size, e.g. ``1.5 GiB``; exact bytes below 1 KiB."""
    if nbytes < 1024:
        return f"{nbytes} B"
    size = float(nbytes)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if size < 1024 or unit == "TiB":
            break
    return f"{size:.1f} {unit}"
