"""The asynchronous gRPC serving model (the default): no thread per waiting call.

One ``grpc.aio`` server runs on an asyncio event loop in a thread of its own
(``AsyncListener``). A call's path::

    client ──HTTP/2──▶ grpc core ──▶ event loop thread
                                      │ 1. RequestContext (peer, client id)
                                      │ 2. limits: connection, queued requests/bytes
                                      │    (refused at once: RESOURCE_EXHAUSTED + code)
                                      ▼
                          storage executor (num.io.threads threads, bounded by
                          queued.max.requests): the blocking core call (a fetch whose
                          answer holds at most 2 MiB is read on the loop's thread)
                                      │
                   answered ◀─────────┤ or parked in a purgatory (broker.core.delayed):
                                      │ no thread; an append, the group fsync, the
                                      │ timer or the end of the call completes it,
                                      ▼ and the ``LoopBridge`` resumes the handler
                                   response

A waiting call is a suspended coroutine and a few hundred bytes of parked operation, so
thousands of clients can hold a long poll or an idle stream each. Storage work (appends,
reads, admin calls) runs on the executor so that a slow disk never stalls the loop; the
``acks=all`` fsync runs on the group fsync thread (``broker.core.group_fsync``).

Streams: ``ProduceStream`` appends request N+1 while request N waits for its fsync (a
reader task that hands whatever arrived during the previous append to the executor in one
job, the job's end a callback on the loop, the handler answering in order);
``FetchStream`` answers its requests one after the other, each parked as long as it has
to; ``ShareFetchStream`` likewise (``broker.grpc.share_stream``). The end of a call
(client gone, cancelled, keepalive failed) cancels the handler's task, whose ``finally``
cancels its parked operation. When the broker stops (``AsyncListener.stop``), every
produce stream reads no more requests, answers those it read (an ``acks=all`` one once
durable, or ``NOT_LEADER_OR_FOLLOWER`` from a leadership the stop resigned) and ends
``UNAVAILABLE`` (retriable: the client sends what was unanswered elsewhere): a producer's
stream stays open between sends, and an open one held grpc's stop for the whole
``shutdown.grace.ms`` (issue #29). A fetch stream waiting for its client's next request
still does (left for later: its parked fetches are answered at once by the core's
``begin_close``, and the next request is refused).

Quotas (``broker.core.quotas``): storage time is counted against the caller's
``request_percentage``, produced and fetched bytes against its byte rates; a caller over
a quota is held back for the throttle time, reported as ``throttle_time_ms`` in produce
and fetch answers: a produce stream is not read for as long (Kafka mutes the channel),
a fetch or unary answer is delayed by it.

Every call runs through the listener's ``RequestPipeline`` (``broker.core.pipeline``): a unary
call through ``serve`` (authorize on the policy table, the core call on the executor,
metrics, classification); the data path through the driver's ``run``/``run_inline`` (the
core call and its quota), ``finish``/``fail`` (metrics, classification) and its
``LoopBridge`` (the one hand-off back to the loop), keeping its own batching. Errors are
classified once per call by the driver and rendered by ``_render`` (``broker.grpc.errors``).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer as AsyncHealthServicer
from grpc_reflection.v1alpha import reflection

from tidelog.broker.core.context import RequestContext
from tidelog.broker.core.errors import Outcome, ShuttingDownError
from tidelog.broker.core.facade import BrokerCore
from tidelog.broker.core.fetch import DEFAULT_PARTITION_MAX_BYTES, PartitionFetched, PendingFetch
from tidelog.broker.core.fetch_sessions import FetchSessionCache, SessionError, answered
from tidelog.broker.core.limits import Admission
from tidelog.broker.core.operations import GRPC_METHOD_OPERATIONS, record_quota
from tidelog.broker.core.pipeline import RequestPipeline
from tidelog.broker.core.produce import Acks, PartitionProduced, parse_acks
from tidelog.broker.core.quotas import CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE
from tidelog.broker.grpc.append_job import AppendJob, produce_bytes
from tidelog.broker.grpc.authorize import resources_of
from tidelog.broker.grpc.data_service import (
    fetch_response,
    fetch_spec,
    produce_response,
    session_fetch,
)
from tidelog.broker.grpc.errors import ERROR_CODE_METADATA_KEY, render
from tidelog.broker.grpc.service import (
    BROKER_SERVICE_NAME,
    UnaryHandler,
    call_context,
    generic_handler,
    wait_cap_ms,
)
from tidelog.broker.grpc.share_stream import ShareFetchStreams
from tidelog.broker.loop_watchdog import LoopWatchdog, thread_stacks
from tidelog.proto.tidelog.v1 import broker_pb2 as pb

__all__ = ["AsyncListener"]

log = logging.getLogger(__name__)


T = TypeVar("T")

_HEALTH_SERVICE_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
_PIPELINE_DEPTH = 8  # unanswered requests a produce stream takes in before it stops reading
_LOOP_CALL_TIMEOUT_S = 30.0
# A fetch whose answer holds at most this many bytes is read on the event loop's thread,
# not on the storage executor. A read takes no lock (``PartitionLog.read``: the partition
# lock is held across appends, rolls and directory fsyncs, which a loaded disk stretches to
# seconds, and a read waiting for it would stall every call) and copies from the page cache:
# ~0.1-0.3 ms for 1 MiB here, less than the two thread hand-offs of the executor (each
# a wake-up, a GIL hand-over and, on a busy machine, a wait for a CPU: measured, a single
# consumer's throughput fell to 0.55-0.7 of the threaded model's under load). Kafka makes
# the same choice: its network threads copy fetched bytes from the page cache (sendfile).
# The cost is the same as Kafka's too: a read of data no longer in the page cache stalls
# the loop for the disk read. Larger fetches (many partitions) go to the executor.
_INLINE_READ_MAX_BYTES = 2 * DEFAULT_PARTITION_MAX_BYTES


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
        self._quotas = core.quotas
        self._admission = admission
        self._executor = executor
        self._loop = loop
        self._pipeline = RequestPipeline(
            listener="grpc",
            acls=core.acls,
            quotas=core.quotas,
            metrics=core.metrics,
            admission=admission,
            executor=executor,
            loop=loop,
            rpc_metrics=True,  # the older tidelog_requests_total, for existing dashboards
        )
        self._bridge = self._pipeline.bridge
        # Followers' incremental fetch sessions (KIP-227; loop's thread only).
        config = core.config
        self._fetch_sessions = FetchSessionCache(
            config.max_incremental_fetch_session_cache_slots,
            config.min_incremental_fetch_session_eviction_ms,
            lambda: int(time.monotonic() * 1000),
        )
        # What ends each open produce stream when the broker stops (``end_streams``).
        self._stream_enders: set[Callable[[], None]] = set()
        self._closing = False
        self._calls: dict[int, str] = {}  # open calls: id of their context -> method
        self._share_streams = ShareFetchStreams(
            self._pipeline,
            self._open,
            self._close,
            self._call,
            _render,
            self._stream_enders,
            lambda: self._closing,
        )

    def end_streams(self) -> None:
        """The broker is stopping: every open produce (and share fetch) stream reads no
        more requests, answers what it read and ends ``UNAVAILABLE``; one opened later
        ends at once."""
        self._closing = True
        for end in list(self._stream_enders):
            end()

    def generic_handler(self) -> grpc.GenericRpcHandler:
        return generic_handler(
            self._unary,
            self.produce,
            self.fetch,
            self.produce_stream,
            self.fetch_stream,
            share_fetch_stream=self._share_streams.serve,
            max_request_entries=self._core.config.max_request_partition_size_limit,
        )

    # --- plumbing -----------------------------------------------------------------------

    def _open(self, context: aio.ServicerContext[Any, Any], method: str) -> RequestContext:
        request = call_context(self._core, context, method)
        self._admission.open_call(request)
        self._calls[id(request)] = method
        return request

    def _close(self, caller: RequestContext) -> None:
        """The call opened by ``_open`` ended."""
        self._calls.pop(id(caller), None)
        self._admission.close_call(caller)

    def calls_in_flight(self) -> dict[str, int]:
        """Open calls by method (what holds a graceful stop, when one does)."""
        return dict(collections.Counter(self._calls.values()))

    async def _run(
        self, caller: RequestContext, function: Callable[..., T], *args: Any
    ) -> tuple[T, int]:
        """The pipeline's core step: ``function(*args)`` on the storage executor within
        ``queued.max.requests`` (refused past it); its result and the
        ``request_percentage`` throttle time."""
        return await self._pipeline.run(caller, function, *args)

    def _observe(self, method: str, code: str, started: float) -> None:
        # Every method has an operation (tests/broker/parity/test_tables.py).
        operation = GRPC_METHOD_OPERATIONS.get(method, method)
        self._pipeline.finish(method, operation, code, started)

    async def _abort(
        self,
        context: aio.ServicerContext[Any, Any],
        method: str,
        exc: BaseException,
        started: float,
    ) -> None:
        """Classify and count ``exc`` once (the pipeline), then render it."""
        operation = GRPC_METHOD_OPERATIONS.get(method, method)
        await _render(context, self._pipeline.fail(method, operation, exc, started))

    # --- unary --------------------------------------------------------------------------

    def _unary(
        self, name: str, handler: UnaryHandler
    ) -> Callable[[Any, aio.ServicerContext[Any, Any]], Awaitable[Any]]:
        operation = GRPC_METHOD_OPERATIONS[name]

        async def serve(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
            started = time.perf_counter()
            try:
                caller = self._open(context, name)
            except Exception as exc:
                await self._abort(context, name, exc, started)
                return None
            try:
                result = await self._pipeline.serve(
                    caller,
                    name,
                    operation,
                    lambda: self._call(caller, handler, request),
                    resources=lambda: resources_of(name, request),
                )
            finally:
                self._close(caller)
            if result.error is not None:
                await _render(context, result.error)
                return None
            return result.value

        return serve

    async def _call(self, caller: RequestContext, handler: UnaryHandler, request: Any) -> Any:
        """A unary call's core step: the handler on the executor, then its throttle."""
        answer, throttle_ms = await self._run(caller, handler, self._core, request, caller)
        await _hold_back(throttle_ms)
        return answer

    # --- produce ------------------------------------------------------------------------

    async def _produce_one(
        self, caller: RequestContext, request: pb.ProduceRequest, size: int
    ) -> tuple[asyncio.Future[list[PartitionProduced]], int]:
        """Append (on the executor); the future of the answers and the throttle time."""
        received_ms = self._core.wall_ms()  # the request's received time, on arrival
        job = AppendJob(
            self._core,
            self._bridge,
            [(request, received_ms, parse_acks(request.acks))],
            [self._loop.create_future()],
            caller,
        )
        _, throttle_ms = await self._run(caller, job.run)
        job.resolve_early()
        bytes_throttle_ms = record_quota(self._quotas, caller, PRODUCER_BYTE_RATE, size)
        return job.futures[0], max(throttle_ms, bytes_throttle_ms)

    async def produce(
        self, request: pb.ProduceRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.ProduceResponse | None:
        started = time.perf_counter()
        try:
            caller = self._open(context, "Produce")
        except Exception as exc:
            await self._abort(context, "Produce", exc, started)
            return None
        try:
            served = await self._pipeline.serve(
                caller, "Produce", "produce", lambda: self._produce_call(caller, request)
            )
        finally:
            self._close(caller)
        if served.error is not None:
            await _render(context, served.error)
            return None
        return served.value

    async def _produce_call(
        self, caller: RequestContext, request: pb.ProduceRequest
    ) -> pb.ProduceResponse:
        """A unary produce's core step: queued bytes, the append, the answer once durable
        per its acks, the throttle. Partitions the caller may not WRITE are refused in the
        answer (``produce_parts``), so the pipeline gets no resources to refuse."""
        size = produce_bytes(request)
        self._admission.admit_bytes(size, caller)
        try:
            future, throttle_ms = await self._produce_one(caller, request, size)
            answers = await future
            await _hold_back(throttle_ms)
        finally:
            self._admission.release_bytes(size)
        return produce_response(request.correlation_id, answers, throttle_ms)

    async def produce_stream(
        self,
        request_iterator: AsyncIterator[pb.ProduceRequest],
        context: aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[pb.ProduceResponse]:
        """Two stages, in request order: a reader task takes requests off the stream (at
        most ``_PIPELINE_DEPTH`` unanswered) and appends them on the storage executor,
        every request that arrived while the previous append job ran in one job (one
        thread hand-off for several requests under load: measured, the hand-off is most
        of the broker's cost per small request); this generator answers each once durable
        per its ``acks``. The end of a job is a callback on the loop that sets the answers
        the job delivered and starts the next job, so no task waits for the executor."""
        started = time.perf_counter()
        try:
            caller = self._open(context, "ProduceStream")
        except Exception as exc:
            await self._abort(context, "ProduceStream", exc, started)
            return
        loop = self._loop
        bridge = self._bridge
        slots = asyncio.Semaphore(_PIPELINE_DEPTH)
        # Every _Incoming in request order, then None (the stream ended) or the error
        # that ended it.
        answers: asyncio.Queue[_Incoming | Exception | None] = asyncio.Queue()
        waiting: list[_Incoming] = []  # read, not yet handed to a job
        state = _StreamState()

        def start_job() -> None:
            # On the loop: everything read so far, in one executor job.
            batch = waiting.copy()
            waiting.clear()
            job = AppendJob(
                self._core,
                bridge,
                [(item.request, item.received_ms, item.acks) for item in batch],
                [item.answer for item in batch],
                caller,
            )
            try:
                self._admission.admit_request(caller)
            except Exception as exc:
                _fail(batch, exc)
                state.ended = True
                return
            try:
                work = self._executor.submit(_timed, job.run)
            except RuntimeError as exc:  # the executor is shut down: the broker stops
                self._admission.release_request()
                _fail(batch, exc)
                state.ended = True
                return
            state.running = True
            work.add_done_callback(lambda done: bridge.post(finish_job, done, job, batch))

        def finish_job(
            done: Future[tuple[None, float]], job: AppendJob, batch: list[_Incoming]
        ) -> None:
            # On the loop, once the job has run.
            self._admission.release_request()
            state.running = False
            try:
                _, busy_s = done.result()
            except Exception as exc:  # shutdown: the stream ends with it
                _fail(batch, exc)
                state.ended = True
                return
            # request_percentage: the batch's storage time, counted after it.
            throttle_ms = self._pipeline.meter_busy(caller, busy_s)
            if throttle_ms:
                state.muted_until = max(state.muted_until, loop.time() + throttle_ms / 1e3)
                for item in batch:
                    item.throttle_ms = max(item.throttle_ms, throttle_ms)
            job.resolve_early()
            if waiting and not state.ended:
                start_job()

        async def read() -> None:
            end: Exception | None = None
            try:
                async for request in request_iterator:
                    received_ms = self._core.wall_ms()  # before any wait for a slot
                    await slots.acquire()
                    acks = parse_acks(request.acks)
                    size = produce_bytes(request)
                    self._admission.admit_bytes(size, caller)
                    state.in_flight_bytes += size
                    # The byte rate is counted here, not after the append, so the mute
                    # below applies before the next request is read.
                    throttle_ms = record_quota(self._quotas, caller, PRODUCER_BYTE_RATE, size)
                    if throttle_ms:
                        state.muted_until = max(state.muted_until, loop.time() + throttle_ms / 1e3)
                    item = _Incoming(
                        request,
                        acks,
                        size,
                        time.perf_counter(),
                        throttle_ms,
                        received_ms,
                        loop.create_future(),
                    )
                    answers.put_nowait(item)
                    waiting.append(item)
                    if not state.running and not state.ended:
                        start_job()
                    # Over a quota: read nothing more from this client for the throttle
                    # time (Kafka mutes the channel); the answers go out at once, with
                    # the time in throttle_time_ms.
                    delay = state.muted_until - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                end = exc
            answers.put_nowait(end)

        reader = asyncio.create_task(read())

        def end_on_close() -> None:
            # A request read but not yet queued is dropped unanswered: nothing of it was
            # appended, and the stream's error fails it on the client (retriable).
            if not reader.done():
                reader.cancel()
                answers.put_nowait(ShuttingDownError("the broker is shutting down"))

        self._stream_enders.add(end_on_close)
        if self._closing:
            end_on_close()
        try:
            while True:
                entry = await answers.get()
                if entry is None:
                    break
                if isinstance(entry, Exception):
                    raise entry
                try:
                    produced = await entry.answer
                finally:
                    self._admission.release_bytes(entry.size)
                    state.in_flight_bytes -= entry.size
                self._observe("ProduceStream", "OK", entry.started)
                yield produce_response(entry.request.correlation_id, produced, entry.throttle_ms)
                slots.release()
        except Exception as exc:
            await self._abort(context, "ProduceStream", exc, started)
        finally:
            self._stream_enders.discard(end_on_close)
            state.ended = True
            reader.cancel()
            if state.in_flight_bytes:
                self._admission.release_bytes(state.in_flight_bytes)
            self._close(caller)

    # --- fetch --------------------------------------------------------------------------

    async def _fetch_one(
        self,
        caller: RequestContext,
        request: pb.FetchRequest,
        context: aio.ServicerContext[Any, Any],
    ) -> bytes:
        woken = asyncio.Event()
        acls = self._core.acls
        try:
            spec, session, incremental = session_fetch(
                request, fetch_spec(request, caller, acls), self._fetch_sessions, caller, acls
            )
        except SessionError as exc:
            return pb.FetchResponse(
                correlation_id=request.correlation_id, error_code=exc.code, error_message=str(exc)
            ).SerializeToString()
        pending = self._core.start_fetch(
            spec,
            wake=self._bridge.waker(woken),
            wait_cap_ms=wait_cap_ms(context.time_remaining()),
        )
        throttle_ms = 0
        # A session's answer may hold partitions the request does not name: only its
        # max_bytes bounds it then.
        most = _answer_bytes_at_most(request) if session is None else request.max_bytes or 1 << 62
        inline = most <= _INLINE_READ_MAX_BYTES
        try:
            while True:
                woken.clear()
                if inline:
                    answers, step_throttle_ms = self._step_inline(caller, pending)
                else:
                    answers, step_throttle_ms = await self._run(
                        caller, self._core.step_fetch, pending
                    )
                throttle_ms = max(throttle_ms, step_throttle_ms)
                if answers is not None:
                    break
                await woken.wait()  # parked: no thread waits, only this coroutine
        finally:
            # The call ended (this task is cancelled) or the fetch was answered.
            self._core.cancel_fetch(pending)
        size = sum(len(a.records) for a in answers)
        if size:
            bytes_throttle_ms = record_quota(self._quotas, caller, CONSUMER_BYTE_RATE, size)
            throttle_ms = max(throttle_ms, bytes_throttle_ms)
        await _hold_back(throttle_ms)
        return fetch_response(
            request.correlation_id,
            answered(session, answers, incremental),
            throttle_ms,
            0 if session is None else session.session_id,
        )

    def _step_inline(
        self, caller: RequestContext, pending: PendingFetch
    ) -> tuple[list[PartitionFetched] | None, int]:
        """``step_fetch`` on the loop's own thread: what ``_run`` does, without the two
        thread hand-offs (see ``_INLINE_READ_MAX_BYTES``)."""
        return self._pipeline.run_inline(caller, self._core.step_fetch, pending)

    async def fetch(
        self, request: pb.FetchRequest, context: aio.ServicerContext[Any, Any]
    ) -> bytes | None:
        started = time.perf_counter()
        try:
            caller = self._open(context, "Fetch")
        except Exception as exc:
            await self._abort(context, "Fetch", exc, started)
            return None
        try:
            served = await self._pipeline.serve(
                caller, "Fetch", "fetch", lambda: self._fetch_one(caller, request, context)
            )
        finally:
            self._close(caller)
        if served.error is not None:
            await _render(context, served.error)
            return None
        return served.value

    async def fetch_stream(
        self,
        request_iterator: AsyncIterator[pb.FetchRequest],
        context: aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[bytes]:
        started = time.perf_counter()
        try:
            caller = self._open(context, "FetchStream")
        except Exception as exc:
            await self._abort(context, "FetchStream", exc, started)
            return
        error: Outcome | None = None
        try:
            async for request in request_iterator:
                started = time.perf_counter()
                served = await self._pipeline.serve(
                    caller,
                    "FetchStream",
                    "fetch",
                    functools.partial(self._fetch_one, caller, request, context),
                )
                if served.error is not None:
                    error = served.error
                    break
                assert served.value is not None
                yield served.value
        except Exception as exc:  # the stream itself (a body that does not parse)
            error = self._pipeline.fail("FetchStream", "fetch", exc, started)
        finally:
            self._close(caller)
        if error is not None:  # rendered outside the try: abort raises
            await _render(context, error)


def _answer_bytes_at_most(request: pb.FetchRequest) -> int:
    """The most record bytes a fetch answer can hold, from the request's own limits (the
    broker's ``fetch.max.bytes`` only lowers it; a first batch larger than every limit,
    which is returned whole, is bounded by ``message.max.bytes``)."""
    total = sum(p.partition_max_bytes or DEFAULT_PARTITION_MAX_BYTES for p in request.partitions)
    return min(total, request.max_bytes) if request.max_bytes > 0 else total


def _timed(function: Callable[..., T], *args: Any) -> tuple[T, float]:
    """``function(*args)`` and the seconds it took (on the executor's thread)."""
    started = time.perf_counter()
    result = function(*args)
    return result, time.perf_counter() - started


async def _render(context: aio.ServicerContext[Any, Any], outcome: Outcome) -> None:
    """End the call with a classified error: status, code metadata, safe message."""
    wire = render(outcome)
    if wire.code is not None:
        context.set_trailing_metadata(((ERROR_CODE_METADATA_KEY, wire.code),))
    await context.abort(wire.status, wire.message)


async def _hold_back(throttle_ms: int) -> None:
    """Wait out a quota's throttle time without holding a thread."""
    if throttle_ms > 0:
        await asyncio.sleep(throttle_ms / 1000.0)


@dataclass(slots=True)
class _Incoming:
    """A produce request taken off a stream and admitted, until answered. Loop only."""

    request: pb.ProduceRequest
    acks: Acks
    size: int
    started: float
    # The producer byte rate's, counted when read; raised to the request_percentage
    # throttle of its append job when that ends.
    throttle_ms: int
    received_ms: int  # the broker's wall clock when it was read (its received time)
    answer: asyncio.Future[list[PartitionProduced]]


@dataclass(slots=True)
class _StreamState:
    """A produce stream's mutable state. Loop only."""

    running: bool = False  # an append job is on the executor
    # A job failed or the handler ended (client gone, cancelled): nothing more is
    # appended, not even what was read before the end.
    ended: bool = False
    in_flight_bytes: int = 0  # admitted and not yet released
    muted_until: float = 0.0  # loop time before which the stream is not read (quota)


def _fail(batch: list[_Incoming], error: Exception) -> None:
    """Fail the answers of ``batch``; the stream raises ``error`` at the first of them."""
    for item in batch:
        if not item.answer.done():
            item.answer.set_exception(error)
            item.answer.exception()  # retrieved: only the first one is awaited


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
        service: _AsyncService,
    ) -> None:
        self._loop = loop
        self._thread = thread
        self._server = server
        self._service = service
        self._health = health
        self._executor = executor
        self.port = port
        self.watchdog = LoopWatchdog(loop, thread, "grpc listener").start()

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

        async def build() -> tuple[aio.Server, AsyncHealthServicer, int, _AsyncService]:
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
            return server, health, port, service

        try:
            server, health, port, service = asyncio.run_coroutine_threadsafe(build(), loop).result(
                _LOOP_CALL_TIMEOUT_S
            )
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)
            executor.shutdown(wait=False)
            raise
        return cls(loop, thread, server, health, executor, port, service)

    def enter_graceful_shutdown(self) -> None:
        """Health reports ``NOT_SERVING`` from now on."""
        asyncio.run_coroutine_threadsafe(self._health.enter_graceful_shutdown(), self._loop).result(
            _LOOP_CALL_TIMEOUT_S
        )

    def stop(self, grace_ms: int, margin_ms: int) -> bool:
        """Stop accepting calls, give those in flight ``grace_ms``, then stop the loop.

        Open produce streams end first (``_AsyncService.end_streams``): an idle one would
        hold the stop for the whole grace period.

        Returns False if the server did not stop within grace + margin.
        """

        def report() -> None:
            held = self._service.calls_in_flight()
            if held:
                log.warning(
                    "gRPC calls still in flight half-way into the stop: %s; threads:\n%s",
                    held,
                    thread_stacks(),
                )

        async def stop() -> None:
            self._service.end_streams()
            check = self._loop.call_later(grace_ms / 2000.0, report)
            try:
                await self._server.stop(grace_ms / 1000.0)
            finally:
                check.cancel()

        future = asyncio.run_coroutine_threadsafe(stop(), self._loop)
        try:
            future.result((grace_ms + margin_ms) / 1000.0)
            stopped = True
        except TimeoutError:
            stopped = False
        self.watchdog.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self._loop.close()
        self._executor.shutdown(wait=False)
        return stopped
