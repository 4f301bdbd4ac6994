"""Kafka's zigzag varints: the integer encoding inside RecordBatch v2 records.

A signed integer is first zigzagged so that small magnitudes of either sign become small
unsigned numbers (``zz = (n << 1) ^ (n >> bits-1)``: 0->0, -1->1, 1->2, -2->3, ...), then
written as unsigned LEB128: seven bits per byte, least significant group first, the high
bit of a byte set when another byte follows. ``varint`` is the 32-bit form (at most 5
bytes), ``varlong`` the 64-bit form (at most 10 bytes), as ``ByteUtils.writeVarint`` /
``writeVarlong`` in Kafka::

    0 -> 00        -1 -> 01        1 -> 02        300 -> D8 04        -2**31 -> FF FF FF FF 0F

The wire protocol's *unsigned* varints (compact strings and arrays, tagged fields) are plain
LEB128 with no zigzag: ``encode_unsigned_varint`` / ``decode_unsigned_varint`` (used by the
flexible record formats of the internal topics, e.g. ``__transaction_state``).

Decoders are strict where Kafka is lenient: a varint longer than 5 (varlong: 10) bytes, or
one whose value does not fit 32 (64) bits, is rejected rather than truncated, because no
correct writer produces it. All functions are pure and thread-safe.

``NONNEGATIVE_VARINTS`` is a precomputed table for the record encoder's hot loop: lengths
and offset deltas are almost always small and non-negative, and a tuple lookup is several
times cheaper than running the encoder.
"""

from __future__ import annotations

from tidelog.storage.errors import CorruptRecordError

__all__ = [
    "INT32_MAX",
    "INT32_MIN",
    "INT64_MAX",
    "INT64_MIN",
    "NONNEGATIVE_VARINTS",
    "decode_unsigned_varint",
    "decode_varint",
    "decode_varlong",
    "encode_unsigned_varint",
    "encode_varint",
    "encode_varlong",
]

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

_Buffer = bytes | bytearray | memoryview


def _encode_unsigned(zz: int) -> bytes:
    if zz < 0x80:
        return bytes((zz,))
    out = bytearray()
    while zz >= 0x80:
        out.append((zz & 0x7F) | 0x80)
        zz >>= 7
    out.append(zz)
    return bytes(out)


def encode_varint(value: int) -> bytes:
    """Encode a signed 32-bit integer as a zigzag varint (1 to 5 bytes).

    Raises ``ValueError`` if ``value`` is outside the int32 range.
    """
    if not INT32_MIN <= value <= INT32_MAX:
        raise ValueError(f"varint value {value} is outside the int32 range")
    return _encode_unsigned(((value << 1) ^ (value >> 31)) & 0xFFFFFFFF)


def encode_varlong(value: int) -> bytes:
    """Encode a signed 64-bit integer as a zigzag varlong (1 to 10 bytes).

    Raises ``ValueError`` if ``value`` is outside the int64 range.
    """
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"varlong value {value} is outside the int64 range")
    return _encode_unsigned(((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF)


def encode_unsigned_varint(value: int) -> bytes:
    """Encode a non-negative 32-bit integer as an unsigned varint (Kafka's
    ``ByteUtils.writeUnsignedVarint``: 1 to 5 bytes). Raises ``ValueError`` out of range."""
    if not 0 <= value <= 0xFFFFFFFF:
        raise ValueError(f"unsigned varint value {value} is outside [0, 2**32)")
    return _encode_unsigned(value)


def _decode_unsigned(buf: _Buffer, position: int, bits: int, kind: str) -> tuple[int, int]:
    max_bytes = (bits + 6) // 7
    end = len(buf)
    result = 0
    shift = 0
    pos = position
    for _ in range(max_bytes):
        if pos >= end:
            raise CorruptRecordError(f"{kind} at position {position} runs past the end of the data")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            if result >> bits:
                raise CorruptRecordError(f"{kind} at position {position} overflows {bits} bits")
            return result, pos
        shift += 7
    raise CorruptRecordError(f"{kind} at position {position} is longer than {max_bytes} bytes")


def decode_varint(buf: _Buffer, position: int = 0) -> tuple[int, int]:
    """Decode the zigzag varint at ``position``; return ``(value, next_position)``.

    Raises ``CorruptRecordError`` if it runs past the end of ``buf``, is longer than 5
    bytes or does not fit 32 bits.
    """
    zz, pos = _decode_unsigned(buf, position, 32, "varint")
    return (zz >> 1) ^ -(zz & 1), pos


def decode_unsigned_varint(buf: _Buffer, position: int = 0) -> tuple[int, int]:
    """Decode the unsigned varint at ``position``; return ``(value, next_position)``.

    Raises ``CorruptRecordError`` as ``decode_varint`` does.
    """
    return _decode_unsigned(buf, position, 32, "unsigned varint")


def decode_varlong(buf: _Buffer, position: int = 0) -> tuple[int, int]:
    """Decode the zigzag varlong at ``position``; return ``(value, next_position)``.

    Raises ``CorruptRecordError`` if it runs past the end of ``buf``, is longer than 10
    bytes or does not fit 64 bits.
    """
    zz, pos = _decode_unsigned(buf, position, 64, "varlong")
    return (zz >> 1) ^ -(zz & 1), pos


# Every value in [0, 8192) encodes in at most 2 bytes (zigzag < 2**14). 8192 entries cost
# about 350 KB; single-byte entries are CPython's shared one-byte objects.
NONNEGATIVE_VARINTS: tuple[bytes, ...] = tuple(encode_varint(n) for n in range(8192))
