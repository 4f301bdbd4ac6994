"""Malformed frames on raw sockets: each gets Kafka's error or a closed connection, and the
broker keeps serving (a well-formed ApiVersions on a new connection is answered after
each). Also: responses leave in request order when requests are pipelined, and a Produce
with acks=0 gets no response."""

from __future__ import annotations

import socket
import struct

import pytest
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest
from kafka.protocol.producer import ProduceRequest

from tests.kafka.clients import Out, produce
from tests.kafka.conftest import KafkaBroker, unique
from tidelog.broker.kafka.kip848 import topic_id

pytestmark = pytest.mark.timeout(60)

TIMEOUT_S = 10.0


def _connect(broker: KafkaBroker) -> socket.socket:
    host, port = broker.bootstrap.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=TIMEOUT_S)
    sock.settimeout(TIMEOUT_S)
    return sock


def _read_frame(sock: socket.socket) -> bytes | None:
    """One response frame's body, or None if the broker closed the connection."""
    prefix = _read_exactly(sock, 4)
    if prefix is None:
        return None
    (size,) = struct.unpack(">i", prefix)
    return _read_exactly(sock, size)


def _read_exactly(sock: socket.socket, count: int) -> bytes | None:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _header(api_key: int, version: int, correlation_id: int, flexible: bool) -> bytes:
    client = b"raw"
    header = struct.pack(">hhih", api_key, version, correlation_id, len(client)) + client
    return header + (b"\0" if flexible else b"")


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def _still_serving(broker: KafkaBroker) -> None:
    with _connect(broker) as sock:
        sock.sendall(_frame(_header(18, 0, 77, flexible=False)))
        body = _read_frame(sock)
    assert body is not None
    assert struct.unpack_from(">i", body)[0] == 77
    assert struct.unpack_from(">h", body, 4)[0] == 0  # NONE


def _closed(sock: socket.socket) -> bool:
    try:
        return _read_frame(sock) is None
    except ConnectionResetError:
        return True


def test_truncated_frame_then_hang_up(kafka_broker: KafkaBroker) -> None:
    with _connect(kafka_broker) as sock:
        sock.sendall(struct.pack(">i", 100) + b"\0\x12\0\0")  # 4 of the 100 bytes promised
        sock.shutdown(socket.SHUT_WR)
        assert _closed(sock)
    _still_serving(kafka_broker)


def test_frame_too_short_for_a_header_is_closed(kafka_broker: KafkaBroker) -> None:
    with _connect(kafka_broker) as sock:
        sock.sendall(_frame(b"\0\x12\0"))
        assert _closed(sock)
    _still_serving(kafka_broker)


@pytest.mark.parametrize("size", [-1, 2**31 - 1, 100 * 1024 * 1024 + 1])
def test_oversized_or_negative_length_is_closed(kafka_broker: KafkaBroker, size: int) -> None:
    with _connect(kafka_broker) as sock:
        sock.sendall(struct.pack(">i", size) + b"\0" * 64)
        assert _closed(sock)
    _still_serving(kafka_broker)


def test_unknown_api_key_is_closed(kafka_broker: KafkaBroker) -> None:
    with _connect(kafka_broker) as sock:
        sock.sendall(_frame(_header(9999, 0, 1, flexible=False) + b"\0" * 8))
        assert _closed(sock)
    _still_serving(kafka_broker)


def test_transactions_are_not_advertised_and_are_closed(kafka_broker: KafkaBroker) -> None:
    with _connect(kafka_broker) as sock:
        sock.sendall(_frame(_header(24, 0, 1, flexible=False) + b"\0" * 8))  # AddPartitionsToTxn
        assert _closed(sock)
    _still_serving(kafka_broker)


def test_unsupported_metadata_version_is_closed(kafka_broker: KafkaBroker) -> None:
    with _connect(kafka_broker) as sock:
        sock.sendall(_frame(_header(3, 99, 1, flexible=True) + b"\0" * 8))
        assert _closed(sock)
    _still_serving(kafka_broker)


def test_unsupported_api_versions_version_gets_the_v0_error_form(
    kafka_broker: KafkaBroker,
) -> None:
    # KIP-511: an ApiVersions version the broker does not know is answered in the v0 form
    # with UNSUPPORTED_VERSION (35) and the broker's range for key 18.
    with _connect(kafka_broker) as sock:
        sock.sendall(_frame(_header(18, 42, 5, flexible=True) + b"\x07garbage"))
        body = _read_frame(sock)
    assert body is not None
    response = ApiVersionsResponse[0].decode(body, header=True)
    assert response.header.correlation_id == 5
    assert response.error_code == 35
    ranges = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
    assert ranges[18] == (0, 4)
    _still_serving(kafka_broker)


