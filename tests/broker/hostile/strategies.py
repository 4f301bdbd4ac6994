"""Hypothesis strategies for hostile requests to ``tidelog.v1.Broker``.

``requests(method)`` builds a request of the RPC's own message type from its descriptor,
field by field, so every field of every RPC is covered and a field added to the
``.proto`` is fuzzed without an edit here; fields whose meaning calls for sharper values
(names, record bytes, counts, sizes) get their own strategy by field name. Values lean
to the edges: empty and huge names, names with ``/``, ``..``, NUL or non-ASCII, every
integer type's extremes and their neighbours, NaN and infinities, long lists.

``batches()`` is record bytes: valid RecordBatch v2 (from ``storage.batch_builder``),
then truncated, bit-flipped (with and without a fixed-up CRC, so both the framing check
and the readers' decoding are reached), with absurd declared lengths, counts and header
counts, concatenations, and plain garbage.
"""

from __future__ import annotations

import struct
from typing import Any

import crc32c
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message
from hypothesis import reject
from hypothesis import strategies as st

from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.storage.records import BatchBuilder, Compression

__all__ = ["KNOWN_TOPICS", "PROTECTED", "batches", "garbage", "names", "requests"]

# Topics the fuzz fixture creates, so that requests reach past "unknown topic".
KNOWN_TOPICS = ("fuzz-plain", "fuzz-compact", "fuzz-append-time")
# What the fuzz must not touch: the correct client's topic and the default quota entity
# (a quota there would throttle the correct client: allowed, but not a fault to find).
PROTECTED = frozenset({"canary", "<default>"})

_INT32 = (-(2**31), -(2**31) + 1, -2, -1, 0, 1, 2, 2**31 - 2, 2**31 - 1)
_INT64 = (-(2**63), -(2**63) + 1, -2, -1, 0, 1, 2**31 - 1, 2**31, 2**62, 2**63 - 1)

CONFIG_KEYS = (
    "segment.bytes",
    "segment.ms",
    "retention.ms",
    "retention.bytes",
    "cleanup.policy",
    "delete.retention.ms",
    "min.compaction.lag.ms",
    "max.message.bytes",
    "message.timestamp.type",
    "min.cleanable.dirty.ratio",
    "partitions",
    "min.insync.replicas",
)
QUOTA_KEYS = ("producer_byte_rate", "consumer_byte_rate", "request_percentage")


def _odd_text() -> st.SearchStrategy[str]:
    return st.sampled_from(
        [
            "",
            ".",
            "..",
            "../etc",
            "a/b",
            "/abs",
            "\x00",
            "a\x00b",
            " ",
            "\n",
            "é",
            "名前",
            "\U0001f4a9",
            "\ud7ff",
            "a" * 249,
            "a" * 250,
            "b" * 5_000,
            "c" * 70_000,
            "__consumer_offsets",
            "CON",
            "-",
            "_",
            "fuzz-plain\x00",
            "fuzz-plain ",
        ]
    )


def names() -> st.SearchStrategy[str]:
    """Topic, group, member and client names."""
    return st.one_of(
        st.sampled_from(KNOWN_TOPICS),
        st.from_regex(r"\Afz[A-Za-z0-9._-]{0,20}\Z"),
        _odd_text(),
        st.text(max_size=40),
    ).filter(lambda name: name not in PROTECTED and not name.startswith("canary"))


def ints(bits: int, signed: bool = True) -> st.SearchStrategy[int]:
    if not signed:
        top = 2**bits - 1
        return st.one_of(st.sampled_from([0, 1, top - 1, top]), st.integers(0, top))
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    edges = _INT32 if bits == 32 else _INT64
    return st.one_of(st.sampled_from(edges), st.integers(-3, 10), st.integers(low, high))


def _small_or_absurd(bits: int = 32) -> st.SearchStrategy[int]:
    """Counts: a few, or far past any limit (never a large valid count: that is a
    legitimate, slow request, not a hostile one)."""
    return st.one_of(st.integers(-3, 4), st.sampled_from([10_001, 2**20, 2 ** (bits - 1) - 1]))


# --- record bytes --------------------------------------------------------------------------


@st.composite
def _valid_batch(draw: st.DrawFn) -> bytes:
    builder = BatchBuilder(
        compression=draw(st.sampled_from([Compression.NONE, Compression.LZ4])),
        producer_id=draw(st.sampled_from([-1, -1, 0, 7, 2**63 - 1])),
        producer_epoch=draw(st.sampled_from([-1, 0, 32_767])),
        base_sequence=draw(st.sampled_from([-1, 0, 5, 2**31 - 1])),
    )
    for _ in range(draw(st.integers(0, 4))):
        builder.append(
            draw(st.sampled_from([0, -1, 1_700_000_000_000, 2**62])),
            draw(st.none() | st.binary(max_size=16)),
            draw(st.none() | st.binary(max_size=64)),
            draw(
                st.lists(
                    st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)),
                    max_size=3,
                )
            ),
        )
    if builder.record_count == 0:
        builder.append(1_700_000_000_000, None, b"v")
    return builder.build()


