"""Every codec of a batch's records (``storage.compression``): round trips, other writers'
payloads, damage, and the decompressed-size limit.

Gzip, snappy and zstd join LZ4 (whose own tests are in ``test_native.py``): hypothesis
batches round-trip through each and decode alike on the C and the pure path (both start
from ``records_data``, so decompression is shared and the record loops are compared);
payloads written by kafka-python's codecs and by zstandard (the libraries Kafka clients
use) decode, and ours decode there; damaged payloads, with the CRC recomputed so only the
decompressor and the parser stand guard, fail with ``CorruptRecordError`` and nothing
else; and a payload past ``MAX_DECOMPRESSED_BYTES`` is refused, before decompressing
where its headers tell (snappy, zstd), while decompressing where they cannot (gzip).
"""

from __future__ import annotations

import gzip
import os
import struct
from collections.abc import Callable
from typing import Any

import cramjam
import crc32c
import kafka.codec
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from tidelog.storage import native as native_choice
from tidelog.storage.columns import decode_batch_into, finish_columns, new_column_builder
from tidelog.storage.compression import compress_records, decompress_records, max_compressed_bytes
from tidelog.storage.errors import CorruptRecordError
from tidelog.storage.records import (
    HEADER_SIZE,
    MAX_DECOMPRESSED_BYTES,
    BatchBuilder,
    Compression,
    Record,
    TimestampType,
    decode_batch,
)

NATIVE = native_choice.NATIVE
EXAMPLES = int(os.environ.get("TIDELOG_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
T0 = 1_700_000_000_000
NEW_CODECS = [Compression.GZIP, Compression.SNAPPY, Compression.ZSTD]
ALL_CODECS = [*NEW_CODECS, Compression.LZ4]


def name(codec: Compression) -> str:
    return codec.name.lower()


by_name = pytest.mark.parametrize("codec", NEW_CODECS, ids=name)


def with_payload(payload: bytes, codec: Compression, count: int = 1) -> bytes:
    """A batch of ``count`` records whose records are ``payload``, marked ``codec``."""
    template = bytearray(BatchBuilder(compression=codec).build(last_offset_delta=0))
    batch = template[:HEADER_SIZE] + payload
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    struct.pack_into(">h", batch, 21, codec)
    struct.pack_into(">i", batch, 23, max(count - 1, 0))
    struct.pack_into(">i", batch, 57, count)
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)


def plain_records(values: list[bytes]) -> bytes:
    """The uncompressed records data of a batch of ``values`` (timestamps T0, no keys)."""
    builder = BatchBuilder()
    for value in values:
        builder.append(T0, None, value)
    return builder.build()[HEADER_SIZE:]


def outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", call()
    except Exception as exc:  # compared by class across the two paths
        return "error", type(exc)


def decode_everywhere(batch: bytes, *, validate: bool = True) -> tuple[str, Any]:
    """The batch decoded on the C path, the pure path and into columns, which must agree."""
    pure = outcome(lambda: decode_batch(batch, validate=validate, pure=True))
    native = outcome(lambda: decode_batch(batch, validate=validate))
    assert native == pure
    builder = new_column_builder(False, pure=True)
    columns = outcome(lambda: decode_batch_into(builder, batch, validate=validate))
    assert columns[0] == pure[0]
    if pure[0] == "error":
        assert pure[1] is CorruptRecordError
        assert columns[1] is CorruptRecordError
        assert builder.rows == 0
    else:
        assert builder.rows == len(pure[1][1])
        finish_columns(builder)
    return pure


# --- round trips ----------------------------------------------------------------------

record_specs = st.tuples(
    st.integers(T0 - 2**40, T0 + 2**40),
    st.none() | st.binary(max_size=30),
    # Repetitive values too, so the codecs have something to compress.
    st.none() | st.binary(max_size=200) | st.binary(max_size=8).map(lambda b: b * 50),
    st.lists(st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=12)), max_size=3),
)


