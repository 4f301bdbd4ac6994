"""The codecs of a batch's records: compressed as Kafka's writers do, decompressed in a bound.

``storage.records`` draws the batch around the records; attribute bits 0-2 name the codec
(``Compression``) and the records, all of them, are one compressed payload after the
61-byte header. Each codec as Kafka's writers send it:

- **gzip (1)**: a gzip stream (RFC 1952: deflate, CRC-32 and size trailer), as Java's
  ``GZIPOutputStream``. Concatenated members are read on (Java's ``GZIPInputStream`` does).
- **snappy (2)**: either xerial framing, what Java's producer writes (``SnappyOutputStream``)
  and what we write: a 16-byte header ``82 'SNAPPY' 00``, version and compatible version
  (int32 each; some writers put them little-endian, so only the first 8 bytes are
  checked), then blocks of ``int32 BE length`` + one raw snappy block; or one raw snappy
  block, which librdkafka may send. A raw block opens with its decompressed length (a
  uvarint), so a snappy payload's output is known before anything is decompressed.
- **lz4 (3)**: Kafka's LZ4 frame: magic ``04 22 4D 18``, FLG, BD, optional content size (8
  bytes) and dictionary id (4), a header checksum, then blocks of ``uint32 LE size`` (high
  bit: stored uncompressed) and data (plus a 4-byte checksum when FLG says so), up to a
  zero size, the end mark; a content checksum may follow. Written with independent 64 KiB
  blocks, no content size, no checksums.
- **zstd (4)**: zstd frames (RFC 8878): magic ``28 B5 2F FD``, a frame header (descriptor,
  window descriptor, dictionary id, optional content size), blocks behind 3-byte headers
  (last-block bit, type raw / RLE / compressed, size), an optional 4-byte checksum;
  skippable frames (magic ``5? 2A 4D 18``) may sit between them.

Decompression is bounded: a hostile batch must not cost a reader more than
``MAX_DECOMPRESSED_BYTES``, whatever it claims. LZ4, snappy and zstd are refused before
anything is decompressed, from a bound read off their block headers (one step per block):
an LZ4 block decompresses to at most the frame's block size, a zstd compressed block to at
most 128 KiB (or the window, if smaller), raw and RLE zstd blocks and snappy blocks to what
their headers say. Gzip has no such headers (deflate expands up to ~1000x), so it is
decompressed with the limit as the output cap and refused as soon as it passes it. A
payload that does not fill its batch exactly, or that the codec refuses, is corrupt. Every
refusal is a ``CorruptRecordError``.

Libraries: stdlib ``zlib`` for gzip, python-lz4 for LZ4, cramjam for snappy and zstd (its
zstd is libzstd, whose decoder also caps the window at 128 MiB, as Kafka's consumers do).
Pure and thread-safe.
"""

from __future__ import annotations

import enum
import zlib

import cramjam
import lz4.frame

from tidelog.storage.errors import CorruptRecordError

__all__ = [
    "MAX_DECOMPRESSED_BYTES",
    "Compression",
    "compress_records",
    "decompress_records",
    "max_compressed_bytes",
]

MAX_DECOMPRESSED_BYTES = 64 << 20
"""The most bytes the records of one compressed batch may decompress to (64 MiB).

64 times the default ``message.max.bytes`` (1 MiB) and ``max_request_size``: a batch our
producers build stays far below it, uncompressed."""


