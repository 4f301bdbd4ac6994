"""Request bodies that are not valid messages, and requests that quote huge values.

Regressions (issue 15, found by ``tests/broker/hostile/test_fuzz.py``):

- gRPC parsed request bodies itself and answered a malformed one (invalid UTF-8 in a
  ``string``, truncated wire data) ``INTERNAL`` "Exception deserializing request!"
  without a code, logging a traceback each time; ``broker.grpc.parse`` now answers
  ``INVALID_REQUEST``, unary and streaming alike.
- An error message quoting a 70 KB topic name exceeded the client's 16 KiB trailer limit,
  so the client saw "received metadata size exceeds hard limit" instead of the error;
  messages are now cut (``broker.core.errors.MAX_MESSAGE_CHARS``).
"""

from __future__ import annotations

import grpc
import pytest

from tests.broker.conftest import TIMEOUT_S, create_topic, error_code, make_batch, produce
from tidelog.broker.core.errors import MAX_MESSAGE_CHARS
from tidelog.broker.grpc.parse import count_entries
from tidelog.broker.testing import InProcessBroker
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc

SERVICE = "/tidelog.v1.Broker/"
INVALID_UTF8_NAME = b"\x0a\x03\xff\xfe\xfd"  # field 1 (name / topic...) = 3 invalid bytes
TRUNCATED = b"\x0a\xff\xff\xff\xff\x0f"  # field 1 claims 4 GiB


@pytest.mark.parametrize(
    ("method", "body"),
    [
        ("CreateTopic", INVALID_UTF8_NAME),
        ("DescribeTopic", INVALID_UTF8_NAME),
        ("CreateTopic", TRUNCATED),
        ("ListGroups", TRUNCATED),
        ("Fetch", TRUNCATED),
    ],
)
def test_a_malformed_unary_body_is_an_invalid_request(
    broker: InProcessBroker, method: str, body: bytes
) -> None:
    with broker.channel() as channel:
        call = channel.unary_unary(SERVICE + method)
        with pytest.raises(grpc.RpcError) as failure:
            call(body, timeout=TIMEOUT_S)
        assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_code(failure.value) == "INVALID_REQUEST"
        assert "not a valid" in (failure.value.details() or "")


@pytest.mark.parametrize("method", ["ProduceStream", "FetchStream"])
def test_a_malformed_message_ends_a_stream_with_an_invalid_request(method: str) -> None:
    with InProcessBroker() as broker, broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        create_topic(stub, "t")
        good = (
            pb.ProduceRequest(
                acks=1,
                topics=[
                    pb.ProduceTopicData(
                        topic="t",
                        partitions=[
                            pb.ProducePartitionData(partition=0, records=make_batch([b"a"]))
                        ],
                    )
                ],
            )
            if method == "ProduceStream"
            else pb.FetchRequest(partitions=[pb.FetchPartition(topic="t", partition=0)])
        ).SerializeToString()
        call = channel.stream_stream(SERVICE + method)
        answers: list[bytes] = []
        with pytest.raises(grpc.RpcError) as failure:
            answers.extend(call(iter([good, TRUNCATED, good]), timeout=TIMEOUT_S))
        assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_code(failure.value) == "INVALID_REQUEST"
        assert len(answers) <= 1  # the good message before it may have been answered
        # The broker goes on, and the stream's counters were released.
        assert produce(stub, "t", 0, make_batch([b"b"])).error_code == ""
        assert broker.server.admission.connections <= 1


def test_an_error_quoting_a_huge_name_still_reaches_the_client(broker: InProcessBroker) -> None:
    with broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        for call, request in (
            (stub.DescribeTopic, pb.DescribeTopicRequest(name="x" * 70_000)),
            (stub.CreateTopic, pb.CreateTopicRequest(name="x" * 70_000)),
            (stub.DeleteTopic, pb.DeleteTopicRequest(name="x" * 70_000)),
        ):
            with pytest.raises(grpc.RpcError) as failure:
                call(request, timeout=TIMEOUT_S)
            assert error_code(failure.value) in {
                "UNKNOWN_TOPIC_OR_PARTITION",
                "INVALID_TOPIC_EXCEPTION",
            }
            assert len(failure.value.details() or "") <= MAX_MESSAGE_CHARS


def test_a_request_with_too_many_entries_is_refused_before_it_is_parsed(
    broker: InProcessBroker,
) -> None:
    """Regression: 4 million partition entries (16 MB on the wire) parsed into ~200 MB and
    were answered one by one; the fuzz run's broker reached 1 GiB RSS."""
    with broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        many = pb.TopicPartitions(topic="t", partitions=list(range(2_000)))
        for call, request in (
            (stub.OffsetFetch, pb.OffsetFetchRequest(group_id="g", partitions=[many] * 2_000)),
            (
                stub.Produce,
                pb.ProduceRequest(
                    topics=[pb.ProduceTopicData(topic="t", partitions=[pb.ProducePartitionData()])]
                    * 30_000
                ),
            ),
        ):
            with pytest.raises(grpc.RpcError) as failure:
                call(request, timeout=TIMEOUT_S)
            assert error_code(failure.value) == "INVALID_REQUEST"
            assert "max.request.partition.size.limit=20000" in (failure.value.details() or "")
        # Within the limit: answered as usual.
        answer = stub.OffsetFetch(
            pb.OffsetFetchRequest(group_id="g", partitions=[many] * 9), timeout=TIMEOUT_S
        )
        assert len(answer.offsets) in (0, 18_000)


def test_count_entries_counts_nested_and_packed_entries() -> None:
    request = pb.OffsetFetchRequest(
        group_id="g", partitions=[pb.TopicPartitions(topic="t", partitions=[1, 300, 70_000])] * 4
    )
    raw = request.SerializeToString()
    assert count_entries(pb.OffsetFetchRequest.DESCRIPTOR, raw, 1_000) == 4 + 4 * 3
    assert 5 < count_entries(pb.OffsetFetchRequest.DESCRIPTOR, raw, 5) < 16  # stops past it
    names = pb.MetadataRequest(topics=["a", "b", "c"]).SerializeToString()
    assert count_entries(pb.MetadataRequest.DESCRIPTOR, names, 1_000) == 3
