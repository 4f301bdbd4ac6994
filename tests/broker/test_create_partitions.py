"""``CreatePartitions`` end to end over gRPC: growth, every per-topic error, validate_only,
durability across a restart, produce and fetch to the new partitions right away, the
metrics, and the group coordinator noticing the new count at the next heartbeat."""

from __future__ import annotations

import urllib.request

import grpc
import pytest

from tests.broker.conftest import TIMEOUT_S, create_topic, fetch, make_batch, produce
from tests.broker.test_groups_rpc import Member, all_of, settle
from tidelog.broker.groups.offset_store import OFFSETS_TOPIC
from tidelog.broker.testing import InProcessBroker
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.log_manager import MAX_PARTITIONS


def grow(
    stub: pb_grpc.BrokerStub, *counts: tuple[str, int], validate_only: bool = False
) -> list[pb.CreatePartitionsTopicResult]:
    answer = stub.CreatePartitions(
        pb.CreatePartitionsRequest(
            topics=[pb.CreatePartitionsTopic(name=n, count=c) for n, c in counts],
            validate_only=validate_only,
        ),
        timeout=TIMEOUT_S,
    )
    return list(answer.results)


def partition_count(stub: pb_grpc.BrokerStub, topic: str) -> int:
    description = stub.DescribeTopic(pb.DescribeTopicRequest(name=topic), timeout=TIMEOUT_S)
    return len(description.partitions)


def test_grow_then_produce_and_fetch_the_new_partitions_at_once(
    stub: pb_grpc.BrokerStub,
) -> None:
    create_topic(stub, "t", 2)
    old = make_batch([b"old"])
    assert produce(stub, "t", 1, old).error_code == ""

    (result,) = grow(stub, ("t", 4))

    assert (result.name, result.error_code, result.partitions) == ("t", "", 4)
    description = stub.DescribeTopic(pb.DescribeTopicRequest(name="t"), timeout=TIMEOUT_S)
    assert [(p.partition, p.log_end_offset) for p in description.partitions] == [
        (0, 0),
        (1, 1),
        (2, 0),
        (3, 0),
    ]
    listed = stub.ListTopics(pb.ListTopicsRequest(), timeout=TIMEOUT_S)
    assert [(t.name, t.partitions) for t in listed.topics] == [("t", 4)]
    for partition in (2, 3):
        batch = make_batch([b"new-%d" % partition, b"more"])
        produced = produce(stub, "t", partition, batch, acks=-1)
        assert (produced.error_code, produced.base_offset) == ("", 0)
        fetched = fetch(stub, "t", partition, 0)
        assert (fetched.error_code, fetched.high_watermark, fetched.records) == ("", 2, batch)
    assert fetch(stub, "t", 1, 0).records == old
    offsets = stub.ListOffsets(
        pb.ListOffsetsRequest(
            partitions=[pb.ListOffsetsPartition(topic="t", partition=3, timestamp_ms=-1)]
        ),
        timeout=TIMEOUT_S,
    )
    assert [(r.error_code, r.offset) for r in offsets.results] == [("", 2)]


def test_a_long_poll_on_a_new_partition_wakes_on_append(stub: pb_grpc.BrokerStub) -> None:
    create_topic(stub, "t", 1)
    grow(stub, ("t", 2))
    batch = make_batch([b"x"])
    future = stub.Fetch.future(
        pb.FetchRequest(
            max_wait_ms=5_000,
            min_bytes=1,
            partitions=[pb.FetchPartition(topic="t", partition=1, fetch_offset=0)],
        ),
        timeout=TIMEOUT_S,
    )
    produce(stub, "t", 1, batch)
    (result,) = future.result(timeout=TIMEOUT_S).results
    assert result.records == batch


def test_every_error_is_answered_per_topic_and_changes_nothing(
    stub: pb_grpc.BrokerStub,
) -> None:
    create_topic(stub, "t", 3)
    create_topic(stub, "u", 1)
    results = grow(
        stub,
        ("nope", 4),
        ("t", 3),
        ("t-smaller", 1),
        ("bad/name", 2),
        (OFFSETS_TOPIC, 10),
        ("u", 2),
        ("u", 3),
    )
    create_topic(stub, "t-smaller", 2)
    results += grow(stub, ("t-smaller", 1))
    for count in (0, -5, MAX_PARTITIONS + 1):
        results += grow(stub, ("t", count))
    got = [(r.name, r.error_code, r.partitions) for r in results]
    assert got == [
        ("nope", "UNKNOWN_TOPIC_OR_PARTITION", -1),
        ("t", "INVALID_PARTITIONS", -1),
        ("t-smaller", "UNKNOWN_TOPIC_OR_PARTITION", -1),
        ("bad/name", "INVALID_TOPIC_EXCEPTION", -1),
        (OFFSETS_TOPIC, "INVALID_REQUEST", -1),
        ("u", "INVALID_REQUEST", -1),
        ("u", "INVALID_REQUEST", -1),
        ("t-smaller", "INVALID_PARTITIONS", -1),
        ("t", "INVALID_PARTITIONS", -1),
        ("t", "INVALID_PARTITIONS", -1),
        ("t", "INVALID_PARTITIONS", -1),
    ]
    assert "unknown topic 'nope'" in results[0].error_message
    assert "has 3 partition(s); the new count must be larger" in results[1].error_message
    assert "internal topic" in results[4].error_message
    assert "more than once" in results[5].error_message
    assert f"at most {MAX_PARTITIONS}" in results[-1].error_message
    assert (partition_count(stub, "t"), partition_count(stub, "u")) == (3, 1)
    internal = stub.DescribeTopic(pb.DescribeTopicRequest(name=OFFSETS_TOPIC), timeout=TIMEOUT_S)
    assert len(internal.partitions) == 5  # offsets.topic.num.partitions


