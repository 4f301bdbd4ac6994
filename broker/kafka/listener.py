"""The Kafka wire-protocol listener: asyncio sockets over the listener-neutral core.

One event loop on its own thread accepts connections (``asyncio.start_server``); each
connection is one coroutine, no thread per connection. A connection reads a frame
(``INT32`` size, then header and body), handles it completely, writes the response, and
only then reads the next frame, as Kafka does (it mutes a socket while a request is in
flight): responses leave in request order, and the produces of one connection are applied
in order, which idempotent sequence checks depend on. Clients pipeline requests; they wait
in the socket buffer meanwhile.

Except Produce (issue #31), when no quota is configured: once a Produce's batches are
appended the next request is read while it waits to be durable (``acks=all``: its
fsync), so one group fsync covers several requests of a connection, as the gRPC
listener's ``ProduceStream`` takes its requests ahead. Appends stay in request order (the
next request is read only after the append), answers leave in request order
(``broker.kafka.in_order``), at most 8 Produce answers are outstanding, and any other request waits
until every answer before it is written, then runs alone as above. Kafka itself needs no
such thing: it answers ``acks=all`` without an fsync. With a quota configured requests go
one at a time, because a throttle belongs to the connection (the mute after an answer).

Blocking core calls (appends, admin, group commits) run on a small thread pool, never on
the loop. Waiting costs no thread: a long-poll Fetch is parked in the core's fetch
purgatory (``BrokerCore.start_fetch``/``step_fetch``) and woken through
``call_soon_threadsafe``; an ``acks=all`` produce is delivered by the group fsync thread
through the same call.

Limits and quotas, as on the gRPC listener (``broker.core.limits``, ``broker.core.quotas``):
``max.connections`` and ``max.connections.per.ip`` count this listener's connections with
the gRPC listener's (one ``Admission``); a connection past a limit is closed at once, as
Kafka closes it. Quotas are metered per user and client id (the request header's):
``producer_byte_rate`` on produced record bytes, ``consumer_byte_rate`` on fetched ones,
``request_percentage`` on the time blocking calls spend on the thread pool. A request
over a quota is answered at once with its throttle time (KIP-219), and then the
connection is muted for that long: nothing more is read from it, so a client that
ignores the hint is held back all the same. ``queued.max.requests`` (blocking calls on
the thread pool) and ``queued.max.request.bytes`` (produced bytes until answered) are
counted with the gRPC listener's (the same ``Admission``); where the gRPC listener
refuses a call past them, this one waits, as Kafka's network threads wait on a full
request queue: the connection is not read meanwhile.

The request pipeline (``broker.core.operations``): each api key is a neutral operation
(``KAFKA_APIS``); handlers ask its policy for each resource (``broker.kafka.authz``),
quotas are metered through ``operations.record_quota`` and every answered request is
counted once, here, by ``operations.observe`` (listener ``kafka``; outcome ``OK`` or the
response's top-level error name, or the exception's code when the connection closes).

Framing errors close the connection and nothing else: a negative or oversized size
(``socket.request.max.bytes``), a header that does not parse, an API key or version that
is not advertised (except ApiVersions, answered with ``UNSUPPORTED_VERSION`` in its v0
form so the client can retry lower, KIP-511), or a body that does not parse. The broker
keeps serving every other connection.

Zero-copy fetch (issue #31, ``docs/performance.md``): on a plaintext listener a Fetch
answer's records are ``FileRegion``s (``broker.core.fetch``), not bytes. The answer is
encoded around them (``encode_response_parts``: the size prefix, header and each
partition's fields as bytes, each region as its length) and written piece by piece: the
bytes with ``transport.write``, each region with ``loop.sendfile`` (``os.sendfile``:
from the page cache to the socket, never through the broker's memory). A region that
sends short (its file truncated since the read) closes the connection, as Kafka does,
since the frame's size is already promised. A TLS listener reads and copies the records
(``sendfile`` cannot encrypt; kTLS would let it, but Python's ``ssl`` does not offer it:
``docs/performance.md``). ``kafka.zero.copy.fetch=false`` turns zero copy off.

Thread-safe: ``start`` and ``stop`` may be called from any thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import ssl
import struct
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from tidelog.broker.core.context import RequestContext
from tidelog.broker.core.facade import BrokerCore
from tidelog.broker.core.fetch_sessions import FetchSessionCache
from tidelog.broker.core.limits import Admission
from tidelog.broker.core.operations import KAFKA_APIS, record_quota
from tidelog.broker.core.pipeline import RequestPipeline
from tidelog.broker.kafka.cluster import KafkaBrokers
from tidelog.broker.kafka.codec import (
    CodecError,
    Plain,
    RequestHeader,
    decode_request,
    encode_response,
    encode_response_parts,
    parse_header,
    response_has_field,
)
from tidelog.broker.kafka.errors import error_name
from tidelog.broker.kafka.in_order import InOrder
from tidelog.broker.kafka.metadata_cache import TopicEntries
from tidelog.broker.kafka.produce_codec import decode_produce, encode_produce_response
from tidelog.broker.kafka.share_sessions import ShareSessions
from tidelog.broker.kafka.versions import ADVERTISED, API_VERSIONS, supported
from tidelog.broker.loop_watchdog import LoopWatchdog
from tidelog.broker.tls import principal_from_peer_certificate
from tidelog.storage.errors import BrokerBusyError
from tidelog.storage.file_region import FileRegion

if TYPE_CHECKING:
    from tidelog.broker.kafka.kip848 import MemberMemory

__all__ = ["Connection", "Handler", "KafkaListener", "ListenerSettings"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_STOP_TIMEOUT_S = 10.0

# A response: a frame's bytes, a zero-copy Fetch's pieces (``send_parts``), or none.
Response = bytes | list[bytes | FileRegion] | None


@dataclass(frozen=True, slots=True)
class ListenerSettings:
    """What the Kafka listener needs beyond the core.

    Attributes:
        host, port: where to listen (port 0: any free port).
        advertised_host, advertised_port: what Metadata tells clients (port 0: the bound
            port).
        max_frame_bytes: the largest request accepted (``socket.request.max.bytes``).
        auto_create_topics: Metadata may create the topics it is asked for.
        io_threads: the pool that runs blocking core calls.
        ssl_context: TLS for every connection (``security.protocol`` SSL, SASL_SSL).
        sasl: connections must authenticate first (SASL_PLAINTEXT, SASL_SSL).
        fetch_session_slots, fetch_session_eviction_ms: the fetch session cache
            (``broker.core.fetch_sessions``).
        zero_copy_fetch: send Fetch records with ``sendfile`` on plaintext connections
            (``kafka.zero.copy.fetch``; the module docstring).
    """

    host: str
    port: int
    advertised_host: str
    advertised_port: int
    max_frame_bytes: int = 100 * 1024 * 1024
    auto_create_topics: bool = False
    io_threads: int = 4
    ssl_context: ssl.SSLContext | None = None
    sasl: bool = False
    fetch_session_slots: int = 1_000
    fetch_session_eviction_ms: int = 120_000
    zero_copy_fetch: bool = True


class Connection:
    """One client connection's state and its access to the core. Used only on the loop's
    thread (not thread-safe)."""

    def __init__(self, listener: KafkaListener, peer: str) -> None:
        self.listener = listener
        self.core = listener.core
        self.settings = listener.settings
        self.peer = peer
        self.context = RequestContext("kafka", peer)
        self.tls = listener.settings.ssl_context is not None
        # SASL state (broker.kafka.sasl).
        self.authenticated = not listener.settings.sasl
        self.sasl_mechanism = ""
        self.handshake_id = ""
        self.raw_sasl = False  # after SaslHandshake v0: raw tokens, no Kafka headers
        # KIP-368: when the authenticated session ends (time.monotonic(); None: never).
        self.session_expires_at: float | None = None
        self.close_after_response = False  # a failed login: answer, then hang up
        # The request being handled: its api key (its operation: KAFKA_APIS) and the
        # longest throttle a quota asked for (ms).
        self.api_key = -1
        self.throttle_ms = 0
        # Set while a pipelined Produce runs (``_serve_connection``): resolved once its
        # batches are appended, so the next request may be read while it waits to be
        # durable.
        self.appended: asyncio.Future[None] | None = None

    def mark_appended(self) -> None:
        """The running Produce appended its batches (``broker.kafka.data``)."""
        appended = self.appended
        if appended is not None and not appended.done():
            appended.set_result(None)

    async def run(self, call: Callable[..., T], *args: Any) -> T:
        """``call(*args)`` on the listener's thread pool (blocking core calls); its time
        there counts against the caller's ``request_percentage`` quota."""
        # The pipeline's core step (waits past queued.max.requests, as Kafka does).
        result, throttle_ms = await self.listener.pipeline.run(self.context, call, *args)
        self.throttle_ms = max(self.throttle_ms, throttle_ms)
        return result

    def run_inline(self, call: Callable[..., T], *args: Any) -> T:
        """``call(*args)`` on the loop's own thread (work that never blocks: the inline
        produce, ``broker.kafka.data``); its time counts against ``request_percentage``
        as ``run``'s does. It takes no ``queued.max.requests`` slot: that limit counts
        requests waiting for the thread pool, and this one never does."""
        result, throttle_ms = self.listener.pipeline.run_inline(self.context, call, *args)
        self.throttle_ms = max(self.throttle_ms, throttle_ms)
        return result

    async def admit_bytes(self, size: int) -> None:
        """Count ``size`` produced bytes against ``queued.max.request.bytes`` (waiting
        until they fit); the caller releases them with ``release_bytes`` once answered."""
        admission = self.listener.admission
        if admission is not None:
            await _wait_for(
                lambda: admission.try_admit_bytes(size),
                lambda context: admission.admit_bytes(size, context),
                self.context,
            )

    def release_bytes(self, size: int) -> None:
        """The bytes counted by ``admit_bytes`` were answered (or dropped)."""
        admission = self.listener.admission
        if admission is not None:
            admission.release_bytes(size)

    def record_quota(self, quota: str, value: float) -> None:
        """Meter ``value`` against the caller's ``quota``; a throttle it asks for holds
        the connection back after this request's answer."""
        throttle_ms = record_quota(self.core.quotas, self.context, quota, value)
        self.throttle_ms = max(self.throttle_ms, throttle_ms)

    @property
    def advertised(self) -> tuple[str, int]:
        """This broker's Kafka endpoint as clients should dial it."""
        return self.listener.advertised

    def kafka_brokers(self) -> KafkaBrokers:
        """Every live broker's Kafka endpoint, None for one without a Kafka listener
        (``broker.kafka.cluster``), from the placement's cluster view (cheap: no I/O); a
        single node, or a cluster broker still joining (no brokers in its view): this
        broker alone."""
        me = self.core.config.broker_id
        if self.core.config.zookeeper_connect is None:
            return {me: self.listener.advertised}
        brokers = self.core.placement.cluster().brokers
        if not brokers:
            return {me: self.listener.advertised}
        return {b.broker_id: b.kafka for b in brokers}

    def kafka_racks(self) -> dict[int, str | None]:
        """Every live broker's ``broker.rack`` (None: not set), as ``kafka_brokers``."""
        me = self.core.config.broker_id
        brokers = self.core.placement.cluster().brokers
        if self.core.config.zookeeper_connect is None or not brokers:
            return {me: self.core.config.broker_rack}
        return {b.broker_id: b.rack for b in brokers}


