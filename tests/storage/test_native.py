"""The C codec (``storage._native``) against the pure-Python reference, and the LZ4 cap.

Differential tests: every generated batch, whole, cut short, bit-flipped or with bytes
overwritten (CRC recomputed, so the record parser alone stands guard), decodes to the
same records on both paths, or fails on both with the same error class. The same for
the column builders (Arrow buffers byte for byte) and the encoder (the same bytes, the
same errors). ``make asan`` runs this file against an AddressSanitizer build of the
extension with more examples (``TIDELOG_FUZZ_EXAMPLES``).
"""

from __future__ import annotations

import gc
import os
import random
import shutil
import struct
import subprocess
import sys
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import crc32c
import lz4.frame
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.storage.test_records import MALFORMED_RECORDS, kafka_batch, one_record_batch
from tidelog.storage import native as native_choice
from tidelog.storage.columns import decode_batch_into, finish_columns, new_column_builder
from tidelog.storage.errors import CorruptRecordError
from tidelog.storage.records import (
    HEADER_SIZE,
    MAX_DECOMPRESSED_BYTES,
    BatchBuilder,
    Compression,
    Record,
    TimestampType,
    decode_batch,
    decode_batch_as,
)

NATIVE = native_choice.NATIVE
needs_native = pytest.mark.skipif(not NATIVE, reason=str(native_choice.PURE_REASON))

