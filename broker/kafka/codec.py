"""Kafka request and response bodies, through the ``kio`` codec, as plain values.

Why kio (decided for issue 18, ``docs/kafka.md``): it is generated from Kafka's own JSON
schemas, typed (frozen dataclasses per API version), parses natively, covers every Kafka
4.x API (KIP-848's ConsumerGroupHeartbeat included) and depends on little. kafka-python's
``kafka.protocol`` was the alternative: it also encodes pre-KIP-896 versions, but it is a
client library's internal API, pulls the whole client in and decodes about 4x slower; it
serves as the second codec the property tests compare against (``tests/kafka``).

Handlers do not see kio's classes: one class per API *version* would make every handler
version-specific. Instead:

- ``decode_request`` parses the body with kio and turns it into plain values: dicts for
  structs, lists for arrays, ``int`` for integers and durations (milliseconds), ``int`` for
  error codes, ``bytes`` for records and bytes, ``str``, ``bool``, ``uuid.UUID``.
- ``encode_response`` builds the version's kio response class from such plain values by
  field name: fields the version does not have are dropped, fields the handler did not
  give take the schema's default, or zero/empty/null. So one handler answers every version.

kio 0.6.5 raises ``KeyError`` on a tagged field it does not know, where KIP-482 says to
skip it. The request *header* is parsed by hand here (``parse_header``), so unknown header
tags are skipped; a body with unknown tags is copied without them (``broker.kafka.tags``)
and parsed again. (Unknown tags nested inside a *known* tagged struct are not reached.)
"""

from __future__ import annotations

import datetime
import enum
import functools
import io
import struct
import types
import typing
import uuid
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields, is_dataclass
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from tidelog.broker.kafka.tags import strip_unknown_tags
from tidelog.storage.file_region import FileRegion

__all__ = [
    "CodecError",
    "EncodedItems",
    "RequestHeader",
    "build",
    "decode_request",
    "encode_item",
    "encode_response",
    "encode_response_parts",
    "is_flexible",
    "parse_header",
    "response_header_bytes",
    "to_plain",
]

Plain = dict[str, Any]

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


class CodecError(ValueError):
    """A request that cannot be parsed (truncated, bad lengths, unknown tags...)."""


