"""A direct codec for Produce (issue #31's lean produce path): the request body read and
the common answer written with ``struct``, without kio's entity objects.

Why: a single-record produce through the Kafka listener spent about as long in kio
(decoding the request into dataclasses, ``to_plain``, ``build`` and writing the answer
back) as in the append itself; Produce is the one request sent per record batch, so it
alone gets a direct codec. Everything else, and every Produce this codec does not take,
goes through kio (``broker.kafka.codec``) as before.

What it takes, and what it leaves to kio:

- ``decode_produce``: Produce v3-v12 (v9+ flexible: compact strings and arrays, tag
  sections). It returns exactly the plain values ``codec.decode_request`` returns (the
  differential tests compare them for every version), with each partition's records as
  ``bytes`` sliced once from the frame. Anything unusual returns None and kio decodes
  the frame as before, with its errors and its handling of unknown tags: a tag section
  that is not empty, a null array, a string that is not UTF-8, bytes left over, a frame
  cut short.
- ``encode_produce_response``: the answer frame (size, header, body) for versions 3-12
  when no partition carries KIP-951's leader hint (``current_leader``) and the answer no
  ``node_endpoints`` (the hints of a wrong leader, ``broker.kafka.data``), and no
  partition ``record_errors``; byte for byte what ``codec.encode_response`` writes (the
  tests compare). Otherwise None, and kio encodes it.

Thread-safe: plain functions over immutable inputs.
"""

from __future__ import annotations

import struct

from tidelog.broker.kafka.codec import CodecError, Plain, response_header_bytes
from tidelog.broker.kafka.codec import _read_uvarint as _uvarint

__all__ = ["decode_produce", "encode_produce_response"]

_PRODUCE = 0
_FIRST = 3
_LAST = 12
_FIRST_FLEXIBLE = 9
_FIRST_LOG_START_OFFSET = 5
_FIRST_ERROR_MESSAGE = 8  # record_errors and error_message per partition

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")
# index, error_code, base_offset, log_append_time, log_start_offset
_PARTITION = struct.Struct(">ihqqq")


class _UnusualError(Exception):
    """Not for this codec: kio decodes the frame."""


def _no_tags(data: bytes, position: int) -> int:
    if data[position] != 0:
        raise _UnusualError("a tag section that is not empty")
    return position + 1


def decode_produce(version: int, frame: bytes, offset: int) -> Plain | None:
    """The Produce request body at ``offset`` of ``frame`` as ``codec.decode_request``
    gives it, or None: kio must decode it (module docstring)."""
    if not _FIRST <= version <= _LAST:
        return None
    try:
        if version >= _FIRST_FLEXIBLE:
            plain, end = _decode_flexible(frame, offset)
        else:
            plain, end = _decode_classic(frame, offset)
    except (_UnusualError, CodecError, IndexError, struct.error, UnicodeDecodeError):
        return None
    return plain if end == len(frame) else None


def _decode_classic(data: bytes, p: int) -> tuple[Plain, int]:
    (length,) = _I16.unpack_from(data, p)
    p += 2
    tid = None
    if length >= 0:
        tid = _text(data, p, length)
        p += length
    acks, timeout = _ACKS_TIMEOUT.unpack_from(data, p)
    p += 6
    (topics,) = _I32.unpack_from(data, p)
    p += 4
    if topics < 0:
        raise _UnusualError("a null array")
    topic_data = []
    for _ in range(topics):
        (length,) = _I16.unpack_from(data, p)
        p += 2
        if length < 0:
            raise _UnusualError("a null topic name")
        name = _text(data, p, length)
        p += length
        (count,) = _I32.unpack_from(data, p)
        p += 4
        if count < 0:
            raise _UnusualError("a null array")
        partitions = []
        for _ in range(count):
            index, size = struct.unpack_from(">ii", data, p)
            p += 8
            records = None
            if size >= 0:
                records = _slice(data, p, size)
                p += size
            partitions.append({"index": index, "records": records})
        topic_data.append({"name": name, "partition_data": partitions})
    plain = {"transactional_id": tid, "acks": acks, "timeout": timeout, "topic_data": topic_data}
    return plain, p