class Compression(enum.IntEnum):
    """Codec ids of attribute bits 0-2; all five are built and decoded."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


LZ4_BLOCK_BYTES = 64 * 1024  # the block size Kafka's writers (and ours) use
_GZIP_WBITS = 16 + zlib.MAX_WBITS  # zlib's "gzip wrapper" window bits
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + (1).to_bytes(4, "big") + (1).to_bytes(4, "big")
_XERIAL_BLOCK_BYTES = 32 * 1024  # xerial's default block size, as Kafka's Java producer
_ZSTD_LEVEL = 3  # Kafka's default compression.zstd.level
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_ZSTD_BLOCK_MAX_BYTES = 128 * 1024  # ZSTD_BLOCKSIZE_MAX: no block regenerates more
_ZSTD_RLE_BLOCK = 1
_ZSTD_COMPRESSED_BLOCK = 2
_ZSTD_RESERVED_BLOCK = 3

_LZ4_MAGIC = b"\x04\x22\x4d\x18"
_LZ4_FLG_CONTENT_SIZE = 0x08
_LZ4_FLG_BLOCK_CHECKSUM = 0x10
_LZ4_FLG_DICTIONARY_ID = 0x01
_LZ4_BLOCK_SIZES = {4: 64 << 10, 5: 256 << 10, 6: 1 << 20, 7: 4 << 20}  # BD bits 4-6


# --- compression (the builder's path) ----------------------------------------------------


def compress_records(codec: Compression, data: bytes | bytearray) -> bytes:
    """``data`` (a batch's records) compressed with ``codec`` as Kafka's Java producer would.

    ``NONE`` returns the bytes unchanged. Deterministic (the gzip header carries no time).
    """
    if codec == Compression.LZ4:
        frame: bytes = lz4.frame.compress(data, block_linked=False, store_size=False)
        return frame
    if codec == Compression.GZIP:
        compressor = zlib.compressobj(wbits=_GZIP_WBITS)
        return compressor.compress(data) + compressor.flush()
    if codec == Compression.SNAPPY:
        view = memoryview(data)
        parts = [_XERIAL_HEADER]
        for start in range(0, len(view), _XERIAL_BLOCK_BYTES):
            block = bytes(cramjam.snappy.compress_raw(view[start : start + _XERIAL_BLOCK_BYTES]))
            parts.append(len(block).to_bytes(4, "big"))
            parts.append(block)
        return b"".join(parts)
    if codec == Compression.ZSTD:
        return bytes(cramjam.zstd.compress(data, level=_ZSTD_LEVEL))
    return bytes(data)


def max_compressed_bytes(codec: Compression, size_bytes: int) -> int:
    """An upper bound on ``len(compress_records(codec, data))`` for ``size_bytes`` of data.

    Each codec's own worst case (data that does not shrink): LZ4 stores such a block raw
    behind its 4-byte length; zlib's ``compressBound`` plus the 18-byte gzip wrapper;
    snappy's ``MaxCompressedLength`` (32 + n + n/6) per xerial block, plus the block
    lengths and header; zstd's ``ZSTD_COMPRESSBOUND``.
    """
    n = size_bytes
    if codec == Compression.LZ4:
        return n + 11 + 4 * (n // LZ4_BLOCK_BYTES + 1)
    if codec == Compression.GZIP:
        return n + (n >> 12) + (n >> 14) + (n >> 25) + 13 + 18
    if codec == Compression.SNAPPY:
        blocks = -(-n // _XERIAL_BLOCK_BYTES)
        return len(_XERIAL_HEADER) + blocks * (4 + 32) + n + n // 6
    if codec == Compression.ZSTD:
        small = (_ZSTD_BLOCK_MAX_BYTES - n) >> 11 if n < _ZSTD_BLOCK_MAX_BYTES else 0
        return n + (n >> 8) + small
    return n


# --- decompression (every reader's path) ---------------------------------------------------


def decompress_records(codec: Compression, payload: memoryview, position: int) -> bytes:
    """The records data of the ``codec`` payload of the batch at ``position``.

    Raises ``CorruptRecordError`` for a payload that may decompress past
    ``MAX_DECOMPRESSED_BYTES`` (or declares a size past it), whose structure does not walk,
    that the codec refuses, or that does not fill the batch exactly. ``NONE`` is the
    caller's (no copy); passed here it returns the bytes.
    """
    if codec == Compression.LZ4:
        return _decompress_lz4(payload, position)
    if codec == Compression.GZIP:
        return _decompress_gzip(payload, position)
    if codec == Compression.SNAPPY:
        return _decompress_snappy(payload, position)
    if codec == Compression.ZSTD:
        return _decompress_zstd(payload, position)
    return bytes(payload)


def _over_the_limit(position: int, what: str, size: int) -> CorruptRecordError:
    return CorruptRecordError(
        f"batch at position {position}: {what} may decompress to {size} bytes, "
        f"over the limit of {MAX_DECOMPRESSED_BYTES}"
    )


def _bad(position: int, codec: str, why: object) -> CorruptRecordError:
    return CorruptRecordError(f"batch at position {position}: bad {codec} data: {why}")


def _decompress_gzip(payload: memoryview, position: int) -> bytes:
    # zlib's max_length caps each member's output, so the limit holds while decompressing.
    parts: list[bytes] = []
    total = 0
    rest: bytes | memoryview = payload
    while True:
        decompressor = zlib.decompressobj(wbits=_GZIP_WBITS)
        try:
            part = decompressor.decompress(rest, MAX_DECOMPRESSED_BYTES + 1 - total)
        except zlib.error as exc:
            raise _bad(position, "gzip", exc) from None
        total += len(part)
        if total > MAX_DECOMPRESSED_BYTES:
            raise CorruptRecordError(
                f"batch at position {position}: gzip data decompresses past the limit of "
                f"{MAX_DECOMPRESSED_BYTES} bytes"
            )
        parts.append(part)
        if not decompressor.eof:
            raise _bad(position, "gzip", "truncated stream")
        rest = decompressor.unused_data
        if not rest:  # one member filled the batch (a second one only if it follows)
            break
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _decompress_snappy(payload: memoryview, position: int) -> bytes:
    if payload[: len(_XERIAL_MAGIC)] != _XERIAL_MAGIC:
        blocks = [payload]
    else:
        blocks = []
        pos = len(_XERIAL_HEADER)
        end = len(payload)
        if end < pos:
            raise _bad(position, "snappy", "truncated xerial header")
        while pos < end:
            if end - pos < 4:
                raise _bad(position, "snappy", "truncated xerial block length")
            length = int.from_bytes(payload[pos : pos + 4], "big")
            pos += 4
            if length > end - pos or length >= 1 << 31:
                raise _bad(position, "snappy", f"xerial block of {length} bytes runs past the end")
            blocks.append(payload[pos : pos + length])
            pos += length
    total = sum(_snappy_length(block, position) for block in blocks)
    if total > MAX_DECOMPRESSED_BYTES:
        raise _over_the_limit(position, "snappy data", total)
    try:
        parts = [bytes(cramjam.snappy.decompress_raw(block)) for block in blocks]
    except cramjam.DecompressionError as exc:
        raise _bad(position, "snappy", exc) from None
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _snappy_length(block: memoryview, position: int) -> int:
    """The decompressed length a raw snappy block declares (its uvarint preamble)."""
    value = 0
    for i in range(min(len(block), 5)):  # 32 bits: at most 5 bytes
        byte = block[i]
        value |= (byte & 0x7F) << (7 * i)
        if byte < 0x80:
            return value
    raise _bad(position, "snappy", "no block length")


def _decompress_zstd(payload: memoryview, position: int) -> bytes:
    bound = _zstd_output_bound(payload, position)
    if bound > MAX_DECOMPRESSED_BYTES:
        raise _over_the_limit(position, "zstd data", bound)
    try:
        data = bytes(cramjam.zstd.decompress(payload))
    except cramjam.DecompressionError as exc:
        raise _bad(position, "zstd", exc) from None
    if len(data) > bound:  # the bound makes this unreachable
        raise _bad(position, "zstd", "more data than its blocks allow")
    return data


def _zstd_output_bound(payload: memoryview, position: int) -> int:
    """An upper bound on what zstd ``payload`` decompresses to, from its headers.

    Walks every frame (RFC 8878 section 3.1): frame header, then block headers to the last
    block and the optional checksum; skippable frames are stepped over. A declared content
    size past the limit is refused here (libzstd may allocate it up front). A payload whose
    structure does not walk is bad; libzstd checks the contents.
    """
    end = len(payload)
    pos = 0
    bound = 0
    if end == 0:
        raise _bad(position, "zstd", "no frame")
    while pos < end:
        if end - pos < 4:
            raise _bad(position, "zstd", "truncated frame")
        magic = bytes(payload[pos : pos + 4])
        if magic[1:] == b"\x2a\x4d\x18" and magic[0] & 0xF0 == 0x50:  # skippable frame
            pos += 8 + int.from_bytes(payload[pos + 4 : pos + 8], "little")
            if pos > end:  # also a frame size cut short
                raise _bad(position, "zstd", "truncated skippable frame")
            continue
        if magic != _ZSTD_MAGIC:
            raise _bad(position, "zstd", "no frame magic")
        pos, block_max, checksum = _zstd_frame_header(payload, pos + 4, position)
        while True:
            if end - pos < 3:
                raise _bad(position, "zstd", "truncated block")
            block_header = int.from_bytes(payload[pos : pos + 3], "little")
            pos += 3
            block_type = (block_header >> 1) & 0x03
            size = block_header >> 3
            if block_type == _ZSTD_RESERVED_BLOCK:
                raise _bad(position, "zstd", "reserved block type")
            # No block regenerates more than block_max (libzstd refuses one that claims
            # to): a compressed block up to it, raw and RLE blocks their size.
            bound += block_max if block_type == _ZSTD_COMPRESSED_BLOCK else min(size, block_max)
            # Raw and compressed blocks carry size bytes, RLE one byte repeated size times.
            pos += 1 if block_type == _ZSTD_RLE_BLOCK else size
            if pos > end:
                raise _bad(position, "zstd", "truncated block")
            if block_header & 1:  # the last block
                break
        pos += 4 if checksum else 0
        if pos > end:
            raise _bad(position, "zstd", "truncated checksum")
    return bound


def _zstd_frame_header(payload: memoryview, pos: int, position: int) -> tuple[int, int, bool]:
    """The frame header at ``pos`` (after the magic): ``(end of header, the most one
    compressed block regenerates, whether a checksum follows the last block)``."""
    end = len(payload)
    if pos >= end:
        raise _bad(position, "zstd", "truncated frame header")
    descriptor = payload[pos]
    if descriptor & 0x08:
        raise _bad(position, "zstd", "reserved frame header bit set")
    single_segment = bool(descriptor & 0x20)
    size_bytes = (1 if single_segment else 0, 2, 4, 8)[descriptor >> 6]
    dictionary_bytes = (0, 1, 2, 4)[descriptor & 0x03]
    header_end = pos + 1 + (not single_segment) + dictionary_bytes + size_bytes
    if header_end > end:
        raise _bad(position, "zstd", "truncated frame header")
    pos += 1
    window: int | None = None
    if not single_segment:
        exponent, mantissa = payload[pos] >> 3, payload[pos] & 0x07
        window = (1 << (10 + exponent)) + ((1 << (10 + exponent)) >> 3) * mantissa
        pos += 1
    pos += dictionary_bytes
    if size_bytes:
        content_size = int.from_bytes(payload[pos : pos + size_bytes], "little")
        content_size += 256 if size_bytes == 2 else 0
        if content_size > MAX_DECOMPRESSED_BYTES:
            raise _over_the_limit(position, "zstd frame", content_size)
        if single_segment:
            window = content_size
    block_max = _ZSTD_BLOCK_MAX_BYTES if window is None else min(window, _ZSTD_BLOCK_MAX_BYTES)
    return header_end, block_max, bool(descriptor & 0x04)


def _decompress_lz4(frame: memoryview, position: int) -> bytes:
    bound = _lz4_output_bound(frame, position)
    if bound > MAX_DECOMPRESSED_BYTES:
        raise _over_the_limit(position, "LZ4 frame", bound)
    try:
        data, used = lz4.frame.decompress(frame, return_bytes_read=True)
    except (RuntimeError, ValueError) as exc:
        raise CorruptRecordError(f"batch at position {position}: bad LZ4 frame: {exc}") from None
    if used != len(frame):
        raise CorruptRecordError(
            f"batch at position {position}: {len(frame) - used} bytes after the LZ4 frame"
        )
    if len(data) > MAX_DECOMPRESSED_BYTES:  # the bound above makes this unreachable
        raise CorruptRecordError(f"batch at position {position}: LZ4 frame too large")
    return bytes(data)


def _lz4_output_bound(frame: memoryview, position: int) -> int:
    """An upper bound on the bytes an LZ4 frame decompresses to (blocks x block size).

    Walks the frame header (LZ4 frame format 1.6: magic, FLG, BD, optional content size
    and dictionary id, header checksum) and the block sizes up to the end mark. A frame
    whose structure does not walk is a bad frame; lz4 itself then checks the contents.
    """
    end = len(frame)
    if end < 7 or frame[:4] != _LZ4_MAGIC:
        raise CorruptRecordError(f"batch at position {position}: bad LZ4 frame: no frame magic")
    flags, descriptor = frame[4], frame[5]
    block_bytes = _LZ4_BLOCK_SIZES.get((descriptor >> 4) & 0x07)
    if block_bytes is None:
        raise CorruptRecordError(
            f"batch at position {position}: bad LZ4 frame: block size code {descriptor >> 4}"
        )
    pos = 7  # magic, FLG, BD, header checksum
    if flags & _LZ4_FLG_CONTENT_SIZE:
        if end < pos + 8:
            raise CorruptRecordError(f"batch at position {position}: bad LZ4 frame: truncated")
        # python-lz4 allocates a declared content size up front: refuse one over the cap
        # (Kafka never writes one; other clients may).
        claimed = int.from_bytes(frame[6:14], "little")
        if claimed > MAX_DECOMPRESSED_BYTES:
            raise CorruptRecordError(
                f"batch at position {position}: LZ4 frame claims {claimed} bytes"
            )
        pos += 8
    if flags & _LZ4_FLG_DICTIONARY_ID:
        pos += 4
    block_checksum = 4 if flags & _LZ4_FLG_BLOCK_CHECKSUM else 0
    blocks = 0
    while True:
        if end < pos + 4:
            raise CorruptRecordError(f"batch at position {position}: bad LZ4 frame: truncated")
        size = int.from_bytes(frame[pos : pos + 4], "little") & 0x7FFFFFFF
        pos += 4
        if size == 0:  # the end mark (a content checksum may follow; lz4 checks it)
            return blocks * block_bytes
        blocks += 1
        pos += size + block_checksum