@dataclass(frozen=True, slots=True)
class RequestHeader:
    """A request header (v1, or v2 for flexible versions) and where the body starts."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str
    body_offset: int


def _read_uvarint(data: bytes | memoryview, position: int) -> tuple[int, int]:
    """An unsigned LEB128 varint at ``position``: (value, next position)."""
    value = 0
    shift = 0
    while True:
        if position >= len(data):
            raise CodecError("truncated varint")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
        if shift > 28:
            raise CodecError("varint longer than 5 bytes")


@functools.cache
def _request_schema(api_key: int, api_version: int) -> Any:
    return load_request_schema(api_key, api_version)


@functools.cache
def _response_schema(api_key: int, api_version: int) -> Any:
    return load_response_schema(api_key, api_version)


@functools.cache
def is_flexible(api_key: int, api_version: int) -> bool:
    """Whether this version uses flexible (KIP-482) encoding; False if kio lacks it."""
    try:
        return bool(_request_schema(api_key, api_version).__flexible__)
    except Exception:
        return False


def parse_header(frame: bytes | memoryview) -> RequestHeader:
    """Parse a request header: ``api_key i16, api_version i16, correlation_id i32,
    client_id nullable i16-length string`` and, for flexible versions (header v2), a tagged
    field section whose tags are all skipped (none is defined for requests).

    ApiVersions requests of versions this broker does not know are read as header v2 when
    the version is 3 or more (their header never changes, KIP-511).

    Raises:
        CodecError: the frame is too short for its header.
    """
    if len(frame) < 10:
        raise CodecError(f"a request header needs at least 10 bytes, got {len(frame)}")
    api_key, api_version, correlation_id, client_len = struct.unpack_from(">hhih", frame, 0)
    position = 10
    client_id = ""
    if client_len >= 0:
        end = position + client_len
        if end > len(frame):
            raise CodecError("truncated client_id")
        client_id = bytes(frame[position:end]).decode("utf-8", errors="replace")
        position = end
    flexible = is_flexible(api_key, api_version) or (api_key == 18 and api_version >= 3)
    if flexible:
        count, position = _read_uvarint(frame, position)
        for _ in range(count):
            _tag, position = _read_uvarint(frame, position)
            size, position = _read_uvarint(frame, position)
            position += size
            if position > len(frame):
                raise CodecError("truncated tagged field in the request header")
    return RequestHeader(api_key, api_version, correlation_id, client_id, position)


def response_header_bytes(api_key: int, api_version: int, correlation_id: int) -> bytes:
    """Response header v0 (``correlation_id``) or v1 (plus an empty tag section) for
    flexible versions; ApiVersions always answers with v0 (its schema says so)."""
    if api_key != 18 and is_flexible(api_key, api_version):
        return struct.pack(">ib", correlation_id, 0)
    return struct.pack(">i", correlation_id)


def decode_request(api_key: int, api_version: int, frame: bytes, offset: int) -> Plain:
    """The request body at ``offset`` of ``frame`` as plain values (module docstring).

    Raises:
        CodecError: kio has no such version, or the body does not parse.
    """
    try:
        schema = _request_schema(api_key, api_version)
    except Exception as exc:
        raise CodecError(f"no schema for api {api_key} v{api_version}: {exc}") from None
    try:
        entity, _ = entity_reader(schema)(frame, offset)
    except KeyError as exc:
        if "tagged field" not in str(exc):
            raise CodecError(f"api {api_key} v{api_version} does not parse: {exc!r}") from None
        # KIP-482: skip the tags this schema does not know (kio raises on them).
        try:
            cleaned = strip_unknown_tags(schema, frame, offset)
            entity, _ = entity_reader(schema)(cleaned, 0)
        except Exception as again:
            message = f"api {api_key} v{api_version} does not parse: {again!r}"
            raise CodecError(message) from None
    except Exception as exc:  # kio raises ValueError, IndexError... on bad bytes
        raise CodecError(f"api {api_key} v{api_version} does not parse: {exc!r}") from None
    plain = to_plain(entity)
    assert isinstance(plain, dict)
    return plain


def encode_response(api_key: int, api_version: int, correlation_id: int, body: Plain) -> bytes:
    """The whole response frame (size prefix, header, body) for plain values ``body``.

    A top-level array given as ``EncodedItems`` (its items already encoded for this api
    key and version, ``encode_item``) is written as those bytes (``_splice``)."""
    schema = _response_schema(api_key, api_version)
    spliced = [name for name, value in body.items() if isinstance(value, EncodedItems)]
    if spliced:
        return _splice(schema, api_key, api_version, correlation_id, body, spliced)
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    out.write(response_header_bytes(api_key, api_version, correlation_id))
    entity_writer(schema)(out, build(schema, body, api_key))
    data = out.getbuffer()
    struct.pack_into(">i", data, 0, len(data) - 4)
    return bytes(data)


@dataclass(frozen=True, slots=True)
class EncodedItems:
    """A top-level array field's items, each already encoded (``encode_item``) for the
    response's api key and version: ``encode_response`` writes the array's length and
    then these bytes, as kio would have written the items themselves. Lets a handler
    keep the encoding of pieces that rarely change (Metadata's topics,
    ``broker.kafka.metadata_cache``) instead of building them for every answer."""

    items: tuple[bytes, ...]


def encode_item(api_key: int, api_version: int, field_name: str, item: Plain) -> bytes:
    """One item of the top-level array ``field_name`` of the response, encoded alone
    (what kio writes for it inside the array: the struct, its tags included)."""
    cls = _item_class(api_key, api_version, field_name)
    out = io.BytesIO()
    entity_writer(cls)(out, build(cls, item, api_key))
    return out.getvalue()


@functools.cache
def _item_class(api_key: int, api_version: int, field_name: str) -> type:
    plans, _ = _plan(_response_schema(api_key, api_version))
    for plan in plans:
        if plan.name == field_name and plan.array and plan.struct is not None:
            return plan.struct
    raise ValueError(f"api {api_key} v{api_version}: no top-level array of structs {field_name}")


# Encoded widths of the fixed-size kafka types (a field after a spliced array must be one).
_FIXED_WIDTH = {
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "uint8": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "float64": 8,
    "bool": 1,
    "error_code": 2,
    "uuid": 16,
    "timedelta_i32": 4,
    "timedelta_i64": 8,
    "datetime_i64": 8,
}


@functools.cache
def _tail_width(api_key: int, api_version: int, field_name: str) -> int:
    """How many bytes kio writes after array ``field_name`` of the response: the
    fields after it, all fixed-size (checked), and a flexible version's tag section,
    empty (checked: the schema has no top-level tagged field). Anything else is a
    ``ValueError``: splicing is only for the shapes it is proven on."""
    schema = _response_schema(api_key, api_version)
    plans, _ = _plan(schema)
    names = [p.name for p in plans]
    if field_name not in names:
        raise ValueError(f"api {api_key} v{api_version} has no field {field_name}")
    width = 0
    for f in fields(schema):
        if f.metadata.get("tag") is not None:
            raise ValueError(f"api {api_key} v{api_version}: top-level tagged fields")
    for plan in plans[names.index(field_name) + 1 :]:
        fixed = _FIXED_WIDTH.get(plan.kafka_type or "")
        if fixed is None or plan.array or plan.struct is not None or plan.nullable:
            raise ValueError(f"api {api_key} v{api_version}: {plan.name} is not fixed-size")
        width += fixed
    if schema.__flexible__:
        width += 1  # zero tagged fields
    return width


def _array_length(flexible: bool, count: int) -> bytes:
    if not flexible:
        return struct.pack(">i", count)
    value = count + 1  # compact arrays: length + 1, unsigned varint
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _splice(
    schema: Any,
    api_key: int,
    api_version: int,
    correlation_id: int,
    body: Plain,
    spliced: list[str],
) -> bytes:
    """``encode_response`` of a body whose top-level array holds ``EncodedItems``: kio
    encodes the body with that array empty; its empty length is then replaced by the
    real length and the items' bytes. The array's place is found from the end (the
    fixed-size fields after it, ``_tail_width``), so only one such field is allowed."""
    if len(spliced) != 1:
        raise ValueError(f"at most one spliced array per response, got {spliced}")
    (name,) = spliced
    encoded: EncodedItems = body[name]
    flexible = bool(schema.__flexible__)
    empty = len(_array_length(flexible, 0))
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    out.write(response_header_bytes(api_key, api_version, correlation_id))
    entity_writer(schema)(out, build(schema, {**body, name: ()}, api_key))
    data = out.getvalue()
    cut = len(data) - _tail_width(api_key, api_version, name)
    frame = b"".join(
        (
            data[: cut - empty],
            _array_length(flexible, len(encoded.items)),
            *encoded.items,
            data[cut:],
        )
    )
    return struct.pack(">i", len(frame) - 4) + frame[4:]


class _RegionBytes(bytes):
    """A ``FileRegion`` where kio's writer expects records: it is written as the region's
    length (``len``) followed by no bytes, and ``_Parts.write`` puts the region in their
    place. Empty bytes in every other respect."""

    region: FileRegion

    def __new__(cls, region: FileRegion) -> _RegionBytes:
        instance = super().__new__(cls)
        instance.region = region
        return instance

    def __len__(self) -> int:
        return self.region.length


class _Parts:
    """kio's output stream for ``encode_response_parts``: bytes, and regions between."""

    def __init__(self) -> None:
        self.parts: list[bytes | FileRegion] = []
        self._bytes = bytearray()

    def write(self, data: bytes) -> int:
        if isinstance(data, _RegionBytes):
            self.parts.append(bytes(self._bytes))
            self.parts.append(data.region)
            self._bytes.clear()
            return 0
        self._bytes += data
        return len(data)

    def finish(self) -> list[bytes | FileRegion]:
        self.parts.append(bytes(self._bytes))
        return [p for p in self.parts if len(p)]


