"""Settings in seconds from environment variables ($SHMLOADER_MASTER_RETRY,
$SHMLOADER_STATE_SECONDS): one reading, one error naming the variable."""

from __future__ import annotations

import pytest

from shmloader._env import seconds_from_env
from shmloader.errors import ConfigError


def test_unset_or_empty_gives_the_default_and_numbers_are_read() -> None:
    assert seconds_from_env("X", 30.0, environ={}) == 30.0
    assert seconds_from_env("X", 30.0, environ={"X": " "}) == 30.0
    assert seconds_from_env("X", 30.0, environ={"X": "2.5"}) == 2.5
    assert seconds_from_env("X", 30.0, zero_ok=True, environ={"X": "0"}) == 0.0


@pytest.mark.parametrize(
    ("raw", "zero_ok", "message"),
    [
        ("soon", False, r"\$X must be a positive number of seconds, got 'soon'"),
        ("0", False, r"\$X must be a positive number of seconds, got '0'"),
        ("-1", True, r"\$X must be a number of seconds >= 0, got '-1'"),
        ("nan", True, r"\$X must be a number of seconds >= 0, got 'nan'"),
    ],
)
def test_what_is_not_a_number_of_seconds_is_named(raw: str, zero_ok: bool, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        seconds_from_env("X", 30.0, zero_ok=zero_ok, environ={"X": raw})
