"""The embedded master's own trainer calls it in-process, not over gRPC.

A dataset with an embedded master (``master=None``) serves its readers over gRPC, but its own
calls (tasks taken, tasks completed, where the tasks it waits for are, lease renewals) came
over the same loopback gRPC: a request and a reply serialised, a channel, the server's
completion queue and a thread pool handing the call over, all in the trainer's process: with
small batches, a good share of its CPU went to those threads rather than to the training
loop.

:class:`LocalStub` has the generated stub's shape (one callable per RPC, taking the request,
``timeout`` and ``metadata``) and calls the :class:`~shmloader.master.service.MasterService`
that the gRPC server serves, so requests take the same path past the wire: the same handler,
the same lock, the same journal, and errors as the same status codes with the same reasons
(:class:`LocalRpcError`, a ``grpc.RpcError``). ``MasterClient`` keeps its conversions,
retries and re-registration on top of it. What differs:

- no token check: the caller is the process that made the master and holds its token;
- no deadline: a call waits for the master's lock as long as it takes, as the dispatcher's
  in-process callers (``Master.dispatcher_call``) always did;
- once the master stops, calls fail as UNAVAILABLE, as they would over gRPC.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grpc

from .service import MasterService

Metadata = Sequence[tuple[str, str]]


class LocalRpcError(grpc.RpcError):
    """A call that the master refused (or that found it stopped), as gRPC reports one."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing: Metadata = ()) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details
        self._trailing: tuple[tuple[str, str], ...] = tuple(trailing)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    # grpc's errors give (key, value) pairs, as client._reason reads them; the stubs' type
    # (objects with .key and .value) is not what grpc returns.
    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:  # type: ignore[override]
        return self._trailing


class _LocalContext:
    """What a ``MasterService`` handler uses of its ``grpc.ServicerContext``."""

    def __init__(self) -> None:
        self._trailing: Metadata = ()

    def set_trailing_metadata(self, metadata: Metadata) -> None:
        self._trailing = tuple(metadata)

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise LocalRpcError(code, details, self._trailing)


class LocalStub:
    """``MasterStub``'s calls on ``service`` in this process; ``serving()`` False (the master
    stopped) makes every call fail as UNAVAILABLE."""

    def __init__(self, service: MasterService, serving: Callable[[], bool]) -> None:
        self._service = service
        self._serving = serving

    def __getattr__(self, method: str) -> Callable[..., Any]:
        handler = getattr(self._service, method)  # AttributeError for a method it lacks
        serving = self._serving

        def call(request: Any, timeout: float | None = None, metadata: Metadata = ()) -> Any:
            if not serving():
                raise LocalRpcError(grpc.StatusCode.UNAVAILABLE, "the master has stopped")
            return handler(request, _LocalContext())

        return call
