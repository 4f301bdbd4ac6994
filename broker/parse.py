"""Request bodies parsed by the broker, not by gRPC, so a malformed one is a clear error.

gRPC's Python server parses each request with the handler's ``request_deserializer``;
when that raises (truncated wire data, invalid UTF-8 in a ``string`` field, a varint
that never ends) it answers ``INTERNAL`` "Exception deserializing request!" without the
``tidelog-error-code`` key, and logs a traceback: a hostile client could fill the log,
and a correct client could not tell a bad request from a broken broker. So the handlers
of ``tidelog.v1.Broker`` take raw bytes and parse them here: a body that is not a valid
message of the RPC's request type is answered ``INVALID_ARGUMENT`` with the code
``INVALID_REQUEST``, like every other bad request, and is not logged as a fault.

``parsing_handler`` wraps one behaviour of either serving model (a plain function,
a coroutine function, or a generator of either kind for the streaming RPCs).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from broker.errors import ERROR_CODE_METADATA_KEY, abort_with, to_wire
from storage.errors import InvalidRequestError

__all__ = ["parse_request", "parsing_handler"]


def parse_request(request_type: Any, raw: bytes) -> Any:
    """``raw`` as a ``request_type`` message.

    Raises:
        InvalidRequestError: ``raw`` is not a valid serialized ``request_type``.
    """
    try:
        return request_type.FromString(raw)
    except (DecodeError, RecursionError, ValueError) as exc:
        name = request_type.DESCRIPTOR.name
        raise InvalidRequestError(
            f"the request body is not a valid {name} ({len(raw)} bytes)"
        ) from exc


def parsing_handler(request_type: Any, behaviour: Any, *, streaming: bool) -> Any:
    """``behaviour`` taking raw request bytes (``streaming``: an iterator of them).

    A unary body that does not parse ends the call with the rendered error before the
    behaviour runs; a stream's bad message raises from the iterator the behaviour reads,
    and the behaviour renders it as any error of its stream.
    """
    if streaming:
        if inspect.isasyncgenfunction(behaviour):

            async def serve_async_stream(
                raw_iterator: AsyncIterator[bytes], context: Any
            ) -> AsyncIterator[Any]:
                # An async generator itself: grpc.aio runs any other kind of stream
                # handler as a synchronous one.
                async def parsed() -> AsyncIterator[Any]:
                    async for raw in raw_iterator:
                        yield parse_request(request_type, raw)

                answers = behaviour(parsed(), context)
                try:
                    async for answer in answers:
                        yield answer
                finally:
                    await answers.aclose()  # its finally releases the call's counters

            return serve_async_stream

        def serve_stream(raw_iterator: Iterator[bytes], context: Any) -> Any:
            return behaviour((parse_request(request_type, raw) for raw in raw_iterator), context)

        return serve_stream

    if inspect.iscoroutinefunction(behaviour):

        async def serve_async(raw: bytes, context: Any) -> Any:
            try:
                request = parse_request(request_type, raw)
            except InvalidRequestError as exc:
                wire = to_wire(exc)
                context.set_trailing_metadata(((ERROR_CODE_METADATA_KEY, wire.code),))
                await context.abort(wire.status, wire.message)
                return None
            return await behaviour(request, context)

        return serve_async

    def serve(raw: bytes, context: grpc.ServicerContext) -> Any:
        try:
            request = parse_request(request_type, raw)
        except InvalidRequestError as exc:
            abort_with(context, exc)
        return behaviour(request, context)

    return serve
