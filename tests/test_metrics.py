"""The master's ``/metrics``: scraped over loopback and parsed with prometheus_client's own
parser, for an embedded master and for ``shmloader master --metrics-port`` with two trainers
whose heartbeats carry their figures."""

from __future__ import annotations

import http.client
import re
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable

import pytest
from _dataset_helpers import dataset, ids_of, source, write_dataset
from _tls import make_pki
from prometheus_client.parser import text_string_to_metric_families

import shmloader

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def get(
    url: str, authorization: str | None = None, context: ssl.SSLContext | None = None
) -> tuple[int, str, str | None]:
    """Status, body and ``WWW-Authenticate`` of a GET, sending ``authorization`` if given
    (HTTPS: trusting what ``context`` trusts)."""
    headers = {} if authorization is None else {"Authorization": authorization}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as r:
            return r.status, r.read().decode(), r.headers["WWW-Authenticate"]
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), exc.headers["WWW-Authenticate"]


def scrape(url: str, token: str | None = None, context: ssl.SSLContext | None = None) -> Samples:
    status, text, _ = get(url, None if token is None else f"Bearer {token}", context)
    assert status == 200, text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def by_consumer(samples: Samples, name: str) -> dict[str, float]:
    return {dict(k[1])["consumer"]: v for k, v in samples.items() if k[0] == name}