@FUZZ
@given(
    st.sampled_from(ALL_CODECS),
    st.lists(record_specs, min_size=1, max_size=40),
    st.integers(0, 2**62),
    st.sampled_from(TimestampType),
)
def test_every_codec_round_trips_alike_on_both_paths(
    codec: Compression,
    specs: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]],
    base_offset: int,
    timestamp_type: TimestampType,
) -> None:
    builder = BatchBuilder(
        compression=codec, base_offset=base_offset, timestamp_type=timestamp_type
    )
    for timestamp, key, value, headers in specs:
        builder.append(timestamp, key, value, headers)
    batch = builder.build()
    assert len(batch) <= builder.estimated_size_bytes() or codec == Compression.NONE
    kind, (header, records) = decode_everywhere(batch)
    assert kind == "ok"
    assert header.compression is codec
    expected = [
        Record(base_offset + i, timestamp, key, value, tuple(headers))
        for i, (timestamp, key, value, headers) in enumerate(specs)
    ]
    if timestamp_type == TimestampType.LOG_APPEND_TIME:
        expected = [r._replace(timestamp_ms=header.max_timestamp) for r in expected]
    assert records == expected


@FUZZ
@given(st.sampled_from(ALL_CODECS), st.binary(max_size=5000), st.integers(0, 300_000))
def test_the_size_estimate_bounds_what_any_data_compresses_to(
    codec: Compression, data: bytes, noise_bytes: int
) -> None:
    assert len(compress_records(codec, data)) <= max_compressed_bytes(codec, len(data))
    noise = os.urandom(noise_bytes)  # what no codec shrinks
    assert len(compress_records(codec, noise)) <= max_compressed_bytes(codec, len(noise))
    assert decompress_records(codec, memoryview(compress_records(codec, data)), 0) == data


# --- other writers, other readers -----------------------------------------------------

XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_HEADER = XERIAL_MAGIC + bytes(8)
VALUES = [b"value-%d-" % i * 20 for i in range(300)]  # about 60 KiB: two xerial blocks


def foreign_payloads() -> list[tuple[str, Compression, bytes]]:
    """What Kafka clients' codecs write for the records of VALUES."""
    data = plain_records(VALUES)
    half = len(data) // 2
    unsized = zstandard.ZstdCompressor(write_content_size=False, write_checksum=True)
    streamed = zstandard.ZstdCompressor(level=19).compressobj()
    skippable = struct.pack("<II", 0x184D2A57, 3) + b"abc"
    two_members = gzip.compress(data[:half]) + gzip.compress(data[half:])
    little_endian = XERIAL_MAGIC + bytes([1, 0, 0, 0, 1, 0, 0, 0])
    two_frames = unsized.compress(data[:half]) + skippable + unsized.compress(data[half:])
    return [
        ("kafka-python gzip", Compression.GZIP, kafka.codec.gzip_encode(data)),
        ("gzip, two members", Compression.GZIP, two_members),
        ("kafka-python snappy, xerial", Compression.SNAPPY, kafka.codec.snappy_encode(data)),
        ("raw snappy", Compression.SNAPPY, bytes(cramjam.snappy.compress_raw(data))),
        (
            "xerial with a little-endian version",
            Compression.SNAPPY,
            little_endian + kafka.codec.snappy_encode(data)[16:],
        ),
        ("kafka-python zstd", Compression.ZSTD, kafka.codec.zstd_encode(data)),
        ("zstd without a content size", Compression.ZSTD, unsized.compress(data)),
        ("zstd streamed", Compression.ZSTD, streamed.compress(data) + streamed.flush()),
        ("zstd, two frames and a skippable one", Compression.ZSTD, two_frames),
        ("kafka-python lz4, content size stored", Compression.LZ4, kafka.codec.lz4_encode(data)),
    ]


@pytest.mark.parametrize(
    ("writer", "codec", "payload"), foreign_payloads(), ids=[p[0] for p in foreign_payloads()]
)
def test_payloads_from_kafka_clients_codecs_decode(
    writer: str, codec: Compression, payload: bytes
) -> None:
    kind, (_, records) = decode_everywhere(with_payload(payload, codec, len(VALUES)))
    assert kind == "ok", writer
    assert [r.value for r in records] == VALUES


