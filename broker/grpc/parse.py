"""Request bodies parsed by the broker, not by gRPC, so a malformed one is a clear error.

gRPC's Python server parses each request with the handler's ``request_deserializer``;
when that raises (truncated wire data, invalid UTF-8 in a ``string`` field, a varint
that never ends) it answers ``INTERNAL`` "Exception deserializing request!" without the
``tidelog-error-code`` key, and logs a traceback: a hostile client could fill the log,
and a correct client could not tell a bad request from a broken broker. So the handlers
of ``tidelog.v1.Broker`` take raw bytes and parse them here: a body that is not a valid
message of the RPC's request type is answered ``INVALID_ARGUMENT`` with the code
``INVALID_REQUEST``, like every other bad request, and is not logged as a fault.

Parsing expands a request: a 4-byte entry of a repeated field becomes a ~50-byte message
object (measured: 16 MB of empty partition entries parsed into 191 MB), and each entry
then becomes Python objects and an answer. So before parsing, a bounded scan of the
wire bytes (``count_entries``, no allocation per entry, stops as soon as the limit is
passed) counts the entries of repeated fields and map entries, nested included; a
request with more than ``max.request.partition.size.limit`` entries (Kafka's name for
its cap on the partitions of one request) is ``INVALID_REQUEST``. The broker's memory
per request is then bounded by ``socket.request.max.bytes`` (record bytes are kept as
one object each) plus the limit times a small constant.

``parsing_handler`` wraps one behaviour of either serving model (a plain function,
a coroutine function, or a generator of either kind for the streaming RPCs).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError

from tidelog.broker.grpc.errors import ERROR_CODE_METADATA_KEY, abort_with, to_wire
from tidelog.storage.errors import InvalidRequestError

__all__ = ["DEFAULT_MAX_ENTRIES", "count_entries", "parse_request", "parsing_handler"]

DEFAULT_MAX_ENTRIES = 20_000
_HIGH_BYTES = bytes(range(0x80, 0x100))  # varint continuation bytes


class _MalformedError(Exception):
    pass


def parse_request(request_type: Any, raw: bytes, max_entries: int = DEFAULT_MAX_ENTRIES) -> Any:
    """``raw`` as a ``request_type`` message.

    Raises:
        InvalidRequestError: ``raw`` is not a valid serialized ``request_type``, or has
            more than ``max_entries`` entries in repeated fields (module docstring).
    """
    name = request_type.DESCRIPTOR.name
    try:
        entries = count_entries(request_type.DESCRIPTOR, raw, max_entries)
    except _MalformedError as exc:
        raise InvalidRequestError(
            f"the request body is not a valid {name} ({len(raw)} bytes)"
        ) from exc
    if entries > max_entries:
        raise InvalidRequestError(
            f"the {name} has more than max.request.partition.size.limit={max_entries}"
            " entries (partitions, topics, names, ...)"
        )
    try:
        return request_type.FromString(raw)
    except (DecodeError, RecursionError, ValueError) as exc:
        name = request_type.DESCRIPTOR.name
        raise InvalidRequestError(
            f"the request body is not a valid {name} ({len(raw)} bytes)"
        ) from exc


def count_entries(descriptor: Descriptor, raw: bytes, limit: int) -> int:
    """The entries of repeated fields in ``raw`` (a serialized ``descriptor`` message),
    nested messages included, counted up to just past ``limit``.

    Raises:
        _MalformedError: the wire data is broken (a length past the end, a bad wire type).
    """
    return _count(descriptor, raw, 0, len(raw), limit, 0)


def _varint(data: bytes, position: int, end: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while True:
        if position >= end or shift > 63:
            raise _MalformedError
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7


def _count(
    descriptor: Descriptor, data: bytes, position: int, end: int, limit: int, count: int
) -> int:
    fields = descriptor.fields_by_number
    while position < end:
        tag, position = _varint(data, position, end)
        field = fields.get(tag >> 3)
        repeated = field is not None and field.is_repeated
        wire_type = tag & 7
        if wire_type == 0:
            _, position = _varint(data, position, end)
            count += repeated
        elif wire_type == 1:
            position += 8
            count += repeated
        elif wire_type == 5:
            position += 4
            count += repeated
        elif wire_type == 2:
            length, position = _varint(data, position, end)
            stop = position + length
            if stop > end:
                raise _MalformedError
            if field is not None and field.message_type is not None:
                count += 1
                if _nests_entries(field.message_type):
                    count = _count(field.message_type, data, position, stop, limit, count)
            elif repeated and field is not None and field.type in _PACKABLE_NOT:
                count += 1  # one string or bytes element
            elif repeated:  # packed scalars: one varint ends at each byte below 0x80
                count += len(data[position:stop].translate(None, _HIGH_BYTES))
            position = stop
        else:  # groups (3, 4) are not proto3; 6 and 7 do not exist
            raise _MalformedError
        if count > limit:
            return count
    if position != end:
        raise _MalformedError
    return count


_PACKABLE_NOT = (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES)
_NESTS_ENTRIES: dict[str, bool] = {}


def _nests_entries(descriptor: Descriptor) -> bool:
    """Whether a ``descriptor`` message can hold repeated fields (else the scan skips
    its bytes whole; protobuf checks their validity when it parses them)."""
    known = _NESTS_ENTRIES.get(descriptor.full_name)
    if known is None:
        _NESTS_ENTRIES[descriptor.full_name] = False  # a recursive type: no loop
        known = any(
            field.is_repeated
            or (field.message_type is not None and _nests_entries(field.message_type))
            for field in descriptor.fields
        )
        _NESTS_ENTRIES[descriptor.full_name] = known
    return known


def parsing_handler(
    request_type: Any, behaviour: Any, *, streaming: bool, max_entries: int = DEFAULT_MAX_ENTRIES
) -> Any:
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
                        yield parse_request(request_type, raw, max_entries)

                answers = behaviour(parsed(), context)
                try:
                    async for answer in answers:
                        yield answer
                finally:
                    await answers.aclose()  # its finally releases the call's counters

            return serve_async_stream

        def serve_stream(raw_iterator: Iterator[bytes], context: Any) -> Any:
            return behaviour(
                (parse_request(request_type, raw, max_entries) for raw in raw_iterator), context
            )

        return serve_stream

    if inspect.iscoroutinefunction(behaviour):

        async def serve_async(raw: bytes, context: Any) -> Any:
            try:
                request = parse_request(request_type, raw, max_entries)
            except InvalidRequestError as exc:
                wire = to_wire(exc)
                context.set_trailing_metadata(((ERROR_CODE_METADATA_KEY, wire.code),))
                await context.abort(wire.status, wire.message)
                return None
            return await behaviour(request, context)

        return serve_async

    def serve(raw: bytes, context: grpc.ServicerContext) -> Any:
        try:
            request = parse_request(request_type, raw, max_entries)
        except InvalidRequestError as exc:
            abort_with(context, exc)
        return behaviour(request, context)

    return serve
