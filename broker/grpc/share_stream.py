"""``ShareFetchStream`` on the asynchronous gRPC listener (issue #32's acknowledgement
overhead): a share member's ShareFetch requests on one open bidirectional stream to a
partition leader.

Why: the share group's no-work phase of ``benchmarks/share_bench.py`` made about 1,550
unary calls for 300,000 records (a ShareFetch and a ShareAcknowledge a poll, plus
heartbeats), and most of the broker's GIL-held time left was grpcio's fixed price per
call (a new HTTP/2 stream, headers and trailers, system calls made with the GIL held).
The plain consumer pays it once, on its one ``FetchStream``. A message on an open stream
costs a fraction of a call.

Decisions:

* **Each request is a ShareFetch, unchanged**: its acknowledgements applied first, then
  records acquired for the member (``ShareOps.fetch``: the same code as the unary call,
  the same per-partition errors, long poll, fencing and durability), so every guarantee
  of the unary call holds per message. A request that names no partitions only
  acknowledges (the answer carries each partition's outcome and no records): the
  client's ``commit_sync`` goes over the stream too. There is no ShareAcknowledge on the
  stream: a ShareFetch without partitions is one.
* **In order, one at a time**, as ``FetchStream``: the client sends the next request
  after the answer to the previous one. A request is authorized as a unary ShareFetch
  (READ on the group and each topic it names) and counted under the operation
  ``share_fetch``; its long poll occupies an executor thread as the unary call's does.
* **A stream that ends while a request is parked** (a long poll on the executor) wakes
  it, and it acquires nothing more (``ShareFetchCancel``): records are never acquired
  for a client that cannot receive them. The acknowledgements it carried stand (they
  were applied before the wait).
* **A stream that ends does not release anything**: the member's records stay locked to
  it until their locks expire, as after a unary call whose client died (a member whose
  stream broke on a network blip opens another and acknowledges what it holds).
  ``close_session`` stays the unary ShareAcknowledge's (``ShareConsumer.close``). Kafka
  releases a share session's records when its connection closes; Tidelog's gRPC client
  multiplexes every call of a client on one connection and a stream is only one of them,
  so the lock is the bound here, as for a member that dies.
* **Broker stop**: the stream reads no more requests, answers the one it serves and ends
  ``UNAVAILABLE`` (``ShuttingDownError``), so an idle stream does not hold the listener's
  stop for the whole grace period (as ``ProduceStream``).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from grpc import aio

from tidelog.broker.core.context import RequestContext
from tidelog.broker.core.errors import Outcome, ShuttingDownError
from tidelog.broker.core.pipeline import RequestPipeline
from tidelog.broker.core.share_ops import ShareFetchCancel
from tidelog.broker.grpc.authorize import resources_of
from tidelog.broker.grpc.share_service import share_fetch
from tidelog.proto.tidelog.v1 import broker_pb2 as pb

__all__ = ["METHOD", "ShareFetchStreams"]

METHOD = "ShareFetchStream"
_OPERATION = "share_fetch"
_REQUEST_RPC = "ShareFetch"  # each request is authorized as this unary call


class ShareFetchStreams:
    """Serves ``ShareFetchStream`` calls on the listener's event loop (loop only)."""

    def __init__(
        self,
        pipeline: RequestPipeline,
        open_call: Callable[[aio.ServicerContext[Any, Any], str], RequestContext],
        close_call: Callable[[RequestContext], None],
        call: Callable[[RequestContext, Any, Any], Awaitable[Any]],
        render: Callable[[aio.ServicerContext[Any, Any], Outcome], Awaitable[None]],
        enders: set[Callable[[], None]],
        closing: Callable[[], bool],
    ) -> None:
        """``call(caller, handler, request)``: a unary handler on the executor with its
        throttle (the listener's ``_call``); ``enders``: what the listener's stop calls."""
        self._pipeline = pipeline
        self._open_call = open_call
        self._close_call = close_call
        self._call = call
        self._render = render
        self._enders = enders
        self._closing = closing

    async def serve(
        self,
        request_iterator: AsyncIterator[pb.ShareFetchRequest],
        context: aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[pb.ShareFetchResponse]:
        """Answer each request in order until the client closes its side."""
        started = time.perf_counter()
        try:
            caller = self._open_call(context, METHOD)
        except Exception as exc:
            await self._render(context, self._pipeline.fail(METHOD, _OPERATION, exc, started))
            return
        # The next request, None at the client's end, or the error that ended the stream.
        incoming: asyncio.Queue[pb.ShareFetchRequest | Exception | None] = asyncio.Queue()

        async def read() -> None:
            end: Exception | None = None
            try:
                async for request in request_iterator:
                    incoming.put_nowait(request)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a body that does not parse
                end = exc
            incoming.put_nowait(end)

        reader = asyncio.create_task(read())
        # Set when the stream ends: a fetch parked on the executor for it stops there.
        cancel = ShareFetchCancel()
        handler = functools.partial(share_fetch, cancel=cancel)

        def end_on_close() -> None:
            reader.cancel()
            incoming.put_nowait(ShuttingDownError("the broker is shutting down"))

        self._enders.add(end_on_close)
        if self._closing():
            end_on_close()
        error: Outcome | None = None
        try:
            while True:
                entry = await incoming.get()
                if entry is None:
                    break
                started = time.perf_counter()
                if isinstance(entry, Exception):
                    error = self._pipeline.fail(METHOD, _OPERATION, entry, started)
                    break
                request = entry
                served = await self._pipeline.serve(
                    caller,
                    METHOD,
                    _OPERATION,
                    functools.partial(self._call, caller, handler, request),
                    resources=functools.partial(resources_of, _REQUEST_RPC, request),
                )
                if served.error is not None:
                    error = served.error
                    break
                assert served.value is not None
                yield served.value
        finally:
            cancel.cancel()
            self._enders.discard(end_on_close)
            reader.cancel()
            self._close_call(caller)
        if error is not None:  # rendered outside the try: abort raises
            await self._render(context, error)