@pytest.mark.parametrize("codec", ALL_CODECS, ids=name)
def test_kafka_pythons_batches_decode_here_and_ours_there(codec: Compression) -> None:
    theirs = DefaultRecordBatchBuilder(2, int(codec), False, -1, -1, -1, 1 << 20)
    for i, value in enumerate(VALUES):
        theirs.append(i, T0 + i, b"k%d" % i, value, [("h", b"x")])
    batch = bytes(theirs.build())
    header, records = decode_batch(batch)
    assert header.compression is codec  # kafka-python sends it plain if it does not shrink
    assert [(r.offset, r.timestamp_ms, r.key, r.value, r.headers) for r in records] == [
        (i, T0 + i, b"k%d" % i, value, (("h", b"x"),)) for i, value in enumerate(VALUES)
    ]
    ours = BatchBuilder(compression=codec)
    for i, value in enumerate(VALUES):
        ours.append(T0 + i, b"k%d" % i, value, [("h", b"x")])
    read = DefaultRecordBatch(bytearray(ours.build()))
    assert read.compression_type == codec
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in read] == [
        (i, T0 + i, b"k%d" % i, value, [("h", b"x")]) for i, value in enumerate(VALUES)
    ]


# --- damage ----------------------------------------------------------------------------


@FUZZ
@given(st.sampled_from(NEW_CODECS), st.data())
def test_damaged_payloads_fail_cleanly_and_alike(codec: Compression, data: st.DataObject) -> None:
    builder = BatchBuilder(compression=codec)
    for value in data.draw(st.lists(st.binary(max_size=300), min_size=1, max_size=8)):
        builder.append(T0, None, value * 3)
    batch = bytearray(builder.build())
    damage = data.draw(st.sampled_from(["cut", "flip", "overwrite", "append", "replace"]))
    if damage == "cut":
        batch = batch[: data.draw(st.integers(HEADER_SIZE, len(batch) - 1))]
    elif damage == "flip":
        for _ in range(data.draw(st.integers(1, 3))):
            at = data.draw(st.integers(HEADER_SIZE, len(batch) - 1))
            batch[at] ^= 1 << data.draw(st.integers(0, 7))
    elif damage == "overwrite":
        for _ in range(data.draw(st.integers(1, 4))):
            batch[data.draw(st.integers(HEADER_SIZE, len(batch) - 1))] = data.draw(
                st.integers(0, 255)
            )
    elif damage == "append":
        batch += data.draw(st.binary(min_size=1, max_size=20))
    else:  # arbitrary bytes where the payload was
        batch = batch[:HEADER_SIZE] + data.draw(st.binary(max_size=100))
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    decode_everywhere(bytes(batch))  # records or CorruptRecordError, alike on every path


@pytest.mark.parametrize(
    ("codec", "payload", "message"),
    [
        (Compression.GZIP, b"", "bad gzip data: truncated stream"),
        (Compression.GZIP, gzip.compress(b"abc")[:-3], "bad gzip data: truncated stream"),
        (Compression.GZIP, gzip.compress(b"abc") + b"\x00", "bad gzip data"),
        (Compression.GZIP, b"\x1f\x8b\x08\x00" + bytes(20), "bad gzip data"),
        (Compression.SNAPPY, b"", "bad snappy data: no block length"),
        (Compression.SNAPPY, b"\xff\xff\xff\xff\xff", "bad snappy data: no block length"),
        (Compression.SNAPPY, XERIAL_MAGIC + b"\x00\x00", "truncated xerial header"),
        (Compression.SNAPPY, XERIAL_HEADER + b"\x00\x00", "truncated xerial block length"),
        (Compression.SNAPPY, XERIAL_HEADER + b"\x00\x00\x00\x09abc", "runs past the end"),
        (Compression.SNAPPY, b"\x05\x00abc", "bad snappy data"),
        (Compression.ZSTD, b"", "bad zstd data: no frame"),
        (Compression.ZSTD, b"\x28\xb5\x2f", "bad zstd data: truncated frame"),
        (Compression.ZSTD, b"\x28\xb5\x2f\xfe\x00\x00\x00", "bad zstd data: no frame magic"),
        (Compression.ZSTD, b"\x28\xb5\x2f\xfd", "truncated frame header"),
        (Compression.ZSTD, b"\x28\xb5\x2f\xfd\x08\x00", "reserved frame header bit"),
        (Compression.ZSTD, b"\x28\xb5\x2f\xfd\x20\x05\x07\x00\x00", "reserved block type"),
        (Compression.ZSTD, b"\x28\xb5\x2f\xfd\x20\x05\x29\x00\x00ab", "truncated block"),
        (Compression.ZSTD, b"\x28\xb5\x2f\xfd\x24\x00\x01\x00\x00", "truncated checksum"),
        (Compression.ZSTD, b"\x28\xb5\x2f\xfd\x20\x06\x29\x00\x00abcde", "bad zstd data"),
        (Compression.ZSTD, struct.pack("<II", 0x184D2A50, 9) + b"abc", "truncated skippable"),
    ],
)  # fmt: skip
def test_payloads_that_do_not_walk_or_decompress_are_bad(
    codec: Compression, payload: bytes, message: str
) -> None:
    for pure in (False, True):
        with pytest.raises(CorruptRecordError, match=message):
            decode_batch(with_payload(payload, codec), pure=pure)


