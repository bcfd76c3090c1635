"""What a client shows a master (a token) and checks it by (a TLS CA), and where they may go.

One place for both, because every client needs the same three answers: the token and CA
given or taken from the environment (``$SHMLOADER_TOKEN``, ``$SHMLOADER_TLS_CA``: what a
Kubernetes secret or a launcher sets for every process alike), the CA read and checked to be
a PEM certificate before gRPC sees it (gRPC reports a bad one as "Failed to create security
handshaker" on every call), and whether the token may travel to an address at all: never in
clear beyond this machine, where anyone on the path could read it and lease the job's tasks.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError

TOKEN_ENV = "SHMLOADER_TOKEN"
TLS_CA_ENV = "SHMLOADER_TLS_CA"
_PEM_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"
TLS_FIX = (
    "Give tls_ca= (or $SHMLOADER_TLS_CA): the CA certificate that signed the master's "
    "--tls-cert, for a master started with shmloader master --tls-cert FILE --tls-key FILE "
    "(docs/how-to/security.md); or reach the master over loopback (an SSH tunnel, a sidecar)"
)
_LOCAL_SCHEMES = ("unix:", "unix-abstract:")


def from_env(given: str | None, variable: str) -> str | None:
    """``given``, else ``$variable``, else None (an empty variable counts as none)."""
    if given is not None:
        return given
    return os.environ.get(variable) or None


def bearer(token: str) -> str:
    """The ``authorization`` value that carries ``token``: what a client sends with every gRPC
    call, and a scraper with every request for the master's ``/metrics``."""
    return f"Bearer {token}"


def carries_token(authorization: bytes, token: str) -> bool:
    """Whether an ``authorization`` value (its bytes as they came) is ``bearer(token)``: the
    one rule of gRPC calls and ``/metrics`` alike. Compared with ``hmac.compare_digest``, so
    the time taken says nothing about the token."""
    return hmac.compare_digest(authorization, bearer(token).encode())


@dataclass(frozen=True)
class Credentials:
    """A token sent with every call (``token``) and, for TLS, the PEM certificates that the
    master's certificate must chain to (``tls_ca``; None: plaintext). Picklable: a trainer
    hands its own to the readers it starts."""

    token: str | None = field(default=None, repr=False)  # kept out of logs and tracebacks
    tls_ca: bytes | None = field(default=None, repr=False)

    @classmethod
    def resolve(
        cls, token: str | None = None, tls_ca: str | os.PathLike[str] | None = None
    ) -> Credentials:
        """From the arguments, else the environment; reads and checks the CA file."""
        token = from_env(token, TOKEN_ENV) or None  # an empty token is no token: none is sent
        path = tls_ca if tls_ca is not None else from_env(None, TLS_CA_ENV)
        return cls(token=token, tls_ca=None if path is None else read_ca(path))

    def check_transport(self, address: str, fix: str = TLS_FIX) -> None:
        """ConfigError if the token would cross the network in clear to ``address``; the
        message ends with ``fix``, what to do instead."""
        if not self.token or self.tls_ca is not None or is_local(address):
            return
        raise ConfigError(
            f"a token would be sent in clear to the master at {address}, beyond this machine, "
            f"where anyone on the path could read it. {fix}"
        )


def read_ca(path: str | os.PathLike[str]) -> bytes:
    """The PEM certificates in ``path``; ConfigError naming the file if it has none."""
    try:
        pem = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"tls_ca: cannot read {os.fspath(path)!r}: {exc.strerror or exc}. Give the CA "
            "certificate (PEM) that signed the master's --tls-cert"
        ) from exc
    if _PEM_CERTIFICATE not in pem:
        raise ConfigError(
            f"tls_ca: {os.fspath(path)!r} holds no PEM certificate (no "
            f"'{_PEM_CERTIFICATE.decode()}' line). Give the CA certificate that signed the "
            "master's --tls-cert (for a self-signed one, that certificate itself), not a key"
        )
    return pem


def hosts_of(address: str) -> list[str]:
    """The hosts of a checked address (master/address.py): ``h`` of ``h:p``, ``[v6]:p``,
    ``dns:///h:p``, ``ipv4:a:p,b:p`` (every one), ``ipv6:[a]:p`` or ``ipv6:a`` (no port);
    none for a Unix socket (always this machine)."""
    if address.startswith(_LOCAL_SCHEMES):
        return []
    target, scheme = address, ""
    for prefix in ("dns:", "ipv4:", "ipv6:"):
        if target.startswith(prefix):
            scheme, target = prefix, target[len(prefix) :]
            if target.startswith("//"):  # dns://authority/host:port
                target = target[2:].partition("/")[2]
            break
    hosts = []
    for item in target.split(",") if scheme in ("ipv4:", "ipv6:") else [target]:
        if item.startswith("["):
            hosts.append(item[1 : item.find("]")])
        elif scheme == "ipv6:":
            hosts.append(item)  # an IPv6 address without brackets has no port
        else:
            hosts.append(item.rpartition(":")[0] or item)
    return hosts


def is_local(address: str) -> bool:
    """Whether ``address`` reaches this machine only: loopback, a Unix socket, the
    unspecified address (``0.0.0.0``, ``::``, which Linux connects to this host), or an
    address of one of this machine's interfaces (the kernel keeps such traffic on loopback)."""
    return all(_is_local_host(host) for host in hosts_of(address))


def _is_local_host(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False  # a name: it may resolve anywhere
    return ip.is_loopback or ip.is_unspecified or str(ip) in _own_addresses()


def _own_addresses() -> set[str]:
    """The addresses of this machine's interfaces, as ``ipaddress`` spells them."""
    import psutil

    found = set()
    for addresses in psutil.net_if_addrs().values():
        for a in addresses:
            try:
                found.add(str(ipaddress.ip_address(a.address.split("%")[0])))
            except ValueError:  # a MAC address, say
                continue
    return found


__all__ = [
    "TLS_CA_ENV",
    "TLS_FIX",
    "TOKEN_ENV",
    "Credentials",
    "bearer",
    "carries_token",
    "from_env",
    "hosts_of",
    "is_local",
    "read_ca",
]
