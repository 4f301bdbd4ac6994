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
reader task, an appender task that appends whatever arrived in one executor job, the
handler answering in order); ``FetchStream`` answers its
requests one after the other, each parked as long as it has to. The end of a call
(client gone, cancelled, keepalive failed) cancels the handler's task, whose ``finally``
cancels its parked operation.

Quotas (``broker.quotas``): storage time is counted against the caller's
``request_percentage``, produced and fetched bytes against its byte rates; a caller over
a quota is held back for the throttle time, reported as ``throttle_time_ms`` in produce
and fetch answers: a produce stream is not read for as long (Kafka mutes the channel),
a fetch or unary answer is delayed by it.

Errors are rendered once per call, by ``_abort``, through ``broker.errors.to_wire``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
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
from broker.produce import Acks, PartitionProduced, parse_acks
from broker.quotas import CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE, REQUEST_PERCENTAGE
from broker.service import (
    BROKER_SERVICE_NAME,
    UnaryHandler,
    fetch_response,
    fetch_spec,
    generic_handler,
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
_PIPELINE_DEPTH = 8  # unanswered requests a produce stream takes in before it stops reading
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
        self._quotas = core.quotas
        self._admission = admission
        self._executor = executor
        self._loop = loop

    def generic_handler(self) -> grpc.GenericRpcHandler:
        return generic_handler(
            self._unary,
            self.produce,
            self.fetch,
            self.produce_stream,
            self.fetch_stream,
            max_request_entries=self._core.config.max_request_partition_size_limit,
        )

    # --- plumbing -----------------------------------------------------------------------

    def _open(self, context: aio.ServicerContext[Any, Any]) -> RequestContext:
        request = request_context(context.peer(), context.invocation_metadata())
        self._admission.open_call(request)
        return request

    async def _run(
        self, caller: RequestContext, function: Callable[..., T], *args: Any
    ) -> tuple[T, int]:
        """Run blocking core work on the storage executor, within ``queued.max.requests``;
        returns its result and the throttle time the caller's ``request_percentage``
        quota asks for (0 without one)."""
        self._admission.admit_request(caller)
        try:
            result, busy_s = await self._loop.run_in_executor(
                self._executor, _timed, function, *args
            )
        finally:
            self._admission.release_request()
        # request_percentage: storage-thread time, in percent of one thread per second.
        return result, self._quotas.record(caller.client_id, REQUEST_PERCENTAGE, busy_s * 100)

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
        loop_thread = threading.get_ident()  # built on the loop's thread

        def resolve(value: T) -> None:
            if not future.done():
                future.set_result(value)

        def deliver(value: T) -> None:
            if threading.get_ident() == loop_thread:
                # Delivered on the loop's own thread: no wake-up of the loop needed
                # (call_soon_threadsafe writes to its self-pipe, a syscall per answer).
                resolve(value)
                return
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
                answer, throttle_ms = await self._run(caller, handler, self._core, request, caller)
                await _hold_back(throttle_ms)
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
        self, caller: RequestContext, request: pb.ProduceRequest, size: int
    ) -> tuple[asyncio.Future[list[PartitionProduced]], int]:
        """Append (on the executor); the future of the answers and the throttle time."""
        received_ms = self._core.wall_ms()  # the request's received time, on arrival
        acks = parse_acks(request.acks)
        answers: asyncio.Future[list[PartitionProduced]] = self._loop.create_future()
        _, throttle_ms = await self._run(
            caller,
            _append_each,
            self._core,
            [(request, received_ms, acks, self._deliver_to(answers))],
        )
        bytes_throttle_ms = self._quotas.record(caller.client_id, PRODUCER_BYTE_RATE, size)
        return answers, max(throttle_ms, bytes_throttle_ms)

    async def produce(
        self, request: pb.ProduceRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.ProduceResponse | None:
        started = time.perf_counter()
        size = _produce_bytes(request)
        caller: RequestContext | None = None
        admitted = False
        try:
            caller = self._open(context)
            self._admission.admit_bytes(size, caller)
            admitted = True
            future, throttle_ms = await self._produce_one(caller, request, size)
            answers = await future
            await _hold_back(throttle_ms)
        except Exception as exc:
            await self._abort(context, "Produce", exc, started)
            return None
        finally:
            if admitted:
                self._admission.release_bytes(size)
            if caller is not None:
                self._admission.close_call(caller)
        self._observe("Produce", "OK", started)
        return produce_response(request.correlation_id, answers, throttle_ms)

    async def produce_stream(
        self,
        request_iterator: AsyncIterator[pb.ProduceRequest],
        context: aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[pb.ProduceResponse]:
        """Three stages, in request order: a reader task takes requests off the stream
        (at most ``_PIPELINE_DEPTH`` unanswered), an appender task appends every request
        that arrived while its previous append ran in one executor job (one thread
        hand-off for several requests under load: measured, the hand-off is most of the
        broker's cost per small request), and this generator answers each once durable
        per its ``acks``."""
        started = time.perf_counter()
        try:
            caller = self._open(context)
        except Exception as exc:
            await self._abort(context, "ProduceStream", exc, started)
            return
        slots = asyncio.Semaphore(_PIPELINE_DEPTH)
        # _Incoming requests, then None (the stream ended) or the error that ended it.
        pending: list[Any] = []
        arrived = asyncio.Event()
        # (_Incoming, answers future, throttle ms) | None | an error, in request order.
        answers: asyncio.Queue[Any] = asyncio.Queue()
        in_flight = [0]  # bytes admitted and not yet released
        muted_until = [0.0]  # loop time before which the stream is not read (quota)
        loop = self._loop

        async def read() -> None:
            end: Exception | None = None
            try:
                async for request in request_iterator:
                    received_ms = self._core.wall_ms()  # before any wait for a slot
                    await slots.acquire()
                    acks = parse_acks(request.acks)
                    size = _produce_bytes(request)
                    self._admission.admit_bytes(size, caller)
                    in_flight[0] += size
                    # The byte rate is counted here, not after the append, so the mute
                    # below applies before the next request is read.
                    throttle_ms = self._quotas.record(caller.client_id, PRODUCER_BYTE_RATE, size)
                    if throttle_ms:
                        muted_until[0] = max(muted_until[0], loop.time() + throttle_ms / 1e3)
                    pending.append(
                        _Incoming(
                            request, acks, size, time.perf_counter(), throttle_ms, received_ms
                        )
                    )
                    arrived.set()
                    # Over a quota: read nothing more from this client for the throttle
                    # time (Kafka mutes the channel); the answers go out at once, with
                    # the time in throttle_time_ms.
                    delay = muted_until[0] - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                end = exc
            pending.append(end)
            arrived.set()

        async def append() -> None:
            while True:
                await arrived.wait()
                arrived.clear()
                batch = pending.copy()
                pending.clear()
                incoming = [item for item in batch if isinstance(item, _Incoming)]
                futures: list[asyncio.Future[list[PartitionProduced]]] = [
                    loop.create_future() for _ in incoming
                ]
                throttle_ms = 0
                if incoming:
                    work = [
                        (item.request, item.received_ms, item.acks, self._deliver_to(future))
                        for item, future in zip(incoming, futures, strict=True)
                    ]
                    try:
                        _, throttle_ms = await self._run(caller, _append_each, self._core, work)
                    except Exception as exc:
                        await answers.put(exc)
                        return
                pending_futures = iter(futures)
                for item in batch:
                    if not isinstance(item, _Incoming):
                        await answers.put(item)  # None or the reader's error: the end
                        return
                    future = next(pending_futures)
                    # request_percentage: the batch's storage time, counted after it.
                    if throttle_ms:
                        muted_until[0] = max(muted_until[0], loop.time() + throttle_ms / 1e3)
                    await answers.put((item, future, max(throttle_ms, item.throttle_ms)))

        tasks = [asyncio.create_task(read()), asyncio.create_task(append())]
        try:
            while True:
                entry = await answers.get()
                if entry is None:
                    break
                if isinstance(entry, Exception):
                    raise entry
                item, future, throttle_ms = entry
                try:
                    produced = await future
                finally:
                    self._admission.release_bytes(item.size)
                    in_flight[0] -= item.size
                self._observe("ProduceStream", "OK", item.started)
                yield produce_response(item.request.correlation_id, produced, throttle_ms)
                slots.release()
        except Exception as exc:
            await self._abort(context, "ProduceStream", exc, started)
        finally:
            for task in tasks:
                task.cancel()
            if in_flight[0]:
                self._admission.release_bytes(in_flight[0])
            self._admission.close_call(caller)

    # --- fetch --------------------------------------------------------------------------

    async def _fetch_one(
        self,
        caller: RequestContext,
        request: pb.FetchRequest,
        context: aio.ServicerContext[Any, Any],
    ) -> pb.FetchResponse:
        woken = asyncio.Event()
        pending = self._core.start_fetch(
            fetch_spec(request),
            wake=self._waker(woken),
            wait_cap_ms=wait_cap_ms(context.time_remaining()),
        )
        throttle_ms = 0
        try:
            while True:
                woken.clear()
                answers, step_throttle_ms = await self._run(caller, self._core.step_fetch, pending)
                throttle_ms = max(throttle_ms, step_throttle_ms)
                if answers is not None:
                    break
                await woken.wait()  # parked: no thread waits, only this coroutine
        finally:
            # The call ended (this task is cancelled) or the fetch was answered.
            self._core.cancel_fetch(pending)
        size = sum(len(a.records) for a in answers)
        if size:
            bytes_throttle_ms = self._quotas.record(caller.client_id, CONSUMER_BYTE_RATE, size)
            throttle_ms = max(throttle_ms, bytes_throttle_ms)
        await _hold_back(throttle_ms)
        return fetch_response(request.correlation_id, answers, throttle_ms)

    async def fetch(
        self, request: pb.FetchRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.FetchResponse | None:
        started = time.perf_counter()
        caller: RequestContext | None = None
        try:
            caller = self._open(context)
            answer = await self._fetch_one(caller, request, context)
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
                answer = await self._fetch_one(caller, request, context)
                self._observe("FetchStream", "OK", started)
                yield answer
        except Exception as exc:
            await self._abort(context, "FetchStream", exc, started)
        finally:
            self._admission.close_call(caller)


def _timed(function: Callable[..., T], *args: Any) -> tuple[T, float]:
    """``function(*args)`` and the seconds it took (on the executor's thread)."""
    started = time.perf_counter()
    result = function(*args)
    return result, time.perf_counter() - started


async def _hold_back(throttle_ms: int) -> None:
    """Wait out a quota's throttle time without holding a thread."""
    if throttle_ms > 0:
        await asyncio.sleep(throttle_ms / 1000.0)


@dataclass(frozen=True, slots=True)
class _Incoming:
    """A produce request taken off a stream, admitted, not yet appended."""

    request: pb.ProduceRequest
    acks: Acks
    size: int
    started: float
    throttle_ms: int  # of the producer byte rate, counted when read
    received_ms: int  # the broker's wall clock when it was read (its received time)


def _append_each(
    core: BrokerCore,
    work: list[tuple[pb.ProduceRequest, int, Acks, Callable[[list[PartitionProduced]], None]]],
) -> None:
    """Append several requests in one executor job, in order, and hand each to
    ``complete`` right there, so an ``acks=all`` fsync is asked for before the event loop
    even hears of the append. An append never raises for a partition's fault (each answer
    carries its own); one that raises (shutdown) fails the whole job."""
    for request, received_ms, acks, deliver in work:
        core.complete(core.append(produce_parts(request, received_ms)), acks, deliver)


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
