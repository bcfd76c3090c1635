"""Seconds from an environment variable: one reading and one error for every such setting.

Settings that must reach every process a job starts (reader processes, each client a dataset
makes) are environment variables; each is a number of seconds with a default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .errors import ConfigError


def seconds_from_env(
    variable: str,
    default: float,
    *,
    zero_ok: bool = False,
    environ: Mapping[str, str] = os.environ,
) -> float:
    """``$variable`` as seconds, else ``default`` (unset or empty). ConfigError naming the
    variable unless it is a number > 0 (>= 0 with ``zero_ok``)."""
    raw = environ.get(variable, "").strip()
    if not raw:
        return default
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not (seconds >= 0 if zero_ok else seconds > 0):
        least = "a number of seconds >= 0" if zero_ok else "a positive number of seconds"
        raise ConfigError(f"${variable} must be {least}, got {raw!r}")
    return seconds
