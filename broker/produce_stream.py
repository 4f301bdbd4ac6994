"""Pipelining for ``ProduceStream``: append request N+1 while request N waits for fsync.

A produce stream is served by two threads. The gRPC worker thread that runs the handler
owns the answers; a reader thread (one per stream) takes requests off the stream in order
and appends them (step 1 of ``broker.produce``), handing each to the worker through a
bounded queue. The worker completes them in the same order (step 2: the ``acks=all``
fsync) and yields the answers. So appends never wait for an fsync, the fsync of one
request usually covers the next ones too (``PartitionLog.flush`` is a no-op once the
recovery point passed), and answers stay in request order.

The queue is bounded (``depth``): a client that sends faster than fsync keeps up with is
slowed down by gRPC flow control once the queue is full, never buffered without bound.
The reader thread ends when the stream ends, when the call is cancelled (the request
iterator then raises) or when the worker stops; it is a daemon thread and the worker joins
it with a timeout.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from storage.errors import InvalidRequestError

__all__ = ["ProducePipeline"]

log = logging.getLogger(__name__)

RequestT = TypeVar("RequestT")
PendingT = TypeVar("PendingT")
ResponseT = TypeVar("ResponseT")

_POLL_S = 0.5  # how often blocked queue operations re-check that the call is alive
_JOIN_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class _Failed:
    """A request the reader could not append: the stream ends with this error."""

    error: BaseException


_END = object()


class ProducePipeline(Generic[RequestT, PendingT, ResponseT]):
    """Runs one produce stream. Not thread-safe: one per stream, driven by ``responses``."""

    def __init__(
        self,
        requests: Iterator[RequestT],
        append: Callable[[RequestT], PendingT],
        complete: Callable[[PendingT], ResponseT],
        is_active: Callable[[], bool],
        depth: int = 8,
        join_timeout_s: float = _JOIN_TIMEOUT_S,
    ) -> None:
        self._requests = requests
        self._append = append
        self._complete = complete
        self._is_active = is_active
        self._queue: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._join_timeout_s = join_timeout_s

    def responses(self) -> Iterator[ResponseT]:
        """Yield one answer per request, in order. Raises the first append error."""
        reader = threading.Thread(target=self._read, name="tidelog-produce-stream", daemon=True)
        reader.start()
        try:
            while True:
                item = self._get()
                if item is _END:
                    return
                if isinstance(item, _Failed):
                    raise item.error
                yield self._complete(item)  # type: ignore[arg-type]  # a PendingT
        finally:
            self._stop.set()
            reader.join(self._join_timeout_s)
            if reader.is_alive():
                log.warning("produce stream reader still running after the stream ended")

    def _get(self) -> object:
        while True:
            try:
                return self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                if not self._is_active():
                    return _END

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _read(self) -> None:
        try:
            for request in self._requests:
                if self._stop.is_set():
                    return
                try:
                    pending: object = self._append(request)
                except Exception as exc:
                    self._put(_Failed(exc))
                    return
                if not self._put(pending):
                    return
        except InvalidRequestError as exc:
            # A message that does not parse (broker.parse): the stream ends with its error.
            self._put(_Failed(exc))
            return
        except Exception as exc:
            # The request iterator raises when the call is cancelled or the client breaks
            # the stream; the worker sees the end and gRPC has the status already.
            log.debug("produce stream ended by the transport: %r", exc)
        self._put(_END)
