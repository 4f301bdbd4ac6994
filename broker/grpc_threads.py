"""The threaded gRPC serving model (``server.io.model=threads``): one thread per call.

The model Tidelog had before the asynchronous one (``broker.grpc_async``), kept selectable
so that both can be measured side by side (``benchmarks/client_bench.py --models``). A
synchronous ``grpc.server`` runs every handler on a worker of its ``num.io.threads`` pool
for the whole life of the call: a long poll or an open stream holds a worker while it
waits, so ``num.io.threads`` waiting clients stop the broker. Do not use it for fleets.

It drives the same core as the asynchronous model, through the blocking helpers
(``BrokerCore.fetch``, ``BrokerCore.complete_blocking``) and the same handler table
(``broker.service``); errors are rendered by ``broker.errors.abort_with``. The limits and
quotas of the asynchronous model are not enforced here.

Streams: ``ProduceStream`` is pipelined (``broker.produce_stream``: a reader thread appends
request N+1 while the worker waits for N's fsync); ``FetchStream`` answers its requests one
after the other, each a long poll that the end of the call interrupts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from broker.context import RequestContext
from broker.core import BrokerCore
from broker.errors import abort_with, to_wire
from broker.fetch import PendingFetch
from broker.limits import Admission
from broker.produce import Acks, PartitionAppend, parse_acks
from broker.produce_stream import ProducePipeline
from broker.service import (
    BROKER_SERVICE_NAME,
    UNARY_HANDLERS,
    UnaryHandler,
    call_context,
    fetch_response,
    fetch_spec,
    generic_handler,
    produce_parts,
    produce_response,
    wait_cap_ms,
)
from proto.tidelog.v1 import broker_pb2 as pb
from storage.errors import InvalidRequestError

__all__ = ["ThreadedListener", "threaded_handler"]

T = TypeVar("T")

_HEALTH_SERVICE_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name


@dataclass(frozen=True, slots=True)
class _PendingProduce:
    correlation_id: int
    acks: Acks
    appends: list[PartitionAppend]
    started: float


def threaded_handler(core: BrokerCore) -> grpc.GenericRpcHandler:
    """Every RPC of ``tidelog.v1.Broker`` over ``core``, for a synchronous server."""
    service = _ThreadedService(core)
    return generic_handler(
        service.unary,
        service.produce,
        service.fetch,
        service.produce_stream,
        service.fetch_stream,
        max_request_entries=core.config.max_request_partition_size_limit,
    )


def _context(core: BrokerCore, context: grpc.ServicerContext, method: str) -> RequestContext:
    return call_context(core, context, method)


class _ThreadedService:
    """The handlers; thread-safe (the core is)."""

    def __init__(self, core: BrokerCore) -> None:
        self._core = core
        self._metrics = core.metrics

    def _call(self, method: str, context: grpc.ServicerContext, body: Callable[[], T]) -> T:
        """Run one request: time it, count it, render its error."""
        started = time.perf_counter()
        try:
            if method not in UNARY_HANDLERS:  # unary handlers authenticate in _context
                _context(self._core, context, method)
            answer = body()
        except Exception as exc:
            wire = to_wire(exc)
            self._observe(method, wire.code or wire.status.name, started)
            abort_with(context, exc, wire)
        self._observe(method, "OK", started)
        return answer

    def _observe(self, method: str, code: str, started: float) -> None:
        self._metrics.observe_request(method, code, time.perf_counter() - started)

    def unary(self, name: str, handler: UnaryHandler) -> Callable[[Any, grpc.ServicerContext], Any]:
        def serve(request: Any, context: grpc.ServicerContext) -> Any:
            return self._call(
                name,
                context,
                lambda: handler(self._core, request, _context(self._core, context, name)),
            )

        return serve

    def produce(
        self, request: pb.ProduceRequest, context: grpc.ServicerContext
    ) -> pb.ProduceResponse:
        received_ms = self._core.wall_ms()

        def body() -> pb.ProduceResponse:
            caller = _context(self._core, context, "Produce")
            parts = produce_parts(request, received_ms, caller, self._core.acls)
            answers = self._core.produce(parts, parse_acks(request.acks))
            return produce_response(request.correlation_id, answers)

        return self._call("Produce", context, body)

    def produce_stream(
        self, request_iterator: Iterator[pb.ProduceRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.ProduceResponse]:
        caller: RequestContext | None = None  # set (authenticated) before the first read

        def append(request: pb.ProduceRequest) -> _PendingProduce:
            assert caller is not None
            started = time.perf_counter()
            acks = parse_acks(request.acks)
            parts = produce_parts(request, self._core.wall_ms(), caller, self._core.acls)
            appends = self._core.append(parts)
            return _PendingProduce(request.correlation_id, acks, appends, started)

        def complete(pending: _PendingProduce) -> pb.ProduceResponse:
            answers = self._core.complete_blocking(pending.appends, pending.acks)
            self._observe("ProduceStream", "OK", pending.started)
            return produce_response(pending.correlation_id, answers)

        pipeline = ProducePipeline(request_iterator, append, complete, context.is_active)
        started = time.perf_counter()
        try:
            caller = _context(self._core, context, "ProduceStream")  # may refuse (broker.auth)
            yield from pipeline.responses()
        except Exception as exc:
            wire = to_wire(exc)
            self._observe("ProduceStream", wire.code or wire.status.name, started)
            abort_with(context, exc, wire)

    def fetch(self, request: pb.FetchRequest, context: grpc.ServicerContext) -> bytes:
        call = _FetchCall(self._core, context)
        return self._call("Fetch", context, lambda: call.fetch(request))

    def fetch_stream(
        self, request_iterator: Iterator[pb.FetchRequest], context: grpc.ServicerContext
    ) -> Iterator[bytes]:
        call = _FetchCall(self._core, context)
        try:
            for request in request_iterator:
                yield self._call("FetchStream", context, _bind(call.fetch, request))
        except InvalidRequestError as exc:  # a message that does not parse (broker.parse)
            abort_with(context, exc)


class _FetchCall:
    """The fetches of one call, one at a time; the end of the call answers the current
    one at once. Thread-safe."""

    def __init__(self, core: BrokerCore, context: grpc.ServicerContext) -> None:
        self._core = core
        self._context = context
        self._lock = threading.Lock()
        self._woken = threading.Event()
        self._pending: PendingFetch | None = None
        self._ended = False
        context.add_callback(self._on_call_end)

    def _on_call_end(self) -> None:
        with self._lock:
            self._ended = True
            pending = self._pending
        if pending is not None:
            self._core.cancel_fetch(pending)
        self._woken.set()

    def fetch(self, request: pb.FetchRequest) -> bytes:
        woken = self._woken
        pending = self._core.start_fetch(
            fetch_spec(request, _context(self._core, self._context, "Fetch"), self._core.acls),
            wake=woken.set,
            wait_cap_ms=wait_cap_ms(self._context.time_remaining()),
        )
        with self._lock:
            self._pending = pending
            ended = self._ended
        if ended:
            self._core.cancel_fetch(pending)
        try:
            while True:
                woken.clear()
                answers = self._core.step_fetch(pending)
                if answers is not None:
                    return fetch_response(request.correlation_id, answers)
                woken.wait()
        finally:
            self._core.cancel_fetch(pending)
            with self._lock:
                self._pending = None


def _bind(
    fetch: Callable[[pb.FetchRequest], bytes], request: pb.FetchRequest
) -> Callable[[], bytes]:
    """``fetch`` with its argument bound now (a lambda in a loop would bind late)."""
    return lambda: fetch(request)


class ThreadedListener:
    """A synchronous ``grpc.server`` with ``num.io.threads`` workers. Thread-safe.

    Build with ``start``; ``stop`` once.
    """

    def __init__(
        self,
        server: grpc.Server,
        executor: ThreadPoolExecutor,
        health_servicer: health.HealthServicer,
        port: int,
    ) -> None:
        self._server = server
        self._executor = executor
        self._health = health_servicer
        self.port = port
        self.watchdog = None  # no event loop to watch: a worker thread per call

    @classmethod
    def start(
        cls,
        core: BrokerCore,
        admission: Admission,
        *,
        address: str,
        options: list[tuple[str, int]],
        io_threads: int,
        bind: Callable[[Any, str], int],
    ) -> ThreadedListener:
        """Start serving on ``address`` (``admission`` is not enforced in this model).

        Raises:
            ListenError (from ``bind``): the address cannot be bound.
        """
        executor = ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix="tidelog-grpc")
        server = grpc.server(executor, options=options)
        health_servicer = health.HealthServicer()
        try:
            server.add_generic_rpc_handlers((threaded_handler(core),))
            health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
            reflection.enable_server_reflection(
                (BROKER_SERVICE_NAME, _HEALTH_SERVICE_NAME, reflection.SERVICE_NAME), server
            )
            port = bind(server, address)
            server.start()
        except BaseException:
            server.stop(None)
            executor.shutdown(wait=False)
            raise
        for name in ("", BROKER_SERVICE_NAME):
            health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        return cls(server, executor, health_servicer, port)

    def enter_graceful_shutdown(self) -> None:
        """Health reports ``NOT_SERVING`` from now on."""
        self._health.enter_graceful_shutdown()

    def stop(self, grace_ms: int, margin_ms: int) -> bool:
        """Stop accepting calls and give those in flight ``grace_ms``; False if gRPC did
        not stop within grace + margin."""
        done = self._server.stop(grace_ms / 1000.0)
        stopped = done.wait((grace_ms + margin_ms) / 1000.0)
        self._executor.shutdown(wait=False)
        return stopped