def until(url: str, done: Callable[[Samples], bool], timeout: float = 20.0) -> Samples:
    """Scrape until ``done(samples)`` (heartbeats carry figures every few seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(url)
        if done(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.2)


def test_an_embedded_master_serves_the_job_and_the_trainers_figures(tmp_path):
    expected = write_dataset(tmp_path / "data", [1000])
    with dataset(tmp_path / "data", tmp_path / "shm", metrics_port=0, epochs=2) as ds:
        assert not ds.started and ds.metrics_url is None  # asking starts nothing
        first = ds.start().metrics_url  # its master serves them from the start
        assert ds.started and first is not None
        seen = Counter(i for b in shmloader.DataLoader(ds, batch_size=50) for i in ids_of(b))
        assert seen == Counter(expected)
        url = ds.metrics_url
        assert url == first and url.startswith("http://127.0.0.1:")
        samples = until(
            url,
            lambda s: sum(by_consumer(s, "shmloader_records_delivered_total").values()) == 1000,
        )
    (consumer,) = by_consumer(samples, "shmloader_records_delivered_total")
    assert value(samples, "shmloader_records_delivered_total", consumer=consumer) == 1000
    assert value(samples, "shmloader_batches_total", consumer=consumer) == 20
    read = value(samples, "shmloader_bytes_read_total", consumer=consumer)
    delivered = value(samples, "shmloader_bytes_delivered_total", consumer=consumer)
    assert 0 < delivered <= read  # readers read ahead into the next epoch
    assert value(samples, "shmloader_readers", consumer=consumer) == 2
    assert value(samples, "shmloader_shm_budget_bytes", consumer=consumer) == 16 << 20
    for role in ("trainer", "reader"):
        assert value(samples, "shmloader_memory_pss_bytes", consumer=consumer, role=role) > 0
    assert value(samples, "shmloader_epoch_records") == 1000
    assert value(samples, "shmloader_epochs_finished_total") >= 1
    assert value(samples, "shmloader_leases_completed_total") >= 10  # 10 tasks of epoch 0
    granted = value(samples, "shmloader_leases_granted_total")
    assert granted >= value(samples, "shmloader_leases_completed_total")
    assert value(samples, "shmloader_tasks_quarantined_total") == 0
    assert value(samples, "shmloader_consumers") == 1
    open_epochs = {dict(k[1])["epoch"] for k in samples if k[0] == "shmloader_tasks"}
    for epoch in open_epochs:  # every task of an open epoch is in one state
        states = ("todo", "leased", "done", "quarantined")
        assert sum(value(samples, "shmloader_tasks", epoch=epoch, state=s) for s in states) == 10


def test_a_standalone_master_serves_the_figures_of_every_trainer(tmp_path):
    expected = write_dataset(tmp_path / "data", [600, 600])
    command = [
        sys.executable,
        "-m",
        "shmloader",
        "master",
        str(tmp_path / "data" / "*.tfrecord"),
        "--records-per-task",
        "50",
        "--epochs",
        "1",
        "--lease-timeout",
        "2",
        "--consumer-timeout",
        "4",
        "--metrics-port",
        "0",
    ]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as master:
        try:
            assert master.stdout is not None
            address = re.search(r"listening on (\S+)", master.stdout.readline())[1]  # type: ignore[index]
            url = re.search(r"metrics at (\S+)", master.stdout.readline())[1]  # type: ignore[index]
            seen: Counter[int] = Counter()
            lock = threading.Lock()
            started = threading.Barrier(2, timeout=60)
            errors: list[BaseException] = []

            def train(i: int) -> None:
                try:
                    run(i)
                except BaseException as exc:
                    errors.append(exc)
                    started.abort()

            def run(i: int) -> None:
                (tmp_path / f"shm{i}").mkdir()
                with shmloader.SharedTaskDataset(
                    source(tmp_path / "data"),
                    master=address,
                    num_readers=1,
                    shm_budget="8MiB",
                    shm_dir=str(tmp_path / f"shm{i}"),
                ) as ds:
                    started.wait()
                    for batch in shmloader.DataLoader(ds, batch_size=25):
                        with lock:
                            seen.update(ids_of(batch))
                        time.sleep(0.01)  # both trainers take part in the epoch
                    until(
                        url,
                        lambda s: (
                            sum(by_consumer(s, "shmloader_records_delivered_total").values())
                            == 1200
                        ),
                    )

            trainers = [threading.Thread(target=train, args=(i,)) for i in range(2)]
            for t in trainers:
                t.start()
            for t in trainers:
                t.join(120)
            assert not errors, errors
            samples = scrape(url)
        finally:
            master.terminate()
            master.wait(30)
    assert seen == Counter(expected)
    delivered = by_consumer(samples, "shmloader_records_delivered_total")
    assert len(delivered) == 2 and sum(delivered.values()) == 1200, delivered
    assert value(samples, "shmloader_leases_completed_total") == 24
    assert value(samples, "shmloader_epochs_finished_total") == 1


def test_metrics_are_refused_where_the_master_is_not_ours_and_on_a_bad_port(tmp_path):
    write_dataset(tmp_path / "data", [10])
    with pytest.raises(shmloader.ConfigError, match="--metrics-port PORT"):
        dataset(tmp_path / "data", tmp_path / "shm", master="127.0.0.1:1", metrics_port=0)
    with pytest.raises(shmloader.ConfigError, match=r"metrics_port must be an int in 0\.\.65535"):
        shmloader.Master(source(tmp_path / "data"), records_per_task=5, metrics_port=70000)
    with shmloader.Master(source(tmp_path / "data"), records_per_task=5, metrics_port=0) as one:
        port = one.metrics_port
        assert port and scrape(f"http://127.0.0.1:{port}/metrics")
        taken = shmloader.Master(source(tmp_path / "data"), records_per_task=5, metrics_port=port)
        with pytest.raises(
            shmloader.MasterError, match=f"cannot serve metrics on 127.0.0.1:{port}"
        ):
            taken.start()


def test_with_a_token_metrics_are_served_only_to_requests_that_carry_it(tmp_path):
    write_dataset(tmp_path / "data", [10])
    plan = source(tmp_path / "data")
    with shmloader.Master(plan, records_per_task=5, metrics_port=0, token="s3cret") as master:
        url = master.metrics_url
        assert url is not None
        status, body, challenge = get(url)
        assert status == 401 and challenge == 'Bearer realm="shmloader master"'
        assert "no token" in body and "'Authorization: Bearer <token>'" in body
        for wrong in ("Bearer s3cre", "Bearer s3cret2", "s3cret", "Basic czNjcmV0"):
            status, body, _ = get(url, wrong)
            assert status == 401 and "wrong token" in body, wrong
        assert value(scrape(url, "s3cret"), "shmloader_epoch_records") == 10
    with shmloader.Master(plan, records_per_task=5, metrics_port=0) as master:
        assert master.metrics_url is not None  # without a token, served to anyone, as before
        assert value(scrape(master.metrics_url), "shmloader_epoch_records") == 10


def test_an_embedded_master_asks_its_token_of_metrics_too(tmp_path):
    write_dataset(tmp_path / "data", [100])
    with dataset(tmp_path / "data", tmp_path / "shm", metrics_port=0, token="s3cret") as ds:
        url = ds.start().metrics_url
        assert url is not None
        assert get(url)[0] == 401 and get(url, "Bearer other")[0] == 401
        assert value(scrape(url, "s3cret"), "shmloader_epoch_records") == 100


def test_a_master_with_tls_serves_metrics_over_https_with_its_certificate(tmp_path, capfd):
    """The token a scraper sends never crosses the network in clear: plain HTTP gets no
    metrics, and failing the handshake neither stops the server nor prints a traceback."""
    write_dataset(tmp_path / "data", [10])
    pki = make_pki(tmp_path / "pki")
    tls = (pki.key.read_bytes(), pki.cert.read_bytes())
    with shmloader.Master(
        source(tmp_path / "data"), records_per_task=5, token="s3cret", tls=tls, metrics_port=0
    ) as master:
        url = master.metrics_url
        assert url == f"https://127.0.0.1:{master.metrics_port}/metrics"
        plain = url.replace("https://", "http://", 1)
        for authorization in (None, "Bearer s3cret"):
            try:
                status, body, _ = get(plain, authorization)
            except (OSError, http.client.HTTPException):
                continue  # the handshake failed and the server closed the connection
            assert status != 200 and "shmloader_" not in body
        context = ssl.create_default_context(cafile=str(pki.ca))
        assert value(scrape(url, "s3cret", context), "shmloader_epoch_records") == 10
        status, body, challenge = get(url, context=context)
        assert status == 401 and "no token" in body and challenge is not None
        # A client that does not trust the master's CA fails its handshake, not the server.
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            get(url, "Bearer s3cret")
        assert value(scrape(url, "s3cret", context), "shmloader_epoch_records") == 10
    assert "Traceback" not in capfd.readouterr().err
