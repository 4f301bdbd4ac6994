"""Produce requests pipelined on one Kafka connection (issue #31, ``broker.kafka.in_order``
``InOrder``): the listener reads the next request once a Produce is appended, while that
one waits for its fsync, and still answers every request once, in request order, with
the offsets of the order the requests came in; any other request is answered after the
Produce answers before it. With a quota configured requests go one at a time, as before.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer import ProduceResponse

from tests.kafka.conftest import KafkaBroker, stored_values, unique
from tests.kafka.raw import frame, produce_request, read_frame

pytestmark = pytest.mark.timeout(120)

TIMEOUT_S = 30.0


def _send_all(bootstrap: str, frames: list[bytes], answers: int) -> list[bytes]:
    """Every frame sent at once on one connection, then ``answers`` response frames."""
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        sock.sendall(b"".join(frames))
        out = []
        for _ in range(answers):
            answer = read_frame(sock)
            assert answer is not None, f"hung up after {len(out)} answers"
            out.append(answer)
    return out


def _correlation(answer: bytes) -> int:
    return int.from_bytes(answer[:4], "big", signed=True)


@pytest.mark.parametrize("acks", [-1, 1])
def test_pipelined_produces_are_answered_once_in_order(
    kafka_broker: KafkaBroker, acks: int
) -> None:
    topic = unique("pipelined")
    kafka_broker.broker.server.core.create_topic(topic, 1, {})
    count = 40  # past the 8 taken ahead: the reader waits for answers to be written
    frames = [
        frame(produce_request(topic, b"v%d" % i, acks=acks), "pipe", i + 1) for i in range(count)
    ]
    # A Metadata request after them: answered after every Produce answer before it.
    frames.append(frame(MetadataRequest[1](topics=[topic]), "pipe", count + 1))
    answers = _send_all(kafka_broker.bootstrap, frames, count + 1)
    assert [_correlation(a) for a in answers] == list(range(1, count + 2))
    offsets = []
    for answer in answers[:count]:
        response = ProduceResponse[7].decode(answer[4:])
        [[part]] = [t.partition_responses for t in response.responses]
        assert part.error_code == 0, part
        offsets.append(part.base_offset)
    assert offsets == list(range(count))  # appended in the order the requests came
    metadata = MetadataResponse[1].decode(answers[count][4:])
    assert [t.name for t in metadata.topics] == [topic]
    assert stored_values(kafka_broker.address, topic, 0, count) == [
        b"v%d" % i for i in range(count)
    ]
    if acks == -1:
        # Every acks=all answer came after its fsync.
        log = kafka_broker.broker.server.core.logs.get_log(topic, 0)
        assert log.recovery_point >= count


def test_acks_zero_between_pipelined_produces_gets_no_answer(kafka_broker: KafkaBroker) -> None:
    topic = unique("pipelined-acks0")
    kafka_broker.broker.server.core.create_topic(topic, 1, {})
    frames = [
        frame(produce_request(topic, b"a", acks=-1), "pipe", 1),
        frame(produce_request(topic, b"b", acks=0), "pipe", 2),
        frame(produce_request(topic, b"c", acks=-1), "pipe", 3),
    ]
    answers = _send_all(kafka_broker.bootstrap, frames, 2)
    assert [_correlation(a) for a in answers] == [1, 3]
    assert stored_values(kafka_broker.address, topic, 0, 3) == [b"a", b"b", b"c"]


def test_a_refused_produce_in_the_pipeline_is_answered_in_its_place(
    kafka_broker: KafkaBroker,
) -> None:
    topic = unique("pipelined-refused")
    kafka_broker.broker.server.core.create_topic(topic, 1, {})
    frames = [
        frame(produce_request(topic, b"a", acks=-1), "pipe", 1),
        frame(produce_request(unique("missing"), b"x", acks=-1), "pipe", 2),
        frame(produce_request(topic, b"c", acks=-1), "pipe", 3),
    ]
    answers = _send_all(kafka_broker.bootstrap, frames, 3)
    assert [_correlation(a) for a in answers] == [1, 2, 3]
    codes = [
        ProduceResponse[7].decode(a[4:]).responses[0].partition_responses[0].error_code
        for a in answers
    ]
    assert codes[0] == codes[2] == 0
    assert codes[1] != 0  # UNKNOWN_TOPIC_OR_PARTITION (or a refusal): in its place
    assert stored_values(kafka_broker.address, topic, 0, 2) == [b"a", b"c"]


def _two_with_fsync_held(kafka_broker: KafkaBroker, topic: str, wait_s: float) -> int:
    """The group fsync held back (its requests kept until released), two ``acks=all``
    Produce requests sent at once: the log end reached within ``wait_s`` (no answer may
    come before the fsync); then released, both must answer in order."""
    core = kafka_broker.broker.server.core
    core.create_topic(topic, 1, {})
    log = core.logs.get_log(topic, 0)
    fsync = core._group_fsync
    held: list[tuple[Any, int]] = []
    fsync.request = lambda plog, end: held.append((plog, end))  # type: ignore[method-assign]
    host, port = kafka_broker.bootstrap.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
            sock.sendall(
                frame(produce_request(topic, b"a", acks=-1), "pipe", 1)
                + frame(produce_request(topic, b"b", acks=-1), "pipe", 2)
            )
            deadline = time.monotonic() + wait_s
            while log.log_end_offset < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            reached = log.log_end_offset
            sock.settimeout(0.3)
            with pytest.raises(TimeoutError):
                sock.recv(1)  # nothing answered before its fsync
            sock.settimeout(TIMEOUT_S)
            del fsync.request  # the real one again
            for plog, end in held:
                fsync.request(plog, end)
            answers = [read_frame(sock), read_frame(sock)]
    finally:
        fsync.__dict__.pop("request", None)
    assert [_correlation(a) for a in answers if a is not None] == [1, 2]
    assert log.recovery_point >= 2
    return reached


def test_the_next_produce_is_appended_while_the_previous_waits_for_its_fsync(
    kafka_broker: KafkaBroker,
) -> None:
    """The second ``acks=all`` Produce is appended while the first still waits for its
    fsync (one request at a time, it was not even read until then)."""
    assert _two_with_fsync_held(kafka_broker, unique("pipelined-overlap"), TIMEOUT_S) == 2


def test_with_a_quota_set_requests_go_one_at_a_time(kafka_broker: KafkaBroker) -> None:
    """A throttle belongs to the connection (the mute after an answer): with any quota
    configured the listener reads the next request only after answering the last."""
    quotas = kafka_broker.broker.server.core.quotas
    quotas.alter("someone-else", {"producer_byte_rate": 10**9}, [])
    try:
        assert quotas.configured
        assert _two_with_fsync_held(kafka_broker, unique("pipelined-quota"), 1.0) == 1
    finally:
        quotas.alter("someone-else", {}, ["producer_byte_rate"])
    assert not quotas.configured