# --- the decompressed-size limit ---------------------------------------------------------


def over_the_limit() -> bytes:
    """The records data of one record of zeros, just past ``MAX_DECOMPRESSED_BYTES``."""
    builder = BatchBuilder()
    builder.append(T0, None, bytes(MAX_DECOMPRESSED_BYTES))
    return builder.build()[HEADER_SIZE:]


BOMBS = {
    # Each a few hundred KiB to ~3 MiB, a batch a broker stores (it never decompresses).
    "gzip": (Compression.GZIP, lambda data: gzip.compress(data, 1), "decompresses past"),
    "snappy, xerial": (
        Compression.SNAPPY,
        lambda data: compress_records(Compression.SNAPPY, data),
        "may decompress to",
    ),
    # One raw block whose preamble claims the size: refused from that alone.
    "snappy, raw": (
        Compression.SNAPPY,
        lambda data: bytes(cramjam.snappy.compress_raw(data)),
        "may decompress to",
    ),
    # With a content size: refused from the frame header.
    "zstd, sized": (
        Compression.ZSTD,
        lambda data: compress_records(Compression.ZSTD, data),
        "zstd frame may decompress to",
    ),
    # Without (Java's zstd-jni stream): refused from the block headers.
    "zstd, streamed": (
        Compression.ZSTD,
        zstandard.ZstdCompressor(write_content_size=False).compress,
        "zstd data may decompress to",
    ),
}


@pytest.mark.parametrize("bomb", BOMBS, ids=list(BOMBS))
def test_a_payload_past_the_limit_is_refused(bomb: str) -> None:
    codec, compress, message = BOMBS[bomb]
    payload = compress(over_the_limit())
    assert len(payload) < 4 << 20
    batch = with_payload(payload, codec)
    for pure in (False, True):
        with pytest.raises(CorruptRecordError, match=f"{message}.*limit"):
            decode_batch(batch, pure=pure)
    builder = new_column_builder(False)
    with pytest.raises(CorruptRecordError, match="limit"):
        decode_batch_into(builder, batch)
    assert builder.rows == 0


def test_a_snappy_block_that_lies_about_its_size_is_refused_before_decompressing() -> None:
    # A preamble of 2**32 - 1 over three literal bytes: nothing is allocated for it.
    payload = b"\xff\xff\xff\xff\x0f" + b"\x08abc"
    with pytest.raises(CorruptRecordError, match="may decompress to 4294967295 bytes"):
        decode_batch(with_payload(payload, Compression.SNAPPY))


@by_name
def test_a_payload_at_the_limit_decodes(codec: Compression) -> None:
    builder = BatchBuilder(compression=codec)
    builder.append(T0, None, bytes(MAX_DECOMPRESSED_BYTES - 64))
    assert len(decode_batch(builder.build())[1][0].value or b"") == MAX_DECOMPRESSED_BYTES - 64