EXAMPLES = int(os.environ.get("TIDELOG_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
T0 = 1_700_000_000_000
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class Row(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def test_the_extension_is_built_unless_the_pure_path_is_forced() -> None:
    # `make venv` / `pip install -e .` build it here; a silent build failure would leave
    # every other test in this file skipped, so this one says so.
    forced = os.environ.get("TIDELOG_PURE_PYTHON", "") not in ("", "0")
    assert NATIVE is not forced, native_choice.PURE_REASON
    if forced:
        assert native_choice.PURE_REASON == "TIDELOG_PURE_PYTHON is set"


# --- generated batches --------------------------------------------------------------

header_keys = st.text(max_size=6)
header_values = st.none() | st.binary(max_size=12)
record_specs = st.tuples(
    st.integers(-(2**45), 2**45) | st.sampled_from([INT64_MIN, INT64_MAX, 0, -1]),
    st.none() | st.binary(max_size=30),
    st.none() | st.binary(max_size=200),
    st.lists(st.tuples(header_keys, header_values), max_size=3),
)


@st.composite
def batches(draw: st.DrawFn) -> bytes:
    specs = draw(st.lists(record_specs, min_size=1, max_size=12))
    builder = BatchBuilder(
        compression=draw(st.sampled_from([Compression.NONE, Compression.LZ4])),
        base_offset=draw(st.integers(0, 2**62)),
        timestamp_type=draw(st.sampled_from(TimestampType)),
        base_timestamp=draw(st.none() | st.integers(-(2**40), 2**40)),
    )
    for timestamp, key, value, headers in specs:
        try:
            builder.append(timestamp, key, value, headers)
        except ValueError:  # a timestamp delta past int64: not encodable, skip it
            continue
    if builder.record_count == 0:
        builder.append(T0, b"k", b"v")
    return builder.build()


def fix_crc(batch: bytearray) -> bytearray:
    if len(batch) >= HEADER_SIZE:
        struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return batch


@st.composite
def damaged_batches(draw: st.DrawFn) -> tuple[bytes, bool]:
    """A batch, maybe damaged; and whether to validate it (CRC) before decoding."""
    batch = bytearray(draw(batches()))
    damage = draw(st.sampled_from(["none", "cut", "flip", "overwrite", "count", "records"]))
    if damage == "cut":
        batch = batch[: draw(st.integers(0, len(batch)))]
    elif damage == "flip":
        for _ in range(draw(st.integers(1, 3))):
            batch[draw(st.integers(0, len(batch) - 1))] ^= 1 << draw(st.integers(0, 7))
    elif damage == "overwrite":
        for _ in range(draw(st.integers(1, 4))):
            batch[draw(st.integers(HEADER_SIZE, len(batch) - 1))] = draw(st.integers(0, 255))
    elif damage == "count":
        struct.pack_into(">i", batch, 57, draw(st.sampled_from([0, 1, 2, 13, -1, 2**31 - 1])))
    elif damage == "records":  # uncompressed records replaced by arbitrary bytes
        struct.pack_into(">h", batch, 21, 0)
        batch = batch[:HEADER_SIZE] + bytearray(draw(st.binary(max_size=80)))
        struct.pack_into(">i", batch, 8, len(batch) - 12)
    if damage != "none" and draw(st.booleans()):
        fix_crc(batch)  # the CRC vouches for the damage: only the parser stands guard
    return bytes(batch), draw(st.booleans())


def outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", call()
    except Exception as exc:  # compared by class across the two paths
        return "error", type(exc)


@needs_native
@FUZZ
@given(damaged_batches())
def test_native_and_pure_decode_agree_on_every_batch(case: tuple[bytes, bool]) -> None:
    batch, validate = case
    native = outcome(lambda: decode_batch(batch, validate=validate))
    pure = outcome(lambda: decode_batch(batch, validate=validate, pure=True))
    assert native == pure
    if native[0] == "error":
        assert native[1] is CorruptRecordError
    rows = outcome(lambda: decode_batch_as(batch, 0, Row, ("t", 7), validate=validate))
    pure_rows = outcome(
        lambda: decode_batch_as(batch, 0, Row, ("t", 7), validate=validate, pure=True)
    )
    assert rows == pure_rows
    if rows[0] == "ok":
        assert {type(row) for row in rows[1][1]} <= {Row}


@needs_native
@FUZZ
@given(batches())
def test_native_rows_of_atomic_fields_are_left_to_reference_counting(batch: bytes) -> None:
    # Rows (and their headers) hold ints, bytes, str and None only: no cycle can pass
    # through them, so the decoder untracks them, as the collector itself does for such
    # exact tuples (never for NamedTuple rows). The consumer's full collections fell from
    # ~30% of its time to ~3%.
    for rows in (decode_batch(batch)[1], decode_batch_as(batch, 0, Row, ("t", 7))[1]):
        for row in rows:
            assert not gc.is_tracked(row)
            assert not any(gc.is_tracked(pair) for pair in row.headers)
    pure = decode_batch_as(batch, 0, Row, ("t", 7), pure=True)[1]
    assert all(gc.is_tracked(row) for row in pure)  # the reference path leaves them be
    assert decode_batch_as(batch, 0, Row, ("t", 7))[1] == pure


class _Holder:
    rows: list[Any]


@needs_native
def test_a_row_whose_prefix_can_hold_a_cycle_stays_collectable() -> None:
    # A prefix the caller chose may be a container: its rows stay tracked, else a cycle
    # through one (holder -> rows -> row -> holder) would never be freed.
    builder = BatchBuilder(base_offset=0)
    builder.append(T0, b"k", b"v", [("h", b"x")])
    batch = builder.build()
    holder = _Holder()
    gone = weakref.ref(holder)
    holder.rows = decode_batch_as(batch, 0, Row, (holder, 7))[1]  # type: ignore[arg-type]
    assert all(gc.is_tracked(row) for row in holder.rows)
    del holder
    gc.collect()
    assert gone() is None


@needs_native
@FUZZ
@given(st.binary(max_size=120), st.integers(0, 8), st.integers(-1, 10), st.booleans())
def test_native_and_pure_agree_on_arbitrary_records_data(
    data: bytes, count: int, last_offset_delta: int, append_time: bool
) -> None:
    # Straight at the record parsers: no header, no CRC in the way.
    from tidelog.storage import _native
    from tidelog.storage.records import _decode_records

    args = (count, 5, T0, T0 + 9 if append_time else None, last_offset_delta, 0)
    native = outcome(lambda: _native.decode_records(data, 0, len(data), *args, Record, None))
    pure = outcome(lambda: _decode_records(data, *args, Record, None))
    assert native == pure


def varint(value: int) -> bytes:
    zz = ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while zz >= 0x80:
        out.append(zz & 0x7F | 0x80)
        zz >>= 7
    out.append(zz)
    return bytes(out)


small = st.integers(-3, 9) | st.integers(-(2**31), 2**31 - 1) | st.integers(INT64_MIN, INT64_MAX)


@st.composite
def records_data(draw: st.DrawFn) -> tuple[bytes, int, int]:
    """Records data, count and last offset delta: each field now and then wrong."""

    # At most one field of a record is wrong, so the rest of it parses and the decoders
    # must both notice that one field.
    wrong_field = ""

    def maybe(right: int, wrong: list[int], field: str) -> int:
        return draw(st.sampled_from(wrong)) if field == wrong_field else right

    data = b""
    records = draw(st.integers(0, 4))
    for index in range(records):
        wrong_field = draw(st.sampled_from(["", "", *FIELDS]))
        key = draw(st.none() | st.binary(max_size=6))
        value = draw(st.none() | st.binary(max_size=6))
        key_length = maybe(-1 if key is None else len(key), [-3, -2, 0, 1, 9], "key")
        value_length = maybe(-1 if value is None else len(value), [-3, -2, 0, 1, 9], "value")
        delta = maybe(index, [-1, 0, index - 1, index + 1, 9], "delta")
        body = b"\x00" + varint(draw(small)) + varint(delta)
        body += varint(key_length) + (key or b"") + varint(value_length) + (value or b"")
        headers = [
            draw(st.sampled_from(NOT_UTF8 if draw(st.integers(0, 15)) == 0 else UTF8))
            for _ in range(draw(st.integers(0, 2)))
        ]
        body += varint(maybe(len(headers), [-2, -1, 0, 1, 3], "headers"))
        for header in headers:
            header_value = draw(st.none() | st.binary(max_size=3))
            value_length = -1 if header_value is None else len(header_value)
            body += varint(maybe(len(header), [-2, -1, 0, 1, 5], "header key")) + header
            body += varint(maybe(value_length, [-3, -2, -1, 0, 5], "header value")) + (
                header_value or b""
            )
        data += varint(maybe(len(body), [-1, 5, len(body) - 1, len(body) + 1], "length")) + body
    data += draw(st.sampled_from([b""] * 8 + [b"\x00", b"\x80", b"\x0c\x00"]))
    wrong_field = draw(st.sampled_from(["", "", "count", "last delta"]))
    count = maybe(records, [0, records - 1, records + 1, 2**31 - 1], "count")
    last_delta = max(records - 1, 0) + draw(st.integers(0, 2))
    last_offset_delta = maybe(last_delta, [-1, 0, records - 2], "last delta")
    return data, count, last_offset_delta


FIELDS = ["key", "value", "delta", "length", "headers", "header key", "header value"]
# Header keys: UTF-8 (ASCII, 2, 3 and 4 bytes) and not (a lone continuation byte, an
# encoded surrogate, an overlong slash, a cut sequence, past U+10FFFF).
UTF8 = [b"", b"h", "é".encode(), "€".encode(), "\U0001f600".encode()]
NOT_UTF8 = [b"\xff", b"\xed\xa0\x80", b"\xc0\xaf", b"\xe2\x82", b"\xf4\x90\x80\x80"]
small = st.integers(-3, 9) | st.integers(INT64_MIN, INT64_MAX)


@needs_native
@FUZZ
@given(records_data())
def test_native_and_pure_agree_on_structured_records_data(case: tuple[bytes, int, int]) -> None:
    from tidelog.storage import _native
    from tidelog.storage.records import _decode_records

    data, count, last_offset_delta = case
    for base_timestamp, append_time in ((INT64_MAX - 3, None), (T0, T0 + 5)):
        args = (count, 5, base_timestamp, append_time, last_offset_delta, 0)
        native = outcome(
            lambda a=args: _native.decode_records(data, 0, len(data), *a, Record, None)
        )
        pure = outcome(lambda a=args: _decode_records(data, *a, Record, None))
        assert native == pure


@needs_native
def test_the_corrupt_record_corpus_gives_the_same_messages() -> None:
    # The hand-made malformed records of test_records, each through both decoders: the
    # C decoder words its errors as the pure one does, position included.
    assert len(MALFORMED_RECORDS) >= 15
    for record_hex, count, last_offset_delta, _ in MALFORMED_RECORDS:
        batch = one_record_batch(record_hex, count=count, last_offset_delta=last_offset_delta)
        with pytest.raises(CorruptRecordError) as native_error:
            decode_batch(batch)
        with pytest.raises(CorruptRecordError) as pure_error:
            decode_batch(batch, pure=True)
        assert str(native_error.value) == str(pure_error.value)


# --- columns --------------------------------------------------------------------------


@needs_native
@FUZZ
@given(damaged_batches(), st.booleans(), st.integers(-1, 2**62))
def test_native_and_pure_column_builders_agree(
    case: tuple[bytes, bool], include_headers: bool, min_offset: int
) -> None:
    batch, validate = case
    results = []
    for pure in (False, True):
        builder = new_column_builder(include_headers, pure=pure)
        decode_batch_into(builder, decode_ok_batch(), 0)  # rows already there stay
        added = outcome(
            lambda b=builder: decode_batch_into(b, batch, validate=validate, min_offset=min_offset)
        )
        results.append((added, builder.rows, builder.last_offset, finish_columns(builder)))
    assert results[0] == results[1]


def decode_ok_batch() -> bytes:
    builder = BatchBuilder(base_offset=3)
    builder.append(T0, b"key", None, [("h", b"1"), ("i", None)])
    builder.append(T0 + 1, None, b"value")
    return builder.build()


@pytest.mark.parametrize("pure", [False, True], ids=["native", "pure"])
def test_columns_hold_the_records(pure: bool) -> None:
    if not pure and not NATIVE:
        pytest.skip(str(native_choice.PURE_REASON))
    builder = new_column_builder(True, pure=pure)
    header, added = decode_batch_into(builder, decode_ok_batch(), 0, min_offset=3)
    assert (header.base_offset, added, builder.rows, builder.last_offset) == (3, 2, 2, 4)
    columns = finish_columns(builder)
    assert builder.rows == 0
    assert builder.last_offset is None
    assert struct.unpack("<2q", columns.offsets) == (3, 4)
    assert struct.unpack("<2q", columns.timestamps) == (T0, T0 + 1)
    assert columns.key_validity == b"\x01"
    assert columns.value_validity == b"\x02"
    assert struct.unpack("<3i", columns.key_offsets) == (0, 3, 3)
    assert (columns.key_data, columns.value_data) == (b"key", b"value")
    assert columns.header_entries == 2
    assert columns.header_list_validity == b"\x01"  # the second record has no headers
    assert struct.unpack("<3i", columns.header_list_offsets or b"") == (0, 2, 2)
    assert columns.header_key_data == b"hi"
    assert columns.header_value_validity == b"\x01"
    _, added = decode_batch_into(builder, decode_ok_batch(), 0, min_offset=4)
    assert added == 1
    assert finish_columns(builder).offsets == struct.pack("<q", 4)


# --- encoding -------------------------------------------------------------------------


@needs_native
@FUZZ
@given(
    st.lists(record_specs, max_size=15),
    st.sampled_from([Compression.NONE, Compression.LZ4]),
    st.none() | st.integers(-(2**40), 2**40),
    st.booleans(),
)
def test_native_and_pure_extend_build_the_same_bytes(
    specs: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]],
    compression: Compression,
    base_timestamp: int | None,
    as_lists: bool,
) -> None:
    columns: list[list[Any]] = [[spec[i] for spec in specs] for i in range(4)]
    if as_lists:  # headers as lists of lists: unpacked as pairs all the same
        columns[3] = [[list(pair) for pair in headers] for headers in columns[3]]
    built = []
    for pure in (False, True):
        builder = BatchBuilder(compression=compression, base_timestamp=base_timestamp)
        builder.append(T0, b"first", None)
        result = outcome(lambda b=builder, p=pure: b.extend(*columns, pure=p))
        built.append((result, builder.record_count, builder.build()))
    assert built[0] == built[1]


BAD_COLUMNS = [
    ([T0], ["text"], [None], [()]),  # a str key
    ([T0], [None], [12], [()]),  # an int value
    ([T0], [None], [None], [[(b"key", b"v")]]),  # a bytes header key
    ([T0], [None], [None], [[("k", "v")]]),  # a str header value
    ([T0], [None], [None], [[("k", b"v", b"x")]]),  # a header of three
    ([T0, INT64_MIN], [None, None], [None, None], [(), ()]),  # a delta past int64
    ([1.5], [None], [None], [()]),  # not an int
]


@needs_native
@pytest.mark.parametrize("columns", BAD_COLUMNS)
def test_native_and_pure_extend_refuse_alike_and_change_nothing(columns: Any) -> None:
    errors = []
    for pure in (False, True):
        builder = BatchBuilder()
        builder.append(T0, b"k", b"v")
        before = builder.build()
        with pytest.raises((TypeError, ValueError)) as error:
            builder.extend(*columns, pure=pure)
        errors.append(error.type)
        assert builder.build() == before
        assert builder.record_count == 1
    assert errors[0] is errors[1]


def test_extend_takes_any_bytes_like() -> None:
    builder = BatchBuilder()
    builder.extend(
        [T0, T0],
        [bytearray(b"k"), memoryview(b"key")],
        [b"v", bytearray(b"value")],
        [[("h", memoryview(b"x"))], ()],
    )
    assert decode_batch(builder.build())[1] == [
        Record(0, T0, b"k", b"v", (("h", b"x"),)),
        Record(1, T0, b"key", b"value", ()),
    ]


# --- LZ4: the decompressed-size cap ---------------------------------------------------


def lz4_batch(frame: bytes, count: int = 1) -> bytes:
    return kafka_batch(
        frame,
        attributes=Compression.LZ4,
        last_offset_delta=count - 1,
        base_timestamp=T0,
        max_timestamp=T0,
        records_count=count,
    )


@pytest.mark.parametrize("pure", [False, True], ids=["native", "pure"])
def test_a_hostile_lz4_frame_is_refused_before_it_expands(pure: bool) -> None:
    # 65 MiB of zeros compress to ~260 KiB: a batch a broker would store (it checks the
    # CRC, not the records), and one that would cost a consumer 65 MiB, or 255x more for
    # a longer frame. Refused from the block headers alone.
    frame = lz4.frame.compress(
        bytes(MAX_DECOMPRESSED_BYTES + (1 << 20)), block_linked=False, store_size=False
    )
    assert len(frame) < 1 << 20
    with pytest.raises(CorruptRecordError, match=r"may decompress to .* over the limit"):
        decode_batch(lz4_batch(frame), pure=pure)
    builder = new_column_builder(False, pure=pure)
    with pytest.raises(CorruptRecordError, match="over the limit"):
        decode_batch_into(builder, lz4_batch(frame))
    assert builder.rows == 0


def test_lz4_frames_up_to_the_cap_decode() -> None:
    records = BatchBuilder()
    records.append(T0, None, bytes(3 << 20))  # 3 MiB in one record: 48 blocks
    body = records.build()[HEADER_SIZE:]
    frame = lz4.frame.compress(body, block_linked=False, store_size=False)
    assert decode_batch(lz4_batch(frame))[1] == [Record(0, T0, None, bytes(3 << 20))]
    sized = lz4.frame.compress(body, block_linked=False, store_size=True)
    assert decode_batch(lz4_batch(sized))[1][0].value == bytes(3 << 20)


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (b"\x04\x22\x4d", "no frame magic"),
        (b"\x00\x22\x4d\x18\x60\x40\x82\x00\x00\x00\x00", "no frame magic"),
        (b"\x04\x22\x4d\x18\x60\x00\x82\x00\x00\x00\x00", "block size code 0"),
        (b"\x04\x22\x4d\x18\x60\x40\x82\x05\x00\x00", "truncated"),
        (b"\x04\x22\x4d\x18\x60\x40\x82\x05\x00\x00\x00abcde", "truncated"),
        (b"\x04\x22\x4d\x18\x68\x40" + bytes(5), "truncated"),
    ],
)
def test_frames_that_do_not_walk_are_bad(frame: bytes, message: str) -> None:
    for pure in (False, True):
        with pytest.raises(CorruptRecordError, match=f"bad LZ4 frame: {message}"):
            decode_batch(lz4_batch(frame), pure=pure)


