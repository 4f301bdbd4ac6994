"""Share-group offset admin (KIP-932, issue #32) on the Kafka listener:
DescribeShareGroupOffsets (90, v0-1), AlterShareGroupOffsets (91, v0),
DeleteShareGroupOffsets (92, v0) and DeleteGroups (42) of a share group.

As in ``test_share_groups.py``: no Python Kafka client speaks these APIs, so requests are
built by the listener's own codec, and one request and its answer of each API are also
checked byte by byte against the published schemas (AlterShareGroupOffsetsRequest.json /
Response.json v0, DeleteShareGroupOffsets v0, DescribeShareGroupOffsets v1: all flexible),
written out here by hand. The group's members are hand-built Kafka share consumers
(``Wire``), whose records and acknowledgements the offsets reflect.
"""

from __future__ import annotations

import socket
import struct
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.kafka import raw
from tests.kafka.conftest import unique
from tests.kafka.test_share_groups import ACCEPT, REJECT, Wire, ack, acquired
from tidelog.broker.core.topic_ids import topic_id
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient, Producer, TopicPartition

pytestmark = pytest.mark.timeout(120)

DESCRIBE_OFFSETS, ALTER_OFFSETS, DELETE_OFFSETS, DELETE_GROUPS = 90, 91, 92, 42
NONE, UNKNOWN_TOPIC, GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP = 0, 3, 69, 68
LOCK_MS = 600_000


@pytest.fixture(scope="module")
def broker() -> Iterator[InProcessBroker]:
    settings = {
        "kafka.listen": "127.0.0.1:0",
        "group.share.min.heartbeat.interval.ms": 100,
        "group.share.heartbeat.interval.ms": 100,
        "group.share.max.record.lock.duration.ms": LOCK_MS,
        "group.share.record.lock.duration.ms": LOCK_MS,
    }
    with InProcessBroker(settings=settings) as b:
        yield b


def _topic(broker: InProcessBroker, partitions: int = 1) -> str:
    name = unique("share-admin")
    with AdminClient(broker.address) as admin:
        admin.create_topic(name, partitions)
    return name


def _produce(broker: InProcessBroker, name: str, count: int) -> None:
    with Producer(broker.address) as producer:
        for i in range(count):
            producer.send(name, value=b"%d" % i, partition=0)
        producer.flush()


def _empty_group(broker: InProcessBroker, name: str) -> str:
    """A share group that a member joined and left: empty, with no share state yet."""
    wire = Wire(broker, unique("share-admin-g"))
    try:
        assert wire.join(name)["error_code"] == NONE
        assert wire.heartbeat(-1)["error_code"] == NONE
    finally:
        wire.close()
    return wire.group


def _exchange(broker: InProcessBroker, frame: bytes) -> bytes:
    port = broker.server.kafka_port
    assert port is not None
    with socket.create_connection(("127.0.0.1", port), 10) as sock:
        sock.sendall(frame)
        answer = raw.read_frame(sock)
    assert answer is not None
    return answer


def _compact(text: str) -> bytes:
    data = text.encode()
    return bytes([len(data) + 1]) + data  # short strings: a one-byte unsigned varint


def _header(api_key: int, version: int, correlation: int) -> bytes:
    return struct.pack(">hhih", api_key, version, correlation, 4) + b"wire" + b"\x00"


def _framed(header: bytes, body: bytes) -> bytes:
    return struct.pack(">i", len(header) + len(body)) + header + body


# --- byte-level fixtures against the published schemas -----------------------------------


def test_alter_offsets_bytes_match_the_published_schema(broker: InProcessBroker) -> None:
    """AlterShareGroupOffsetsRequest v0: GroupId compact string, Topics compact array of
    (TopicName compact string, Partitions compact array of (PartitionIndex int32,
    StartOffset int64, tags), tags), tags; header v2. The answer, header v1 then
    ThrottleTimeMs int32, ErrorCode int16, ErrorMessage compact nullable string, Responses
    compact array of (TopicName compact string, TopicId uuid, Partitions compact array of
    (PartitionIndex int32, ErrorCode int16, ErrorMessage compact nullable string, tags),
    tags), tags."""
    name = _topic(broker)
    group = _empty_group(broker, name)
    body = (
        _compact(group)
        + b"\x02"  # one topic
        + _compact(name)
        + b"\x02"  # one partition
        + struct.pack(">iq", 0, 5)
        + b"\x00"  # partition tags
        + b"\x00"  # topic tags
        + b"\x00"  # body tags
    )
    by_hand = _framed(_header(ALTER_OFFSETS, 0, 11), body)
    built = raw.kio_frame(
        ALTER_OFFSETS,
        0,
        {"group_id": group,
         "topics": [{"topic_name": name,
                     "partitions": [{"partition_index": 0, "start_offset": 5}]}]},
        "wire",
        11,
    )  # fmt: skip
    assert built == by_hand
    answer = _exchange(broker, by_hand)
    correlation, tags, _throttle, error = struct.unpack_from(">ibih", answer, 0)
    assert (correlation, tags, error) == (11, 0, NONE)
    position = 11
    assert answer[position : position + 2] == b"\x00\x02"  # ErrorMessage null, one topic
    position += 2
    assert answer[position : position + 1 + len(name)] == _compact(name)
    position += 1 + len(name)
    assert uuid.UUID(bytes=answer[position : position + 16]) == topic_id(name)
    position += 16
    assert answer[position] == 2  # one partition
    assert struct.unpack_from(">ih", answer, position + 1) == (0, NONE)
    assert answer[position + 7 :] == b"\x00\x00\x00\x00"  # message null; tags x3
    with AdminClient(broker.address) as admin:
        offsets = admin.list_share_group_offsets(group)
    assert [(tp.partition, o.start_offset) for tp, o in offsets.items()] == [(0, 5)]