# A handler answers one request with the response body's plain values, or None for no
# response at all (Produce with acks=0).
Handler = Callable[[Connection, RequestHeader, Plain], Awaitable[Plain | None]]


class KafkaListener:
    """The running listener: a loop thread, a server socket, a thread pool."""

    def __init__(
        self,
        core: BrokerCore,
        settings: ListenerSettings,
        handlers: dict[int, Handler],
        admission: Admission | None = None,
    ) -> None:
        self.core = core
        self.settings = settings
        self.handlers = handlers
        self.executor = concurrent.futures.ThreadPoolExecutor(
            settings.io_threads, thread_name_prefix="kafka-io"
        )
        self.port = 0
        self.advertised = (settings.advertised_host, settings.advertised_port)
        # The connection limits shared with the gRPC listener (None: no limits).
        self.admission = admission
        # KIP-848 members' last subscription and owned partitions (loop's thread only).
        self.kip848_members: dict[tuple[str, str], MemberMemory] = {}
        # KIP-227 incremental fetch sessions (loop's thread only).
        self.fetch_sessions = FetchSessionCache(
            settings.fetch_session_slots,
            settings.fetch_session_eviction_ms,
            lambda: int(time.monotonic() * 1000),
        )
        # Bytes handed to sendfile from segment files, and in how many regions (zero-copy
        # fetch; loop's thread only; read by tests).
        self.sendfile_bytes = 0
        self.sendfile_regions = 0
        # Partitions a produce appended on the loop's thread, and on the thread pool
        # (broker.kafka.data's inline produce; loop's thread only; read by tests).
        self.inline_appends = 0
        self.pool_appends = 0
        # KIP-932 share sessions (loop's thread only; broker.kafka.share).
        self.share_sessions = ShareSessions()
        # Topic names by their derived ids (Fetch v13+ names topics by id; loop's thread
        # only; rebuilt from the topic list on a miss, ``broker.kafka.data``).
        self.topic_names: dict[uuid.UUID, str] = {}
        # Metadata's topic entries, encoded once while unchanged (loop's thread only;
        # ``broker.kafka.metadata_cache``).
        self.metadata_entries = TopicEntries()
        self._loop = asyncio.new_event_loop()
        # Every request's steps (broker.core.pipeline): Kafka waits past queued.max.requests
        # and closes the connection on an error a handler did not put in its answer.
        self.pipeline = RequestPipeline(
            listener="kafka",
            acls=core.acls,
            quotas=core.quotas,
            metrics=core.metrics,
            admission=admission,
            executor=self.executor,
            loop=self._loop,
            wait_when_full=True,
            closes_on_error=True,
        )
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._serve, name="kafka-listener", daemon=True)
        self._connections: set[asyncio.Task[None]] = set()
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._stopped = False
        self._watchdog = LoopWatchdog(self._loop, self._thread, "kafka listener")

    @classmethod
    def start(
        cls, core: BrokerCore, settings: ListenerSettings, admission: Admission | None = None
    ) -> KafkaListener:
        """Bind and serve; returns once listening. ``admission``: the connection limits
        (the server's, shared with the gRPC listener).

        Raises:
            OSError: the address cannot be bound.
        """
        from tidelog.broker.kafka.handlers import HANDLERS

        listener = cls(core, settings, HANDLERS, admission)
        listener._thread.start()
        listener._started.wait()
        if listener._start_error is not None:
            listener.executor.shutdown(wait=False)
            raise listener._start_error
        log.info(
            "kafka listener on %s:%d (advertised %s:%d)",
            settings.host,
            listener.port,
            *listener.advertised,
        )
        return listener

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(
                asyncio.start_server(
                    self._accept,
                    self.settings.host,
                    self.settings.port,
                    ssl=self.settings.ssl_context,
                )
            )
        except BaseException as exc:
            self._start_error = exc
            self._started.set()
            self._loop.close()
            return
        self.port = self._server.sockets[0].getsockname()[1]
        if not self.settings.advertised_port:
            self.advertised = (self.settings.advertised_host, self.port)
        self._watchdog.start()
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    def stop(self) -> None:
        """Stop accepting, close every connection, stop the loop. Idempotent."""
        if self._stopped or not self._thread.is_alive():
            self._stopped = True
            return
        self._stopped = True
        future = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        try:
            future.result(_STOP_TIMEOUT_S)
        except Exception:
            log.exception("kafka listener did not stop cleanly")
        self._watchdog.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(_STOP_TIMEOUT_S)
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=_STOP_TIMEOUT_S)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        connection = Connection(self, _peer_name(writer.get_extra_info("peername")))
        # Mutual TLS: a verified client certificate names the caller (SASL, if the
        # listener wants it, replaces this with the user who logs in).
        principal = principal_from_peer_certificate(writer.get_extra_info("peercert"))
        if principal is not None:
            connection.context = dataclasses.replace(connection.context, principal=principal)
        admission = self.admission
        counted = False
        try:
            if admission is not None:
                admission.open_call(connection.context)  # logs a refusal, once a second
                counted = True
            await self._serve_connection(connection, reader, writer)
        except BrokerBusyError:
            pass  # max.connections(.per.ip): closed at once, as Kafka does
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away
        except asyncio.CancelledError:
            pass  # the listener stops
        except Exception:
            log.exception("kafka connection from %s failed", connection.peer)
        finally:
            if counted and admission is not None:
                admission.close_call(connection.context)
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve_connection(
        self,
        connection: Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        limit = self.settings.max_frame_bytes
        incoming = _Incoming(reader)
        answers = InOrder(self, connection, writer)
        try:
            await self._read_requests(connection, incoming, writer, answers, limit)
        finally:
            answers.cancel()

    async def _read_requests(
        self,
        connection: Connection,
        incoming: _Incoming,
        writer: asyncio.StreamWriter,
        answers: InOrder,
        limit: int,
    ) -> None:
        while True:
            try:
                prefix = await incoming.readexactly(4)
            except asyncio.IncompleteReadError:
                await answers.drain()  # closed between requests: what is left, answered
                return
            (size,) = struct.unpack(">i", prefix)
            if size < 10 or size > limit:
                log.info(
                    "kafka connection from %s: frame size %d outside [10, %d]: closed",
                    connection.peer,
                    size,
                    limit,
                )
                return
            frame = await incoming.readexactly(size)
            if self._pipelines(connection, frame):
                await answers.produce(frame)
                continue
            await answers.drain()  # anything else after the pipelined answers, as before
            if connection.raw_sasl:
                # Imported here: broker.kafka.sasl imports this module.
                from tidelog.broker.kafka.sasl import raw_token

                answer = await raw_token(connection, frame)
                if answer is None:
                    return
                response: Response = struct.pack(">i", len(answer)) + answer
            elif frame[:2] == _FETCH_KEY:
                # A long poll: freed as soon as the client hangs up (below).
                response = await incoming.unless_closed(self.respond(connection, frame))
            else:
                response = await self.respond(connection, frame)
            if isinstance(response, list):
                await self.send_parts(connection, writer, response)
            elif response is not None:
                writer.write(response)
                await writer.drain()
            if connection.close_after_response:
                return
            if connection.throttle_ms > 0:
                # Muted for the throttle time (KIP-219), answer or not (acks=0).
                await asyncio.sleep(connection.throttle_ms / 1000)

    def _pipelines(self, connection: Connection, frame: bytes) -> bool:
        """Whether this request is a Produce read while earlier ones wait to be durable.

        Only without quotas: a throttle is the connection's (``Connection.throttle_ms``,
        the mute after an answer), which requests answered out of their reading order
        would mix up; with any quota configured every request goes one at a time.
        """
        return (
            frame[:2] == _PRODUCE_KEY
            and not connection.raw_sasl
            and not connection.close_after_response
            and not self.core.quotas.configured
        )

    async def send_parts(
        self,
        connection: Connection,
        writer: asyncio.StreamWriter,
        parts: list[bytes | FileRegion],
    ) -> None:
        """Write a zero-copy answer: bytes as bytes, regions with ``sendfile`` (the module
        docstring); every region is closed, sent or not.

        Raises:
            ConnectionError: a region sent short, or the connection closed meanwhile.
        """
        try:
            for part in parts:
                if isinstance(part, bytes):
                    writer.write(part)
                    continue
                # Counted before sending: a client that has the whole answer knows the
                # count is up to date (the tests rely on it).
                self.sendfile_bytes += part.length
                self.sendfile_regions += 1
                try:
                    sent = await self._loop.sendfile(
                        writer.transport,
                        part,  # type: ignore[arg-type]  # fileno() and seek() suffice
                        part.position,
                        part.length,
                        fallback=False,
                    )
                except asyncio.SendfileNotAvailableError:
                    self.sendfile_bytes -= part.length
                    self.sendfile_regions -= 1
                    writer.write(part.read())  # not a plain socket: copied after all
                    continue
                except RuntimeError as exc:  # "Transport is closing"
                    raise ConnectionError(str(exc)) from None
                if sent != part.length:
                    raise _close(
                        connection,
                        f"a fetched file region sent {sent} of {part.length} bytes "
                        "(truncated since it was read)",
                    )
            await writer.drain()
        finally:
            for part in parts:
                if isinstance(part, FileRegion):
                    part.close()

    async def respond(self, connection: Connection, frame: bytes) -> Response:
        """The response frame for one request frame, None for no response; a list of
        bytes and file regions for a zero-copy Fetch (``send_parts``).

        Raises:
            ConnectionError: close the connection (reason logged).
        """
        try:
            header = parse_header(frame)
        except CodecError as exc:
            raise _close(connection, f"bad request header: {exc}") from None
        key, version = header.api_key, header.api_version
        if self.core.placement.cluster().cut_off and not connection.close_after_response:
            # Issue #33: cut off from ZooKeeper, this broker vouches for no leader: it
            # answers (NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE), then hangs up.
            # librdkafka asks only brokers it is connected to for metadata: kept
            # connected, it asked this one again and again for the whole cut.
            log.info(
                "kafka connection from %s: cut off from ZooKeeper, closing after this answer",
                connection.peer,
            )
            connection.close_after_response = True
        if key == API_VERSIONS and not supported(key, version):
            # KIP-511: the v0 form with UNSUPPORTED_VERSION and our range for key 18.
            body = {"error_code": 35, "api_keys": _api_keys()}
            return encode_response(API_VERSIONS, 0, header.correlation_id, body)
        if not supported(key, version):
            raise _close(connection, f"api {key} v{version} is not advertised")
        if not connection.authenticated and key not in _BEFORE_AUTHENTICATION:
            raise _close(connection, f"api {key} before SASL authentication")
        expires = connection.session_expires_at
        if expires is not None and key not in _BEFORE_AUTHENTICATION and time.monotonic() > expires:
            # KIP-368: the client did not re-authenticate in time; Kafka closes too.
            raise _close(
                connection, f"api {key} after the SASL session expired (no re-authentication)"
            )
        handler = self.handlers.get(key)
        if handler is None:
            raise _close(connection, f"api {key} has no handler")
        # Produce's own codec first (issue #31's lean path), kio for what it leaves.
        request = decode_produce(version, frame, header.body_offset) if key == _PRODUCE else None
        if request is None:
            try:
                request = decode_request(key, version, frame, header.body_offset)
            except CodecError as exc:
                raise _close(connection, str(exc)) from None
        if header.client_id != connection.context.client_id:
            connection.context = dataclasses.replace(connection.context, client_id=header.client_id)
        connection.throttle_ms = 0
        connection.api_key = key
        rpc, operation = KAFKA_APIS[key]
        # Handlers authorize per resource (Kafka answers each refusal in place), so the
        # pipeline gets no resources to refuse the request as a whole.
        served = await self.pipeline.serve(
            connection.context,
            rpc,
            operation,
            lambda: handler(connection, header, request),
            outcome_of=_outcome,
        )
        answer = served.value
        if answer is None:
            return None
        if connection.throttle_ms > 0 and response_has_field(key, "throttle_time"):
            answer["throttle_time"] = connection.throttle_ms
        if key == _FETCH_API and _has_regions(answer):
            return encode_response_parts(key, version, header.correlation_id, answer)
        if key == _PRODUCE:
            encoded = encode_produce_response(version, header.correlation_id, answer)
            if encoded is not None:
                return encoded
        return encode_response(key, version, header.correlation_id, answer)


_PRODUCE = 0
_PRODUCE_KEY = struct.pack(">h", _PRODUCE)
_FETCH_API = 1
_FETCH_KEY = struct.pack(">h", _FETCH_API)


def _has_regions(answer: Plain) -> bool:
    """Whether a Fetch answer holds a zero-copy region (``broker.kafka.data``)."""
    return any(
        isinstance(p.get("records"), FileRegion)
        for t in answer.get("responses") or ()
        for p in t.get("partitions") or ()
    )


# What a hang-up watch reads at most at once (bytes of the client's next requests).
_WATCH_BYTES = 64 * 1024


class _Incoming:
    """A connection's incoming bytes: the stream, and what the hang-up watch already read
    from it (the client's next requests, pipelined), which is read first.

    ``unless_closed`` runs one request's handling while watching the socket: a parked
    Fetch of a client that hung up is freed at once, as the gRPC listener frees the call
    of a client that cancelled, rather than at its deadline (``max_wait_ms``, up to
    ``fetch.max.wait.ms``). Kafka mutes a connection while its request is in flight and
    finds the hang-up only when it writes the answer; its purgatory holds the fetch until
    then. Here the watch reads ahead instead of muting: the bytes it gets are kept for
    the next frame; only an end of stream (the peer closed, or reset) counts. It stops
    at the first bytes read: a client that pipelines a request behind its fetch is
    plainly alive. Only Fetch is watched: the other requests either answer at once or
    (a JoinGroup waiting for its rebalance, an ``acks=all`` produce) must run to their
    end whether or not the client still listens, as in Kafka.
    """

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader
        self._ahead = bytearray()

    async def readexactly(self, count: int) -> bytes:
        """``count`` bytes (``asyncio.IncompleteReadError`` if the stream ends first)."""
        if not self._ahead:
            return await self._reader.readexactly(count)
        taken = bytes(self._ahead[:count])
        del self._ahead[:count]
        if len(taken) < count:
            try:
                taken += await self._reader.readexactly(count - len(taken))
            except asyncio.IncompleteReadError as exc:
                raise asyncio.IncompleteReadError(taken + exc.partial, count) from None
        return taken

    async def unless_closed(self, handling: Awaitable[Response]) -> Response:
        """``handling``'s answer; cancels it if the peer hangs up first.

        Raises:
            ConnectionError: the peer hung up while the request was handled.
        """
        task = asyncio.ensure_future(handling)
        if self._ahead:
            return await task  # already holds the next request: alive
        watch = asyncio.ensure_future(self._reader.read(_WATCH_BYTES))
        try:
            await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            task.cancel()
            watch.cancel()
            raise
        if not watch.done():
            # Cancelling a read that is still waiting loses nothing: bytes stay in the
            # stream's buffer until a read returns them.
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
            return await task
        try:
            data = watch.result()
        except (ConnectionError, OSError):
            data = b""  # reset by the peer: hung up as well
        if data:
            self._ahead += data
            return await task
        task.cancel()  # the handler's ``finally`` cancels its parked fetch
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise ConnectionError("the client hung up while its request was handled")


def _outcome(answer: Plain | None) -> str:
    """An answered request's outcome: its top-level error's name (no answer: ``OK``)."""
    return "OK" if answer is None else error_name(int(answer.get("error_code") or 0))


# ApiVersions, SaslHandshake, SaslAuthenticate: all a connection may send before SASL.
_BEFORE_AUTHENTICATION = frozenset({18, 17, 36})


def _api_keys() -> list[Plain]:
    return [
        {"api_key": key, "min_version": low, "max_version": high}
        for key, (low, high) in sorted(ADVERTISED.items())
    ]


_ADMIT_RETRY_FIRST_S = 0.001
_ADMIT_RETRY_MAX_S = 0.05


async def _wait_for(
    fits: Callable[[], bool],
    admit: Callable[[RequestContext], None],
    context: RequestContext,
) -> None:
    """Wait until an ``Admission`` counter admits (``fits``), as Kafka's network thread
    waits on a full request queue. The first refusal is counted and logged (``admit``
    raises it); the retries are not, so one wait is one refusal in the metrics."""
    try:
        admit(context)
        return
    except BrokerBusyError:
        pass
    delay_s = _ADMIT_RETRY_FIRST_S
    while not fits():
        await asyncio.sleep(delay_s)
        delay_s = min(delay_s * 2, _ADMIT_RETRY_MAX_S)


def _peer_name(peername: Any) -> str:
    """A socket's peer as the gRPC listener names one (``ipv4:1.2.3.4:5``,
    ``ipv6:[::1]:5``), the form ``RequestContext.host`` and the limits per IP read."""
    if not peername:
        return "unknown"
    host, port = peername[0], peername[1]
    return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"


def _close(connection: Connection, reason: str) -> ConnectionError:
    log.info("kafka connection from %s closed: %s", connection.peer, reason)
    return ConnectionError(reason)
