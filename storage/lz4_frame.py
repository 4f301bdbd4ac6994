"""LZ4 frames of record batches: decompressed within a bound, or refused.

Kafka's frame (``storage.records`` draws the batch around it): magic ``04 22 4D 18``, FLG,
BD, optional content size (8 bytes) and dictionary id (4), a header checksum, then blocks
of ``uint32 LE size`` (high bit: stored uncompressed) and data (plus a 4-byte checksum
when FLG says so), up to a zero size, the end mark; a content checksum may follow.

LZ4 expands up to ~255x and python-lz4 grows its buffer to whatever a frame decompresses
to, so a hostile 4 MiB batch could cost a consumer a gigabyte. No block decompresses to
more than the frame's block size (BD), so the block count times the block size bounds
the output; walking the block headers costs one step per block (64 KiB for Kafka's
writers), and a frame whose bound passes ``MAX_DECOMPRESSED_BYTES`` is refused before
anything is decompressed. Pure and thread-safe.
"""

from __future__ import annotations

import lz4.frame

from storage.errors import CorruptRecordError

__all__ = ["MAX_DECOMPRESSED_BYTES", "decompress_records"]

MAX_DECOMPRESSED_BYTES = 64 << 20
"""The most bytes the records of one LZ4 batch may decompress to (64 MiB).

64 times the default ``message.max.bytes`` (1 MiB) and ``max_request_size``: a batch our
producers build stays far below it, uncompressed."""

_LZ4_MAGIC = b"\x04\x22\x4d\x18"
_LZ4_FLG_CONTENT_SIZE = 0x08
_LZ4_FLG_BLOCK_CHECKSUM = 0x10
_LZ4_FLG_DICTIONARY_ID = 0x01
_LZ4_BLOCK_SIZES = {4: 64 << 10, 5: 256 << 10, 6: 1 << 20, 7: 4 << 20}  # BD bits 4-6


def decompress_records(frame: memoryview, position: int) -> bytes:
    """The records data of the LZ4 ``frame`` of the batch at ``position``.

    Raises ``CorruptRecordError`` for a frame that may decompress past
    ``MAX_DECOMPRESSED_BYTES`` (or declares a content size past it), whose structure does
    not walk, that lz4 refuses, or that does not fill the batch exactly.
    """
    bound = _lz4_output_bound(frame, position)
    if bound > MAX_DECOMPRESSED_BYTES:
        raise CorruptRecordError(
            f"batch at position {position}: LZ4 frame may decompress to {bound} bytes, "
            f"over the limit of {MAX_DECOMPRESSED_BYTES}"
        )
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