def encode_response_parts(
    api_key: int, api_version: int, correlation_id: int, body: Plain
) -> list[bytes | FileRegion]:
    """The whole response frame for plain values ``body`` whose records fields may hold
    ``FileRegion``s (a zero-copy Fetch, ``broker.kafka.data``): the frame's bytes in
    order, with each region in the place of its bytes, which are never read (the
    listener sends them from the file). The size prefix counts the regions' lengths.
    ``encode_response`` for a body without regions gives the same bytes joined."""
    schema = _response_schema(api_key, api_version)
    out = _Parts()
    out.write(b"\0\0\0\0")
    out.write(response_header_bytes(api_key, api_version, correlation_id))
    entity_writer(schema)(out, build(schema, body, api_key))  # type: ignore[arg-type]
    parts = out.finish()
    first = parts[0]
    assert isinstance(first, bytes)  # the size prefix and header: never a region
    size = sum(len(p) for p in parts) - 4
    parts[0] = struct.pack(">i", size) + first[4:]
    return parts


def to_plain(value: Any) -> Any:
    """kio values -> plain values (module docstring)."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, tuple):
        return [to_plain(v) for v in value]
    if isinstance(value, datetime.timedelta):
        return int(value / datetime.timedelta(milliseconds=1))
    if isinstance(value, datetime.datetime):
        return (value - _EPOCH) // datetime.timedelta(milliseconds=1)
    if isinstance(value, enum.IntEnum):
        return int(value)
    return value


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


_SCALAR_ZERO: dict[str | None, Any] = {"string": "", "bytes": b"", "records": b""}


@dataclass(frozen=True, slots=True)
class _FieldPlan:
    """How to turn one field's plain value into kio's (computed once per class)."""

    name: str
    kafka_type: str | None
    nullable: bool
    array: bool
    struct: type | None  # the struct class (of the field, or of the array's items)
    has_default: bool


@functools.cache
def _plan(cls: type) -> tuple[tuple[_FieldPlan, ...], frozenset[str]]:
    hints = _hints(cls)
    plans = []
    for f in fields(cls):
        hint = hints[f.name]
        nullable = False
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            args = typing.get_args(hint)
            nullable = type(None) in args
            inner = [a for a in args if a is not type(None)]
            hint = inner[0] if len(inner) == 1 else hint
        array = typing.get_origin(hint) is tuple
        target = typing.get_args(hint)[0] if array else hint
        struct = target if isinstance(target, type) and is_dataclass(target) else None
        plans.append(
            _FieldPlan(
                f.name,
                f.metadata.get("kafka_type"),
                nullable,
                array,
                struct,
                f.default is not MISSING or f.default_factory is not MISSING,
            )
        )
    return tuple(plans), frozenset(p.name for p in plans)


def _scalar(kafka_type: str | None, value: Any) -> Any:
    """A plain scalar -> what kio's writer expects for ``kafka_type``."""
    if kafka_type is None or kafka_type.startswith(("int", "uint", "float")):
        return value
    if kafka_type == "string":
        return value if value is not None else ""
    if kafka_type == "error_code":
        return ErrorCode(value or 0)
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(milliseconds=value or 0)
    if kafka_type == "datetime_i64":
        return _EPOCH + datetime.timedelta(milliseconds=value or 0)
    if kafka_type == "records" and isinstance(value, FileRegion):
        return _RegionBytes(value)
    if kafka_type in ("bytes", "records"):
        return bytes(value) if value is not None else b""
    if kafka_type == "bool":
        return bool(value)
    if kafka_type == "uuid":
        return value if isinstance(value, uuid.UUID) else uuid.UUID(int=value or 0)
    return value


