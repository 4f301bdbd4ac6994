"""A ``ShareConsumer``'s share fetch streams: one ``ShareFetchStream`` per leader it reads
from (issue #32's acknowledgement overhead; ``broker.grpc.share_stream`` is the broker's
side, docs/share-groups.md "The share fetch stream").

Each request is a ``ShareFetchRequest`` and gets one answer, in order; the caller waits
for it (``ShareLinks.fetch``), as for a unary ShareFetch, so the consumer's logic is the
same over either. What the stream saves is gRPC's price per call.

Decisions:

* **A request's timeout** is kept by one watchdog thread per consumer that wakes every
  ``_WATCH_S`` and cancels a stream whose answer is late (a blocking read of a gRPC
  stream takes no timeout): the answer's error is then ``KafkaTimeoutError``, as a unary
  call's deadline, and the stream is opened again for the next request. A timer thread
  a request would cost more than the call it replaces.
* **A broken stream** (broker gone, restarted, cancelled) fails the request in flight
  with the mapped error and is dropped; nothing is sent again on its own: a request
  carrying acknowledgements may have been applied (as a ShareAcknowledge, not tried
  again on ``UNAVAILABLE``; ``share_consumer._call``), and the consumer keeps them as
  retriable to send again, whose answer then says whether they still hold.
* **An older broker** without the method answers ``UNIMPLEMENTED`` before it reads
  anything: the request goes again as a unary ShareFetch and that broker is asked by
  unary calls from then on. ``streams=False`` (``ShareConsumer(share_fetch_stream=False)``)
  uses unary calls only.

Thread-safe: a stream serves one request at a time (a lock per stream: ``poll`` on the
application's thread and ``commit_async``'s thread may share it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

from tidelog.client.connection import Connection
from tidelog.client.errors import ClosedError
from tidelog.client.grpc_connection import GrpcConnection
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.storage.errors import (
    BrokerUnavailableError,
    InvalidRequestError,
    KafkaTimeoutError,
    TidelogError,
)

__all__ = ["ShareLinks", "share_call"]

_WATCH_S = 0.05
_METHOD = "ShareFetchStream"


class _Link:
    """One open stream to one broker."""

    __slots__ = ("deadline", "lock", "responses", "stream", "timed_out")

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.responses: Iterator[pb.ShareFetchResponse] = stream.responses()
        self.lock = threading.Lock()
        self.deadline = 0.0  # monotonic seconds; 0: no request in flight
        self.timed_out = False


class ShareLinks:
    """The share fetch streams of one consumer, by broker address."""

    def __init__(self, *, streams: bool = True) -> None:
        self._streams = streams
        self._lock = threading.Lock()
        self._links: dict[str, _Link] = {}
        self._unary: set[str] = set()  # brokers that do not serve the stream
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None

    def fetch(
        self,
        connection: Connection,
        request: pb.ShareFetchRequest,
        timeout_ms: int,
        *,
        retry: bool = True,
    ) -> pb.ShareFetchResponse:
        """One ShareFetch at ``connection``'s broker, on its stream (unary where there is
        none); raises the call's ``TidelogError``. ``retry``: a unary call is tried again
        on ``UNAVAILABLE`` (``share_consumer._call``)."""
        if not isinstance(connection, GrpcConnection):
            raise InvalidRequestError("ShareFetch needs a gRPC connection")
        address = connection.address
        if not self._streams or address in self._unary:
            return _unary(connection, request, timeout_ms, retry)
        link = self._link(connection)
        with link.lock:
            try:
                return self._ask(link, request, timeout_ms)
            except TidelogError as exc:
                self._drop(address, link)
                if _unimplemented(exc):
                    self._unary.add(address)
                    return _unary(connection, request, timeout_ms, retry)
                raise

    def _ask(
        self, link: _Link, request: pb.ShareFetchRequest, timeout_ms: int
    ) -> pb.ShareFetchResponse:
        link.timed_out = False
        link.deadline = time.monotonic() + timeout_ms / 1000
        try:
            link.stream.send(request)
            return next(link.responses)
        except StopIteration:
            raise BrokerUnavailableError(f"{_METHOD}: the broker ended the stream") from None
        except ClosedError:
            if link.timed_out:
                raise KafkaTimeoutError(f"{_METHOD}: no answer within {timeout_ms} ms") from None
            raise
        finally:
            link.deadline = 0.0

    def _link(self, connection: GrpcConnection) -> _Link:
        with self._lock:
            if self._stop.is_set():
                raise ClosedError("the share consumer is closed")
            link = self._links.get(connection.address)
            if link is None:
                transport = connection.transport
                link = _Link(
                    transport.open_stream(
                        transport.stub.ShareFetchStream, _METHOD, wait_for_ready=False
                    )
                )
                self._links[connection.address] = link
            if self._watchdog is None:
                self._watchdog = threading.Thread(
                    target=self._watch, name="share-stream-watchdog", daemon=True
                )
                self._watchdog.start()
            return link

    def _drop(self, address: str, link: _Link) -> None:
        with self._lock:
            if self._links.get(address) is link:
                del self._links[address]
        link.stream.cancel()

    def _watch(self) -> None:
        while not self._stop.wait(_WATCH_S):
            now = time.monotonic()
            with self._lock:
                links = list(self._links.values())
            for link in links:
                deadline = link.deadline
                if deadline and now > deadline:
                    link.timed_out = True
                    link.stream.cancel()

    def close(self) -> None:
        """End every stream (half-closed: the broker answers nothing more). Idempotent."""
        with self._lock:
            self._stop.set()
            links, self._links = list(self._links.values()), {}
        for link in links:
            link.stream.close()


def _unimplemented(exc: TidelogError) -> bool:
    """The broker does not serve ``ShareFetchStream`` (``error_from_rpc``'s
    ``UNIMPLEMENTED``, an ``InvalidRequestError`` without a broker error code)."""
    return isinstance(exc, InvalidRequestError) and "does not implement" in str(exc)


def _unary(
    connection: GrpcConnection, request: pb.ShareFetchRequest, timeout_ms: int, retry: bool
) -> pb.ShareFetchResponse:
    transport = connection.transport
    answer: pb.ShareFetchResponse = transport.call(
        transport.stub.ShareFetch,
        request,
        what="ShareFetch",
        timeout_ms=timeout_ms,
        retry_unavailable=retry,
    )
    return answer


def share_call(
    connection: Connection, method: str, request: Any, timeout_ms: int, *, retry: bool = True
) -> Any:
    """One call. ``retry`` False: not tried again when the broker answers ``UNAVAILABLE``
    (``Transport.call``'s ``retry_unavailable``): a ShareAcknowledge the broker applied
    before it died, tried again on its successor or restart, is refused as not held any
    more, and that refusal would be reported as the outcome (the fault harness's checker
    caught such an ACCEPT reported failed and never redelivered). Its outcome is then the
    ``BrokerUnavailableError``: unknown."""
    if not isinstance(connection, GrpcConnection):
        raise InvalidRequestError(f"{method} needs a gRPC connection")
    transport = connection.transport
    return transport.call(
        getattr(transport.stub, method),
        request,
        what=method,
        timeout_ms=timeout_ms,
        retry_unavailable=retry,
    )
