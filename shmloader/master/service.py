"""The gRPC servicer: request checks, status codes and the lock around the dispatcher.

The dispatcher is a pure, single-threaded state machine; this layer adds only what the network
needs. Every handler runs through :func:`_rpc`, which turns our exceptions into status codes
and anything unexpected into INTERNAL (logged with its traceback), so no request, however
malformed, can take the server down or leave the lock held.

Status codes: INVALID_ARGUMENT for values that can never be right (empty or huge consumer ids,
negative ``max_tasks``, a rank outside the world); FAILED_PRECONDITION for requests that do
not fit the current state (unknown consumer, a lease that is not active), carrying the
dispatcher's explanation; NOT_FOUND for an epoch past the planned ones; UNAUTHENTICATED comes
from the server's token check.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import grpc

from .._proto import master_pb2 as pb
from .._proto import master_pb2_grpc as pb_grpc
from ..errors import ConfigError, LeaseError, MasterError, NotActive
from . import _convert
from .dispatcher import Dispatcher
from .epochs import schedule_of
from .figures import TrainerFigures
from .progress import Lease as DispatcherLease
from .snapshot import WHEREABOUTS, left_records
from .wire import (
    MAX_EPOCH,
    MAX_ERROR_CHARS,
    MAX_ID_CHARS,
    MAX_IDS_PER_CALL,
    MAX_TASKS_PER_CALL,
    REASON_KEY,
    UNKNOWN_CONSUMER,
)

log = logging.getLogger(__name__)

_WHEREABOUTS: dict[str, pb.Whereabouts] = {
    name: getattr(pb.Whereabouts, name.upper()) for name in WHEREABOUTS
}
# Epoch shapes (units and records per queue) remembered for seq numbers and EpochInfo.
_SHAPES_KEPT = 64
MAX_FIGURES = 1024  # consumers whose last figures /metrics reports (the latest to beat)


class RpcFailure(Exception):
    """A refusal with its status code, raised inside a handler and turned into a reply."""

    def __init__(self, code: grpc.StatusCode, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason


@dataclass(frozen=True)
class EpochShape:
    """Where each queue's units start (``bounds``) and how many records each queue holds."""

    bounds: tuple[int, ...]
    records: tuple[int, ...]


Req = TypeVar("Req")
Rep = TypeVar("Rep")
Handler = Callable[[Any, Req, grpc.ServicerContext], Rep]


def _rpc(fn: Handler[Req, Rep]) -> Handler[Req, Rep]:
    """Run a handler, mapping every exception to a status code (see the module docstring)."""

    @functools.wraps(fn)
    def handler(self: Any, request: Req, context: grpc.ServicerContext) -> Rep:
        try:
            return fn(self, request, context)
        except RpcFailure as exc:
            _abort(context, exc.code, str(exc), exc.reason)
        except LeaseError as exc:
            _abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except ConfigError as exc:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except MasterError as exc:
            _abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except Exception as exc:
            log.exception("master: %s failed unexpectedly", fn.__name__)
            _abort(context, grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")

    return handler


def _abort(
    context: grpc.ServicerContext, code: grpc.StatusCode, message: str, reason: str | None = None
) -> NoReturn:
    if reason is not None:
        context.set_trailing_metadata(((REASON_KEY, reason),))
    context.abort(code, message)
    raise AssertionError("grpc's context.abort returned")  # it always raises


def _invalid(message: str) -> RpcFailure:
    return RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, message)


def check_consumer_id(consumer: str) -> str:
    if not consumer:
        raise _invalid("the consumer id is empty; give each consumer a non-empty name")
    if len(consumer) > MAX_ID_CHARS:
        raise _invalid(f"the consumer id has {len(consumer)} characters; at most {MAX_ID_CHARS}")
    return consumer


def _check_lease_id(lease_id: int) -> int:
    if lease_id <= 0:
        raise _invalid(f"lease ids are positive, got {lease_id}")
    return lease_id


