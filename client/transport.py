"""The one client module that touches gRPC: channel, stubs, deadlines, error mapping.

``Transport`` owns one channel to the broker with:

- reconnect backoff of at most ``reconnect_backoff_max_ms`` (gRPC's default grows to 120 s,
  far too slow to notice a restarted broker), starting at 100 ms;
- keepalive pings every 30 s (``keepalive_time_ms``), with calls in flight or not, and
  the connection dropped if one has no answer within 20 s: a broker whose host vanished
  without closing the socket is noticed within 50 s even by a stream that waits (a long
  poll, an idle ``ProduceStream``) or a connection between calls, and the channel
  reconnects. A killed broker is noticed at once by the closed socket. The Tidelog broker
  accepts pings down to 10 s apart; a plain gRPC server accepts one per 5 minutes and
  would close the connection for "too many pings";
- message size limits: requests up to ``max_send_bytes``, answers of any size the broker
  sends (it bounds them by ``fetch.max.bytes`` plus one batch).

Every unary call has a deadline. A call the broker could not be reached for is tried
again until the deadline, so a broker that restarts within it is simply waited for, and
one that stays down gives ``BrokerUnavailableError`` when it passes, never a hang. (The
channel's connectivity is not watched: grpcio's watcher thread races ``close`` and dies
with "Channel closed!".) A failed call becomes the exact ``TidelogError`` the broker
meant: the code string in trailing metadata ``tidelog-error-code`` goes through
``error_for_code``; without it the gRPC status decides (``error_from_rpc``). A broker
that could not be reached is described in words where gRPC's details allow
(``describe_unavailable``): a TLS client against a plaintext listener, a plaintext client
against a TLS listener, a refused connection; the error raised when the call gives up
names the whole time it waited and the first failure's cause.

Streams (``open_stream``) are the data path: a ``BidiStream`` takes requests through
``send`` (never blocks) and yields answers from ``responses()``; a broken stream raises
the mapped error from ``responses()``. The routed data path opens them fail-fast
(``wait_for_ready=False``): a broker that is down must show at once, so that its
partitions are asked for again where they are led now, not wait on a dead address.

Security (``client.security``): the channel is opened by ``ClientSecurity`` (TLS or not);
with a SASL protocol the transport logs in (``Session``) before its first call and sends
the session token with every call. A call the broker answers ``SASL_SESSION_EXPIRED``
(the channel reconnected: tokens are bound to one connection) logs in again and is
repeated within its deadline; a stream opened with a stale token fails with that
retriable error and the next stream gets a fresh login.

Thread-safe: gRPC channels and stubs are; a ``BidiStream`` has one reader.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import grpc

from tidelog.client.errors import ClosedError
from tidelog.client.security import SESSION_METADATA_KEY, ClientSecurity, Session
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc
from tidelog.storage.errors import (
    BrokerUnavailableError,
    InternalError,
    InvalidRequestError,
    KafkaTimeoutError,
    RequestTooLargeError,
    SaslSessionExpiredError,
    TidelogError,
    error_for_code,
)

__all__ = [
    "ERROR_CODE_METADATA_KEY",
    "BidiStream",
    "Transport",
    "describe_unavailable",
    "error_from_rpc",
]

log = logging.getLogger(__name__)

ERROR_CODE_METADATA_KEY = "tidelog-error-code"

# Must stay at or above what the broker accepts (10 s, broker/server.py).
_KEEPALIVE_TIME_MS = 30_000
_KEEPALIVE_TIMEOUT_MS = 20_000
_INITIAL_RECONNECT_BACKOFF_MS = 100
# How long one call keeps knocking on a broker that cannot be reached before it says so
# (the router then asks the cluster who serves the request now, within its own timeout).
UNAVAILABLE_RETRY_MS = 2_000
_SEND_MARGIN_BYTES = 64 * 1024  # protobuf framing around the record bytes

RequestT = TypeVar("RequestT")
ResponseT = TypeVar("ResponseT")


def describe_unavailable(details: str, *, tls: bool | None = None) -> str:
    """Why a broker could not be reached, from gRPC's ``details`` of an ``UNAVAILABLE``.

    ``tls``: whether the client connects with TLS (None: unknown). A TLS handshake
    answered by something that is not TLS (OpenSSL's ``WRONG_VERSION_NUMBER``) is a TLS
    client at a plaintext listener; a plaintext client whose connection is closed before
    any answer is most often at a TLS listener (the broker drops the HTTP/2 preface it
    cannot read), though a broker dying at that moment looks the same, so it is worded
    as a question. Other details are returned as they are ("" as "no details").
    """
    lowered = details.lower()
    if "handshake" in lowered and "wrong_version_number" in lowered:
        return (
            "the broker did not answer the TLS handshake (OpenSSL: WRONG_VERSION_NUMBER);"
            " is its listener TLS?"
        )
    if "handshake" in lowered:
        return f"the TLS handshake failed ({details})"
    if tls is False and ("socket closed" in lowered or "connection reset" in lowered):
        return (
            "the broker closed the connection without answering; is its listener TLS?"
            " This client connects without TLS (security_protocol PLAINTEXT)"
        )
    if "connection refused" in lowered:
        return "connection refused: is a broker listening there?"
    return details or "no details"


def error_from_rpc(
    exc: grpc.RpcError, address: str, what: str, *, tls: bool | None = None
) -> TidelogError:
    """The ``TidelogError`` a failed call stands for.

    With a ``tidelog-error-code`` in the trailing metadata: that exact class. Without:
    ``UNAVAILABLE`` is ``BrokerUnavailableError``; ``DEADLINE_EXCEEDED`` is
    ``KafkaTimeoutError``; ``RESOURCE_EXHAUSTED`` is ``RequestTooLargeError`` (gRPC's
    own size limit); ``UNIMPLEMENTED`` is ``InvalidRequestError`` (this broker does not
    serve the call); ``CANCELLED`` is ``ClosedError``; anything else ``InternalError``.
    ``tls`` (whether the client uses TLS) sharpens an ``UNAVAILABLE``'s words
    (``describe_unavailable``).
    """
    code = None
    status = None
    details = ""
    call: Any = exc  # failed calls are both RpcError and Call (the stubs cannot say so)
    if hasattr(call, "code") and hasattr(call, "trailing_metadata"):
        status = call.code()
        details = call.details() or ""
        for key, value in call.trailing_metadata() or ():
            if key == ERROR_CODE_METADATA_KEY:
                code = value if isinstance(value, str) else value.decode()
    if code:
        return error_for_code(code, details)
    message = f"{what}: {details}" if details else what
    if status == grpc.StatusCode.UNAVAILABLE:
        cause = describe_unavailable(details, tls=tls)
        return BrokerUnavailableError(f"{what}: broker at {address} is unavailable: {cause}")
    if status == grpc.StatusCode.DEADLINE_EXCEEDED:
        return KafkaTimeoutError(f"{what}: no answer from {address} before the deadline")
    if status == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return RequestTooLargeError(message)
    if status == grpc.StatusCode.UNIMPLEMENTED:
        return InvalidRequestError(f"the broker at {address} does not implement {what}")
    if status == grpc.StatusCode.CANCELLED:
        return ClosedError(f"{what} was cancelled")
    return InternalError(message)


def _details(exc: grpc.RpcError) -> str:
    """gRPC's details of a failed call ("" if it has none)."""
    call: Any = exc
    return (call.details() or "") if hasattr(call, "details") else ""


class _RequestQueue(Generic[RequestT]):
    """The request iterator gRPC drains for a stream; ``close`` ends it."""

    _END: Any = object()

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def put(self, request: RequestT) -> None:
        self._queue.put(request)

    def close(self) -> None:
        self._queue.put(self._END)

    def __iter__(self) -> Iterator[RequestT]:
        return self

    def __next__(self) -> RequestT:
        item = self._queue.get()
        if item is self._END:
            self._queue.put(self._END)  # later calls end too
            raise StopIteration
        return item  # type: ignore[no-any-return]


class BidiStream(Generic[RequestT, ResponseT]):
    """One open bidirectional stream. ``send`` from any thread; one thread reads.

    ``close`` half-closes (the broker answers what it has, then the stream ends);
    ``cancel`` ends it at once (``responses()`` then raises ``ClosedError``).
    """

    def __init__(
        self,
        method: grpc.StreamStreamMultiCallable[Any, Any],
        address: str,
        what: str,
        metadata: tuple[tuple[str, str], ...],
        wait_for_ready: bool = True,
        on_session_expired: Callable[[], None] | None = None,
    ) -> None:
        self._requests: _RequestQueue[RequestT] = _RequestQueue()
        self._on_session_expired = on_session_expired
        self._address = address
        self._what = what
        self._call: Any = method(
            iter(self._requests), wait_for_ready=wait_for_ready, metadata=metadata
        )

    def send(self, request: RequestT) -> None:
        """Queue one request; gRPC sends it in order. Never blocks."""
        self._requests.put(request)

    def responses(self) -> Iterator[ResponseT]:
        """The answers, in order; raises the mapped ``TidelogError`` if the stream breaks."""
        try:
            yield from self._call
        except grpc.RpcError as exc:
            error = error_from_rpc(exc, self._address, self._what)
            if isinstance(error, SaslSessionExpiredError) and self._on_session_expired:
                self._on_session_expired()  # the next stream logs in again
            raise error from None
        finally:
            self._requests.close()

    def close(self) -> None:
        """No more requests: the broker finishes the ones it has and ends the stream."""
        self._requests.close()

    def cancel(self) -> None:
        """End the stream now; requests in flight get no answer."""
        self._requests.close()
        self._call.cancel()


class Transport:
    """A channel to one broker. Thread-safe; ``close`` once.

    ``keepalive_time_ms`` and ``keepalive_timeout_ms`` exist for tests against a broker
    with short keepalive settings; pinging more often than the broker accepts makes it
    close the connection. Raises ``ValueError`` if either is below 1.
    """

    def __init__(
        self,
        address: str,
        *,
        client_id: str,
        request_timeout_ms: int,
        reconnect_backoff_max_ms: int = 1_000,
        max_send_bytes: int = 1024 * 1024,
        keepalive_time_ms: int = _KEEPALIVE_TIME_MS,
        keepalive_timeout_ms: int = _KEEPALIVE_TIMEOUT_MS,
        security: ClientSecurity | None = None,
    ) -> None:
        if keepalive_time_ms < 1 or keepalive_timeout_ms < 1:
            raise ValueError(
                f"keepalive_time_ms and keepalive_timeout_ms must be >= 1, got"
                f" {keepalive_time_ms} and {keepalive_timeout_ms}"
            )
        self.address = address
        self.request_timeout_ms = request_timeout_ms
        max_backoff = max(reconnect_backoff_max_ms, _INITIAL_RECONNECT_BACKOFF_MS)
        options = [
            ("grpc.primary_user_agent", f"tidelog-client/{client_id}"),
            ("grpc.max_send_message_length", max_send_bytes + _SEND_MARGIN_BYTES),
            ("grpc.max_receive_message_length", -1),
            ("grpc.keepalive_time_ms", keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", keepalive_timeout_ms),
            # grpcio 1.85 does not arm the keepalive timeout of its own: an unanswered
            # ping is caught by the general ping timeout (default 1 minute).
            ("grpc.http2.ping_timeout_ms", keepalive_timeout_ms),
            # Between calls too: the next call then finds a live connection rather than
            # waiting out its deadline on a dead one.
            ("grpc.keepalive_permit_without_calls", 1),
            # gRPC stops pinging after 2 pings without sending data; a stream that only
            # waits (long poll, idle ProduceStream) would then go unwatched.
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.initial_reconnect_backoff_ms", _INITIAL_RECONNECT_BACKOFF_MS),
            ("grpc.min_reconnect_backoff_ms", _INITIAL_RECONNECT_BACKOFF_MS),
            ("grpc.max_reconnect_backoff_ms", max_backoff),
            # A separate TCP connection per client object: producers and consumers of one
            # process do not queue behind each other on a shared HTTP/2 connection.
            ("grpc.use_local_subchannel_pool", 1),
        ]
        self._metadata = (("tidelog-client-id", client_id),)
        self.security = security or ClientSecurity()
        self._session = Session(self.security) if self.security.sasl else None
        self._channel = self.security.open_channel(address, options)
        self._max_backoff_ms = max_backoff
        self.stub = broker_pb2_grpc.BrokerStub(self._channel)
        self._closed = False

    def call(
        self,
        method: Callable[..., ResponseT],
        request: object,
        *,
        what: str,
        timeout_ms: int | None = None,
        retry_unavailable: bool = True,
    ) -> ResponseT:
        """Make one unary call within ``timeout_ms``; raise the mapped ``TidelogError``.

        ``method`` is a stub attribute (``transport.stub.ListTopics``). While the broker
        cannot be reached (``UNAVAILABLE`` without a code: nothing was served) the call is
        tried again, backing off up to ``reconnect_backoff_max_ms``, for at most
        ``UNAVAILABLE_RETRY_MS`` (or the timeout, if shorter), then raises
        ``BrokerUnavailableError``: the caller (``client.routing``) asks the cluster who
        serves it now and retries there, within its own timeout, rather than this call
        spending the whole timeout on a broker that died. That error names the time
        waited and the first failure's cause (a TLS mismatch, a refused connection). A
        broker that does not answer in time gives ``KafkaTimeoutError``; after ``close``,
        ``ClosedError``.

        ``retry_unavailable`` False: ``BrokerUnavailableError`` at once, no second try. For
        a call that is not idempotent (a share acknowledgement): a broker that dies while
        serving it also answers ``UNAVAILABLE``, though it may have applied it, and the
        second try's answer ("not held any more") would then be taken for the outcome.
        """
        timeout = self.request_timeout_ms if timeout_ms is None else max(timeout_ms, 1)
        started = time.monotonic()
        deadline = started + timeout / 1000
        unavailable_deadline = min(deadline, started + UNAVAILABLE_RETRY_MS / 1000)
        backoff_s = _INITIAL_RECONNECT_BACKOFF_MS / 1000
        first_cause: str | None = None  # why the broker could not be reached, first time
        while True:
            if self._closed:
                raise ClosedError(f"{what}: the client is closed")
            remaining = deadline - time.monotonic()
            token: str | None = None
            try:
                token = self._login(deadline, what)
                return method(
                    request,
                    timeout=max(remaining, 0.001),
                    wait_for_ready=False,
                    metadata=self._with_token(token),
                )
            except grpc.RpcError as exc:
                error = error_from_rpc(exc, self.address, what, tls=self.security.tls)
                if first_cause is None and isinstance(error, BrokerUnavailableError):
                    first_cause = describe_unavailable(_details(exc), tls=self.security.tls)
            except BrokerUnavailableError as exc:  # the login could not reach the broker
                error = exc
                first_cause = first_cause or str(exc)
            except ValueError as exc:  # grpc: "Cannot invoke RPC on closed channel!"
                raise ClosedError(f"{what}: the client is closed") from exc
            if isinstance(error, SaslSessionExpiredError) and self._session is not None:
                # The connection changed under the token: log in on this one, call again.
                self._session.invalidate(token)
                if deadline - time.monotonic() > 0:
                    continue
            if not isinstance(error, BrokerUnavailableError) or not retry_unavailable:
                raise error
            remaining = unavailable_deadline - time.monotonic()
            if remaining <= 0:
                waited = int((time.monotonic() - started) * 1000)
                raise BrokerUnavailableError(
                    f"{what}: broker at {self.address} unreachable for {waited} ms: "
                    + (first_cause or "no details")
                )
            time.sleep(min(backoff_s, remaining))
            backoff_s = min(backoff_s * 2, self._max_backoff_ms / 1000)

    def open_stream(
        self,
        method: grpc.StreamStreamMultiCallable[Any, Any],
        what: str,
        *,
        wait_for_ready: bool = True,
    ) -> BidiStream[Any, Any]:
        """Open a bidirectional stream (``transport.stub.ProduceStream``).

        ``wait_for_ready`` False: if the broker cannot be reached (the channel's connection
        attempt failed), ``responses()`` raises ``BrokerUnavailableError`` at once instead
        of waiting for it to come back; a channel still connecting is waited for either way.
        """
        if self._closed:
            raise ClosedError(f"{what}: the client is closed")
        token = self._login(time.monotonic() + self.request_timeout_ms / 1000, what)
        return BidiStream(
            method,
            self.address,
            what,
            self._with_token(token),
            wait_for_ready,
            self.session_expired if self._session is not None else None,
        )

    def session_expired(self) -> None:
        """Forget the session token (a stream failed with ``SASL_SESSION_EXPIRED``)."""
        if self._session is not None:
            self._session.invalidate(self._session.token)

    def _login(self, deadline: float, what: str) -> str | None:
        """The session token, logging in first if needed; None without SASL."""
        if self._session is None:
            return None

        def authenticate(request: pb.AuthenticateRequest) -> pb.AuthenticateResponse:
            try:
                answer: pb.AuthenticateResponse = self.stub.Authenticate(
                    request,
                    timeout=max(deadline - time.monotonic(), 0.001),
                    wait_for_ready=False,
                    metadata=self._metadata,
                )
            except grpc.RpcError as exc:
                raise error_from_rpc(exc, self.address, f"{what}: Authenticate") from None
            return answer

        return self._session.ensure(authenticate)

    def _with_token(self, token: str | None) -> tuple[tuple[str, str], ...]:
        if token is None:
            return self._metadata
        return (*self._metadata, (SESSION_METADATA_KEY, token))

    @property
    def closed(self) -> bool:
        """``close`` was called: every call raises ``ClosedError`` from now on."""
        return self._closed

    def close(self) -> None:
        """Close the channel; calls in flight end with ``CANCELLED``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._channel.close()
