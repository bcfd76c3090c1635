"""TLS and the token end to end: a trainer and its readers reach a master serving TLS, with
the CA given as ``tls_ca=`` or ``$SHMLOADER_TLS_CA``; a token never goes in clear beyond this
machine; each way TLS can be wrong says what is wrong, at once; the master on loopback
answers on 127.0.0.1 and ::1 alike."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from _dataset_helpers import (
    data_loader,
    dataset,
    ids_of,
    shm_entries,
    source,
    subprocess_env,
    write_dataset,
)
from _tls import Pki, make_pki

import shmloader
from shmloader.cli.main import main
from shmloader.errors import ConfigError, MasterError
from shmloader.master.client import MasterClient
from shmloader.master.credentials import Credentials, hosts_of, is_local

TOKEN = "s3cret-token"
SIZES = [120, 80]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def data(tmp_path: Path) -> Path:
    write_dataset(tmp_path / "data", SIZES)
    return tmp_path / "data"


def _spawn_master(data: Path, pki: Pki, *extra: str) -> tuple[subprocess.Popen[str], str]:
    """``shmloader master`` serving TLS with a token (from the environment, as in a
    container); returns the process and the port it listens on."""
    cmd = [sys.executable, "-m", "shmloader", "master", str(data / "*.tfrecord")]
    cmd += ["--records-per-task", "20", "--epochs", "1", "--seed", "7"]
    cmd += ["--tls-cert", str(pki.cert), "--tls-key", str(pki.key), *extra]
    env = {**subprocess_env(), "SHMLOADER_TOKEN": TOKEN}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("shmloader master listening on 127.0.0.1:"):
        proc.kill()
        raise AssertionError(line + proc.communicate()[1])
    return proc, line.split(":")[-1].strip()


@pytest.fixture
def tls_master(data: Path, pki: Pki) -> Iterator[str]:
    """The port of a standalone master serving TLS with TOKEN over ``data``."""
    proc, port = _spawn_master(data, pki)
    yield port
    proc.kill()
    proc.communicate()


def _one_epoch(ds: shmloader.SharedTaskDataset) -> list[int]:
    with ds:
        return [i for batch in data_loader(ds, "shmloader", 16) for i in ids_of(batch)]


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_a_trainer_and_its_readers_reach_a_tls_master_with_a_token(
    tmp_path: Path,
    data: Path,
    pki: Pki,
    tls_master: str,
    how: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    extra: dict[str, object] = {"tls_ca": str(pki.ca), "token": TOKEN}
    if how == "environment":  # what a Kubernetes secret mounted as variables gives
        monkeypatch.setenv("SHMLOADER_TLS_CA", str(pki.ca))
        monkeypatch.setenv("SHMLOADER_TOKEN", TOKEN)
        extra = {}
    ds = dataset(
        data, tmp_path / "shm", master=f"localhost:{tls_master}", records_per_task=20, **extra
    )
    ids = _one_epoch(ds)
    assert Counter(ids) == Counter(range(sum(SIZES)))  # every record once, read by the readers
    assert shm_entries(tmp_path / "shm") == []


def test_stats_takes_the_ca_and_token_as_options_or_from_the_environment(
    pki: Pki, tls_master: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    address = f"127.0.0.1:{tls_master}"
    assert main(["stats", address, "--tls-ca", str(pki.ca), "--token", TOKEN, "--json"]) == 0
    assert '"total_records"' in capsys.readouterr().out
    monkeypatch.setenv("SHMLOADER_TLS_CA", str(pki.ca))
    monkeypatch.setenv("SHMLOADER_TOKEN", TOKEN)
    assert main(["top", address, "--count", "1"]) == 0
    assert "epoch" in capsys.readouterr().out
    monkeypatch.delenv("SHMLOADER_TLS_CA")
    assert main(["stats", address]) == 1  # plaintext to a TLS master: said, with the fix
    assert "give tls_ca= or $SHMLOADER_TLS_CA" in capsys.readouterr().err


def test_a_wrong_ca_or_a_name_the_certificate_lacks_fails_at_once_and_says_so(
    tmp_path: Path, data: Path, pki: Pki
) -> None:
    other = make_pki(tmp_path / "other")
    only_localhost = make_pki(tmp_path / "named", names=("localhost",))
    proc, port = _spawn_master(data, only_localhost)  # a certificate for "localhost" only
    try:
        cases = [
            (f"localhost:{port}", other.ca),  # a CA that did not sign it
            (f"127.0.0.1:{port}", only_localhost.ca),  # an address it does not name
        ]
        for address, ca in cases:
            began = time.monotonic()
            with (
                MasterClient(address, token=TOKEN, root_certificates=ca.read_bytes()) as c,
                pytest.raises(MasterError, match="TLS handshake with the master") as err,
            ):
                c.register("c")
            assert time.monotonic() - began < 10  # not the 30 s of retries an outage gets
            assert "signed the master's --tls-cert" in str(err.value)
        with MasterClient(
            f"localhost:{port}", token=TOKEN, root_certificates=only_localhost.ca.read_bytes()
        ) as c:
            assert c.register("c").total_records == sum(SIZES)
    finally:
        proc.kill()
        proc.communicate()


@pytest.mark.long
def test_a_token_is_never_sent_in_clear_beyond_this_machine(tmp_path: Path, data: Path) -> None:
    for master in ("10.1.2.3:7070", "master.example.com:7070", "[2001:db8::1]:7070"):
        with pytest.raises(ConfigError, match="sent in clear") as err:
            dataset(data, tmp_path / "shm", master=master, token=TOKEN)
        assert "tls_ca=" in str(err.value) and master in str(err.value)
        with pytest.raises(ConfigError, match="sent in clear"):
            MasterClient(master, token=TOKEN)
        assert main(["stats", master, "--token", TOKEN]) == 1
    assert shm_entries(tmp_path / "shm") == []
    for local in ("127.0.0.1:1", "localhost:1", "[::1]:1", "0.0.0.0:1", "unix:/tmp/m.sock"):
        assert is_local(local), local
        Credentials(token=TOKEN).check_transport(local)  # loopback: allowed
    assert not is_local("dns:///master.example.com:7070")
    assert is_local("ipv4:127.0.0.1:7070")
    Credentials(token=TOKEN, tls_ca=b"x").check_transport("10.1.2.3:7070")  # TLS: allowed
    Credentials().check_transport("10.1.2.3:7070")  # no token: nothing to leak


def test_a_ca_file_that_is_missing_or_not_a_certificate_names_the_file(
    tmp_path: Path, data: Path, pki: Pki
) -> None:
    shm = tmp_path / "shm"
    with pytest.raises(ConfigError, match=r"cannot read .*nowhere\.pem"):
        dataset(data, shm, master="localhost:1", tls_ca=str(tmp_path / "nowhere.pem"))
    with pytest.raises(ConfigError, match=r"master\.key' holds no PEM certificate"):
        dataset(data, shm, master="localhost:1", tls_ca=str(pki.key))  # the key, by mistake
    with pytest.raises(ConfigError, match="embedded master serves no TLS"):
        dataset(data, shm, tls_ca=str(pki.ca))
    assert shm_entries(shm) == []


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_the_master_on_loopback_answers_on_ipv4_and_ipv6(data: Path) -> None:
    with shmloader.Master(source(data), records_per_task=20) as master:
        assert master.address.startswith("127.0.0.1:")
        for host in ("127.0.0.1", "localhost", "[::1]"):
            with MasterClient(f"{host}:{master.port}", timeout=5, retry_for=0) as c:
                assert c.register(f"c-{host}").total_records == sum(SIZES)


def test_the_cli_master_warns_beyond_loopback_without_tls(data: Path) -> None:
    cmd = [sys.executable, "-m", "shmloader", "master", str(data / "*.tfrecord")]
    cmd += ["--records-per-task", "20", "--host", "0.0.0.0", "--token", TOKEN]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env()
    )
    try:
        assert proc.stdout is not None and "listening on" in proc.stdout.readline()
    finally:
        proc.kill()
        _, err = proc.communicate()
    assert "without TLS" in err


def test_readers_of_an_embedded_master_on_every_interface_reach_it_over_loopback(
    tmp_path: Path, data: Path
) -> None:
    # The address it gives other machines may resolve beyond this one; its own readers, with
    # the token, dial 127.0.0.1.
    ds = dataset(data, tmp_path / "shm", master_host="0.0.0.0", token=TOKEN, records_per_task=20)
    assert Counter(_one_epoch(ds)) == Counter(range(sum(SIZES)))


def test_every_address_of_a_target_is_checked_and_the_token_kept_out_of_reprs() -> None:
    assert hosts_of("ipv4:127.0.0.1:1,10.0.0.5:1") == ["127.0.0.1", "10.0.0.5"]
    assert not is_local("ipv4:127.0.0.1:1,10.0.0.5:1")  # one of them is beyond this machine
    assert hosts_of("ipv6:[::1]:7070,[2001:db8::1]:7070") == ["::1", "2001:db8::1"]
    assert hosts_of("ipv6:::1") == ["::1"] and is_local("ipv6:::1")
    assert hosts_of("dns://8.8.8.8/master.example.com:7070") == ["master.example.com"]
    own = [
        a.address
        for addresses in psutil.net_if_addrs().values()
        for a in addresses
        if a.family == socket.AF_INET and not a.address.startswith("127.")
    ]
    for address in own:  # this machine's own interfaces: the kernel keeps it on loopback
        assert is_local(f"{address}:7070"), address
    Credentials(token="").check_transport("10.1.2.3:7070")  # an empty token is not sent
    assert Credentials.resolve(token="").token is None
    assert TOKEN not in repr(Credentials(token=TOKEN))
