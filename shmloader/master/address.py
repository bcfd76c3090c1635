"""Checking a master address before gRPC sees it.

Apart from the client because it is a pure function of a string that only says what is wrong
with it, where gRPC would accept the string and fail much later with "unreachable".
"""

from __future__ import annotations

from ..errors import ConfigError

_GRPC_SCHEMES = ("dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:", "vsock:")


def check_address(address: object) -> None:
    """ConfigError unless ``address`` is ``host:port`` (an IPv6 host in brackets) or a gRPC
    target with a scheme (``dns:///h:p``, ``ipv4:h:p``, ``unix:path``). Without this, gRPC
    takes ``"10.0.0.5"`` for port 443, ``"::1:7070"`` for a host name and ``":99999"`` for
    port 34463, and the mistake surfaces only as "unreachable", ``retry_for`` seconds later."""
    what = "address must be 'host:port' ('[v6addr]:port' for IPv6)"
    if not isinstance(address, str) or not address:
        raise ConfigError(f"{what}, got {address!r}")
    if address.startswith(_GRPC_SCHEMES):
        return
    host, sep, port = address.rpartition(":")
    if not sep or not host or host != host.strip() or not port.isdigit():
        raise ConfigError(f"{what}, got {address!r}")
    if "/" in host or " " in host:
        raise ConfigError(f"{what} (no scheme or path), got {address!r}")
    if not 1 <= int(port) <= 65535:
        raise ConfigError(f"{what} with a port in 1..65535, got {address!r}")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise ConfigError(f"{what}: put an IPv6 address in brackets, got {address!r}")


__all__ = ["check_address"]
