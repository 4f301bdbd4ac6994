"""``queued.max.requests`` and ``queued.max.request.bytes`` on the Kafka listener: counted
with the gRPC listener's (one ``Admission``); where gRPC refuses a call past them, a Kafka
connection waits, as Kafka's network threads wait on a full request queue, and is served
once room is made. Raw requests on sockets, so what the broker answers is seen as sent."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from kafka.protocol.producer import ProduceResponse

from tests.kafka.conftest import unique
from tests.kafka.raw import frame, produce_request, read_frame
from tidelog.broker.testing import InProcessBroker
from tidelog.storage.errors import QueuedMaxRequestBytesError, QueuedMaxRequestsError

pytestmark = pytest.mark.timeout(60)

# How long a held request must stay unanswered: long enough that an answer would have
# come (a produce here takes milliseconds), short enough for the suite.
_HELD_S = 0.3


@pytest.fixture
def broker() -> Iterator[InProcessBroker]:
    settings = {
        "kafka.listen": "127.0.0.1:0",
        "queued.max.requests": 1,
        "queued.max.request.bytes": 1_000,
    }
    with InProcessBroker(settings=settings) as running:
        yield running


def _held_then_answered(broker: InProcessBroker, release: object) -> None:
    topic = unique("queued")
    # flush.messages: an append that fsyncs is never appended on the loop (issue #31's
    # inline produce, which takes no queued.max.requests slot): it waits for the pool.
    broker.server.core.create_topic(topic, 1, {"flush.messages": "1"})
    port = broker.server.kafka_port
    assert port is not None
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(frame(produce_request(topic, b"v", acks=1), "admission"))
        sock.settimeout(_HELD_S)
        with pytest.raises(TimeoutError):
            sock.recv(1, socket.MSG_PEEK)  # held: no answer while the room is taken
        sock.settimeout(10)
        assert callable(release)
        release()
        answer = read_frame(sock)
    assert answer is not None
    response = ProduceResponse[7].decode(answer, header=True)
    assert response.responses[0].partition_responses[0].error_code == 0


def test_a_kafka_request_waits_for_queued_max_requests(broker: InProcessBroker) -> None:
    admission = broker.server.admission
    admission.admit_request()  # the one slot, taken as another listener's call would
    _held_then_answered(broker, admission.release_request)
    # One wait is one refusal in the metrics, and everything was released.
    assert admission.refusals() == {QueuedMaxRequestsError.code: 1}
    assert admission.queued_requests == 0
    assert admission.queued_bytes == 0


def test_a_kafka_produce_waits_for_queued_max_request_bytes(broker: InProcessBroker) -> None:
    admission = broker.server.admission
    admission.admit_bytes(1_000)  # the whole budget, held by another produce
    _held_then_answered(broker, lambda: admission.release_bytes(1_000))
    assert admission.refusals() == {QueuedMaxRequestBytesError.code: 1}
    assert admission.queued_bytes == 0
    assert admission.queued_requests == 0