def _decode_flexible(data: bytes, p: int) -> tuple[Plain, int]:
    n, p = _uvarint(data, p)
    tid = None
    if n:
        tid = _text(data, p, n - 1)
        p += n - 1
    acks, timeout = _ACKS_TIMEOUT.unpack_from(data, p)
    p += 6
    topics, p = _uvarint(data, p)
    if not topics:
        raise _UnusualError("a null array")
    topic_data = []
    for _ in range(topics - 1):
        n, p = _uvarint(data, p)
        if not n:
            raise _UnusualError("a null topic name")
        name = _text(data, p, n - 1)
        p += n - 1
        count, p = _uvarint(data, p)
        if not count:
            raise _UnusualError("a null array")
        partitions = []
        for _ in range(count - 1):
            (index,) = _I32.unpack_from(data, p)
            n, p = _uvarint(data, p + 4)
            records = None
            if n:
                records = _slice(data, p, n - 1)
                p += n - 1
            p = _no_tags(data, p)
            partitions.append({"index": index, "records": records})
        p = _no_tags(data, p)
        topic_data.append({"name": name, "partition_data": partitions})
    p = _no_tags(data, p)
    plain = {"transactional_id": tid, "acks": acks, "timeout": timeout, "topic_data": topic_data}
    return plain, p


def _text(data: bytes, p: int, length: int) -> str:
    if p + length > len(data):
        raise _UnusualError("a string past the frame")
    return data[p : p + length].decode("utf-8")


def _slice(data: bytes, p: int, length: int) -> bytes:
    if p + length > len(data):
        raise _UnusualError("bytes past the frame")
    return data[p : p + length]


def encode_produce_response(version: int, correlation_id: int, answer: Plain) -> bytes | None:
    """The answer's whole frame as ``codec.encode_response`` writes it, or None: kio must
    encode it (leader hints, record errors; module docstring)."""
    if not _FIRST <= version <= _LAST or answer.get("node_endpoints"):
        return None
    flexible = version >= _FIRST_FLEXIBLE
    out = bytearray(b"\0\0\0\0")
    out += response_header_bytes(_PRODUCE, version, correlation_id)
    topics = answer["responses"]
    out += _count(len(topics), flexible)
    for topic in topics:
        out += _string(topic["name"], flexible)
        partitions = topic["partition_responses"]
        out += _count(len(partitions), flexible)
        for p in partitions:
            if "current_leader" in p or p.get("record_errors"):
                return None
            out += _PARTITION.pack(
                p["index"],
                p["error_code"],
                p["base_offset"],
                p.get("log_append_time", -1),
                p.get("log_start_offset", -1),
            )
            if version < _FIRST_LOG_START_OFFSET:
                del out[-8:]
            if version >= _FIRST_ERROR_MESSAGE:
                out += _count(0, flexible)  # record_errors
                message = p.get("error_message")
                out += _nullable_string(message, flexible)
            if flexible:
                out += b"\0"
        if flexible:
            out += b"\0"
    out += _I32.pack(answer.get("throttle_time", 0))
    if flexible:
        out += b"\0"
    struct.pack_into(">i", out, 0, len(out) - 4)
    return bytes(out)


def _count(count: int, flexible: bool) -> bytes:
    if not flexible:
        return _I32.pack(count)
    return _varint_bytes(count + 1)


def _string(text: str, flexible: bool) -> bytes:
    raw = text.encode()
    if not flexible:
        return _I16.pack(len(raw)) + raw
    return _varint_bytes(len(raw) + 1) + raw


def _nullable_string(text: str | None, flexible: bool) -> bytes:
    if text is None:
        return b"\0" if flexible else b"\xff\xff"
    return _string(text, flexible)


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
