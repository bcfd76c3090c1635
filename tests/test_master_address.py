"""Master addresses are checked when a client is made, not found wrong ``retry_for`` later."""

from __future__ import annotations

import pytest

from shmloader.errors import ConfigError
from shmloader.master import MasterClient


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("127.0.0.1", "host:port"),  # gRPC would dial port 443
        ("::1:7070", "IPv6 address in brackets"),
        ("127.0.0.1:99999", "port in 1..65535"),  # gRPC would dial port 34463
        ("127.0.0.1:0", "port in 1..65535"),
        ("http://127.0.0.1:7070", "no scheme or path"),
        ("127.0.0.1:7070/", "host:port"),
        (" 127.0.0.1:7070", "host:port"),
        (":7070", "host:port"),
        ("", "host:port"),
    ],
)
def test_a_malformed_address_is_refused_at_once(address: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        MasterClient(address)


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1:7070", "localhost:7070", "[::1]:7070", "dns:///localhost:7070", "ipv4:1.2.3.4:5"],
)
def test_well_formed_addresses_and_grpc_targets_are_taken(address: str) -> None:
    MasterClient(address, retry_for=0).close()  # no call made: nothing needs to listen