def test_random_lz4_frames_fail_cleanly() -> None:
    rng = random.Random(17)
    good = lz4.frame.compress(decode_ok_batch()[HEADER_SIZE:], block_linked=False)
    for _ in range(500):
        frame = bytearray(good)
        for _ in range(rng.randint(1, 3)):
            frame[rng.randrange(len(frame))] = rng.randrange(256)
        batch = lz4_batch(bytes(frame), count=2)
        native = outcome(lambda b=batch: decode_batch(b, validate=False))
        assert native == outcome(lambda b=batch: decode_batch(b, validate=False, pure=True))
        assert native[0] == "ok" or native[1] is CorruptRecordError


# --- the build ------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_without_a_compiler_the_build_warns_and_succeeds(tmp_path: Path) -> None:
    # setup.py's extension is optional: a machine without a C compiler still installs
    # (and then runs the pure-Python codec). CC names a compiler that does not exist.
    root = Path(__file__).resolve().parents[2]
    for name in ("setup.py", "pyproject.toml", "README.md", "storage/_native.c"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(root / name, tmp_path / name)
    build = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--inplace"],
        cwd=tmp_path,
        env={**os.environ, "CC": str(tmp_path / "no-such-cc")},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert build.returncode == 0, build.stderr
    assert "storage._native" in build.stdout + build.stderr  # the warning names it
    assert not list((tmp_path / "storage").glob("_native*.so"))


class TimedRow(NamedTuple):
    """``Row`` plus the batch times, as ``client.types.ConsumerRecord``."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    sent_timestamp_ms: int | None
    received_timestamp_ms: int | None


_MS = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.integers(0, 2**45))


@needs_native
@FUZZ
@given(damaged_batches(), _MS, _MS)
def test_native_and_pure_agree_on_the_three_timestamps(
    case: tuple[bytes, bool], sent: int | None, received: int | None
) -> None:
    batch, validate = case

    def decode(pure: bool) -> tuple[str, Any]:
        return outcome(
            lambda: decode_batch_as(
                batch, 0, TimedRow, ("t", 7), times=(sent, received), validate=validate, pure=pure
            )
        )

    native, pure = decode(False), decode(True)
    assert native == pure
    if native[0] == "ok":
        for row in native[1][1]:
            assert type(row) is TimedRow
            assert (row.sent_timestamp_ms, row.received_timestamp_ms) == (sent, received)
    else:
        assert native[1] is CorruptRecordError
