"""The asynchronous gRPC serving model (the default): no thread per waiting call.

One ``grpc.aio`` server runs on an asyncio event loop in a thread of its own
(``AsyncListener``). A call's path::

    client ──HTTP/2──▶ grpc core ──▶ event loop thread
                                      │ 1. RequestContext (peer, client id)
                                      │ 2. limits: connection, queued requests/bytes
                                      │    (refused at once: RESOURCE_EXHAUSTED + code)
                                      ▼
                          storage executor (num.io.threads threads, bounded by
                          queued.max.requests): the blocking core call
                                      │
                   answered ◀─────────┤ or parked in a purgatory (broker.delayed):
                                      │ no thread; an append, the group fsync, the
                                      │ timer or the end of the call completes it,
                                      ▼ and ``call_soon_threadsafe`` resumes the handler
                                   response

A waiting call is a suspended coroutine and a few hundred bytes of parked operation, so
thousands of clients can hold a long poll or an idle stream each. Storage work (appends,
reads, admin calls) runs on the executor so that a slow disk never stalls the loop; the
``acks=all`` fsync runs on the group fsync thread (``broker.group_fsync``).

Streams: ``ProduceStream`` appends request N+1 while request N waits for its fsync (a
reader task appends and parks, the handler answers in order); ``FetchStream`` answers its
requests one after the other, each parked as long as it has to. The end of a call
(client gone, cancelled, keepalive failed) cancels the handler's task, whose ``finally``
cancels its parked operation.

Errors are rendered once per call, by ``_abort``, through ``broker.errors.to_wire``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer as AsyncHealthServicer
from grpc_reflection.v1alpha import reflection

from broker.context import RequestContext
from broker.core import BrokerCore
from broker.errors import ERROR_CODE_METADATA_KEY, to_wire
from broker.limits import Admission
from broker.produce import PartitionProduced, parse_acks
from broker.service import (
    BROKER_SERVICE_NAME,
    UNARY_HANDLERS,
    UnaryHandler,
    fetch_response,
    fetch_spec,
    message_types,
    produce_parts,
    produce_response,
    request_context,
    wait_cap_ms,
)
from proto.tidelog.v1 import broker_pb2 as pb

__all__ = ["AsyncListener"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_HEALTH_SERVICE_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
_PIPELINE_DEPTH = 8  # produce requests appended ahead of the one waiting for its fsync
_LOOP_CALL_TIMEOUT_S = 30.0


class _AsyncService:
    """The handlers, run on the event loop's thread only."""

    def __init__(
        self,
        core: BrokerCore,
        admission: Admission,
        executor: ThreadPoolExecutor,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._core = core
        self._metrics = core.metrics
        self._admission = admission
        self._executor = executor
        self._loop = loop

    def generic_handler(self) -> grpc.GenericRpcHandler:
        handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
        for name, handler in UNARY_HANDLERS.items():
            request_type, response_type = message_types(name)
            handlers[name] = grpc.unary_unary_rpc_method_handler(
                self._unary(name, handler),
                request_deserializer=request_type.FromString,
                response_serializer=response_type.SerializeToString,
            )
        handlers["Produce"] = grpc.unary_unary_rpc_method_handler(
            self.produce,
            request_deserializer=pb.ProduceRequest.FromString,
            response_serializer=pb.ProduceResponse.SerializeToString,
        )
        handlers["Fetch"] = grpc.unary_unary_rpc_method_handler(
            self.fetch,
            request_deserializer=pb.FetchRequest.FromString,
            response_serializer=pb.FetchResponse.SerializeToString,
        )
        handlers["ProduceStream"] = grpc.stream_stream_rpc_method_handler(
            self.produce_stream,
            request_deserializer=pb.ProduceRequest.FromString,
            response_serializer=pb.ProduceResponse.SerializeToString,
        )
        handlers["FetchStream"] = grpc.stream_stream_rpc_method_handler(
            self.fetch_stream,
            request_deserializer=pb.FetchRequest.FromString,
            response_serializer=pb.FetchResponse.SerializeToString,
        )
        return grpc.method_handlers_generic_handler(BROKER_SERVICE_NAME, handlers)

    # --- plumbing -----------------------------------------------------------------------

    def _open(self, context: aio.ServicerContext[Any, Any]) -> RequestContext:
        request = request_context(context.peer(), context.invocation_metadata())
        self._admission.open_call(request)
        return request

    async def _run(self, function: Callable[..., T], *args: Any) -> T:
        """Run blocking core work on the storage executor, within ``queued.max.requests``."""
        self._admission.admit_request()
        try:
            return await self._loop.run_in_executor(self._executor, function, *args)
        finally:
            self._admission.release_request()

    def _observe(self, method: str, code: str, started: float) -> None:
        self._metrics.observe_request(method, code, time.perf_counter() - started)

    async def _abort(
        self,
        context: aio.ServicerContext[Any, Any],
        method: str,
        exc: BaseException,
        started: float,
    ) -> None:
        """Render ``exc`` once: metrics, status, code metadata, safe message."""
        wire = to_wire(exc)
        self._observe(method, wire.code or wire.status.name, started)
        if wire.code is not None:
            context.set_trailing_metadata(((ERROR_CODE_METADATA_KEY, wire.code),))
        await context.abort(wire.status, wire.message)

    def _deliver_to(self, future: asyncio.Future[T]) -> Callable[[T], None]:
        """A callback any thread may call once to resolve ``future`` on the loop."""
        loop = self._loop

        def resolve(value: T) -> None:
            if not future.done():
                future.set_result(value)

        def deliver(value: T) -> None:
            try:
                loop.call_soon_threadsafe(resolve, value)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

        return deliver

    def _waker(self, event: asyncio.Event) -> Callable[[], None]:
        loop = self._loop

        def wake() -> None:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:
                pass

        return wake

    # --- unary --------------------------------------------------------------------------

    def _unary(
        self, name: str, handler: UnaryHandler
    ) -> Callable[[Any, aio.ServicerContext[Any, Any]], Awaitable[Any]]:
        async def serve(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
            started = time.perf_counter()
            try:
                caller = self._open(context)
            except Exception as exc:
                await self._abort(context, name, exc, started)
                return None
            try:
                answer = await self._run(handler, self._core, request, caller)
            except Exception as exc:
                await self._abort(context, name, exc, started)
                return None
            finally:
                self._admission.close_call(caller)
            self._observe(name, "OK", started)
            return answer

        return serve

    # --- produce ------------------------------------------------------------------------

    async def _produce_one(
        self, request: pb.ProduceRequest
    ) -> asyncio.Future[list[PartitionProduced]]:
        """Append (on the executor) and return the future of the answers."""
        acks = parse_acks(request.acks)
        appends = await self._run(self._core.append, produce_parts(request))
        answers: asyncio.Future[list[PartitionProduced]] = self._loop.create_future()
        self._core.complete(appends, acks, self._deliver_to(answers))
        return answers

    async def produce(
        self, request: pb.ProduceRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.ProduceResponse | None:
        started = time.perf_counter()
        size = _produce_bytes(request)
        caller: RequestContext | None = None
        admitted = False
        try:
            caller = self._open(context)
            self._admission.admit_bytes(size)
            admitted = True
            answers = await (await self._produce_one(request))
        except Exception as exc:
            await self._abort(context, "Produce", exc, started)
            return None
        finally:
            if admitted:
                self._admission.release_bytes(size)
            if caller is not None:
                self._admission.close_call(caller)
        self._observe("Produce", "OK", started)
        return produce_response(request.correlation_id, answers)

    async def produce_stream(
        self,
        request_iterator: AsyncIterator[pb.ProduceRequest],
        context: aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[pb.ProduceResponse]:
        started = time.perf_counter()
        try:
            caller = self._open(context)
        except Exception as exc:
            await self._abort(context, "ProduceStream", exc, started)
            return
        # Items: (correlation id, answers, bytes, started) | an error | None (the end).
        queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=_PIPELINE_DEPTH)
        in_flight = [0]  # bytes admitted and not yet released

        async def read() -> None:
            try:
                async for request in request_iterator:
                    begun = time.perf_counter()
                    size = _produce_bytes(request)
                    self._admission.admit_bytes(size)
                    in_flight[0] += size
                    answers = await self._produce_one(request)
                    await queue.put((request.correlation_id, answers, size, begun))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await queue.put(exc)
                return
            await queue.put(None)

        reader = asyncio.create_task(read())
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                if isinstance(item, Exception):
                    raise item
                correlation_id, future, size, begun = item
                try:
                    answers = await future
                finally:
                    self._admission.release_bytes(size)
                    in_flight[0] -= size
                self._observe("ProduceStream", "OK", begun)
                yield produce_response(correlation_id, answers)
        except Exception as exc:
            await self._abort(context, "ProduceStream", exc, started)
        finally:
            reader.cancel()
            if in_flight[0]:
                self._admission.release_bytes(in_flight[0])
            self._admission.close_call(caller)

    # --- fetch --------------------------------------------------------------------------

    async def _fetch_one(
        self, request: pb.FetchRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.FetchResponse:
        woken = asyncio.Event()
        pending = self._core.start_fetch(
            fetch_spec(request),
            wake=self._waker(woken),
            wait_cap_ms=wait_cap_ms(context.time_remaining()),
        )
        try:
            while True:
                woken.clear()
                answers = await self._run(self._core.step_fetch, pending)
                if answers is not None:
                    return fetch_response(request.correlation_id, answers)
                await woken.wait()  # parked: no thread waits, only this coroutine
        finally:
            # The call ended (this task is cancelled) or the fetch was answered.
            self._core.cancel_fetch(pending)

    async def fetch(
        self, request: pb.FetchRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.FetchResponse | None:
        started = time.perf_counter()
        caller: RequestContext | None = None
        try:
            caller = self._open(context)
            answer = await self._fetch_one(request, context)
        except Exception as exc:
            await self._abort(context, "Fetch", exc, started)
            return None
        finally:
            if caller is not None:
                self._admission.close_call(caller)
        self._observe("Fetch", "OK", started)
        return answer

    async def fetch_stream(
        self,
        request_iterator: AsyncIterator[pb.FetchRequest],
        context: aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[pb.FetchResponse]:
        started = time.perf_counter()
        try:
            caller = self._open(context)
        except Exception as exc:
            await self._abort(context, "FetchStream", exc, started)
            return
        try:
            async for request in request_iterator:
                started = time.perf_counter()
                answer = await self._fetch_one(request, context)
                self._observe("FetchStream", "OK", started)
                yield answer
        except Exception as exc:
            await self._abort(context, "FetchStream", exc, started)
        finally:
            self._admission.close_call(caller)


def _produce_bytes(request: pb.ProduceRequest) -> int:
    return sum(len(p.records) for t in request.topics for p in t.partitions)


class AsyncListener:
    """A ``grpc.aio`` server on an event loop thread of its own. Thread-safe: every
    method hands its work to the loop and waits for it.

    Build with ``start``; ``stop`` once.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        thread: threading.Thread,
        server: aio.Server,
        health: AsyncHealthServicer,
        executor: ThreadPoolExecutor,
        port: int,
    ) -> None:
        self._loop = loop
        self._thread = thread
        self._server = server
        self._health = health
        self._executor = executor
        self.port = port

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
    ) -> AsyncListener:
        """Start the loop thread and the server on ``address``.

        Raises:
            ListenError (from ``bind``): the address cannot be bound.
        """
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="tidelog-grpc-loop", daemon=True)
        thread.start()
        executor = ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix="tidelog-io")

        async def build() -> tuple[aio.Server, AsyncHealthServicer, int]:
            server = aio.server(options=options)
            service = _AsyncService(core, admission, executor, loop)
            server.add_generic_rpc_handlers((service.generic_handler(),))
            health = AsyncHealthServicer()
            health_pb2_grpc.add_HealthServicer_to_server(health, server)
            reflection.enable_server_reflection(
                (BROKER_SERVICE_NAME, _HEALTH_SERVICE_NAME, reflection.SERVICE_NAME), server
            )
            try:
                port = bind(server, address)
                await server.start()
            except BaseException:
                await server.stop(None)
                raise
            for name in ("", BROKER_SERVICE_NAME):
                await health.set(name, health_pb2.HealthCheckResponse.SERVING)
            return server, health, port

        try:
            server, health, port = asyncio.run_coroutine_threadsafe(build(), loop).result(
                _LOOP_CALL_TIMEOUT_S
            )
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)
            executor.shutdown(wait=False)
            raise
        return cls(loop, thread, server, health, executor, port)

    def enter_graceful_shutdown(self) -> None:
        """Health reports ``NOT_SERVING`` from now on."""
        asyncio.run_coroutine_threadsafe(self._health.enter_graceful_shutdown(), self._loop).result(
            _LOOP_CALL_TIMEOUT_S
        )

    def stop(self, grace_ms: int, margin_ms: int) -> bool:
        """Stop accepting calls, give those in flight ``grace_ms``, then stop the loop.

        Returns False if the server did not stop within grace + margin.
        """
        future = asyncio.run_coroutine_threadsafe(self._server.stop(grace_ms / 1000.0), self._loop)
        try:
            future.result((grace_ms + margin_ms) / 1000.0)
            stopped = True
        except TimeoutError:
            stopped = False
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self._loop.close()
        self._executor.shutdown(wait=False)
        return stopped
