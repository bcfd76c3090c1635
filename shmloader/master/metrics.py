"""The master's ``/metrics``: the whole job in Prometheus's text format, for every consumer.

Served with ``prometheus_client`` (the standard library for it) on a port of its own:
``shmloader master ... --metrics-port P``, ``Master(..., metrics_port=P)`` or
``SharedTaskDataset(..., metrics_port=P)`` for an embedded master. Each scrape reads the
dispatcher's progress and the last figures each trainer's heartbeat carried
(``TrainerFigures``), under the service's lock; nothing is kept between scrapes, so the
figures are those of the moment.

A master with a token asks it of ``/metrics`` too: a request without the header
``Authorization: Bearer <token>`` gets 401 (the same rule as gRPC calls,
``credentials.carries_token``). prometheus_client's own ``start_http_server`` has no hook for
that, so its WSGI app is served here, behind a check, the way that function serves it (a
thread per request, no request log). A master that serves TLS serves ``/metrics`` over HTTPS
with the same certificate and key, so the token a scraper sends never crosses the network in
clear; each connection's handshake runs in that connection's thread (with a timeout), so a
client that fails it or never finishes it holds up no other, and is not logged.

Names follow Prometheus's conventions: the ``shmloader_`` prefix, ``_total`` for counters,
base units (bytes, seconds). The job's own (tasks, leases, epochs) have no labels but
``state`` and ``epoch``; a trainer's carry ``consumer`` (and ``role`` for memory).
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from .credentials import bearer, carries_token
from .figures import TrainerFigures
from .progress import Progress
from .service import MasterService

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

log = logging.getLogger(__name__)

# Seconds a connection may take for each step (the TLS handshake, reading the request, sending
# the reply) before its thread gives up on it: Prometheus's scrape_timeout is 10 s by default.
_TIMEOUT = 30.0

# Dispatcher counter -> (metric name, help).
_LEASE_COUNTERS = {
    "granted": ("shmloader_leases_granted_total", "Leases the master granted."),
    "completed": ("shmloader_leases_completed_total", "Leases completed: their task is done."),
    "late_completed": (
        "shmloader_leases_completed_late_total",
        "Leases completed after they lapsed (their task was done once all the same).",
    ),
    "failed": (
        "shmloader_leases_failed_total",
        "Leases whose reader reported a failure; the task is retried or quarantined.",
    ),
    "expired": (
        "shmloader_leases_expired_total",
        "Leases that lapsed (nobody renewed them for lease_timeout); the task is retried.",
    ),
    "released": (
        "shmloader_leases_released_total",
        "Leases returned unread (a consumer left, or handed its tasks back).",
    ),
}

# TrainerFigures field -> (metric name, help, counter?).
_TRAINER = {
    "records_consumed": (
        "shmloader_records_delivered_total",
        "Rows the consumer's training loop consumed.",
        True,
    ),
    "bytes_consumed": (
        "shmloader_bytes_delivered_total",
        "Bytes of shared memory the rows the consumer's loop consumed took.",
        True,
    ),
    "bytes_read": (
        "shmloader_bytes_read_total",
        "Bytes the consumer's readers wrote into shared memory.",
        True,
    ),
    "records_skipped": (
        "shmloader_records_skipped_total",
        "Records the source left out of the consumer's completed tasks (on_error='skip').",
        True,
    ),
    "batches": (
        "shmloader_batches_total",
        "Batches the consumer's loop received (shmloader.DataLoader).",
        True,
    ),
    "loop_seconds": (
        "shmloader_loop_seconds_total",
        "Seconds of the consumer's training steps, waits included (shmloader.DataLoader).",
        True,
    ),
    "loop_wait_seconds": (
        "shmloader_data_wait_seconds_total",
        "Seconds the consumer's loop waited for batches (shmloader.DataLoader).",
        True,
    ),
    "reader_wait_seconds": (
        "shmloader_reader_wait_seconds_total",
        "Seconds the consumer's sampler waited for tasks its readers had not made ready.",
        True,
    ),
    "shm_in_use_bytes": (
        "shmloader_shm_in_use_bytes",
        "Bytes of segments in the consumer's shared-memory store.",
        False,
    ),
    "shm_budget_bytes": (
        "shmloader_shm_budget_bytes",
        "The most bytes of segments the consumer's store may hold.",
        False,
    ),
    "readers": ("shmloader_readers", "Reader processes the consumer runs.", False),
}


class JobCollector(Collector):
    """Reads one master's service at each scrape."""

    def __init__(self, service: MasterService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        service = self.service
        with service.lock:
            progress = service.dispatcher.progress()
            figures = dict(service.figures)
        yield from self._job(progress)
        yield from self._trainers(figures, {c.consumer for c in progress.consumers})

    def _job(self, progress: Progress) -> Iterator[Metric]:
        started = CounterMetricFamily(
            "shmloader_epochs_started", "Epochs the master opened.", value=progress.epochs_started
        )
        finished = CounterMetricFamily(
            "shmloader_epochs_finished",
            "Epochs the master finished.",
            value=progress.epochs_finished,
        )
        yield started
        yield finished
        yield GaugeMetricFamily(
            "shmloader_epoch_records",
            "Records one epoch schedules (the plan's, before DDP padding).",
            value=progress.total_records,
        )
        tasks = GaugeMetricFamily(
            "shmloader_tasks",
            "Tasks (DDP: task pieces) of the open epochs, by state.",
            labels=["epoch", "state"],
        )
        records = GaugeMetricFamily(
            "shmloader_records",
            "Records of the open epochs, by state.",
            labels=["epoch", "state"],
        )
        quarantined = 0
        for e in progress.epochs:
            quarantined += e.quarantined_units
            if e.finished:
                continue
            for state in ("todo", "leased", "done", "quarantined"):
                tasks.add_metric([str(e.epoch), state], getattr(e, f"{state}_units"))
                records.add_metric([str(e.epoch), state], getattr(e, f"{state}_records"))
        yield tasks
        yield records
        yield CounterMetricFamily(
            "shmloader_tasks_quarantined",
            "Tasks that failed on every try, over all epochs (their records are listed by "
            "shmloader stats).",
            value=quarantined,
        )
        for key, (name, help_text) in _LEASE_COUNTERS.items():
            yield CounterMetricFamily(
                name.removesuffix("_total"), help_text, value=progress.counters.get(key, 0)
            )
        yield GaugeMetricFamily(
            "shmloader_consumers",
            "Consumers (trainers) registered at the master now.",
            value=len(progress.consumers),
        )

    def _trainers(
        self, figures: dict[str, TrainerFigures], registered: set[str]
    ) -> Iterator[Metric]:
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for key, (name, help_text, counter) in _TRAINER.items():
            kind = CounterMetricFamily if counter else GaugeMetricFamily
            base = name.removesuffix("_total") if counter else name
            families[key] = kind(base, help_text, labels=["consumer"])
        pss = GaugeMetricFamily(
            "shmloader_memory_pss_bytes",
            "PSS of the consumer's processes, by role (trainer, worker, reader).",
            labels=["consumer", "role"],
        )
        for consumer, f in figures.items():
            for key, family in families.items():
                value = getattr(f, key)
                if not _TRAINER[key][2] and consumer not in registered:
                    continue  # a gauge of a consumer that left says nothing of now
                family.add_metric([consumer], value)
            if consumer in registered:
                for role, nbytes in sorted(f.pss_bytes.items()):
                    pss.add_metric([consumer, role], nbytes)
        yield from families.values()
        yield pss


class RequireToken:
    """WSGI middleware: the wrapped app answers only requests whose ``Authorization`` header
    carries the master's token; the others get 401 and what to send instead. Without it,
    anyone who reaches the port reads the job's figures even where every gRPC call needs
    the token."""

    def __init__(self, app: WSGIApplication, token: str) -> None:
        self._app = app
        self._token = token

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        given = environ.get("HTTP_AUTHORIZATION")
        # WSGI hands headers over as latin-1 strings: encoded back, they are the bytes sent.
        if isinstance(given, str) and carries_token(
            given.encode("latin-1", "replace"), self._token
        ):
            return self._app(environ, start_response)
        what = "no token" if not given else "wrong token"
        body = (
            f"401 Unauthorized: {what}. This shmloader master's /metrics needs its token: "
            f"send the header 'Authorization: {bearer('<token>')}' (Prometheus: "
            "authorization: {credentials_file: FILE} in the scrape config).\n"
        ).encode()
        start_response(
            "401 Unauthorized",
            [
                ("Content-Type", "text/plain; charset=utf-8"),
                ("Content-Length", str(len(body))),
                ("WWW-Authenticate", 'Bearer realm="shmloader master"'),
            ],
        )
        return [body]


class _Server(ThreadingMixIn, WSGIServer):
    """A thread per request, as prometheus_client's own server: a slow scraper does not hold
    up the next. ``daemon_threads``: a request in progress neither keeps the process alive
    nor makes ``server_close`` wait for it. With ``tls``, the listening socket is wrapped:
    every connection it accepts is TLS, its handshake left to the connection's thread."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[WSGIRequestHandler],
        family: int,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.address_family = family  # read by the base class as it makes the socket
        super().__init__(address, handler)
        if tls is not None:
            # Not in accept(): a client that never finishes its handshake would stop the
            # serving thread there, and every scrape after it.
            self.socket = tls.wrap_socket(
                self.socket, server_side=True, do_handshake_on_connect=False
            )
            self.base_environ["HTTPS"] = "on"  # wsgi.url_scheme: https

    def handle_error(self, request: object, client_address: object) -> None:
        """A connection that failed (a handshake of plain HTTP or with a CA the client does
        not trust, a client gone or too slow): one line at debug level, not socketserver's
        traceback on stderr. The server serves on."""
        log.debug("metrics: a connection from %s failed: %s", client_address, sys.exc_info()[1])


class _SilentHandler(WSGIRequestHandler):
    """Logs no request: wsgiref writes every one to stderr, a line per scrape. Finishes a TLS
    connection's handshake first, in the connection's own thread."""

    timeout = _TIMEOUT

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(self.timeout)
            self.request.do_handshake()
        super().setup()

    def log_message(self, format: str, *args: object) -> None:
        pass


def tls_context(tls: tuple[bytes, bytes]) -> ssl.SSLContext:
    """A server context for the master's ``(private key PEM, certificate chain PEM)``: the
    same certificate its gRPC serves. OSError if they do not load (not PEM, a key that is not
    the certificate's)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    key, chain = tls
    # load_cert_chain reads files only: each PEM goes into an anonymous file in memory
    # (memfd), named by its descriptor, so the private key is never written to a file system.
    fds = []
    try:
        for name, pem in (("chain.pem", chain), ("key.pem", key)):
            fd = os.memfd_create(f"shmloader-metrics-{name}", os.MFD_CLOEXEC)
            fds.append(fd)
            os.write(fd, pem)
        chain_path, key_path = (f"/proc/self/fd/{fd}" for fd in fds)
        context.load_cert_chain(chain_path, key_path)
    except ssl.SSLError as exc:
        raise OSError(f"cannot load the TLS certificate and key: {exc}") from exc
    finally:
        for fd in fds:
            os.close(fd)
    return context


@dataclass
class MetricsServer:
    """``/metrics`` of one master, served over HTTP (HTTPS: ``scheme``) from a thread of its
    own."""

    server: WSGIServer
    thread: threading.Thread
    scheme: str = "http"

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def serve_metrics(
    service: MasterService,
    host: str,
    port: int,
    token: str | None = None,
    tls: tuple[bytes, bytes] | None = None,
) -> MetricsServer:
    """Serve ``service``'s job at ``http://host:port/metrics`` (port 0: any free one), to
    requests that carry ``token`` where there is one; with ``tls`` (the master's ``(private
    key PEM, certificate chain PEM)``) at ``https://``, with that certificate. OSError if
    ``host:port`` cannot be bound or ``tls`` does not load."""
    context = None if tls is None else tls_context(tls)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobCollector(service))
    app: WSGIApplication = make_wsgi_app(registry)
    if token is not None:
        app = RequireToken(app, token)
    # The first address the host resolves to, of whichever family (HTTPServer alone knows
    # IPv4 only): what prometheus_client's start_http_server binds too.
    family, _, _, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    server = _Server((str(address[0]), port), _SilentHandler, family, context)
    server.set_app(app)
    thread = threading.Thread(
        target=server.serve_forever, name="shmloader-master-metrics", daemon=True
    )
    thread.start()
    return MetricsServer(server, thread, "http" if context is None else "https")
