"""``MasterClient``: the consumer side of the master's gRPC protocol.

What it adds to plain stubs, so that readers and trainers need no gRPC code of their own:

* a deadline (``timeout``) on every call, and retries with exponential backoff for up to
  ``retry_for`` seconds (default ``$SHMLOADER_MASTER_RETRY``, else 30) while the master is
  UNAVAILABLE or CANCELLED (restarting, not up yet, shutting down), and on
  DEADLINE_EXCEEDED for calls safe to repeat (Lease is, by its request id);
* errors as ours: FAILED_PRECONDITION / NOT_FOUND of lease calls (renew, complete, fail)
  become :class:`LeaseError`, everything else :class:`MasterError`, with the master's words;
* a master that restarted without its journal (or declared a consumer dead) answers
  "unknown consumer": the client registers that consumer again, with the rank it registered
  with, and retries the call once, so user code does not notice;
* an optional heartbeat thread per consumer that keeps going across master restarts.

One client may be used from many threads. gRPC channels do not survive ``fork``: create the
client inside the process that uses it (it refuses to work in a forked child).
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

import grpc

from .._env import seconds_from_env
from .._keywords import suggest_keywords
from .._proto import master_pb2 as pb
from .._proto import master_pb2_grpc as pb_grpc
from ..errors import ConfigError, LeaseError, MasterError
from . import forked
from ._convert import (
    ConsumerInfo,
    EpochInfo,
    LeaseInfo,
    LeaseReply,
    figures_to_msg,
    handback_to_msgs,
    lease_from_msg,
    problems_from_msg,
    progress_from_msg,
    register_from_msg,
)
from .address import check_address
from .credentials import Credentials, bearer
from .figures import TrainerFigures
from .progress import Progress
from .wire import MAX_ERROR_CHARS, REASON_KEY, UNKNOWN_CONSUMER, HandBack

log = logging.getLogger(__name__)

_FIRST_BACKOFF = 0.05
_MAX_BACKOFF = 2.0
_CHANNEL_OPTIONS = [
    # Reconnect quickly after a master restart (gRPC's default backoff grows to 2 minutes).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # Progress reports of long jobs with many quarantined tasks can exceed the 4 MiB default.
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    # Our own retry loop decides what is safe to repeat.
    ("grpc.enable_retries", 0),
]


class RenewError(LeaseError):
    """Some leases of a renew were not active; the others were renewed.

    ``renewed`` maps lease id -> new deadline, ``not_active`` lease id -> the master's reason
    (a ``NotActive``: its ``handed_to`` names who got the task if the lease lapsed).
    """

    def __init__(self, renewed: dict[int, float], not_active: dict[int, str]) -> None:
        self.renewed = renewed
        self.not_active = not_active
        super().__init__("; ".join(not_active.values()))


_RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
# How gRPC words a TLS handshake refused for good (a certificate the CA did not sign or
# that does not name the host, a master without TLS, an unusable CA): no retry mends those.
# A connection cut mid-handshake (a master killed) reads SSL_ERROR_SYSCALL or "Socket
# closed", and is retried as any other.
_HANDSHAKE_FAILURES = (
    "ssl_error_ssl",
    "security handshaker",
    "peer name",
    "verification check failed",
)


def _handshake_failed(exc: grpc.RpcError) -> bool:
    details = getattr(exc, "details", lambda: None)() or ""
    return any(words in details.lower() for words in _HANDSHAKE_FAILURES)


RETRY_ENV = "SHMLOADER_MASTER_RETRY"
DEFAULT_RETRY_SECONDS = 30.0


def default_retry_for() -> float:
    """``$SHMLOADER_MASTER_RETRY`` seconds, else 30: how long a master may be unreachable
    before calls give up. An environment variable, so that it reaches the reader processes
    and every client a dataset makes (a master restarted from its journal on a slow host may
    need longer)."""
    return seconds_from_env(RETRY_ENV, DEFAULT_RETRY_SECONDS, zero_ok=True)


class MasterClient:
    """Talks to a master at ``address`` (``host:port``); see the module docstring.

    ``root_certificates`` (PEM) switches to TLS, with the server's name checked against
    its certificate; ``token`` is sent with every call, and is refused (ConfigError) for an
    address beyond this machine without TLS.
    ``local``: the master runs in this process; call it through this stub (``Master.
    local_stub()``, local.py) instead of a gRPC channel to ``address``.
    """

    @suggest_keywords()
    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        root_certificates: bytes | None = None,
        timeout: float = 10.0,
        retry_for: float | None = None,
        local: Any = None,
    ) -> None:
        if retry_for is None:
            retry_for = default_retry_for()
        check_address(address)
        if not timeout > 0 or not retry_for >= 0:
            raise ConfigError(f"timeout must be > 0 and retry_for >= 0, got {timeout}, {retry_for}")
        forked.check("a master client")
        self.address = address
        self.timeout = float(timeout)
        self.retry_for = float(retry_for)
        self._closing = threading.Event()
        self._channel: grpc.Channel | None = None
        self._tls = root_certificates is not None
        if local is not None:
            self._stub: Any = local
        else:
            Credentials(token, root_certificates).check_transport(address)
            if root_certificates is None:
                self._channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
            else:
                creds = grpc.ssl_channel_credentials(root_certificates=root_certificates)
                self._channel = grpc.secure_channel(address, creds, options=_CHANNEL_OPTIONS)
            self._stub = pb_grpc.MasterStub(self._channel)
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", bearer(token)),) if token else ()
        )
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._ranks: dict[str, int | None] = {}  # consumers registered through this client
        self._may_register: dict[str, Callable[[], bool]] = {}  # speak_for's guards
        self._infos: dict[str, ConsumerInfo] = {}
        self._heartbeats: dict[str, tuple[threading.Thread, threading.Event]] = {}
        forked.used()
        # Set by stop_retrying (and close): backoff waits end at once.
        self._hurry = threading.Event()
        # When a call last gave up on an unreachable master (None after any answer).
        self.gave_up_at: float | None = None

    @property
    def local(self) -> bool:
        """Whether calls go to a master in this process, without gRPC (``local=``)."""
        return self._channel is None

    def stop_retrying(self) -> None:
        """From now on try each call once: for a caller that knows the master is gone (a
        call already gave up on it) and must not wait ``retry_for`` again per call, as
        a dataset closing after losing its master. Calls waiting to retry give up now."""
        self._hurry.set()

    # ------------------------------------------------------------------ consumers

    def register(self, consumer: str, rank: int | None = None) -> ConsumerInfo:
        """Join the job (again: harmless). The client remembers ``rank`` to re-register."""
        request = pb.RegisterRequest(consumer=consumer, rank=rank)
        info = register_from_msg(self._call("Register", request, idempotent=True))
        with self._lock:
            self._ranks[consumer] = rank
            self._infos[consumer] = info
        return info

    def speak_for(
        self,
        consumer: str,
        rank: int | None = None,
        *,
        may_register: Callable[[], bool] | None = None,
    ) -> None:
        """Calls for ``consumer``, registered by another process (a trainer, for its readers),
        register it again, as :meth:`register` would have, if the master forgot it meanwhile
        (declared dead after a stall, restarted without a journal). Registers nothing now.

        Without it such a call fails in the window before the registering process's own
        heartbeat registers again: after a SIGSTOPped trainer and its readers go on, a reader's
        ``Lease`` comes first and failed the run.

        ``may_register()`` is asked first, each time: False where the other process has left
        the master on purpose (a trainer closing, or on SIGTERM, while its readers still
        run), and the call then fails as it would without ``speak_for``: registered again,
        the consumer would be a ghost, holding leases nobody reads until they lapse."""
        with self._lock:
            self._ranks.setdefault(consumer, rank)
            if may_register is not None:
                self._may_register[consumer] = may_register

    def heartbeat(self, consumer: str, figures: TrainerFigures | None = None) -> None:
        """A sign of life for a consumer that may send nothing else for a while: one silent
        past ``consumer_timeout`` is declared dead and loses its leases. If the master forgot
        it (restarted without a journal, or timed it out), registers it again. ``figures``:
        what the trainer measured, for the master's ``/metrics``."""
        request = pb.ConsumerRequest(consumer=consumer)
        if figures is not None:
            request.figures.CopyFrom(figures_to_msg(figures))
        self._call("Heartbeat", request, True, consumer=consumer)

    def leave(self, consumer: str, consumed: HandBack | None = None) -> None:
        """Unregister (leases go back to the queue at once); a no-op if the master does not
        know the consumer (any more). Also stops the consumer's heartbeat thread.

        ``consumed`` (elastic mode): lease id -> record ranges ``[start, stop)`` the trainer
        consumed of the lease's task; whoever leases the task next skips them."""
        self._stop_heartbeat(consumer)
        with self._lock:
            self._ranks.pop(consumer, None)
            self._infos.pop(consumer, None)
            self._may_register.pop(consumer, None)
        try:
            request = pb.LeaveRequest(consumer=consumer, consumed=handback_to_msgs(consumed))
            self._invoke("Leave", request, idempotent=True)
        except grpc.RpcError as exc:
            if _reason(exc) != UNKNOWN_CONSUMER:
                raise self._error("Leave", exc) from exc

    def checkpoint(self, consumer: str, consumed: HandBack) -> bool:
        """Tell the master what ``consumer``'s trainer just saved in its state (elastic mode):
        lease id -> record ranges its loop consumed of the lease's task. Should the lease
        lapse before anyone resumes from that state, the task goes back less them. False from
        a master older than this call, which cannot keep them (a trainer resumed later than
        ``consumer_timeout`` may then see rows of its state come again elsewhere)."""
        request = pb.CheckpointRequest(consumer=consumer, consumed=handback_to_msgs(consumed))
        try:
            self._call("Checkpoint", request, True, consumer=consumer)
        except MasterError as exc:
            if isinstance(exc.__cause__, grpc.RpcError) and (
                _code(exc.__cause__) == grpc.StatusCode.UNIMPLEMENTED
            ):
                return False
            raise
        return True

    # --------------------------------------------------------------------- leases

    def lease(self, consumer: str, max_tasks: int = 1) -> LeaseReply:
        """Up to ``max_tasks`` leases; none when nothing is available right now.

        Retried on a timeout like the idempotent calls: every try carries the same random
        request id, and the master answers a repeat with the leases it granted for it rather
        than new ones. (From ``secrets``: DataLoader workers seed ``random`` alike.) A master
        older than the id ignores it, and a retry there may grant twice; the extra leases
        lapse unread and count as failed attempts, as before."""
        request_id = secrets.randbits(63)
        request = pb.LeaseRequest(consumer=consumer, max_tasks=max_tasks, request_id=request_id)
        reply = self._call("Lease", request, True, consumer=consumer)
        return LeaseReply([lease_from_msg(m) for m in reply.leases], reply.finished)

    def renew(self, lease_ids: Sequence[int]) -> dict[int, float]:
        """Extend leases; returns their new deadlines. :class:`RenewError` (a LeaseError)
        if some were not active: the others are renewed and listed in it."""
        if not lease_ids:
            return {}
        reply = self._call("Renew", pb.RenewRequest(lease_ids=lease_ids), True, lease=True)
        renewed = dict(reply.deadlines)
        if reply.not_active:
            raise RenewError(renewed, problems_from_msg(reply.not_active))
        return renewed

    def complete(self, lease_id: int) -> None:
        """Count the lease's records as delivered, once. LeaseError if its unit was handed out
        again meanwhile; not retried on a timeout, since the first call may have counted."""
        self._call("Complete", pb.CompleteRequest(lease_id=lease_id), False, lease=True)

    def complete_many(self, lease_ids: Sequence[int]) -> dict[int, str]:
        """Complete several leases in one call; returns those that could not be, with why.

        Unlike :meth:`complete`, a lease that is no longer active does not raise: the others
        are completed all the same, and the caller decides what a late completion means.
        """
        if not lease_ids:
            return {}
        request = pb.CompleteManyRequest(lease_ids=lease_ids)
        reply = self._call("CompleteMany", request, False, lease=True)
        return dict(problems_from_msg(reply.not_completed))

    def mark_taken(self, lease_ids: Sequence[int]) -> dict[int, str]:
        """Tell the master the trainer took these leases' tasks into its sampler; returns the
        leases that are no longer active, with why (the others were marked)."""
        if not lease_ids:
            return {}
        reply = self._call("Taken", pb.TakenRequest(lease_ids=lease_ids), True, lease=True)
        return dict(problems_from_msg(reply.not_taken))

    def fail(self, lease_id: int, error: str, *, permanent: bool = False) -> None:
        """Report that the lease's task could not be read; long messages are shortened.
        ``permanent``: a retry would fail the same way (the master quarantines the task now)."""
        if len(error) > MAX_ERROR_CHARS:
            cut = f" ... [cut: {len(error)} characters in all]"
            error = error[: MAX_ERROR_CHARS - len(cut)] + cut
        request = pb.FailRequest(lease_id=lease_id, error=error, permanent=permanent)
        self._call("Fail", request, False, lease=True)

    # -------------------------------------------------------------------- queries

    def epoch_info(self, consumer: str, epoch: int) -> EpochInfo:
        """Units and records of ``consumer``'s queue in ``epoch`` (also before it starts)."""
        request = pb.EpochInfoRequest(consumer=consumer, epoch=epoch)
        reply = self._call("EpochInfo", request, True, consumer=consumer)
        left = tuple(int(n) for n in reply.left_records)
        return EpochInfo(reply.epoch, reply.num_tasks, reply.num_records, left)

    def whereabouts(self, consumer: str, epoch: int, seqs: Sequence[int]) -> list[str]:
        """Where tasks ``seqs`` of ``consumer``'s queue in ``epoch`` are, in order: "todo",
        "mine", "other" (leased by another consumer), "taken" (and its trainer took it in
        hand), "done" or "quarantined"."""
        request = pb.WhereaboutsRequest(consumer=consumer, epoch=epoch, seqs=list(seqs))
        reply = self._call("Whereabouts", request, True, consumer=consumer)
        return [pb.Whereabouts.Name(w).lower() for w in reply.whereabouts]

    def progress(self, since_epoch: int = 0) -> Progress:
        """The job as the master sees it, every trainer included (what ``shmloader stats``
        prints); a trainer's own counts are in ``SharedTaskDataset.stats()``.

        ``since_epoch``: finished epochs before it are left out of ``epochs`` (the counts stay
        whole), for a caller that polls: the reply of a job with 20,000 finished epochs took
        about 0.24 s to build and read. A master older than the argument sends every epoch."""
        request = pb.ProgressRequest(since_epoch=since_epoch)
        return progress_from_msg(self._call("Progress", request, True))

    # ------------------------------------------------------------------ heartbeat

    def start_heartbeat(
        self,
        consumer: str,
        interval: float | None = None,
        figures: Callable[[], TrainerFigures | None] | None = None,
    ) -> None:
        """Heartbeat ``consumer`` from a daemon thread until :meth:`leave` or :meth:`close`.

        ``interval`` defaults to a quarter of the master's ``consumer_timeout`` (known once
        the consumer registered through this client), else 1 s. Failures are logged and the
        thread keeps trying, so it carries on after the master comes back. ``figures()``,
        called before each beat, gives what the beat carries (None: nothing); an exception
        it raises is logged and the beat goes without.
        """
        with self._lock:
            if consumer in self._heartbeats:
                return
            if interval is None:
                info = self._infos.get(consumer)
                interval = info.consumer_timeout / 4 if info is not None else 1.0
            if not interval > 0:
                raise ConfigError(f"interval must be > 0 seconds, got {interval}")
            stop = threading.Event()
            thread = threading.Thread(
                target=self._beat,
                args=(consumer, interval, stop, figures),
                name=f"shmloader-heartbeat-{consumer}",
                daemon=True,
            )
            self._heartbeats[consumer] = (thread, stop)
        thread.start()

    def _beat(
        self,
        consumer: str,
        interval: float,
        stop: threading.Event,
        figures: Callable[[], TrainerFigures | None] | None,
    ) -> None:
        while not stop.wait(interval) and not self._closing.is_set():
            measured = None
            if figures is not None:
                try:
                    measured = figures()
                except Exception as exc:  # figures are for a dashboard: the beat must go
                    log.warning("consumer %r: its figures could not be measured: %s", consumer, exc)
            try:
                self.heartbeat(consumer, measured)
            except MasterError as exc:
                if self._closing.is_set() or stop.is_set() or self._hurry.is_set():
                    return  # closing, or the caller knows the master is gone
                log.warning("heartbeat of consumer %r failed (will retry): %s", consumer, exc)

    def _stop_heartbeat(self, consumer: str) -> None:
        with self._lock:
            entry = self._heartbeats.pop(consumer, None)
        if entry is not None:
            entry[1].set()
            if entry[0] is not threading.current_thread():
                entry[0].join(self.timeout)

    def close(self) -> None:
        """Stop heartbeat threads and close the channel (in-flight calls are cancelled)."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._hurry.set()
        with self._lock:
            beats = list(self._heartbeats.values())
            self._heartbeats.clear()
        for _, stop in beats:
            stop.set()
        if os.getpid() == self._pid and self._channel is not None:
            self._channel.close()
        for thread, _ in beats:
            thread.join(self.timeout)

    def __enter__(self) -> MasterClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MasterClient({self.address!r})"

    # ------------------------------------------------------------------- plumbing

    def _call(
        self,
        method: str,
        request: Any,
        idempotent: bool,
        *,
        consumer: str | None = None,
        lease: bool = False,
    ) -> Any:
        """One RPC with retries; re-register ``consumer`` and retry once if it is unknown."""
        try:
            return self._invoke(method, request, idempotent)
        except grpc.RpcError as exc:
            if consumer is None or _reason(exc) != UNKNOWN_CONSUMER:
                raise self._error(method, exc, lease) from exc
            with self._lock:
                known = consumer in self._ranks
                rank = self._ranks.get(consumer)
                may_register = self._may_register.get(consumer)
            if not known or (may_register is not None and not may_register()):
                raise self._error(method, exc, lease) from exc
            log.info("master forgot consumer %r; registering it again", consumer)
        self.register(consumer, rank)
        try:
            return self._invoke(method, request, idempotent)
        except grpc.RpcError as exc:
            raise self._error(method, exc, lease) from exc

    def _invoke(self, method: str, request: Any, idempotent: bool) -> Any:
        """Call until an answer, retrying UNAVAILABLE, CANCELLED (and DEADLINE_EXCEEDED when
        ``idempotent``) with exponential backoff for up to ``retry_for`` seconds."""
        stub: Callable[..., Any] = getattr(self._stub, method)
        give_up = time.monotonic() + (0.0 if self._hurry.is_set() else self.retry_for)
        delay = _FIRST_BACKOFF
        while True:
            self._check_usable()
            try:
                reply = stub(request, timeout=self.timeout, metadata=self._metadata)
            except grpc.RpcError as exc:
                code = _code(exc)
                # CANCELLED: a master shutting down (to restart, say) cancels calls in flight;
                # ours are cancelled only by close(), which _check_usable reports.
                again = (code in _RETRIED and not _handshake_failed(exc)) or (
                    idempotent and code == grpc.StatusCode.DEADLINE_EXCEEDED
                )
                if not again:
                    raise
                if time.monotonic() + delay > give_up or self._hurry.wait(delay):
                    self._check_usable()
                    self.gave_up_at = time.monotonic()
                    raise
            except ValueError as exc:  # grpc: "Cannot invoke RPC on closed channel!"
                self._check_usable()
                raise MasterError(f"{method} to the master at {self.address}: {exc}") from exc
            else:
                self.gave_up_at = None
                return reply
            delay = min(delay * 2, _MAX_BACKOFF)

    def _check_usable(self) -> None:
        if os.getpid() != self._pid:
            raise MasterError(
                "this MasterClient was created in another process; gRPC channels do not "
                "survive fork: create a MasterClient in each process"
            )
        if self._closing.is_set():
            raise MasterError(f"the MasterClient for {self.address} is closed")

    def _error(self, method: str, exc: grpc.RpcError, lease: bool = False) -> MasterError:
        code = _code(exc)
        details = getattr(exc, "details", lambda: None)() or str(exc)
        if lease and code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND):
            return LeaseError(details)
        if code in _RETRIED and _handshake_failed(exc):
            return MasterError(
                f"the TLS handshake with the master at {self.address} failed ({details}). "
                "Check that tls_ca (or $SHMLOADER_TLS_CA) is the CA certificate that signed "
                "the master's --tls-cert, that this certificate names the host of the address "
                "among its subject alternative names, and that the master serves TLS "
                "(shmloader master --tls-cert FILE --tls-key FILE)"
            )
        if code in _RETRIED:
            hint = ""
            if not self._tls and "Socket closed" in details:
                hint = (
                    " (a master that serves TLS closes plaintext connections so: if it was "
                    "started with --tls-cert, give tls_ca= or $SHMLOADER_TLS_CA)"
                )
            return MasterError(
                f"the master at {self.address} is unreachable (retried for {self.retry_for}s): "
                f"{details}{hint}"
            )
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return MasterError(
                f"{method}: the master at {self.address} did not answer within {self.timeout}s"
            )
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return MasterError(f"the master at {self.address} refused the token: {details}")
        name = code.name if code is not None else "UNKNOWN"
        return MasterError(f"{method} refused by the master at {self.address} ({name}): {details}")


def _code(exc: grpc.RpcError) -> grpc.StatusCode | None:
    code = getattr(exc, "code", None)
    return code() if callable(code) else None


def _reason(exc: grpc.RpcError) -> str | None:
    trailing = getattr(exc, "trailing_metadata", None)
    for key, value in (trailing() if callable(trailing) else None) or ():
        if key == REASON_KEY:
            return str(value)
    return None


__all__ = [
    "ConsumerInfo",
    "EpochInfo",
    "LeaseInfo",
    "LeaseReply",
    "MasterClient",
    "RenewError",
]