def test_garbage_body_is_closed(kafka_broker: KafkaBroker) -> None:
    with _connect(kafka_broker) as sock:
        # A Metadata v1 body claiming 1,000 topic names and holding none.
        sock.sendall(_frame(_header(3, 1, 1, flexible=False) + struct.pack(">i", 1000)))
        assert _closed(sock)
    _still_serving(kafka_broker)


def test_pipelined_responses_keep_request_order(kafka_broker: KafkaBroker) -> None:
    requests = []
    for correlation_id in range(1, 21):
        request = (ApiVersionsRequest[3] if correlation_id % 2 else MetadataRequest[1])(
            **({} if correlation_id % 2 else {"topics": None})
        )
        request.with_header(correlation_id=correlation_id, client_id="pipeline")
        requests.append(request.encode(header=True, framed=True))
    with _connect(kafka_broker) as sock:
        sock.sendall(b"".join(requests))  # all at once, before reading anything
        seen = []
        for _ in range(20):
            body = _read_frame(sock)
            assert body is not None
            seen.append(struct.unpack_from(">i", body)[0])
    assert seen == list(range(1, 21))


def test_produce_acks_0_gets_no_response(kafka_broker: KafkaBroker) -> None:
    from tidelog.storage.records import BatchBuilder

    topic = unique("acks0")
    kafka_broker.broker.server.core.create_topic(topic, 1, {})
    builder = BatchBuilder()
    builder.append(1_700_000_000_000, None, b"v")
    batch = builder.build()
    produce = ProduceRequest[7](
        acks=0,
        timeout_ms=1000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=topic,
                partition_data=[
                    ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=batch)
                ],
            )
        ],
    )
    produce.with_header(correlation_id=1, client_id="acks0")
    after = ApiVersionsRequest[0]()
    after.with_header(correlation_id=2, client_id="acks0")
    with _connect(kafka_broker) as sock:
        sock.sendall(
            produce.encode(header=True, framed=True) + after.encode(header=True, framed=True)
        )
        body = _read_frame(sock)
    assert body is not None
    # The first answer on the connection is the ApiVersions one: nothing for the produce.
    assert struct.unpack_from(">i", body)[0] == 2
    view = kafka_broker.broker.server.core.describe_topic(topic)
    assert view.partitions[0].log_end_offset == 1


def test_unknown_tags_in_a_request_body_are_skipped(kafka_broker: KafkaBroker) -> None:
    # Metadata v12 for all topics (topics null), then a tag section with two unknown tags.
    body = b"\x00" + b"\x01" + b"\x00" + b"\x02" + b"\x63\x03abc" + b"\x64\x00"
    with _connect(kafka_broker) as sock:
        sock.sendall(_frame(_header(3, 12, 8, flexible=True) + body))
        answer = _read_frame(sock)
    assert answer is not None
    assert struct.unpack_from(">i", answer)[0] == 8
    _still_serving(kafka_broker)


def _fetch_v16_body(topic: str, replica_state_tags: bytes) -> bytes:
    """A Fetch v16 of partition 0 of ``topic`` (by its id) from offset 0, with a
    ``replica_state`` tagged struct whose own tag section is ``replica_state_tags``."""
    partition = struct.pack(">iiqiqi", 0, -1, 0, -1, -1, 1 << 20) + b"\0"
    topics = b"\x02" + topic_id(topic).bytes + b"\x02" + partition + b"\0"
    replica_state = struct.pack(">iq", -1, -1) + replica_state_tags
    tags = b"\x01" + b"\x01" + bytes([len(replica_state)]) + replica_state
    fixed = struct.pack(">iiibii", 0, 1, 1 << 20, 0, 0, -1)
    return fixed + topics + b"\x01" + b"\x01" + tags


def test_unknown_tags_inside_a_known_tagged_struct_are_skipped(kafka_broker: KafkaBroker) -> None:
    """KIP-482 at every level: Fetch v16's ``replica_state`` (tag 1) carrying two tags
    nobody defined (kio alone raises on them) is read, and the fetch answered."""
    topic = unique("nested-tags")
    core = kafka_broker.broker.server.core
    core.create_topic(topic, 1, {})
    produce(
        "tidelog",
        kafka_broker.bootstrap,
        kafka_broker.address,
        topic,
        [Out(None, b"v", partition=0)],
    )
    unknown = b"\x02" + b"\x63\x03abc" + b"\x64\x00"  # tags 99 and 100
    with _connect(kafka_broker) as sock:
        for correlation_id, nested in ((5, b"\0"), (6, unknown)):
            body = _fetch_v16_body(topic, nested)
            sock.sendall(_frame(_header(1, 16, correlation_id, flexible=True) + body))
            answer = _read_frame(sock)
            assert answer is not None, "the broker closed the connection"
            decoded = FetchResponse[16].decode(answer, header=True)
            assert decoded.header.correlation_id == correlation_id
            ((found,),) = [t.partitions for t in decoded.responses]
            assert found.error_code == 0
            assert found.high_watermark == 1
    _still_serving(kafka_broker)
