"""Tests for the RecordBatch v2 format (``storage.records``) and its varints.

Expected bytes are built here field by field with ``struct`` from the reference table
(``reference/kafka-internals.md`` section 2), and CRCs are checked against a bitwise
CRC-32C written below, so the format is pinned independently of the encoder under test.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import NamedTuple

import crc32c
import lz4.frame
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidelog.storage import records, varint
from tidelog.storage.errors import CorruptRecordError
from tidelog.storage.records import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    NO_SEQUENCE,
    BatchBuilder,
    BatchHeader,
    Compression,
    Record,
    TimestampType,
    decode_batch,
    decode_batch_as,
    decode_records,
    encode_batch,
    iter_batch_headers,
    read_header,
    set_base_offset,
    set_log_append_time,
    set_partition_leader_epoch,
    split_whole_batches,
    validate_batch,
)
from tidelog.storage.varint import (
    decode_unsigned_varint,
    decode_varint,
    decode_varlong,
    encode_unsigned_varint,
    encode_varint,
    encode_varlong,
)

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
T0 = 1_700_000_000_000

FAST = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Row(NamedTuple):
    """A consumer-shaped row for ``decode_batch_as``: two prefix fields, then a Record's."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def as_rows(rows: list[Record], topic: str = "t", partition: int = 3) -> list[Row]:
    return [Row(topic, partition, *record) for record in rows]


FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def crc32c_reference(data: bytes) -> int:
    """Bitwise CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), no tables."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def kafka_batch(
    records_bytes: bytes,
    *,
    base_offset: int = 0,
    partition_leader_epoch: int = -1,
    attributes: int = 0,
    last_offset_delta: int,
    base_timestamp: int,
    max_timestamp: int,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    records_count: int,
) -> bytes:
    """A batch assembled straight from the reference table, one field per line."""
    crc_covered = (
        struct.pack(">h", attributes)  # 21 attributes
        + struct.pack(">i", last_offset_delta)  # 23
        + struct.pack(">q", base_timestamp)  # 27
        + struct.pack(">q", max_timestamp)  # 35
        + struct.pack(">q", producer_id)  # 43
        + struct.pack(">h", producer_epoch)  # 51
        + struct.pack(">i", base_sequence)  # 53
        + struct.pack(">i", records_count)  # 57
        + records_bytes  # 61
    )
    return (
        struct.pack(">q", base_offset)  # 0 baseOffset
        + struct.pack(">i", 4 + 1 + 4 + len(crc_covered))  # 8 batchLength: bytes after it
        + struct.pack(">i", partition_leader_epoch)  # 12
        + struct.pack(">b", 2)  # 16 magic
        + struct.pack(">I", crc32c_reference(crc_covered))  # 17 crc
        + crc_covered
    )


def patched(batch: bytes, offset: int, fmt: str, value: int, *, fix_crc: bool = True) -> bytes:
    """``batch`` with one header field replaced, CRC recomputed unless told otherwise."""
    out = bytearray(batch)
    struct.pack_into(fmt, out, offset, value)
    if fix_crc:
        struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


# Three records written out by hand from the record table (zigzag varints: 0->00, -1->01,
# 1->02, 2->04, 5->0a, 300->d8 04).
HAND_RECORDS = (
    # r0: ts T0 (delta 0), offset delta 0, key b"k1", value b"hello", no headers; 13 bytes
    bytes.fromhex("1a00000004")
    + b"k1"
    + bytes.fromhex("0a")
    + b"hello"
    + b"\x00"
    # r1: ts T0+300, delta 1, null key, value b"world", header ("h", b"v"); 16 bytes
    + bytes.fromhex("2000d80402010a")
    + b"world"
    + bytes.fromhex("0202")
    + b"h"
    + bytes.fromhex("02")
    + b"v"
    # r2: ts T0-1, delta 2, empty key, null value, no headers; 6 bytes
    + bytes.fromhex("0c000104000100")
)
HAND_EXPECTED = [
    Record(100, T0, b"k1", b"hello", ()),
    Record(101, T0 + 300, None, b"world", (("h", b"v"),)),
    Record(102, T0 - 1, b"", None, ()),
]


def hand_batch(**overrides: int) -> bytes:
    fields = {
        "base_offset": 100,
        "last_offset_delta": 2,
        "base_timestamp": T0,
        "max_timestamp": T0 + 300,
        "producer_id": 1234,
        "producer_epoch": 3,
        "base_sequence": 7,
        "records_count": 3,
    }
    fields.update(overrides)
    return kafka_batch(HAND_RECORDS, **fields)


def hand_builder(compression: Compression = Compression.NONE) -> BatchBuilder:
    builder = BatchBuilder(
        compression=compression,
        base_offset=100,
        producer_id=1234,
        producer_epoch=3,
        base_sequence=7,
    )
    builder.append(T0, b"k1", b"hello")
    builder.append(T0 + 300, None, b"world", [("h", b"v")])
    builder.append(T0 - 1, b"", None)
    return builder


def sample_batch(compression: Compression, count: int = 40, base_offset: int = 0) -> bytes:
    builder = BatchBuilder(compression=compression, base_offset=base_offset)
    for i in range(count):
        headers = [("trace", b"%d" % i), ("none", None)] if i % 7 == 0 else []
        key = None if i % 5 == 0 else b"key-%d" % i
        builder.append(T0 + i * 37 - 500, key, b"v" * (i * 11), headers)
    return builder.build()


# --- CRC-32C and varints -------------------------------------------------------------


def test_crc32c_check_values() -> None:
    assert crc32c.crc32c(b"123456789") == 0xE3069283
    assert crc32c_reference(b"123456789") == 0xE3069283


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, "00"),
        (-1, "01"),
        (1, "02"),
        (-2, "03"),
        (63, "7e"),
        (-64, "7f"),
        (64, "8001"),
        (300, "d804"),
        (INT32_MAX, "feffffff0f"),
        (INT32_MIN, "ffffffff0f"),
    ],
)
def test_varint_vectors(value: int, encoded: str) -> None:
    assert encode_varint(value).hex() == encoded
    assert decode_varint(bytes.fromhex(encoded)) == (value, len(encoded) // 2)
    assert encode_varlong(value).hex() == encoded  # same bytes while the value fits int32


def test_varlong_extremes() -> None:
    assert encode_varlong(INT64_MIN).hex() == "ff" * 9 + "01"
    assert encode_varlong(INT64_MAX).hex() == "fe" + "ff" * 8 + "01"
    assert decode_varlong(bytes.fromhex("ff" * 9 + "01")) == (INT64_MIN, 10)


@given(st.integers(INT32_MIN, INT32_MAX), st.binary(max_size=3))
def test_varint_round_trip(value: int, suffix: bytes) -> None:
    data = b"\xaa" + encode_varint(value) + suffix
    assert decode_varint(data, 1) == (value, len(data) - len(suffix))


@given(st.integers(0, 2**32 - 1), st.binary(max_size=3))
def test_unsigned_varint_round_trip_without_zigzag(value: int, suffix: bytes) -> None:
    data = encode_unsigned_varint(value)
    if value < 0x80:
        assert data == bytes((value,))  # no zigzag: 1 stays 01, not 02
    assert decode_unsigned_varint(data + suffix) == (value, len(data))
    with pytest.raises(CorruptRecordError):
        decode_unsigned_varint(data[:-1])


def test_unsigned_varint_refuses_negatives_and_overflow() -> None:
    with pytest.raises(ValueError, match="unsigned"):
        encode_unsigned_varint(-1)
    with pytest.raises(CorruptRecordError, match="overflows"):
        decode_unsigned_varint(bytes.fromhex("ffffffff7f"))


@given(st.integers(INT64_MIN, INT64_MAX))
def test_varlong_round_trip(value: int) -> None:
    data = encode_varlong(value)
    assert decode_varlong(data) == (value, len(data))


@pytest.mark.parametrize("value", [INT32_MAX + 1, INT32_MIN - 1])
def test_varint_rejects_values_outside_int32(value: int) -> None:
    with pytest.raises(ValueError, match="int32"):
        encode_varint(value)
    encode_varlong(value)  # fine as a varlong


def test_varlong_rejects_values_outside_int64() -> None:
    with pytest.raises(ValueError, match="int64"):
        encode_varlong(INT64_MAX + 1)


@pytest.mark.parametrize(
    ("decode", "data", "message"),
    [
        (decode_varint, b"", "past the end"),
        (decode_varint, b"\x80", "past the end"),
        (decode_varint, b"\x80\x80\x80\x80\x80\x00", "longer than 5"),
        (decode_varint, b"\xff\xff\xff\xff\x1f", "overflows 32"),
        (decode_varlong, b"\x80" * 10 + b"\x00", "longer than 10"),
        (decode_varlong, b"\xff" * 9 + b"\x02", "overflows 64"),
    ],
)
def test_varint_decode_errors(
    decode: Callable[[bytes, int], tuple[int, int]], data: bytes, message: str
) -> None:
    with pytest.raises(CorruptRecordError, match=message):
        decode(data, 0)


# --- the hand-built Kafka vector ----------------------------------------------------


def test_hand_built_vector_matches_builder_and_decoder() -> None:
    expected = hand_batch()
    assert len(expected) == HEADER_SIZE + len(HAND_RECORDS)
    assert struct.unpack_from(">I", expected, 17)[0] == crc32c.crc32c(expected[21:])
    assert hand_builder().build() == expected

    header, decoded = decode_batch(expected)
    assert decoded == HAND_EXPECTED
    assert header == BatchHeader(
        base_offset=100,
        batch_length=len(expected) - LOG_OVERHEAD,
        partition_leader_epoch=-1,
        magic=2,
        crc=crc32c_reference(expected[21:]),
        attributes=0,
        last_offset_delta=2,
        base_timestamp=T0,
        max_timestamp=T0 + 300,
        producer_id=1234,
        producer_epoch=3,
        base_sequence=7,
        records_count=3,
    )
    assert (header.last_offset, header.next_offset, header.last_sequence) == (102, 103, 9)
    assert header.size_bytes == len(expected)
    assert header.compression is Compression.NONE
    assert header.timestamp_type is TimestampType.CREATE_TIME
    assert not header.is_transactional
    assert not header.is_control
    assert not header.has_delete_horizon


def test_hand_built_lz4_vector_matches_builder_and_decoder() -> None:
    frame = lz4.frame.compress(HAND_RECORDS, block_linked=False, store_size=False)
    expected = kafka_batch(
        frame,
        base_offset=100,
        attributes=3,
        last_offset_delta=2,
        base_timestamp=T0,
        max_timestamp=T0 + 300,
        producer_id=1234,
        producer_epoch=3,
        base_sequence=7,
        records_count=3,
    )
    assert hand_builder(Compression.LZ4).build() == expected
    header, decoded = decode_batch(expected)
    assert header.compression is Compression.LZ4
    assert decoded == HAND_EXPECTED


def test_decoder_accepts_every_buffer_type() -> None:
    batch = b"\x00" * 5 + hand_batch()
    for buf in (batch, bytearray(batch), memoryview(batch)):
        _, decoded = decode_batch(buf, 5)
        assert decoded == HAND_EXPECTED
        assert all(type(r.key) in (bytes, type(None)) for r in decoded)
        assert all(type(r.value) in (bytes, type(None)) for r in decoded)


def test_lz4_frame_is_kafkas_even_for_multi_block_input() -> None:
    builder = BatchBuilder(compression=Compression.LZ4)
    for i in range(1500):
        builder.append(T0 + i, b"key-%d" % i, bytes(range(256))[i % 7 :] * 1)
    uncompressed = builder.estimated_size_bytes()
    assert uncompressed > 3 * 64 * 1024
    batch = builder.build()
    frame = batch[HEADER_SIZE:]
    assert frame[:7] == bytes.fromhex("04224d18604082")  # magic, FLG 0x60, BD 0x40, HC
    blocks = 0
    position = 7
    while (size := int.from_bytes(frame[position : position + 4], "little")) != 0:
        position += 4 + (size & 0x7FFFFFFF)
        blocks += 1
    assert blocks >= 3
    assert position + 4 == len(frame)  # end mark, no content checksum
    assert len(decode_batch(batch)[1]) == 1500


# --- round trips ------------------------------------------------------------------------

header_entries = st.lists(
    st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=10)), max_size=3
)
timestamps = st.one_of(
    st.integers(T0 - 200, T0 + 20_000),  # the producer's case: close to the first
    st.integers(-(2**62), 2**62 - 1),  # anything whose delta still fits int64
)
record_specs = st.tuples(
    timestamps,
    st.none() | st.binary(max_size=40),
    st.none() | st.binary(max_size=300),  # past 63 bytes, lengths take 2 bytes
    header_entries,
    st.integers(1, 20_000),  # offset gap, used when offsets are explicit
)


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.LZ4], ids=["none", "lz4"])
@FAST
@given(
    specs=st.lists(record_specs, min_size=1, max_size=25),
    explicit_offsets=st.booleans(),
    base_offset=st.integers(0, 2**62),
    timestamp_type=st.sampled_from(TimestampType),
    delete_horizon=st.none() | st.integers(-(2**60), 2**60),
    extra_offsets=st.none() | st.integers(0, 1000),
)
def test_build_decode_round_trip(
    compression: Compression,
    specs: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]], int]],
    explicit_offsets: bool,
    base_offset: int,
    timestamp_type: TimestampType,
    delete_horizon: int | None,
    extra_offsets: int | None,
) -> None:
    builder = BatchBuilder(
        compression=compression, base_offset=base_offset, timestamp_type=timestamp_type
    )
    expected = []
    delta = -1
    for timestamp, key, value, headers, gap in specs:
        wanted = delta + gap if explicit_offsets else None
        delta = builder.append(timestamp, key, value, headers, offset_delta=wanted)
        expected.append(Record(base_offset + delta, timestamp, key, value, tuple(headers)))
    assert builder.record_count == len(specs)
    last_offset_delta = None if extra_offsets is None else delta + extra_offsets
    estimate = builder.estimated_size_bytes()

    batch = builder.build(last_offset_delta=last_offset_delta, delete_horizon_ms=delete_horizon)

    if delete_horizon is None:
        assert len(batch) <= estimate
        if compression is Compression.NONE:
            assert len(batch) == estimate
    header, decoded = decode_batch(batch)
    max_timestamp = max(spec[0] for spec in specs)
    if timestamp_type is TimestampType.LOG_APPEND_TIME:
        expected = [Record(r.offset, max_timestamp, r.key, r.value, r.headers) for r in expected]
    assert decoded == expected
    assert header.records_count == len(specs)
    assert header.last_offset == base_offset + (last_offset_delta or delta)
    assert header.max_timestamp == max_timestamp
    assert header.compression is compression
    assert header.timestamp_type is timestamp_type
    assert header.delete_horizon_ms == delete_horizon
    assert header.base_timestamp == (specs[0][0] if delete_horizon is None else delete_horizon)
    assert list(decode_records(batch)) == expected
    _, rows = decode_batch_as(batch, 0, Row, ("t", 3))
    assert rows == as_rows(expected)
    assert {type(row) for row in rows} == {Row}


@FAST
@given(
    before=st.lists(record_specs, max_size=3),
    specs=st.lists(record_specs, max_size=25),
    big=st.booleans(),
    compression=st.sampled_from([Compression.NONE, Compression.LZ4]),
)
def test_extend_builds_the_bytes_of_append_in_a_loop(
    before: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]], int]],
    specs: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]], int]],
    big: bool,
    compression: Compression,
) -> None:
    if big and specs:  # lengths past the 2-byte varint table
        timestamp, key, _, headers, gap = specs[0]
        specs[0] = (timestamp, key, b"x" * 9000, headers, gap)
    looped = BatchBuilder(compression=compression, producer_id=7, base_sequence=3)
    extended = BatchBuilder(compression=compression, producer_id=7, base_sequence=3)
    for timestamp, key, value, headers, _ in before:
        looped.append(timestamp, key, value, headers)
        extended.append(timestamp, key, value, headers)
    for timestamp, key, value, headers, _ in specs:
        looped.append(timestamp, key, value, headers)
    extended.extend(
        [spec[0] for spec in specs],
        [spec[1] for spec in specs],
        [spec[2] for spec in specs],
        [spec[3] for spec in specs],
    )
    assert extended.record_count == looped.record_count
    if looped.record_count:
        assert extended.build() == looped.build()


def test_extend_refuses_bad_columns_and_changes_nothing() -> None:
    builder = BatchBuilder()
    builder.append(T0, b"k", b"v")
    before = builder.build()
    with pytest.raises(ValueError, match="same length"):
        builder.extend([T0], [b"k"], [], [()])
    with pytest.raises(ValueError, match="int64"):
        builder.extend([T0, INT64_MAX + 1], [None, None], [None, None], [(), ()])
    with pytest.raises(ValueError, match="int64"):  # a delta past int64: encode_varlong
        builder.extend([T0 + 1, INT64_MIN], [None, None], [None, None], [(), ()])
    builder.extend([], [], [], [])
    assert builder.build() == before
    assert builder.record_count == 1


def test_decode_batch_as_needs_a_two_field_prefix() -> None:
    batch = encode_batch([(T0, b"a", b"1")])
    with pytest.raises(ValueError, match="two fields"):
        decode_batch_as(batch, 0, Row, ("t",))  # type: ignore[arg-type]


def test_encode_batch_convenience() -> None:
    batch = encode_batch([(T0, b"a", b"1"), (T0 + 1, None, None)], base_offset=7)
    assert decode_batch(batch)[1] == [Record(7, T0, b"a", b"1"), Record(8, T0 + 1, None, None)]
    with pytest.raises(ValueError, match="empty"):
        encode_batch([])


# --- builder edge cases -----------------------------------------------------------------


def test_empty_batch_needs_last_offset_delta() -> None:
    builder = BatchBuilder(compression=Compression.LZ4, base_offset=50)
    with pytest.raises(ValueError, match="last_offset_delta"):
        builder.build()
    batch = builder.build(last_offset_delta=4, max_timestamp_ms=T0)
    header, decoded = decode_batch(batch)
    assert decoded == []
    assert (header.records_count, header.next_offset) == (0, 55)
    assert header.compression is Compression.NONE  # as Kafka's writeEmptyHeader
    assert (header.base_timestamp, header.max_timestamp) == (-1, T0)
    assert len(batch) == HEADER_SIZE


def test_last_offset_delta_keeps_the_original_last_offset() -> None:
    builder = BatchBuilder(base_offset=1000)
    builder.append(T0, b"a", b"1", offset_delta=2)
    builder.append(T0, b"b", b"2", offset_delta=5)
    header, decoded = decode_batch(builder.build(last_offset_delta=9))
    assert [r.offset for r in decoded] == [1002, 1005]
    assert (header.last_offset, header.records_count) == (1009, 2)
    with pytest.raises(ValueError, match="last_offset_delta"):
        builder.build(last_offset_delta=4)


def test_offset_deltas_must_increase() -> None:
    builder = BatchBuilder()
    assert builder.append(T0, None, b"x") == 0
    assert builder.append(T0, None, b"x", offset_delta=3) == 3
    assert builder.append(T0, None, b"x") == 4
    for bad in (4, 2, -1):
        with pytest.raises(ValueError, match="does not exceed"):
            builder.append(T0, None, b"x", offset_delta=bad)
    with pytest.raises(ValueError, match="int32"):
        builder.append(T0, None, b"x", offset_delta=INT32_MAX + 1)
    assert builder.record_count == 3


@pytest.mark.parametrize(
    "codec",
    [Compression.GZIP, Compression.SNAPPY, Compression.ZSTD],
    ids=["gzip", "snappy", "zstd"],
)
def test_every_kafka_codec_is_built(codec: Compression) -> None:
    # tests/storage/test_codecs.py holds the round trips; here: the codec bits are set.
    builder = BatchBuilder(compression=codec)
    builder.append(T0, b"k", b"v")
    header, records = decode_batch(builder.build())
    assert header.compression is codec
    assert records == [Record(0, T0, b"k", b"v")]


def test_builder_rejects_out_of_range_fields() -> None:
    with pytest.raises(ValueError, match="producer_epoch"):
        BatchBuilder(producer_epoch=2**15)
    with pytest.raises(ValueError, match="base_offset"):
        BatchBuilder(base_offset=-1)
    builder = BatchBuilder(base_timestamp=0)
    with pytest.raises(ValueError, match="int64"):
        builder.append(INT64_MAX + 1, None, None)
    builder.append(INT64_MAX, None, None)  # delta 2**63 - 1 still fits
    builder.append(INT64_MIN + 1, None, None)
    with pytest.raises(ValueError, match="int64"):
        BatchBuilder(base_timestamp=1).append(INT64_MIN, None, None)  # delta < int64 min


def test_a_rejected_append_leaves_the_builder_unchanged() -> None:
    builder = BatchBuilder()
    with pytest.raises(TypeError, match="header key must be a str"):
        builder.append(T0 + 5, None, b"x", [(b"not a str", None)])  # type: ignore[list-item]
    builder.append(-(2**62), b"k", b"v")
    with pytest.raises(ValueError, match="int64"):
        builder.append(INT64_MAX, None, None)  # its delta from the base overflows int64
    header, decoded = decode_batch(builder.build())
    assert decoded == [Record(0, -(2**62), b"k", b"v")]
    assert (header.base_timestamp, header.max_timestamp) == (-(2**62), -(2**62))


def test_builder_keeps_producer_fields_and_transactional_flag() -> None:
    builder = BatchBuilder(
        producer_id=2**40, producer_epoch=9, base_sequence=INT32_MAX - 1, is_transactional=True
    )
    for i in range(4):
        builder.append(T0, None, b"%d" % i)
    header = validate_batch(builder.build())
    assert (header.producer_id, header.producer_epoch) == (2**40, 9)
    assert header.is_transactional
    assert header.last_sequence == 1  # INT32_MAX - 1 + 3 wraps past INT32_MAX to 0


@pytest.mark.parametrize(
    ("base_sequence", "last_offset_delta", "last_sequence"),
    [(10, 5, 15), (INT32_MAX, 1, 0), (INT32_MAX - 1, 5, 3), (NO_SEQUENCE, 5, NO_SEQUENCE)],
)
def test_last_sequence_wraps_like_kafka(
    base_sequence: int, last_offset_delta: int, last_sequence: int
) -> None:
    header = read_header(
        hand_batch(base_sequence=base_sequence, last_offset_delta=last_offset_delta)
    )
    assert header.last_sequence == last_sequence


def test_delete_horizon_rebases_timestamp_deltas() -> None:
    horizon = T0 + 86_400_000
    batch = hand_builder().build(delete_horizon_ms=horizon)
    header, decoded = decode_batch(batch)
    assert header.has_delete_horizon
    assert header.delete_horizon_ms == horizon
    assert header.base_timestamp == horizon
    assert decoded == HAND_EXPECTED
    # the stored delta of the first record is now T0 - horizon, a 4-byte varlong
    first_delta, _ = decode_varlong(batch, HEADER_SIZE + 2)
    assert first_delta == T0 - horizon


# --- corruption -------------------------------------------------------------------------

SAMPLES = {codec: sample_batch(codec) for codec in (Compression.NONE, Compression.LZ4)}


@pytest.mark.parametrize("codec", [Compression.NONE, Compression.LZ4], ids=["none", "lz4"])
def test_truncation_at_every_byte_is_corrupt(codec: Compression) -> None:
    batch = SAMPLES[codec]
    assert len(decode_batch(batch)[1]) == 40
    for cut in range(len(batch)):
        for check in (validate_batch, read_header):
            with pytest.raises(CorruptRecordError, match="position 0"):
                check(batch[:cut])
        with pytest.raises(CorruptRecordError):
            decode_batch(batch[:cut], validate=False)


@pytest.mark.parametrize("codec", [Compression.NONE, Compression.LZ4], ids=["none", "lz4"])
@FUZZ
@given(data=st.data())
def test_flipped_bytes_fail_validation_outside_the_uncovered_fields(
    codec: Compression, data: st.DataObject
) -> None:
    batch = SAMPLES[codec]
    position = data.draw(st.integers(0, len(batch) - 1))
    mask = data.draw(st.integers(1, 255))
    damaged = bytearray(batch)
    damaged[position] ^= mask
    if position < 8 or 12 <= position < 16:  # baseOffset, partitionLeaderEpoch: no CRC
        validate_batch(damaged)
    else:
        with pytest.raises(CorruptRecordError):
            validate_batch(damaged)
    try:  # decoding without validation may succeed, but may only ever fail cleanly
        decode_batch(bytes(damaged), validate=False)
    except CorruptRecordError:
        pass


@pytest.mark.parametrize("codec", [Compression.NONE, Compression.LZ4], ids=["none", "lz4"])
@FUZZ
@given(data=st.data())
def test_damaged_records_with_a_valid_crc_fail_cleanly(
    codec: Compression, data: st.DataObject
) -> None:
    # The CRC is recomputed after the damage, so only the record parser stands guard.
    raw = sample_batch(Compression.NONE, count=6)
    body = bytearray(raw[HEADER_SIZE:])
    for _ in range(data.draw(st.integers(1, 4))):
        body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        body = body[: data.draw(st.integers(0, len(body)))]
    if codec is Compression.LZ4 and data.draw(st.booleans()):
        body = bytearray(lz4.frame.compress(bytes(body), block_linked=False, store_size=False))
    elif codec is Compression.LZ4:  # damage the frame itself
        frame = bytearray(lz4.frame.compress(raw[HEADER_SIZE:], block_linked=False))
        frame[data.draw(st.integers(0, len(frame) - 1))] ^= data.draw(st.integers(1, 255))
        body = frame
    header = read_header(raw)
    batch = kafka_batch(
        bytes(body),
        attributes=codec,
        last_offset_delta=header.last_offset_delta,
        base_timestamp=header.base_timestamp,
        max_timestamp=header.max_timestamp,
        records_count=data.draw(st.sampled_from([6, 5, 7, 0, 2**31 - 1])),
    )
    try:
        _, decoded = decode_batch(batch)
    except CorruptRecordError:
        return
    assert len(decoded) == read_header(batch).records_count


@FUZZ
@given(st.binary(max_size=200), st.integers(0, 70))
def test_arbitrary_bytes_never_raise_anything_but_corrupt_record(
    blob: bytes, keep_prefix: int
) -> None:
    buf = SAMPLES[Compression.NONE][:keep_prefix] + blob
    for call in (
        lambda: read_header(buf),
        lambda: validate_batch(buf),
        lambda: decode_batch(buf, validate=False),
        lambda: list(iter_batch_headers(buf, validate=False)),
        lambda: list(decode_records(buf)),
    ):
        try:
            call()
        except CorruptRecordError:
            pass
    assert 0 <= split_whole_batches(buf) <= len(buf)


def test_read_header_of_a_lone_header() -> None:
    header_only = hand_batch()[:HEADER_SIZE]
    with pytest.raises(CorruptRecordError, match="runs past the end"):
        read_header(header_only)
    header = read_header(header_only, whole=False)  # a caller that read just the header
    assert header.size_bytes == len(hand_batch())
    with pytest.raises(CorruptRecordError, match="magic 0"):
        read_header(bytes(HEADER_SIZE), whole=False)


def test_crc_mismatch_is_reported_with_position() -> None:
    batch = bytearray(b"\x00" * 3 + SAMPLES[Compression.NONE])
    batch[-1] ^= 0x01
    with pytest.raises(CorruptRecordError, match=r"position 3: CRC-32C mismatch"):
        validate_batch(batch, 3)
    read_header(batch, 3)  # framing alone does not look at the CRC


@pytest.mark.parametrize(
    ("field_offset", "fmt", "value", "message"),
    [
        (16, ">b", 1, "magic 1"),
        (16, ">b", 3, "magic 3"),
        (8, ">i", HEADER_SIZE - LOG_OVERHEAD - 1, "below the minimum"),
        (8, ">i", -5, "below the minimum"),
        (8, ">i", 10_000, "runs past the end"),
    ],
)
def test_bad_framing(field_offset: int, fmt: str, value: int, message: str) -> None:
    batch = patched(hand_batch(), field_offset, fmt, value, fix_crc=False)
    for check in (read_header, validate_batch):
        with pytest.raises(CorruptRecordError, match=message):
            check(batch)
    assert split_whole_batches(batch) == 0


@pytest.mark.parametrize(
    ("field_offset", "fmt", "value", "message"),
    [
        (57, ">i", -1, "recordsCount -1"),
        (57, ">i", 4, "recordsCount 4 does not fit lastOffsetDelta 2"),
        (23, ">i", -1, "lastOffsetDelta -1"),
        (21, ">h", 5, "unknown compression codec id 5"),
    ],
)
def test_inconsistent_header_fails_validation(
    field_offset: int, fmt: str, value: int, message: str
) -> None:
    batch = patched(hand_batch(), field_offset, fmt, value)
    with pytest.raises(CorruptRecordError, match=message):
        validate_batch(batch)


@pytest.mark.parametrize(
    ("records_count", "message"),
    [(2, "bytes left after 2 records"), (3, None), (1, "bytes left after 1 records")],
)
def test_record_count_mismatch(records_count: int, message: str | None) -> None:
    batch = patched(hand_batch(), 57, ">i", records_count)
    if message is None:
        assert decode_batch(batch)[1] == HAND_EXPECTED
    else:
        with pytest.raises(CorruptRecordError, match=message):
            decode_batch(batch)
    too_many = patched(hand_batch(last_offset_delta=9), 57, ">i", 4)
    with pytest.raises(CorruptRecordError, match="runs past the end"):
        decode_batch(too_many)


def one_record_batch(record_hex: str, *, count: int = 1, last_offset_delta: int = 0) -> bytes:
    return kafka_batch(
        bytes.fromhex(record_hex),
        last_offset_delta=last_offset_delta,
        base_timestamp=T0,
        max_timestamp=T0,
        records_count=count,
    )


# Hand-made malformed records and what the error says (test_native runs them through the
# C decoder too, which must say the same).
MALFORMED_RECORDS = [
    ("0c 00 00 00 03 01 00", 1, 0, "key length -2"),
    ("0c 00 00 00 01 05 00", 1, 0, "value length -3"),
    ("0c 00 00 00 01 01 01", 1, 0, "header count -1"),
    ("10 00 00 00 01 01 02 01 01", 1, 0, "record at byte 0 .*: header key length -1"),
    ("12 00 00 00 01 01 02 02 ff 01", 1, 0, "header key not UTF-8"),
    ("12 00 00 00 01 01 02 02 68 05", 1, 0, "header value length -3"),
    ("0a 00 00 00 01 01", 1, 0, "record at byte 0 .*: length 5 is below 6"),
    ("0e 00 00 00 01 01 00", 1, 0, "length 7 .* runs past the end"),
    ("10 00 00 00 01 01 00 00 00", 1, 0, "fields end at"),
    ("0c 00 00 04 01 01 00", 1, 0, "offset delta 2 out of order"),
    ("0c 00 00 00 01 01 00" * 2, 2, 1, "offset delta 0 out of order"),
    ("0c 00 00 02 01 01 00 0c 00 00 00 01 01 00", 2, 1, "offset delta 0 out of order"),
    ("16 00 00 00 80 80 80 80 80 00 01 00", 1, 0, "varint at position 4 is longer"),
    ("0c 00 00 00 01 01 00 80", 2, 1, "record at byte 7 .*: runs past the end"),
    ("0c 00 00 00 01 01 00 00", 1, 0, "1 bytes left after 1 records"),
]


@pytest.mark.parametrize(("record_hex", "count", "last_offset_delta", "message"), MALFORMED_RECORDS)
def test_malformed_records_are_named(
    record_hex: str, count: int, last_offset_delta: int, message: str
) -> None:
    batch = one_record_batch(record_hex, count=count, last_offset_delta=last_offset_delta)
    validate_batch(batch)  # the framing and the CRC are fine: only the records are bad
    with pytest.raises(CorruptRecordError, match=f"batch at position 0: .*{message}"):
        decode_batch(batch)
    with pytest.raises(CorruptRecordError, match=f"batch at position 0: .*{message}"):
        decode_batch_as(batch, 0, Row, ("t", 3))


@pytest.mark.parametrize(
    ("base_timestamp", "delta", "timestamp"),
    [
        (INT64_MAX, 1, INT64_MIN),  # 1-byte fast path
        (INT64_MIN + 5, -300, INT64_MAX - 294),  # 2-byte fast path
        (2**62, 2**62 + 2**61, INT64_MIN + 2**61),  # the strict varlong path
        (-(2**62), 5, -(2**62) + 5),  # no wrap needed
    ],
)
def test_timestamps_wrap_like_java_longs(base_timestamp: int, delta: int, timestamp: int) -> None:
    body = b"\x00" + encode_varlong(delta) + bytes.fromhex("00 01 01 00")
    batch = kafka_batch(
        encode_varint(len(body)) + body,
        last_offset_delta=0,
        base_timestamp=base_timestamp,
        max_timestamp=base_timestamp,
        records_count=1,
    )
    assert decode_batch(batch)[1] == [Record(0, timestamp, None, None)]
    assert decode_batch_as(batch, 0, Row, ("t", 3))[1] == [
        Row("t", 3, 0, timestamp, None, None, ())
    ]


@pytest.mark.parametrize(
    "codec",
    [Compression.GZIP, Compression.SNAPPY, Compression.ZSTD],
    ids=["gzip", "snappy", "zstd"],
)
def test_a_codec_marked_on_plain_records_validates_but_does_not_decode(
    codec: Compression,
) -> None:
    batch = patched(hand_batch(), 21, ">h", codec)
    assert validate_batch(batch).compression is codec
    with pytest.raises(CorruptRecordError, match=f"bad {codec.name.lower()} data"):
        decode_batch(batch)


def test_lz4_frame_must_fill_the_batch_exactly() -> None:
    frame = lz4.frame.compress(HAND_RECORDS, block_linked=False, store_size=False)
    fields = {
        "attributes": 3,
        "last_offset_delta": 2,
        "base_timestamp": T0,
        "max_timestamp": T0,
        "records_count": 3,
    }
    assert len(decode_batch(kafka_batch(frame, **fields))[1]) == 3
    with pytest.raises(CorruptRecordError, match="after the LZ4 frame"):
        decode_batch(kafka_batch(frame + b"\x00", **fields))
    with pytest.raises(CorruptRecordError, match="bad LZ4 frame"):
        decode_batch(kafka_batch(frame[:-1], **fields))
    sized = lz4.frame.compress(HAND_RECORDS, block_linked=False, store_size=True)
    assert len(decode_batch(kafka_batch(sized, **fields))[1]) == 3  # other clients may
    huge = bytearray(sized)
    huge[6:14] = (2**40).to_bytes(8, "little")
    with pytest.raises(CorruptRecordError, match="claims"):
        decode_batch(kafka_batch(bytes(huge), **fields))


def test_unknown_codec_id_on_the_header_property() -> None:
    header = read_header(patched(hand_batch(), 21, ">h", 7))
    with pytest.raises(CorruptRecordError, match="codec id 7"):
        _ = header.compression


# --- in-place rewrites ------------------------------------------------------------------


def test_set_base_offset_keeps_the_crc_valid() -> None:
    buf = bytearray(b"\xff" * 4 + hand_batch())
    crc_before = read_header(buf, 4).crc
    set_base_offset(buf, 4, 5_000)
    header, decoded = decode_batch(buf, 4)
    assert header.crc == crc_before
    assert [r.offset for r in decoded] == [5_000, 5_001, 5_002]
    with pytest.raises(ValueError, match="out of range"):
        set_base_offset(buf, 4, -1)
    with pytest.raises(CorruptRecordError, match="position 0"):
        set_base_offset(buf, 0, 1)  # no batch starts there


def test_set_partition_leader_epoch_keeps_the_crc_valid() -> None:
    buf = bytearray(hand_batch())
    set_partition_leader_epoch(memoryview(buf), 0, 42)
    assert validate_batch(buf).partition_leader_epoch == 42
    with pytest.raises(ValueError, match="int32"):
        set_partition_leader_epoch(buf, 0, 2**31)


@pytest.mark.parametrize("codec", [Compression.NONE, Compression.LZ4], ids=["none", "lz4"])
def test_set_log_append_time_recomputes_the_crc(codec: Compression) -> None:
    batch = SAMPLES[codec]
    before = validate_batch(batch)
    buf = bytearray(batch)
    append_time = T0 + 999_999
    set_log_append_time(memoryview(buf), 0, append_time)
    header, decoded = decode_batch(buf)  # validates the new CRC
    assert header.crc != before.crc
    assert header.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert header.attributes == before.attributes | 0x08
    assert header.max_timestamp == append_time
    assert header.base_timestamp == before.base_timestamp  # Kafka leaves it alone
    assert len(decoded) == 40
    assert {r.timestamp_ms for r in decoded} == {append_time}
    assert [r.offset for r in decoded] == list(range(40))


# --- walking concatenated batches -------------------------------------------------------


def concatenated() -> tuple[bytes, list[bytes]]:
    parts = [
        sample_batch(Compression.NONE, count=3, base_offset=0),
        sample_batch(Compression.LZ4, count=20, base_offset=3),
        BatchBuilder(base_offset=23).build(last_offset_delta=1),
        sample_batch(Compression.NONE, count=9, base_offset=25),
    ]
    return b"".join(parts), parts


def test_iter_batch_headers_and_decode_records_walk_every_batch() -> None:
    buf, parts = concatenated()
    positions = [sum(len(p) for p in parts[:i]) for i in range(len(parts))]
    walked = list(iter_batch_headers(buf))
    assert [position for position, _ in walked] == positions
    assert [header.base_offset for _, header in walked] == [0, 3, 23, 25]
    assert split_whole_batches(buf) == len(buf)
    offsets = [r.offset for r in decode_records(memoryview(buf))]
    assert offsets == [*range(0, 23), *range(25, 34)]


def test_a_cut_tail_is_left_out_or_reported() -> None:
    buf, parts = concatenated()
    whole = len(buf) - len(parts[-1])
    for cut in range(1, len(parts[-1])):
        damaged = buf[: whole + cut]
        assert split_whole_batches(damaged) == whole
        walker = iter_batch_headers(damaged, validate=cut % 2 == 0)
        assert [next(walker)[0] for _ in range(3)] == [0, len(parts[0]), whole - len(parts[2])]
        with pytest.raises(CorruptRecordError, match=f"position {whole}"):
            next(walker)
    assert split_whole_batches(buf[:whole] + b"\x00" * 200) == whole  # garbage after
    assert split_whole_batches(b"") == 0


def test_public_names() -> None:
    assert sorted(records.__all__) == sorted(
        [
            "HEADER_SIZE",
            "LOG_OVERHEAD",
            "MAGIC",
            "MAX_DECOMPRESSED_BYTES",
            "NO_PARTITION_LEADER_EPOCH",
            "NO_PRODUCER_EPOCH",
            "NO_PRODUCER_ID",
            "NO_SEQUENCE",
            "NO_TIMESTAMP",
            "SUPPORTED_COMPRESSION",
            "BatchBuilder",
            "BatchHeader",
            "Compression",
            "Record",
            "TimestampType",
            "decode_batch",
            "decode_batch_as",
            "decode_records",
            "encode_batch",
            "iter_batch_headers",
            "read_header",
            "records_data",
            "set_base_offset",
            "set_log_append_time",
            "set_partition_leader_epoch",
            "split_whole_batches",
            "validate_batch",
        ]
    )
    assert all(hasattr(records, name) for name in records.__all__)
    assert sorted(varint.__all__) == sorted(
        [
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
    )
    assert all(hasattr(varint, name) for name in varint.__all__)
    assert (records.MAGIC, records.LOG_OVERHEAD, records.HEADER_SIZE) == (2, 12, 61)