def test_describe_and_delete_offsets_bytes_match_the_published_schemas(
    broker: InProcessBroker,
) -> None:
    """DescribeShareGroupOffsetsRequest v1: Groups compact array of (GroupId compact
    string, Topics compact nullable array of (TopicName compact string, Partitions compact
    int32 array, tags), tags), tags. Its answer: ThrottleTimeMs int32, Groups compact
    array of (GroupId, Topics compact array of (TopicName, TopicId uuid, Partitions
    compact array of (PartitionIndex int32, StartOffset int64, LeaderEpoch int32, Lag
    int64, ErrorCode int16, ErrorMessage, tags), tags), ErrorCode int16, ErrorMessage,
    tags), tags. DeleteShareGroupOffsetsRequest v0: GroupId, Topics compact array of
    (TopicName, tags), tags; its answer: ThrottleTimeMs, ErrorCode, ErrorMessage,
    Responses compact array of (TopicName, TopicId, ErrorCode, ErrorMessage, tags),
    tags."""
    name = _topic(broker)
    group = _empty_group(broker, name)
    with AdminClient(broker.address) as admin:
        _produce(broker, name, 3)
        admin.alter_share_group_offsets(group, {TopicPartition(name, 0): 1})
    body = (
        b"\x02"  # one group
        + _compact(group)
        + b"\x02"  # one topic
        + _compact(name)
        + b"\x02"
        + struct.pack(">i", 0)  # partitions [0]
        + b"\x00\x00\x00"  # topic, group, body tags
    )
    by_hand = _framed(_header(DESCRIBE_OFFSETS, 1, 12), body)
    built = raw.kio_frame(
        DESCRIBE_OFFSETS,
        1,
        {"groups": [{"group_id": group, "topics": [{"topic_name": name, "partitions": [0]}]}]},
        "wire",
        12,
    )
    assert built == by_hand
    answer = _exchange(broker, by_hand)
    correlation, tags, _throttle = struct.unpack_from(">ibi", answer, 0)
    assert (correlation, tags) == (12, 0)
    position = 9
    assert answer[position] == 2  # one group
    position += 1
    assert answer[position : position + 1 + len(group)] == _compact(group)
    position += 1 + len(group)
    assert answer[position] == 2  # one topic
    position += 1
    assert answer[position : position + 1 + len(name)] == _compact(name)
    position += 1 + len(name)
    assert uuid.UUID(bytes=answer[position : position + 16]) == topic_id(name)
    position += 16
    assert answer[position] == 2  # one partition
    # Start offset 1; leader epoch 0 (a single node); lag: high watermark 3 - 1.
    assert struct.unpack_from(">iqiqh", answer, position + 1) == (0, 1, 0, 2, NONE)
    position += 1 + 26
    # partition message null + tags, topic tags, group ErrorCode, message, tags, body tags
    assert answer[position:] == b"\x00\x00\x00" + struct.pack(">h", NONE) + b"\x00\x00\x00"

    body = _compact(group) + b"\x02" + _compact(name) + b"\x00" + b"\x00"
    by_hand = _framed(_header(DELETE_OFFSETS, 0, 13), body)
    built = raw.kio_frame(
        DELETE_OFFSETS, 0, {"group_id": group, "topics": [{"topic_name": name}]}, "wire", 13
    )
    assert built == by_hand
    answer = _exchange(broker, by_hand)
    correlation, tags, _throttle, error = struct.unpack_from(">ibih", answer, 0)
    assert (correlation, tags, error) == (13, 0, NONE)
    position = 11
    assert answer[position : position + 2] == b"\x00\x02"  # ErrorMessage null, one topic
    position += 2
    assert answer[position : position + 1 + len(name)] == _compact(name)
    position += 1 + len(name)
    assert uuid.UUID(bytes=answer[position : position + 16]) == topic_id(name)
    position += 16
    assert answer[position:] == struct.pack(">h", NONE) + b"\x00\x00\x00"
    with AdminClient(broker.address) as admin:
        assert admin.list_share_group_offsets(group) == {}


