"""Share groups (KIP-932, issue #32) on the Kafka listener: ShareGroupHeartbeat (76),
ShareGroupDescribe (77), ShareFetch (78), ShareAcknowledge (79), all v1.

No Python Kafka client speaks these APIs, so requests are built from plain values by the
listener's own codec (``raw.kio_frame``); one request and its answer are also checked
byte by byte against the published schema (ShareGroupHeartbeatRequest.json /
ShareGroupHeartbeatResponse.json, v1, flexible), written out here by hand, so the codec
is not only checked against itself. The end-to-end test shares one group between a
Kafka-wire share consumer built here and Tidelog's ``ShareConsumer`` over gRPC.
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
from tidelog.broker.core.topic_ids import topic_id
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient, Producer, ShareConsumer
from tidelog.storage.records import decode_records

pytestmark = pytest.mark.timeout(120)

HEARTBEAT, DESCRIBE, FETCH, ACKNOWLEDGE = 76, 77, 78, 79
ACCEPT, RELEASE, REJECT = 1, 2, 3
NONE, INVALID_REQUEST, SESSION_NOT_FOUND, BAD_SESSION_EPOCH = 0, 42, 122, 123
INVALID_RECORD_STATE, UNKNOWN_TOPIC_ID = 121, 100
LOCK_MS = 600_000  # no lock expires during a test: every redelivery here is a RELEASE


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


class Wire:
    """A hand-built Kafka share consumer: one raw connection, its member id, its share
    session's next epoch."""

    def __init__(self, broker: InProcessBroker, group: str) -> None:
        port = broker.server.kafka_port
        assert port is not None
        sock = socket.create_connection(("127.0.0.1", port), 10)
        self.session = raw.SaslSession(sock, "wire-share")
        self.group = group
        self.member_id = str(uuid.uuid4())  # KIP-1082: the client names itself
        self.epoch = 0

    def call(self, api_key: int, body: dict[str, Any]) -> dict[str, Any]:
        return self.session.call_plain(api_key, 1, body)

    def call_v(self, api_key: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
        return self.session.call_plain(api_key, version, body)

    def join(self, *topics: str) -> dict[str, Any]:
        return self.heartbeat(0, list(topics))

    def heartbeat(self, epoch: int, topics: list[str] | None = None) -> dict[str, Any]:
        body = {"group_id": self.group, "member_id": self.member_id, "member_epoch": epoch}
        if topics is not None:
            body["subscribed_topic_names"] = topics
        return self.call(HEARTBEAT, body)

    def fetch(
        self,
        partitions: dict[tuple[str, int], list[dict[str, Any]]],
        *,
        epoch: int | None = None,
        max_records: int = 500,
        max_wait_ms: int = 0,
    ) -> dict[str, Any]:
        """ShareFetch at the session's epoch (or ``epoch``); ``partitions``: per
        partition, its acknowledgement batches."""
        answer = self.call(
            FETCH,
            {
                "group_id": self.group,
                "member_id": self.member_id,
                "share_session_epoch": self.epoch if epoch is None else epoch,
                "max_wait": max_wait_ms,
                "min_bytes": 1,
                "max_records": max_records,
                "batch_size": max_records,
                "topics": _topics(partitions, "partition_index"),
                "forgotten_topics_data": [],
            },
        )
        if answer["error_code"] == NONE and epoch is None:
            self.epoch = self.epoch + 1 if self.epoch >= 0 else 0
        return answer

    def acknowledge(
        self, partitions: dict[tuple[str, int], list[dict[str, Any]]], *, epoch: int | None = None
    ) -> dict[str, Any]:
        answer = self.call(
            ACKNOWLEDGE,
            {
                "group_id": self.group,
                "member_id": self.member_id,
                "share_session_epoch": self.epoch if epoch is None else epoch,
                "topics": _topics(partitions, "partition_index"),
            },
        )
        if answer["error_code"] == NONE and epoch is None:
            self.epoch += 1
        return answer

    def close(self) -> None:
        self.session.close()


def _topics(partitions: dict[tuple[str, int], list[dict[str, Any]]], key: str) -> list[Any]:
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (name, partition), batches in partitions.items():
        by_topic.setdefault(name, []).append({key: partition, "acknowledgement_batches": batches})
    return [{"topic_id": topic_id(name), "partitions": ps} for name, ps in by_topic.items()]


def ack(first: int, last: int, kind: int) -> dict[str, Any]:
    return {"first_offset": first, "last_offset": last, "acknowledge_types": [kind]}


def acquired(answer: dict[str, Any], name: str) -> dict[int, list[int]]:
    """Per partition of ``name``, the offsets acquired, checked against the records sent:
    every acquired offset is a record of the answer's batches."""
    out: dict[int, list[int]] = {}
    for t in answer["responses"]:
        if t["topic_id"] != topic_id(name):
            continue
        for p in t["partitions"]:
            assert p["error_code"] == NONE, p
            offsets = [
                o
                for r in p["acquired_records"]
                for o in range(r["first_offset"], r["last_offset"] + 1)
            ]
            present = {r.offset for r in decode_records(p["records"])}
            assert set(offsets) <= present
            out[p["partition_index"]] = offsets
    return out


def _produce(broker: InProcessBroker, name: str, count: int, partitions: int = 1) -> None:
    with Producer(broker.address) as producer:
        for i in range(count):
            producer.send(name, value=b"%d" % i, partition=i % partitions)
        producer.flush()


def _topic(broker: InProcessBroker, partitions: int = 1) -> str:
    name = unique("share-wire")
    with AdminClient(broker.address) as admin:
        admin.create_topic(name, partitions)
    return name


# --- byte-level fixture -------------------------------------------------------------------


def _compact(text: str) -> bytes:
    data = text.encode()
    return bytes([len(data) + 1]) + data  # short strings: a one-byte unsigned varint


def test_heartbeat_bytes_match_the_published_schema(broker: InProcessBroker) -> None:
    """ShareGroupHeartbeatRequest v1: GroupId compact string, MemberId compact string,
    MemberEpoch int32, RackId compact nullable string, SubscribedTopicNames compact
    nullable array of compact strings, tagged fields; header v2. The answer, header v1
    then ThrottleTimeMs int32, ErrorCode int16, ErrorMessage, MemberId (compact nullable
    strings), MemberEpoch int32, HeartbeatIntervalMs int32, Assignment (nullable struct:
    int8 -1 null or 1, then TopicPartitions compact array of (TopicId uuid, Partitions
    compact int32 array, tags), tags), tags."""
    name = _topic(broker, 2)
    group, member = unique("share-bytes"), str(uuid.uuid4())
    body = (
        _compact(group)
        + _compact(member)
        + struct.pack(">i", 0)
        + b"\x00"  # RackId null
        + b"\x02"
        + _compact(name)  # one topic
        + b"\x00"  # no tags
    )
    header = struct.pack(">hhih", HEARTBEAT, 1, 7, 4) + b"wire" + b"\x00"
    by_hand = struct.pack(">i", len(header) + len(body)) + header + body
    built = raw.kio_frame(
        HEARTBEAT,
        1,
        {"group_id": group, "member_id": member, "member_epoch": 0,
         "subscribed_topic_names": [name]},
        "wire",
        7,
    )  # fmt: skip
    assert built == by_hand
    port = broker.server.kafka_port
    assert port is not None
    with socket.create_connection(("127.0.0.1", port), 10) as sock:
        sock.sendall(by_hand)
        answer = raw.read_frame(sock)
    assert answer is not None
    correlation, tags, _throttle, error = struct.unpack_from(">ibih", answer, 0)
    assert (correlation, tags, error) == (7, 0, NONE)
    position = 11
    assert answer[position] == 0  # ErrorMessage null
    position += 1
    assert answer[position : position + 1 + len(member)] == _compact(member)
    position += 1 + len(member)
    epoch, interval = struct.unpack_from(">ii", answer, position)
    assert epoch >= 1
    assert interval == 100
    position += 8
    assert answer[position] == 1  # an assignment
    assert answer[position + 1] == 2  # one topic
    assert uuid.UUID(bytes=answer[position + 2 : position + 18]) == topic_id(name)
    partitions = answer[position + 18]
    assert partitions == 3  # two partitions: every member of a share group gets all
    assert struct.unpack_from(">ii", answer, position + 19) == (0, 1)
    assert answer[position + 27 :] == b"\x00\x00\x00"  # topic, assignment, body tags


def test_api_versions_advertise_v1_of_each_share_api(broker: InProcessBroker) -> None:
    from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

    port = broker.server.kafka_port
    assert port is not None
    with socket.create_connection(("127.0.0.1", port), 10) as sock:
        answer = raw.SaslSession(sock, "v").call(ApiVersionsRequest[3](), ApiVersionsResponse)
    ranges = {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}
    assert all(ranges[key] == (1, 1) for key in (HEARTBEAT, DESCRIBE, FETCH, ACKNOWLEDGE))


# --- membership ----------------------------------------------------------------------------


def test_heartbeat_and_describe(broker: InProcessBroker) -> None:
    name = _topic(broker, 2)
    wire = Wire(broker, unique("share-describe"))
    try:
        joined = wire.join(name)
        assert joined["error_code"] == NONE
        assert joined["member_epoch"] >= 1
        [assigned] = joined["assignment"]["topic_partitions"]
        assert (assigned["topic_id"], assigned["partitions"]) == (topic_id(name), [0, 1])
        again = wire.heartbeat(joined["member_epoch"])  # unchanged: no assignment sent
        assert again["error_code"] == NONE
        assert again["assignment"] is None
        described = wire.call(
            DESCRIBE, {"group_ids": [wire.group, "no-such"], "include_authorized_operations": True}
        )
        mine, missing = described["groups"]
        assert mine["error_code"] == NONE
        assert mine["group_state"] == "Stable"
        [member] = mine["members"]
        assert member["member_id"] == wire.member_id
        assert member["subscribed_topic_names"] == [name]
        [tp] = member["assignment"]["topic_partitions"]
        assert (tp["topic_name"], tp["partitions"]) == (name, [0, 1])
        assert missing["error_code"] != NONE
        left = wire.heartbeat(-1)
        assert left["error_code"] == NONE
        assert left["member_epoch"] == -1
        after = wire.call(DESCRIBE, {"group_ids": [wire.group]})
        assert after["groups"][0]["members"] == []
    finally:
        wire.close()


# --- records and share sessions ---------------------------------------------------------


def test_fetch_acknowledge_and_the_share_session(broker: InProcessBroker) -> None:
    name = _topic(broker)
    wire = Wire(broker, unique("share-session"))
    other = Wire(broker, wire.group)
    tp = (name, 0)
    try:
        assert wire.join(name)["error_code"] == NONE
        opened = wire.fetch({tp: []})  # epoch 0: the share partition starts at the end
        assert opened["error_code"] == NONE
        assert acquired(opened, name) == {0: []}
        assert opened["acquisition_lock_timeout"] == LOCK_MS
        _produce(broker, name, 6)
        first = wire.fetch({}, max_records=4, max_wait_ms=5_000)  # the session's partitions
        assert acquired(first, name) == {0: [0, 1, 2, 3]}
        # Per-offset types: accept 0, release 1; then accept 2-3 as one batch.
        per_offset = {"first_offset": 0, "last_offset": 1, "acknowledge_types": [ACCEPT, RELEASE]}
        second = wire.fetch({tp: [per_offset, ack(2, 3, ACCEPT)]}, max_records=2)
        assert second["responses"][0]["partitions"][0]["acknowledge_error_code"] == NONE
        assert acquired(second, name) == {0: [1, 4]}  # the released record first
        # Another member's acknowledgement of records it never acquired fails whole.
        assert acquired(other.fetch({tp: []}), name) == {0: [5]}
        refused = other.acknowledge({tp: [ack(1, 1, ACCEPT)]})
        [p] = refused["responses"][0]["partitions"]
        assert p["error_code"] == INVALID_RECORD_STATE
        # Session rules: a stale epoch, an unknown session, acknowledgements at epoch 0.
        stale = wire.fetch({}, epoch=wire.epoch - 1)
        assert stale["error_code"] == BAD_SESSION_EPOCH
        assert stale["responses"] == []
        assert wire.acknowledge({tp: [ack(1, 1, ACCEPT)]}, epoch=0)["error_code"] == (
            BAD_SESSION_EPOCH
        )
        stranger = Wire(broker, wire.group)
        assert stranger.fetch({}, epoch=1)["error_code"] == SESSION_NOT_FOUND
        stranger.close()
        with_acks = other.fetch({tp: [ack(5, 5, ACCEPT)]}, epoch=0)
        assert with_acks["error_code"] == INVALID_REQUEST
        unknown = wire.fetch({("no-such-topic", 0): []})
        [t] = [t for t in unknown["responses"] if t["topic_id"] == topic_id("no-such-topic")]
        assert t["partitions"][0]["error_code"] == UNKNOWN_TOPIC_ID
        # Reject 1, then close the session (-1): 4 is released at once, so the other
        # member gets 4 now, and never 1.
        rejected = wire.acknowledge({tp: [ack(1, 1, REJECT)]})
        assert rejected["responses"][0]["partitions"][0]["error_code"] == NONE
        closed = wire.acknowledge({}, epoch=-1)
        assert closed["error_code"] == NONE
        assert wire.fetch({}, epoch=1)["error_code"] == SESSION_NOT_FOUND
        assert acquired(other.fetch({}), name) == {0: [4]}
    finally:
        wire.close()
        other.close()


def test_a_wire_consumer_and_a_share_consumer_share_one_group(broker: InProcessBroker) -> None:
    """A Kafka-wire member and Tidelog's ShareConsumer (gRPC) in one share group on a
    one-partition topic (both members are assigned it): the wire member takes 10 records,
    accepts half and releases half; the ShareConsumer receives the released ones and
    everything else, never an accepted one, and every record ends accepted once."""
    name = _topic(broker)
    group = unique("share-both")
    wire = Wire(broker, group)
    consumer = ShareConsumer(broker.address, group, request_timeout_ms=10_000)
    tp = (name, 0)
    try:
        consumer.subscribe([name])
        assert wire.join(name)["error_code"] == NONE
        assert acquired(wire.fetch({tp: []}), name) == {0: []}  # starts at the log end
        _produce(broker, name, 40)
        taken = acquired(wire.fetch({}, max_records=10, max_wait_ms=5_000), name)
        assert taken == {0: list(range(10))}
        batch = {
            "first_offset": 0,
            "last_offset": 9,
            "acknowledge_types": [ACCEPT] * 5 + [RELEASE] * 5,
        }
        answer = wire.acknowledge({tp: [batch]})
        assert answer["responses"][0]["partitions"][0]["error_code"] == NONE
        got: list[int] = []
        for _ in range(100):
            got.extend(r.offset for r in consumer.poll(timeout_ms=200))
            if len(got) >= 35:
                break
        consumer.commit_sync()
        assert sorted(got) == list(range(5, 40))  # each once, the released ones included
        # Nothing is left for the wire member: all 40 are acknowledged.
        assert acquired(wire.fetch({}, max_wait_ms=0), name) == {0: []}
        [state] = broker.server.core.shares.describe(group).partitions  # type: ignore[union-attr]
        assert (state.start_offset, state.acquired, state.available) == (40, 0, 0)
    finally:
        consumer.close()
        wire.close()


def test_list_groups_v5_gives_types_and_lists_share_groups(broker: InProcessBroker) -> None:
    name = _topic(broker)
    wire = Wire(broker, unique("share-listed"))
    try:
        assert wire.join(name)["error_code"] == NONE
        share_only = wire.call_v(16, 5, {"states_filter": [], "types_filter": ["share"]})
        listed = {g["group_id"]: g for g in share_only["groups"]}
        assert wire.group in listed
        assert (listed[wire.group]["group_type"], listed[wire.group]["protocol_type"]) == (
            "share",
            "share",
        )
        assert all(g["group_type"] == "share" for g in share_only["groups"])
        everything = wire.call_v(16, 5, {"states_filter": [], "types_filter": []})
        assert wire.group in {g["group_id"] for g in everything["groups"]}
        consumers = wire.call_v(16, 5, {"states_filter": [], "types_filter": ["consumer"]})
        assert wire.group not in {g["group_id"] for g in consumers["groups"]}
        older = wire.call_v(16, 4, {"states_filter": []})  # no types before v5
        assert wire.group not in {g["group_id"] for g in older["groups"]}
    finally:
        wire.close()