class MasterService(pb_grpc.MasterServicer):
    """Serves one dispatcher; every call to it happens under ``lock``."""

    def __init__(self, dispatcher: Dispatcher, lock: threading.Lock | None = None) -> None:
        self.dispatcher = dispatcher
        self.lock = lock or threading.Lock()
        self._shapes: OrderedDict[int, EpochShape] = OrderedDict()
        self._shapes_lock = threading.Lock()
        # The last figures each consumer's heartbeat carried, for /metrics (metrics.py): kept
        # in memory only (not the dispatcher's state, not journaled), for consumers that left
        # too (their counters stay part of the job's totals), at most MAX_FIGURES of them.
        self.figures: OrderedDict[str, TrainerFigures] = OrderedDict()

    # ------------------------------------------------------------------ consumers

    @_rpc
    def Register(self, request: pb.RegisterRequest, context: Any) -> pb.RegisterReply:
        consumer = check_consumer_id(request.consumer)
        rank = request.rank if request.HasField("rank") else None
        d = self.dispatcher
        try:
            d.config.check_rank(consumer, rank)
        except MasterError as exc:
            raise _invalid(str(exc)) from exc
        with self.lock:
            d.register(consumer, time.time(), rank)
        return _convert.register_to_msg(consumer, rank, d.config, d.table)

    @_rpc
    def Heartbeat(self, request: pb.ConsumerRequest, context: Any) -> pb.Empty:
        consumer = check_consumer_id(request.consumer)
        with self.lock:
            self._known(consumer)
            self.dispatcher.heartbeat(consumer, time.time())
            if request.HasField("figures"):
                self.figures[consumer] = _convert.figures_from_msg(request.figures)
                self.figures.move_to_end(consumer)
                while len(self.figures) > MAX_FIGURES:
                    self.figures.popitem(last=False)
        return pb.Empty()

    @_rpc
    def Leave(self, request: pb.LeaveRequest, context: Any) -> pb.Empty:
        consumer = check_consumer_id(request.consumer)
        consumed = self._handback(request, "leave")
        with self.lock:
            self._known(consumer)
            self.dispatcher.leave(consumer, time.time(), consumed)
        return pb.Empty()

    @_rpc
    def Checkpoint(self, request: pb.CheckpointRequest, context: Any) -> pb.Empty:
        consumer = check_consumer_id(request.consumer)
        consumed = self._handback(request, "checkpoint")
        with self.lock:
            self._known(consumer)
            self.dispatcher.checkpoint(consumer, consumed, time.time())
        return pb.Empty()

    def _handback(
        self, request: pb.LeaveRequest | pb.CheckpointRequest, what: str
    ) -> dict[int, list[tuple[int, int]]]:
        consumed = _convert.handback_from_msg(request)
        self._lease_ids(consumed, what)
        ranges = sum(len(r) for r in consumed.values())
        if ranges > MAX_IDS_PER_CALL:
            raise _invalid(f"{ranges} consumed ranges in one {what}; at most {MAX_IDS_PER_CALL}")
        return consumed

    # --------------------------------------------------------------------- leases

    @_rpc
    def Lease(self, request: pb.LeaseRequest, context: Any) -> pb.LeaseReply:
        consumer = check_consumer_id(request.consumer)
        n = request.max_tasks
        if not 0 <= n <= MAX_TASKS_PER_CALL:
            raise _invalid(f"max_tasks must be in 0..{MAX_TASKS_PER_CALL}, got {n}")
        with self.lock:
            self._known(consumer)
            request_id = request.request_id if request.HasField("request_id") else None
            leases = self.dispatcher.lease(consumer, n, time.time(), request_id)
            finished = self.dispatcher.finished
        return pb.LeaseReply(
            leases=[_convert.lease_to_msg(lease, self.seq(lease)) for lease in leases],
            finished=finished,
        )

    @staticmethod
    def _lease_ids(given: Any, what: str) -> list[int]:
        ids = list(given)
        if len(ids) > MAX_IDS_PER_CALL:
            raise _invalid(f"{len(ids)} lease ids in one {what}; at most {MAX_IDS_PER_CALL}")
        for lease_id in ids:
            _check_lease_id(lease_id)
        return ids

    @_rpc
    def Renew(self, request: pb.RenewRequest, context: Any) -> pb.RenewReply:
        ids = self._lease_ids(request.lease_ids, "renew")
        reply = pb.RenewReply()
        with self.lock:
            now = time.time()
            for lease_id in ids:
                try:
                    reply.deadlines[lease_id] = self.dispatcher.renew(lease_id, now).deadline
                except LeaseError as exc:
                    reply.not_active.append(
                        _convert.problem_to_msg(lease_id, NotActive.of_error(exc))
                    )
        return reply

    @_rpc
    def Complete(self, request: pb.CompleteRequest, context: Any) -> pb.Empty:
        lease_id = _check_lease_id(request.lease_id)
        with self.lock:
            self.dispatcher.complete(lease_id, time.time())
        return pb.Empty()

    @_rpc
    def CompleteMany(self, request: pb.CompleteManyRequest, context: Any) -> pb.CompleteManyReply:
        ids = self._lease_ids(request.lease_ids, "complete")
        reply = pb.CompleteManyReply()
        with self.lock:
            now = time.time()
            for lease_id in ids:
                try:
                    self.dispatcher.complete(lease_id, now)
                except LeaseError as exc:
                    reply.not_completed.append(
                        _convert.problem_to_msg(lease_id, NotActive.of_error(exc))
                    )
        return reply

    @_rpc
    def Taken(self, request: pb.TakenRequest, context: Any) -> pb.TakenReply:
        ids = self._lease_ids(request.lease_ids, "taken")
        with self.lock:
            problems = self.dispatcher.mark_taken(ids, time.time())
        reply = pb.TakenReply()
        reply.not_taken.extend(_convert.problem_to_msg(i, why) for i, why in problems.items())
        return reply

    @_rpc
    def Fail(self, request: pb.FailRequest, context: Any) -> pb.Empty:
        lease_id = _check_lease_id(request.lease_id)
        if len(request.error) > MAX_ERROR_CHARS:
            raise _invalid(
                f"the error message has {len(request.error)} characters; at most "
                f"{MAX_ERROR_CHARS} (the client shortens longer ones)"
            )
        with self.lock:
            self.dispatcher.fail(lease_id, request.error, time.time(), permanent=request.permanent)
        return pb.Empty()

    # -------------------------------------------------------------------- queries

    @_rpc
    def EpochInfo(self, request: pb.EpochInfoRequest, context: Any) -> pb.EpochInfoReply:
        consumer = check_consumer_id(request.consumer)
        epoch = self._check_epoch(request.epoch)
        with self.lock:
            self._known(consumer)
            rank = self.dispatcher.rank_of(consumer)
            left = left_records(self.dispatcher, epoch)
        shape = self.shape(epoch)
        queue = rank or 0
        return pb.EpochInfoReply(
            epoch=epoch,
            num_tasks=shape.bounds[queue + 1] - shape.bounds[queue],
            num_records=shape.records[queue],
            left_records=shape.records if left is None else left,
        )

    @_rpc
    def Whereabouts(self, request: pb.WhereaboutsRequest, context: Any) -> pb.WhereaboutsReply:
        consumer = check_consumer_id(request.consumer)
        epoch = self._check_epoch(request.epoch)
        seqs = list(request.seqs)
        if len(seqs) > MAX_IDS_PER_CALL:
            raise _invalid(f"{len(seqs)} seqs in one call; at most {MAX_IDS_PER_CALL}")
        with self.lock:
            self._known(consumer)
            rank = self.dispatcher.rank_of(consumer)
        shape = self.shape(epoch)
        queue = rank or 0
        first, size = shape.bounds[queue], shape.bounds[queue + 1] - shape.bounds[queue]
        bad = [s for s in seqs if not 0 <= s < size]
        if bad:
            raise _invalid(
                f"epoch {epoch} has {size} tasks in this consumer's queue, not seq {bad[0]}"
            )
        with self.lock:
            units = [first + s for s in seqs]
            where = self.dispatcher.whereabouts(consumer, epoch, units, time.time())
        return pb.WhereaboutsReply(whereabouts=[_WHEREABOUTS[w] for w in where])

    def _check_epoch(self, epoch: int) -> int:
        if not 0 <= epoch < MAX_EPOCH:
            raise _invalid(f"epoch must be in 0..{MAX_EPOCH - 1}, got {epoch}")
        planned = self.dispatcher.config.epochs
        if planned is not None and epoch >= planned:
            raise RpcFailure(
                grpc.StatusCode.NOT_FOUND,
                f"epoch {epoch} is not planned: this master runs epochs 0..{planned - 1}",
            )
        return epoch

    @_rpc
    def Progress(self, request: pb.ProgressRequest, context: Any) -> pb.ProgressReply:
        with self.lock:
            progress = self.dispatcher.progress(int(request.since_epoch))
        return _convert.progress_to_msg(progress)

    # ------------------------------------------------------------------- helpers

    def expire(self, now: float | None = None) -> None:
        """Take back expired leases and dead consumers' leases (the server's timer calls it)."""
        with self.lock:
            self.dispatcher.expire(time.time() if now is None else now)

    def resume(self, now: float, stopped_for: float) -> None:
        """The master could not run for ``stopped_for`` s: fresh deadlines for everyone (the
        server's timer calls it before ``expire``; see ``Dispatcher.resume``)."""
        with self.lock:
            self.dispatcher.resume(now, stopped_for)

    def seq(self, lease: DispatcherLease) -> int:
        """The lease's position in its queue of the epoch: stable across retries of the unit."""
        if lease.rank is None:
            return lease.unit  # elastic mode: one queue starting at unit 0
        return lease.unit - self.shape(lease.epoch).bounds[lease.rank]

    def shape(self, epoch: int) -> EpochShape:
        """Units and records per queue of ``epoch``, from the schedule (a pure function of the
        plan and settings, so also for epochs that have not started). Computed outside the
        dispatcher's lock and cached: a million-task schedule takes a noticeable moment."""
        with self._shapes_lock:
            shape = self._shapes.get(epoch)
            if shape is not None:
                self._shapes.move_to_end(epoch)
                return shape
        schedule = schedule_of(self.dispatcher.table, self.dispatcher.config, epoch)
        bounds = tuple(int(b) for b in schedule.bounds)
        records = tuple(schedule.queue_records(q) for q in range(len(bounds) - 1))
        shape = EpochShape(bounds, records)
        with self._shapes_lock:
            self._shapes[epoch] = shape
            while len(self._shapes) > _SHAPES_KEPT:
                self._shapes.popitem(last=False)
        return shape

    def _known(self, consumer: str) -> None:
        """FAILED_PRECONDITION marked ``unknown-consumer`` unless ``consumer`` is registered,
        so the client knows that registering again is the cure. Call under the lock."""
        try:
            self.dispatcher.leases_of(consumer)
        except MasterError as exc:
            raise RpcFailure(
                grpc.StatusCode.FAILED_PRECONDITION, str(exc), UNKNOWN_CONSUMER
            ) from exc