def test_api_versions_advertise_kafka_4_1s_ranges(broker: InProcessBroker) -> None:
    from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

    port = broker.server.kafka_port
    assert port is not None
    with socket.create_connection(("127.0.0.1", port), 10) as sock:
        answer = raw.SaslSession(sock, "v").call(ApiVersionsRequest[3](), ApiVersionsResponse)
    ranges = {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}
    assert (ranges[DESCRIBE_OFFSETS], ranges[ALTER_OFFSETS], ranges[DELETE_OFFSETS]) == (
        (0, 1),
        (0, 0),
        (0, 0),
    )


# --- a share group's life through the Kafka wire ------------------------------------------


def _describe(wire: Wire, version: int, topics: list[dict[str, Any]] | None) -> dict[str, Any]:
    answer = wire.call_v(
        DESCRIBE_OFFSETS, version, {"groups": [{"group_id": wire.group, "topics": topics}]}
    )
    [group] = answer["groups"]
    return group


def test_offsets_follow_acknowledgements_then_alter_delete_and_delete_the_group(
    broker: InProcessBroker,
) -> None:
    name = _topic(broker)
    wire = Wire(broker, unique("share-admin-life"))
    try:
        assert wire.join(name)["error_code"] == NONE
        assert wire.fetch({(name, 0): []})["error_code"] == NONE  # starts at the log end
        _produce(broker, name, 4)
        got = acquired(wire.fetch({(name, 0): []}), name)
        assert got == {0: [0, 1, 2, 3]}
        # 0 and 1 done, 2 and 3 in flight: SPSO 2, lag 4 - 2.
        answer = wire.fetch({(name, 0): [ack(0, 0, ACCEPT), ack(1, 1, REJECT)]})
        assert answer["error_code"] == NONE
        group = _describe(wire, 1, [{"topic_name": name, "partitions": [0, 7]}])
        assert group["error_code"] == NONE
        [topic] = group["topics"]
        assert (topic["topic_name"], topic["topic_id"]) == (name, topic_id(name))
        here, missing = topic["partitions"]
        assert (here["start_offset"], here["lag"], here["error_code"]) == (2, 2, NONE)
        assert missing["error_code"] == UNKNOWN_TOPIC
        # v0 (no lag field) and topics null (every share partition of the group).
        [everything] = _describe(wire, 0, None)["topics"]
        assert [(p["partition_index"], p["start_offset"]) for p in everything["partitions"]] == [
            (0, 2)
        ]
        # Alter, delete and DeleteGroups are refused while a member is in the group.
        topics = [{"topic_name": name, "partitions": [{"partition_index": 0, "start_offset": 0}]}]
        refused = wire.call_v(ALTER_OFFSETS, 0, {"group_id": wire.group, "topics": topics})
        assert refused["error_code"] == NON_EMPTY_GROUP
        assert refused["responses"][0]["partitions"][0]["error_code"] == NON_EMPTY_GROUP
        deleted = wire.call_v(DELETE_GROUPS, 2, {"groups_names": [wire.group]})
        assert deleted["results"][0]["error_code"] == NON_EMPTY_GROUP

        assert wire.heartbeat(-1)["error_code"] == NONE  # leaves: 2 and 3 released
        altered = wire.call_v(ALTER_OFFSETS, 0, {"group_id": wire.group, "topics": topics})
        assert altered["error_code"] == NONE
        [after] = _describe(wire, 1, [{"topic_name": name, "partitions": [0]}])["topics"]
        assert (after["partitions"][0]["start_offset"], after["partitions"][0]["lag"]) == (0, 4)

        delete_body = {
            "group_id": wire.group,
            "topics": [{"topic_name": name}, {"topic_name": "nope"}],
        }
        removed = wire.call_v(DELETE_OFFSETS, 0, delete_body)
        assert removed["error_code"] == NONE
        assert [(t["topic_name"], t["error_code"]) for t in removed["responses"]] == [
            (name, NONE),
            ("nope", UNKNOWN_TOPIC),
        ]
        assert _describe(wire, 1, None)["topics"] == []

        deleted = wire.call_v(DELETE_GROUPS, 2, {"groups_names": [wire.group]})
        assert deleted["results"][0]["error_code"] == NONE
        gone = _describe(wire, 1, None)
        assert gone["error_code"] == GROUP_ID_NOT_FOUND
    finally:
        wire.close()
