"""Topic admin over gRPC against a real broker, bad input included."""

from __future__ import annotations

import grpc
import pytest

from tests.broker.conftest import TIMEOUT_S, create_topic, error_code, make_batch, produce
from tidelog.broker.testing import InProcessBroker
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc


def test_create_list_describe_alter_delete(stub: pb_grpc.BrokerStub) -> None:
    created = create_topic(stub, "events", 3, **{"retention.ms": "60000"})
    assert created.name == "events"
    assert [p.partition for p in created.partitions] == [0, 1, 2]
    assert created.config["retention.ms"] == "60000"
    assert created.config["cleanup.policy"] == "delete"  # every effective key, defaults too
    assert produce(stub, "events", 1, make_batch([b"a", b"b"])).error_code == ""

    listed = stub.ListTopics(pb.ListTopicsRequest(), timeout=TIMEOUT_S)
    assert [(t.name, t.partitions) for t in listed.topics] == [("events", 3)]

    described = stub.DescribeTopic(pb.DescribeTopicRequest(name="events"), timeout=TIMEOUT_S)
    p1 = described.partitions[1]
    assert (p1.log_start_offset, p1.log_end_offset, p1.high_watermark) == (0, 2, 2)
    assert p1.size_bytes > 0
    assert p1.segments == 1

    altered = stub.AlterTopicConfig(
        pb.AlterTopicConfigRequest(
            name="events", set={"cleanup.policy": "compact"}, delete=["retention.ms"]
        ),
        timeout=TIMEOUT_S,
    )
    assert altered.config["cleanup.policy"] == "compact"
    assert altered.config["retention.ms"] == "604800000"  # back to the broker default

    stub.DeleteTopic(pb.DeleteTopicRequest(name="events"), timeout=TIMEOUT_S)
    assert list(stub.ListTopics(pb.ListTopicsRequest(), timeout=TIMEOUT_S).topics) == []


def test_partitions_zero_means_num_partitions() -> None:
    with InProcessBroker(settings={"num.partitions": 4}) as broker, broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        assert len(create_topic(stub, "t", 0).partitions) == 4


def _fails(call: object, status: grpc.StatusCode, code: str) -> grpc.RpcError:
    assert callable(call)
    with pytest.raises(grpc.RpcError) as info:
        call()
    error = info.value
    assert error.code() == status
    assert error_code(error) == code
    return error


@pytest.mark.parametrize("name", ["../x", "a/b", "", "x" * 250, ".", "..", "sp ace", "é"])
def test_invalid_topic_names_are_refused(stub: pb_grpc.BrokerStub, name: str) -> None:
    error = _fails(
        lambda: create_topic(stub, name),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_TOPIC_EXCEPTION",
    )
    assert "topic name" in (error.details() or "")
    # The broker keeps serving.
    assert create_topic(stub, "fine").name == "fine"


def test_duplicate_creation_is_refused_and_loses_nothing(stub: pb_grpc.BrokerStub) -> None:
    create_topic(stub, "dup", 2)
    produce(stub, "dup", 0, make_batch([b"keep me"]))
    _fails(
        lambda: create_topic(stub, "dup", 5), grpc.StatusCode.ALREADY_EXISTS, "TOPIC_ALREADY_EXISTS"
    )
    described = stub.DescribeTopic(pb.DescribeTopicRequest(name="dup"), timeout=TIMEOUT_S)
    assert len(described.partitions) == 2
    assert described.partitions[0].log_end_offset == 1


def test_bad_configs_and_partition_counts(stub: pb_grpc.BrokerStub) -> None:
    _fails(
        lambda: create_topic(stub, "c", 1, **{"retention.msec": "1"}),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_CONFIG",
    )
    _fails(
        lambda: create_topic(stub, "c", 1, **{"cleanup.policy": "shred"}),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_CONFIG",
    )
    _fails(
        lambda: create_topic(stub, "c", -1), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PARTITIONS"
    )
    assert list(stub.ListTopics(pb.ListTopicsRequest(), timeout=TIMEOUT_S).topics) == []
    create_topic(stub, "c")
    _fails(
        lambda: stub.AlterTopicConfig(
            pb.AlterTopicConfigRequest(name="c", set={"segment.bytes": "1"}), timeout=TIMEOUT_S
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_CONFIG",
    )


def test_unknown_topics(stub: pb_grpc.BrokerStub) -> None:
    for call in (
        lambda: stub.DescribeTopic(pb.DescribeTopicRequest(name="nope"), timeout=TIMEOUT_S),
        lambda: stub.DeleteTopic(pb.DeleteTopicRequest(name="nope"), timeout=TIMEOUT_S),
        lambda: stub.AlterTopicConfig(
            pb.AlterTopicConfigRequest(name="nope", set={"retention.ms": "1"}), timeout=TIMEOUT_S
        ),
    ):
        _fails(call, grpc.StatusCode.NOT_FOUND, "UNKNOWN_TOPIC_OR_PARTITION")


def test_topics_survive_a_restart(broker: InProcessBroker) -> None:
    with broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        create_topic(stub, "kept", 2, **{"retention.ms": "123456"})
        produce(stub, "kept", 1, make_batch([b"x"]), acks=-1)
    broker.restart()
    with broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        described = stub.DescribeTopic(pb.DescribeTopicRequest(name="kept"), timeout=TIMEOUT_S)
    assert described.config["retention.ms"] == "123456"
    assert described.partitions[1].log_end_offset == 1