def test_one_refused_topic_does_not_stop_the_others(stub: pb_grpc.BrokerStub) -> None:
    create_topic(stub, "a", 1)
    create_topic(stub, "b", 1)
    results = grow(stub, ("a", 3), ("missing", 2), ("b", 2))
    assert [(r.name, r.error_code, r.partitions) for r in results] == [
        ("a", "", 3),
        ("missing", "UNKNOWN_TOPIC_OR_PARTITION", -1),
        ("b", "", 2),
    ]
    assert (partition_count(stub, "a"), partition_count(stub, "b")) == (3, 2)


def test_validate_only_checks_and_changes_nothing(stub: pb_grpc.BrokerStub) -> None:
    create_topic(stub, "t", 2)
    results = grow(stub, ("t", 6), ("t2", 3), validate_only=True)
    assert [(r.name, r.error_code, r.partitions) for r in results] == [
        ("t", "", 6),
        ("t2", "UNKNOWN_TOPIC_OR_PARTITION", -1),
    ]
    (refused,) = grow(stub, ("t", 2), validate_only=True)
    assert refused.error_code == "INVALID_PARTITIONS"
    assert partition_count(stub, "t") == 2


def test_an_empty_request_is_an_empty_answer(stub: pb_grpc.BrokerStub) -> None:
    assert grow(stub) == []


def test_growth_survives_a_restart(broker: InProcessBroker) -> None:
    with broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        create_topic(stub, "t", 1, **{"segment.bytes": "100000"})
        grow(stub, ("t", 3))
        produce(stub, "t", 2, make_batch([b"on-2"]), acks=-1)
    broker.restart()
    with broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        description = stub.DescribeTopic(pb.DescribeTopicRequest(name="t"), timeout=TIMEOUT_S)
        assert [p.log_end_offset for p in description.partitions] == [0, 0, 1]
        assert description.config["segment.bytes"] == "100000"
        assert fetch(stub, "t", 2, 0).records == make_batch([b"on-2"])
        (again,) = grow(stub, ("t", 3))
        assert again.error_code == "INVALID_PARTITIONS"


def test_shutting_down_broker_answers_unavailable(broker: InProcessBroker) -> None:
    with broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        create_topic(stub, "t", 1)
        broker.server.core.begin_close()
        with pytest.raises(grpc.RpcError) as raised:
            grow(stub, ("t", 2))
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE


def test_new_partitions_show_in_the_metrics() -> None:
    with InProcessBroker(metrics=True) as broker, broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        create_topic(stub, "t", 1)
        grow(stub, ("t", 3))
        grow(stub, ("t", 2))
        assert broker.metrics_port is not None
        url = f"http://127.0.0.1:{broker.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            text = response.read().decode()
    assert 'tidelog_log_end_offset{partition="2",topic="t"} 0.0' in text
    # Per-topic refusals live inside an answered call, so the call itself is OK.
    assert 'tidelog_requests_total{code="OK",method="CreatePartitions"} 2.0' in text


def test_subscribed_groups_rebalance_at_the_next_heartbeat(stub: pb_grpc.BrokerStub) -> None:
    create_topic(stub, "t", 2)
    a, b = Member(stub, "g", ["t"]), Member(stub, "g", ["t"])
    settle(a, b)
    assert a.owned | b.owned == all_of("t", 2)
    before = stub.DescribeGroup(pb.DescribeGroupRequest(group_id="g"), timeout=TIMEOUT_S)

    grow(stub, ("t", 4))
    answer = a.heartbeat()  # the first heartbeat after the growth bumps the group epoch
    after = stub.DescribeGroup(pb.DescribeGroupRequest(group_id="g"), timeout=TIMEOUT_S)
    assert after.group_epoch == before.group_epoch + 1
    assert answer.member_epoch == after.group_epoch
    settle(a, b)
    assert a.owned | b.owned == all_of("t", 4)
    assert not a.owned & b.owned
    assert (len(a.owned), len(b.owned)) == (2, 2)
    final = stub.DescribeGroup(pb.DescribeGroupRequest(group_id="g"), timeout=TIMEOUT_S)
    assert final.state == "Stable"