def _value(plan: _FieldPlan, value: Any, api_key: int | None) -> Any:
    if value is None and (plan.nullable or plan.array or plan.struct is not None):
        return _zero(plan)
    struct = plan.struct
    if plan.array:
        if struct is not None:
            return tuple(v if isinstance(v, struct) else build(struct, v, api_key) for v in value)
        return tuple(value)
    if struct is not None:
        return value if isinstance(value, struct) else build(struct, value, api_key)
    return _scalar(plan.kafka_type, value)


def _zero(plan: _FieldPlan) -> Any:
    """The value of a field nobody gave: zero, empty or null by type."""
    if plan.nullable:
        return None
    if plan.array:
        return ()
    if plan.struct is not None:
        return build(plan.struct, {})
    return _scalar(plan.kafka_type, _SCALAR_ZERO.get(plan.kafka_type, 0))


def response_has_field(api_key: int, name: str) -> bool:
    """Whether some version of ``api_key``'s response has a field ``name`` (a version
    without it drops it when encoding)."""
    return name in _field_names(api_key)


@functools.cache
def _field_names(api_key: int) -> frozenset[str]:
    """Every field name of every response version of ``api_key``, nested ones included."""
    names: set[str] = set()
    version = 0
    misses = 0
    while misses < 20:  # kio lacks some low versions (KIP-896 baselines)
        try:
            schema = load_response_schema(api_key, version)
        except Exception:
            misses += 1
        else:
            _collect(schema, names, set())
        version += 1
    return frozenset(names)


def _collect(cls: type, names: set[str], seen: set[type]) -> None:
    if cls in seen:
        return
    seen.add(cls)
    for f in fields(cls):
        names.add(f.name)
        hint = _hints(cls)[f.name]
        for candidate in (hint, *typing.get_args(hint)):
            for inner in (candidate, *typing.get_args(candidate)):
                if isinstance(inner, type) and is_dataclass(inner):
                    _collect(inner, names, seen)


def build(cls: type, values: Mapping[str, Any], api_key: int | None = None) -> Any:
    """kio entity ``cls`` from plain ``values`` by field name (module docstring).

    With ``api_key``, a name that no version of that API's response has is a bug in the
    handler (a typo would otherwise be dropped silently as "not in this version"):
    ``ValueError``.
    """
    plans, names = _plan(cls)
    if api_key is not None and not names.issuperset(values):
        unknown = set(values) - names - _field_names(api_key)
        if unknown:
            raise ValueError(f"{cls.__name__}: no version has fields {sorted(unknown)}")
    kwargs: dict[str, Any] = {}
    for plan in plans:
        if plan.name in values:
            kwargs[plan.name] = _value(plan, values[plan.name], api_key)
        elif not plan.has_default:
            kwargs[plan.name] = _zero(plan)
    return cls(**kwargs)