def _fix_crc(batch: bytearray) -> bytearray:
    if len(batch) >= 61:
        struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return batch


@st.composite
def _hostile_batch(draw: st.DrawFn) -> bytes:
    batch = bytearray(draw(_valid_batch()))
    kind = draw(
        st.sampled_from(
            [
                "truncate",
                "flip",
                "flip-crc-fixed",
                "length",
                "count",
                "header-count",
                "magic",
                "attributes",
                "append",
            ]
        )
    )
    if kind == "truncate":
        return bytes(batch[: draw(st.integers(0, len(batch) - 1))])
    if kind in ("flip", "flip-crc-fixed"):
        for _ in range(draw(st.integers(1, 4))):
            bit = draw(st.integers(0, len(batch) * 8 - 1))
            batch[bit // 8] ^= 1 << (bit % 8)
        return bytes(_fix_crc(batch) if kind == "flip-crc-fixed" else batch)
    if kind == "length":  # the declared batch length: absurd, negative, off by some
        value = draw(st.sampled_from([-1, 0, 48, 49, 2**31 - 1, -(2**31), len(batch) - 11]))
        struct.pack_into(">i", batch, 8, value)
        return bytes(batch)
    if kind == "count":  # records count (inside the CRC): a lie, CRC fixed up
        struct.pack_into(">i", batch, 57, draw(ints(32)))
        return bytes(_fix_crc(batch))
    if kind == "header-count":  # a record claiming a huge header count, CRC fixed up
        builder = BatchBuilder()
        builder.append(1_700_000_000_000, b"k", b"v")
        raw = bytearray(builder.build())
        # The record's last byte is its header count (varint 0): replace it by a huge one.
        huge = draw(st.sampled_from([b"\xfe\xff\xff\xff\x0f", b"\x80\x80\x80\x80\x08", b"\x7f"]))
        raw = raw[:-1] + huge
        struct.pack_into(">i", raw, 8, len(raw) - 12)
        return bytes(_fix_crc(raw))
    if kind == "magic":
        batch[16] = draw(st.sampled_from([0, 1, 3, 255]))
        return bytes(batch)
    if kind == "attributes":  # codecs, transactional/control flags, CRC fixed up
        struct.pack_into(">h", batch, 21, draw(st.integers(-(2**15), 2**15 - 1)))
        return bytes(_fix_crc(batch))
    return bytes(batch) + draw(st.binary(min_size=1, max_size=80))  # trailing garbage


def batches() -> st.SearchStrategy[bytes]:
    """Record bytes of a produce request (see the module docstring)."""
    return st.one_of(
        _valid_batch(),
        _hostile_batch(),
        st.lists(st.one_of(_valid_batch(), _hostile_batch()), min_size=2, max_size=3).map(b"".join),
        st.binary(max_size=200),
        st.sampled_from([b"", b"\x00" * 61, b"\xff" * 61, b"\x00" * 2_000_000]),
    )


def garbage() -> st.SearchStrategy[bytes]:
    """Raw request bodies: arbitrary bytes, and valid ones broken."""
    return st.one_of(
        st.binary(max_size=300),
        st.sampled_from(
            [
                b"\x0a\xff\xff\xff\xff\x0f",  # a length past the end
                b"\x0a\x03\xff\xfe\xfd",  # field 1 as invalid UTF-8 (or bytes)
                b"\x08" + b"\xff" * 11,  # a varint that never ends
                b"\x0b" * 200,  # start-group tags, nested
                b"\x22\x80\x80\x80\x80\x08",  # a nested message of 2 GiB
                b"\x1a" * 1000,
            ]
        ),
    )


# --- requests ------------------------------------------------------------------------------

_SCALAR: dict[int, st.SearchStrategy[Any]] = {
    FieldDescriptor.TYPE_INT32: ints(32),
    FieldDescriptor.TYPE_SINT32: ints(32),
    FieldDescriptor.TYPE_SFIXED32: ints(32),
    FieldDescriptor.TYPE_INT64: ints(64),
    FieldDescriptor.TYPE_SINT64: ints(64),
    FieldDescriptor.TYPE_SFIXED64: ints(64),
    FieldDescriptor.TYPE_UINT32: ints(32, signed=False),
    FieldDescriptor.TYPE_UINT64: ints(64, signed=False),
    FieldDescriptor.TYPE_BOOL: st.booleans(),
    FieldDescriptor.TYPE_DOUBLE: st.floats(allow_nan=True, allow_infinity=True),
    FieldDescriptor.TYPE_FLOAT: st.floats(width=32, allow_nan=True, allow_infinity=True),
    FieldDescriptor.TYPE_STRING: names(),
    FieldDescriptor.TYPE_BYTES: st.binary(max_size=100),
}

# Fields with a sharper strategy than their type's, by name.
_BY_NAME: dict[str, st.SearchStrategy[Any]] = {
    "records": batches(),
    "partitions": _small_or_absurd(),  # CreateTopicRequest.partitions (an int32)
    "count": _small_or_absurd(),
    "replication_factor": _small_or_absurd(),
    "max_wait_ms": st.one_of(st.integers(-2, 50), st.sampled_from([2**31 - 1, -(2**31)])),
    "timeout_ms": st.one_of(st.integers(-2, 50), st.sampled_from([2**31 - 1, -(2**31)])),
    "rebalance_timeout_ms": st.one_of(st.integers(-2, 50), st.sampled_from([2**31 - 1])),
    "session_timeout_ms": st.one_of(st.integers(-2, 50), st.sampled_from([2**31 - 1])),
    "batch_times": st.binary(max_size=100),
}


# The most a repeated field's copies add up to: past the broker's largest request
# (socket.request.max.bytes, 100 MiB) a larger one is refused the same way. Uncapped, 2,000
# copies of 2 MB of record bytes made one Produce request of 4 GB, which this test
# process built, serialized and broke three ways (5-12 GiB of RSS).
LIST_BYTES_CAP = 128 * 1024 * 1024


def _byte_size(element: Any) -> int:
    if isinstance(element, (bytes, str)):
        return len(element)
    if isinstance(element, Message):
        return int(element.ByteSize())
    return 10  # a number or an enum: a varint at most


def _repeated(pair: tuple[Any, int]) -> list[Any]:
    element, count = pair
    return [element] * max(1, min(count, LIST_BYTES_CAP // max(1, _byte_size(element))))


def _lists(single: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    """A few elements, or one element repeated an absurd number of times (drawing
    thousands of distinct elements would cost hypothesis more than the broker), up to
    ``LIST_BYTES_CAP`` bytes of copies."""
    return st.one_of(
        st.lists(single, max_size=3),
        st.tuples(single, st.sampled_from([50, 2_000])).map(_repeated),
    )


def _field(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        key_field = field.message_type.fields_by_name["key"]
        value_field = field.message_type.fields_by_name["value"]
        keys = st.one_of(st.sampled_from(CONFIG_KEYS + QUOTA_KEYS), names())
        values = (
            st.one_of(
                st.sampled_from(["-1", "0", "1", "compact", "delete", "LogAppendTime", "1e9"]),
                st.sampled_from([str(v) for v in _INT64]),
                _SCALAR[FieldDescriptor.TYPE_STRING],
            )
            if value_field.type == FieldDescriptor.TYPE_STRING
            else _scalar(value_field)
        )
        del key_field
        return st.dictionaries(keys, values, max_size=4)
    if field.message_type is not None:
        single = _message(field.message_type, depth + 1)
    elif field.name in _BY_NAME and not (field.name == "partitions" and field.is_repeated):
        single = _BY_NAME[field.name]
    else:
        single = _scalar(field)
    if field.is_repeated:
        if field.message_type is None and field.name == "partitions":
            single = ints(32)  # TopicPartitions.partitions: repeated int32
        return _lists(single)
    return single


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    if field.type == FieldDescriptor.TYPE_ENUM:
        return ints(32)
    return _SCALAR[field.type]


def _message(descriptor: Descriptor, depth: int) -> st.SearchStrategy[Any]:
    cls = getattr(pb, descriptor.name)
    if depth > 3:
        return st.just(cls())
    fields = list(descriptor.fields)
    oneofs = {f.name for o in descriptor.oneofs for f in o.fields if not o.name.startswith("_")}

    @st.composite
    def build(draw: st.DrawFn) -> Any:
        values: dict[str, Any] = {}
        chosen_oneof: set[str] = set()
        for field in fields:
            if not draw(st.booleans()):
                continue  # unset (the default, or absent for optional fields)
            if field.name in oneofs:
                group = field.containing_oneof.name
                if group in chosen_oneof:
                    continue
                chosen_oneof.add(group)
            values[field.name] = draw(_field(field, depth))
        try:
            return cls(**values)
        except DecodeError:
            # protobuf's constructor re-parses nested messages: a drawn combination it
            # cannot build is not a request anyone can send. Draw another.
            reject()

    return build()


def requests(method: str) -> st.SearchStrategy[Any]:
    """Requests of ``method``'s input type, every field fuzzed (module docstring)."""
    descriptor = pb.DESCRIPTOR.services_by_name["Broker"].methods_by_name[method]
    return _message(descriptor.input_type, 0)
