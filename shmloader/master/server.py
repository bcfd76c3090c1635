"""``Master``: the dispatcher served over gRPC, embedded in a process or standalone.

One object owns the dispatcher (or the journal that recovers it), the gRPC server, the lock
every request takes, and a timer thread that calls ``expire`` about once a second (which also
lets the journal's "batch" fsync policy act while the job is idle). It binds loopback unless
told otherwise; with ``token`` every call must carry ``authorization: Bearer <token>`` (and
so must every request for ``/metrics``), with ``tls`` the channel is encrypted (and
``/metrics`` is HTTPS, with the same certificate). The standard ``grpc.health.v1`` service
reports SERVING until shutdown starts.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from .._keywords import suggest_keywords
from .._proto import master_pb2_grpc as pb_grpc
from ..errors import ConfigError, MasterError
from ..sources.base import Shard, Source
from . import forked
from .config import JobConfig
from .credentials import carries_token
from .dispatcher import Dispatcher
from .journal import FSYNC_POLICIES, Fsync, Journal
from .local import LocalStub
from .progress import Progress
from .service import MasterService
from .tasks import DdpPolicy
from .wire import MAX_REQUEST_BYTES

if TYPE_CHECKING:
    from .metrics import MetricsServer

log = logging.getLogger(__name__)

SERVICE_NAME = "shmloader.master.Master"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")  # the default; others call for a token
_IPV4_LOOPBACK = ("127.0.0.1", "localhost")  # served on ::1 too
_WORKERS = 16
T = TypeVar("T")


@dataclass(frozen=True)
class ServerOptions:
    """How a master serves its job (``Master``'s arguments after the job's), defined once."""

    journal: str | os.PathLike[str] | None = None
    fsync: Fsync = "batch"
    host: str = "127.0.0.1"
    port: int = 0
    token: str | None = None
    tls: tuple[bytes, bytes] | None = None
    metrics_port: int | None = None


class Master:
    """Tasks, epochs and leases of one job, served over gRPC; see docs/master.md.

    ``source_or_plan`` is a Source (its ``plan()`` is called once, here) or a list of Shards.
    With ``journal=DIR`` the state is journaled there and recovered on the next start with the
    same plan and schedule settings. ``tls`` is ``(private key PEM, certificate chain PEM)``.
    ``metrics_port``: serve Prometheus metrics of the whole job at ``http://host:port/metrics``
    (0: any free port, then ``metrics_port`` tells it), with a ``token`` only to requests
    that carry it, with ``tls`` at ``https://`` with the same certificate (``metrics_url``
    tells it). ``first_epoch`` and ``resume`` (task
    id -> consumed record ranges, a merged loader state's ``"consumed"``) continue a
    checkpoint's epoch with any world size.
    """

    @suggest_keywords()
    def __init__(
        self,
        source_or_plan: Source | Sequence[Shard],
        *,
        records_per_task: int,
        epochs: int | None = JobConfig.epochs,
        shuffle: bool = JobConfig.shuffle,
        seed: int = JobConfig.seed,
        world_size: int | None = JobConfig.world_size,
        ddp_policy: DdpPolicy = JobConfig.ddp_policy,
        lease_timeout: float = JobConfig.lease_timeout,
        consumer_timeout: float = JobConfig.consumer_timeout,
        max_retries: int = JobConfig.max_retries,
        journal: str | os.PathLike[str] | None = ServerOptions.journal,
        fsync: Fsync = ServerOptions.fsync,
        host: str = ServerOptions.host,
        port: int = ServerOptions.port,
        token: str | None = ServerOptions.token,
        tls: tuple[bytes, bytes] | None = ServerOptions.tls,
        metrics_port: int | None = ServerOptions.metrics_port,
        first_epoch: int = 0,
        resume: dict[int, list[tuple[int, int]]] | None = None,
    ) -> None:
        job = JobConfig(
            records_per_task=records_per_task,
            epochs=epochs,
            shuffle=shuffle,
            seed=seed,
            lease_timeout=lease_timeout,
            consumer_timeout=consumer_timeout,
            max_retries=max_retries,
            world_size=world_size,
            ddp_policy=ddp_policy,
            first_epoch=first_epoch,
            resume=resume,
        )
        options = ServerOptions(journal, fsync, host, port, token, tls, metrics_port)
        self._configure(source_or_plan, job, options)

    @classmethod
    def for_job(
        cls,
        source_or_plan: Source | Sequence[Shard],
        job: JobConfig,
        options: ServerOptions = ServerOptions(),
    ) -> Master:
        """A master for ``job`` and ``options``, each given as one value (a
        ``SharedTaskDataset``'s embedded master)."""
        master = cls.__new__(cls)
        master._configure(source_or_plan, job, options)
        return master

    def _configure(
        self, source_or_plan: Source | Sequence[Shard], job: JobConfig, options: ServerOptions
    ) -> None:
        journal, fsync, host, port = options.journal, options.fsync, options.host, options.port
        token, tls, metrics_port = options.token, options.tls, options.metrics_port
        self.plan = _plan_of(source_or_plan)
        self.config = job
        if fsync not in FSYNC_POLICIES:
            raise ConfigError(f"fsync must be one of {FSYNC_POLICIES}, got {fsync!r}")
        if not isinstance(host, str) or not host:
            raise ConfigError(f"host must be a non-empty string, got {host!r}")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigError(f"port must be an int in 0..65535 (0: any free port), got {port!r}")
        if token is not None and (not isinstance(token, str) or not token):
            raise ConfigError("token must be a non-empty string or None")
        if tls is not None and not (
            isinstance(tls, tuple) and len(tls) == 2 and all(isinstance(x, bytes) for x in tls)
        ):
            raise ConfigError("tls must be (private key PEM bytes, certificate chain PEM bytes)")
        if metrics_port is not None and (
            isinstance(metrics_port, bool)
            or not isinstance(metrics_port, int)
            or not 0 <= metrics_port <= 65535
        ):
            raise ConfigError(
                f"metrics_port must be an int in 0..65535 (0: any free port), got {metrics_port!r}"
            )
        self.metrics_port = metrics_port
        self._metrics: MetricsServer | None = None
        self.journal_dir = None if journal is None else os.fspath(journal)
        self.fsync = fsync
        self.host = host
        self.port = port
        self._token = token
        self._tls = tls
        self._lock = threading.Lock()
        self._journal: Journal | None = None
        self._dispatcher: Dispatcher | None = None
        self._service: MasterService | None = None
        self._server: grpc.Server | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._health: health.HealthServicer | None = None
        self._ticker: threading.Thread | None = None
        self._stopping = threading.Event()
        self._stopped = False

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Master:
        """Recover or create the dispatcher, bind, serve, and start the expiry timer."""
        if self._server is not None or self._stopped:
            raise MasterError("this Master was started already; create a new one to serve again")
        forked.check("a master")
        if self.journal_dir is not None:
            self._journal = Journal.open(
                self.journal_dir, self.plan, self.config, time.time(), fsync=self.fsync
            )
            self._dispatcher = self._journal.dispatcher
        else:
            self._dispatcher = Dispatcher(self.plan, self.config)
        self._service = MasterService(self._dispatcher, self._lock)
        try:
            self._serve(self._service)
            if self.metrics_port is not None:
                self._serve_metrics(self._service)
        except BaseException:
            self.stop(grace=0)
            raise
        return self

    def _serve_metrics(self, service: MasterService) -> None:
        from .metrics import serve_metrics  # prometheus_client: only for a master that serves

        try:
            self._metrics = serve_metrics(
                service, self.host, self.metrics_port or 0, self._token, self._tls
            )
        except OSError as exc:
            raise MasterError(
                f"cannot serve metrics on {_bracket(self.host)}:{self.metrics_port}: {exc}"
            ) from exc
        self.metrics_port = self._metrics.port
        log.info("shmloader master: metrics at %s", self.metrics_url)

    @property
    def metrics_url(self) -> str | None:
        """Where the job's Prometheus metrics are served (None: they are not): ``https://``
        where the master serves TLS."""
        if self._metrics is None:
            return None
        return f"{self._metrics.scheme}://{_bracket(self.host)}:{self._metrics.port}/metrics"

    def _serve(self, service: MasterService) -> None:
        # Ours to shut down: gRPC's stop() leaves the pool's threads waiting for work for as
        # long as the Master object lives (a closed dataset the script still holds).
        self._executor = ThreadPoolExecutor(
            max_workers=_WORKERS, thread_name_prefix="shmloader-master"
        )
        server = grpc.server(
            self._executor,
            interceptors=[_TokenCheck(self._token)] if self._token is not None else None,
            options=[
                # Never share a port with another live server (gRPC allows it by default).
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
            ],
        )
        pb_grpc.add_MasterServicer_to_server(service, server)
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        # The IPv4 loopback, and then the IPv6 one on the same port: clients resolve
        # "localhost" to ::1 first, and one answer there spares them a refused connection.
        both = self.host in _IPV4_LOOPBACK
        first = "127.0.0.1" if both else self.host
        target = f"{_bracket(first)}:{self.port}"
        try:
            port = self._listen(server, target)
        except RuntimeError as exc:
            raise MasterError(
                f"cannot listen on {target}: {_bind_error(first, self.port)} ({exc})"
            ) from exc
        if port == 0:
            raise MasterError(f"cannot listen on {target}: {_bind_error(first, self.port)}")
        self.port = port
        if both:
            self._listen_ipv6_loopback(server, port)
        server.start()
        self._server = server
        forked.used()
        for name in ("", SERVICE_NAME):
            self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        interval = min(1.0, self.config.lease_timeout / 4, self.config.consumer_timeout / 4)
        self._ticker = threading.Thread(
            target=self._tick,
            args=(service, max(interval, 0.05)),
            name="shmloader-master-expiry",
            daemon=True,
        )
        self._ticker.start()
        log.info("shmloader master listening on %s", self.address)

    def _listen(self, server: grpc.Server, target: str) -> int:
        """Add ``target`` to ``server``, with TLS if the master has it; the bound port."""
        if self._tls is None:
            return server.add_insecure_port(target)
        return server.add_secure_port(target, grpc.ssl_server_credentials([self._tls]))

    def _listen_ipv6_loopback(self, server: grpc.Server, port: int) -> None:
        """Also ``[::1]:port``, where the machine has IPv6; where it cannot (no IPv6, or the
        port is another program's there), IPv4 alone serves, as ``127.0.0.1:port`` says."""
        try:
            bound = self._listen(server, f"[::1]:{port}")
        except RuntimeError:
            bound = 0
        if bound != port:
            log.info(
                "master: listening on 127.0.0.1:%d only (not on [::1]:%d: %s)",
                port,
                port,
                _bind_error("::1", port),
            )
            # Clients told "localhost" may try ::1 first, and reach whatever listens there.
            self.host = "127.0.0.1"

    def _tick(self, service: MasterService, interval: float) -> None:
        previous = time.time()
        while not self._stopping.wait(interval):
            now = time.time()
            try:
                tick(service, interval, previous, now)
            except Exception:
                # The next tick tries again; a journal that cannot be written also fails the
                # requests, which tell their callers.
                log.exception("master: expiring leases failed")
            previous = now

    def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving (in-flight calls get ``grace`` seconds), then close the journal."""
        if self._stopped:
            return
        self._stopped = True
        if self._metrics is not None:
            self._metrics.stop()
        if self._health is not None:
            self._health.enter_graceful_shutdown()
        if self._server is not None:
            self._server.stop(grace).wait()
        if self._executor is not None:
            self._executor.shutdown(wait=False)  # idle threads end now, busy ones after their call
        self._stopping.set()
        if self._ticker is not None:
            self._ticker.join()
        self._close_journal()

    def _close_journal(self) -> None:
        with self._lock:
            if self._journal is not None:
                self._journal.close()

    def __enter__(self) -> Master:
        """Starts the master unless it runs already (``with Master(...).start() as m`` works)."""
        return self if self._server is not None else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -------------------------------------------------------------------- queries

    @property
    def address(self) -> str:
        """``host:port`` to give clients (the bound port once started)."""
        return f"{_bracket(self.host)}:{self.port}"

    @property
    def journal(self) -> Journal | None:
        """The journal once started (None without ``journal=``): its ``recovery`` says what a
        restart found on disk (the snapshot, the updates replayed after it)."""
        return self._journal

    def local_stub(self) -> LocalStub:
        """A stub for a ``MasterClient(..., local=)`` in this process: its calls reach the
        service without gRPC (local.py). Fails as UNAVAILABLE once the master stops."""
        if self._service is None:
            raise MasterError("the master has not been started")
        return LocalStub(self._service, lambda: self._server is not None and not self._stopped)

    def progress(self) -> Progress:
        """The dispatcher's progress report, read in-process under the lock."""
        return self.dispatcher_call(lambda d: d.progress())

    def dispatcher_call(self, fn: Callable[[Dispatcher], T]) -> T:
        """Run ``fn(dispatcher)`` under the lock every request takes."""
        if self._dispatcher is None:
            raise MasterError("the master has not been started")
        with self._lock:
            return fn(self._dispatcher)

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else "serving" if self._server else "not started"
        return f"Master({self.address}, {len(self.plan)} shards, {state})"


def stall_threshold(interval: float) -> float:
    """How much later than due (``interval`` s after the last) a tick must run for the master to
    count as having been stopped. ``4 * interval`` is at most the shortest timeout (the interval
    is at most a quarter of each), so a silence judged across a longer gap would be mostly the
    master's own; the 2-s floor keeps ordinary lateness of a thread on a busy host (scheduling,
    a garbage collection, a request holding the lock) from counting. A false alarm only
    postpones the expiry of a dead consumer by one timeout; a missed one declares live
    consumers dead and hands their tasks out twice."""
    return max(2.0, 4 * interval)


def tick(service: MasterService, interval: float, previous: float, now: float) -> None:
    """One run of the expiry timer at ``now`` (wall clock, the clock expiry judges silence by,
    so a clock stepped forward also counts); ``previous``: when the last one ran. After a gap
    the master could not have heard anyone in (process stopped, or starved of the GIL by the
    trainer embedding it), everyone gets fresh deadlines first, as at a restart."""
    stopped_for = now - previous
    if stopped_for > stall_threshold(interval):
        log.warning(
            "the master was not running for %.1f s (process stopped or starved of the GIL): "
            "leases and consumers get fresh deadlines",
            stopped_for,
        )
        service.resume(now, stopped_for)
    service.expire(now)


def _plan_of(source_or_plan: Source | Sequence[Shard]) -> list[Shard]:
    plan_fn = getattr(source_or_plan, "plan", None)
    plan = list(plan_fn() if callable(plan_fn) else source_or_plan)  # type: ignore[arg-type]
    for i, shard in enumerate(plan):
        if not isinstance(shard, Shard):
            raise ConfigError(f"plan entry {i} is a {type(shard).__name__}, not a Shard")
    return plan


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


class _TokenCheck(grpc.ServerInterceptor):
    """Refuse (UNAUTHENTICATED) any call without ``authorization: Bearer <token>``.

    The rule is ``credentials.carries_token``'s (constant time), which ``/metrics`` follows too.
    """

    def __init__(self, token: str) -> None:
        self._token = token

    def intercept_service(
        self, continuation: Callable[[Any], Any], details: grpc.HandlerCallDetails
    ) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        given = ""
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                given = value if isinstance(value, str) else ""
        if carries_token(given.encode(), self._token):
            return handler
        return _refusal(handler)


def _deny(request: Any, context: grpc.ServicerContext) -> Any:
    context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token")


def _refusal(handler: Any) -> Any:
    """A handler of the same kind as ``handler`` that refuses the call. It takes the request's
    bytes as they are: parsed first, garbage from a caller without the token got INTERNAL
    (a parse error) instead of UNAUTHENTICATED, telling it that it reached the service."""
    serde = {"request_deserializer": None, "response_serializer": handler.response_serializer}
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(_deny, **serde)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(_deny, **serde)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(_deny, **serde)
    return grpc.stream_stream_rpc_method_handler(_deny, **serde)


def _bind_error(host: str, port: int) -> str:
    """Why gRPC could not bind (it says only "Failed to bind"): the operating system's reason,
    found by binding a plain socket the same way."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        return f"{host!r} is not an address here ({exc.strerror or exc})"
    reasons = []
    for family, kind, proto, _name, address in infos:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.bind(address)
        except OSError as exc:
            reasons.append(exc.strerror or str(exc))
    if not reasons:
        return "the port was free a moment later (another program held it)"
    hint = (
        "; another program (or master) has the port: pick another --port"
        if any("in use" in r for r in reasons)
        else ""
    )
    return ", ".join(dict.fromkeys(reasons)) + hint
