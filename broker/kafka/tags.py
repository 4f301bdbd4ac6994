"""Drop tagged fields a request's schema does not know, so that kio can parse it.

KIP-482: a receiver must skip tagged fields it does not know (a newer client may send tags
an older broker has never heard of). kio 0.6.5's reader raises ``KeyError`` instead. When
it does, the listener walks the body with the schema (kio's dataclasses: field types in
their metadata, ``tag`` for the known tagged fields), copying every byte except the unknown
tagged fields, and parses the copy. Only flexible versions have tagged fields.

Byte layout walked (flexible versions; a struct's tagged fields come after its fields)::

    int8/bool 1, int16 2, int32 4, int64 8, float64 8, uuid 16 bytes
    string, bytes, records   uvarint length+1, then the bytes (0: null)
    array                    uvarint count+1, then the items (0: null)
    nullable struct          int8 -1 (null) or 1, then the struct
    tagged fields            uvarint count, then per field: uvarint tag, uvarint size, data

A known tagged field that is a struct (or an array of structs) is walked too, and written
again with its new size: the tags it carries that the schema does not know are dropped as
well, as Kafka's generated readers skip them at every level.

Pure: bytes in, bytes out.
"""

from __future__ import annotations

import functools
import types
import typing
from dataclasses import fields, is_dataclass
from typing import Any

__all__ = ["strip_unknown_tags"]

_FIXED = {
    "int8": 1,
    "bool": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "float64": 8,
    "uuid": 16,
}


class _Reader:
    """A position in the body and the copy being written. Not thread-safe."""

    def __init__(self, data: bytes, position: int) -> None:
        self.data = data
        self.position = position
        self.out = bytearray()

    def take(self, count: int) -> bytes:
        end = self.position + count
        if count < 0 or end > len(self.data):
            raise ValueError("truncated request body")
        chunk = self.data[self.position : end]
        self.position = end
        return chunk

    def uvarint(self) -> tuple[int, bytes]:
        start = self.position
        value = shift = 0
        while True:
            byte = self.take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value, self.data[start : self.position]
            shift += 7
            if shift > 28:
                raise ValueError("varint longer than 5 bytes")


@functools.cache
def _layout(cls: type) -> tuple[tuple[tuple[str, str | None, bool, bool, type | None], ...],
                                dict[int, tuple[str | None, bool, type | None]]]:  # fmt: skip
    """(untagged fields as (name, kafka type, nullable, array, struct), known tags)."""
    hints = typing.get_type_hints(cls)
    plain = []
    tagged: dict[int, tuple[str | None, bool, type | None]] = {}
    for f in fields(cls):
        hint = hints[f.name]
        nullable = False
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            nullable = type(None) in typing.get_args(hint)
            inner = [a for a in typing.get_args(hint) if a is not type(None)]
            hint = inner[0] if len(inner) == 1 else hint
        array = typing.get_origin(hint) is tuple
        target = typing.get_args(hint)[0] if array else hint
        struct = target if isinstance(target, type) and is_dataclass(target) else None
        if "tag" in f.metadata:
            tagged[int(f.metadata["tag"])] = (f.metadata.get("kafka_type"), array, struct)
        else:
            plain.append((f.name, f.metadata.get("kafka_type"), nullable, array, struct))
    return tuple(plain), tagged


def _copy_value(reader: _Reader, kafka_type: str | None, struct: type | None) -> None:
    if struct is not None:
        _copy_struct(reader, struct)
    elif kafka_type in _FIXED:
        reader.out += reader.take(_FIXED[kafka_type])
    elif kafka_type in ("string", "bytes", "records"):
        length, raw = reader.uvarint()
        reader.out += raw
        if length:
            reader.out += reader.take(length - 1)
    else:
        raise ValueError(f"unknown field type {kafka_type!r}")


def _copy_struct(reader: _Reader, cls: type) -> None:
    plain, tagged = _layout(cls)
    for _name, kafka_type, nullable, array, struct in plain:
        if array:
            count, raw = reader.uvarint()
            reader.out += raw
            for _ in range(max(count - 1, 0)):
                _copy_value(reader, kafka_type, struct)
        elif struct is not None and nullable:
            marker = reader.take(1)
            reader.out += marker
            if marker != b"\xff":
                _copy_struct(reader, struct)
        else:
            _copy_value(reader, kafka_type, struct)
    count, _ = reader.uvarint()
    kept = []
    for _ in range(count):
        tag, raw_tag = reader.uvarint()
        size, raw_size = reader.uvarint()
        data = reader.take(size)
        known = tagged.get(tag)
        if known is None:
            continue
        kafka_type, array, struct = known
        if struct is not None:
            # A known tagged struct may itself carry tags this schema does not know.
            data = _copy_tagged_struct(data, array, struct)
            raw_size = _encode_uvarint(len(data))
        kept.append(raw_tag + raw_size + data)
    reader.out += _encode_uvarint(len(kept))
    for chunk in kept:
        reader.out += chunk


def _copy_tagged_struct(data: bytes, array: bool, struct: type) -> bytes:
    """A known tagged field's value (a struct, or an array of them), walked like the body
    so the unknown tags inside it are dropped as well."""
    reader = _Reader(data, 0)
    if array:
        count, raw = reader.uvarint()
        reader.out += raw
        for _ in range(max(count - 1, 0)):
            _copy_struct(reader, struct)
    else:
        _copy_struct(reader, struct)
    if reader.position != len(data):
        raise ValueError("a tagged field's size does not match its value")
    return bytes(reader.out)


def _encode_uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def strip_unknown_tags(schema: Any, data: bytes, offset: int) -> bytes:
    """The body of a flexible request at ``offset`` of ``data``, without the tagged
    fields ``schema`` (a kio request class) does not know; the known ones are kept.

    Raises:
        ValueError: the body does not follow the schema (truncated, bad lengths).
    """
    reader = _Reader(data, offset)
    _copy_struct(reader, schema)
    return bytes(reader.out)
