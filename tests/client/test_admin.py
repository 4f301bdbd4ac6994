"""The admin client against a real in-process broker, and its errors."""

from __future__ import annotations

import time

import pytest

from tidelog.broker.testing import InProcessBroker
from tidelog.client import (
    AdminClient,
    BrokerUnavailableError,
    ClosedError,
    InvalidConfigError,
    InvalidTopicError,
    OffsetAndTimestamp,
    OffsetOutOfRangeError,
    Producer,
    TopicAlreadyExistsError,
    TopicPartition,
    UnknownTopicOrPartitionError,
)
from tidelog.client.types import TopicSummary


def test_create_describe_list_alter_delete(admin: AdminClient) -> None:
    created = admin.create_topic("admin-topic", 3, {"retention.ms": 3_600_000})
    assert created.name == "admin-topic"
    assert [p.partition for p in created.partitions] == [0, 1, 2]
    assert created.config["retention.ms"] == "3600000"
    assert TopicSummary("admin-topic", 3, False) in admin.list_topics()
    described = admin.describe_topic("admin-topic")
    assert described.partitions[1].log_start_offset == 0
    assert described.partitions[1].log_end_offset == 0
    # KIP-966's eligible leader replicas are cluster mode's; a single node has none.
    assert all(p.elr == () and p.last_known_elr == () for p in described.partitions)
    assert described.config["cleanup.policy"] == "delete"  # defaults included
    altered = admin.alter_topic_config("admin-topic", {"retention.ms": "60000"})
    assert altered.config["retention.ms"] == "60000"
    reverted = admin.alter_topic_config("admin-topic", delete=["retention.ms"])
    assert reverted.config["retention.ms"] != "60000"
    admin.delete_topic("admin-topic")
    assert "admin-topic" not in {t.name for t in admin.list_topics()}


def test_describe_shows_log_start_and_end_offsets(
    broker: InProcessBroker, admin: AdminClient
) -> None:
    admin.create_topic("admin-offsets", 2)
    with Producer(broker.address) as producer:
        for i in range(7):
            producer.send("admin-offsets", b"x", partition=i % 2)
    partitions = admin.describe_topic("admin-offsets").partitions
    assert [(p.log_start_offset, p.log_end_offset) for p in partitions] == [(0, 4), (0, 3)]
    assert all(p.size_bytes > 0 and p.segments >= 1 for p in partitions)


def test_list_offsets(broker: InProcessBroker, admin: AdminClient) -> None:
    admin.create_topic("admin-list-offsets", 1)
    with Producer(broker.address) as producer:
        for i in range(5):
            producer.send("admin-list-offsets", b"x", timestamp_ms=10_000 + i * 10)
    tp = TopicPartition("admin-list-offsets", 0)
    assert admin.list_offsets({tp: "earliest"})[tp] == OffsetAndTimestamp(0, -1)
    assert admin.list_offsets({tp: "latest"})[tp] == OffsetAndTimestamp(5, -1)
    assert admin.list_offsets({tp: 10_015}) == {tp: OffsetAndTimestamp(2, 10_020)}
    assert admin.list_offsets({tp: 99_999}) == {tp: None}
    with pytest.raises(ValueError, match="offset spec"):
        admin.list_offsets({tp: "middle"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="offset spec"):
        admin.list_offsets({tp: -3})
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.list_offsets({TopicPartition("admin-list-offsets", 7): "latest"})


def test_list_offsets_max_timestamp(broker: InProcessBroker, admin: AdminClient) -> None:
    """KIP-734: the record with the largest timestamp, the first of two that share it,
    whatever the order of the timestamps in the log; None for an empty partition."""
    admin.create_topic("admin-max-timestamp", 2)
    tp, empty = TopicPartition("admin-max-timestamp", 0), TopicPartition("admin-max-timestamp", 1)
    assert admin.list_offsets({tp: "max_timestamp", empty: "max_timestamp"}) == {
        tp: None,
        empty: None,
    }
    with Producer(broker.address, linger_ms=0) as producer:
        for ts in (5_000, 9_000, 7_000, 9_000, 1_000):
            producer.send("admin-max-timestamp", b"x", partition=0, timestamp_ms=ts).result(10)
    assert admin.list_offsets({tp: "max_timestamp", empty: "max_timestamp"}) == {
        tp: OffsetAndTimestamp(1, 9_000),
        empty: None,
    }


def test_delete_records(broker: InProcessBroker, admin: AdminClient) -> None:
    admin.create_topic("admin-delete-records", 2)
    with Producer(broker.address, linger_ms=0) as producer:
        for i in range(10):
            producer.send("admin-delete-records", b"v%d" % i, partition=0).result(10)
    zero = TopicPartition("admin-delete-records", 0)
    one = TopicPartition("admin-delete-records", 1)
    assert admin.delete_records({zero: 4, one: -1}) == {zero: 4, one: 0}
    assert admin.list_offsets({zero: "earliest"}) == {zero: OffsetAndTimestamp(4, -1)}
    assert admin.describe_topic("admin-delete-records").partitions[0].log_start_offset == 4
    assert admin.delete_records({zero: 2}) == {zero: 4}  # never moves down
    assert admin.delete_records({zero: -1}) == {zero: 10}  # -1: the high watermark
    assert admin.delete_records({}) == {}
    with pytest.raises(OffsetOutOfRangeError, match="high watermark"):
        admin.delete_records({zero: 11})
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.delete_records({TopicPartition("admin-delete-records", 9): 0})
    with pytest.raises(ValueError, match="-1 for the high watermark"):
        admin.delete_records({zero: -2})
    with pytest.raises(TypeError):
        admin.delete_records({zero: "3"})  # type: ignore[dict-item]


def test_describe_producers(broker: InProcessBroker, admin: AdminClient) -> None:
    admin.create_topic("admin-producers", 2)
    with Producer(broker.address, linger_ms=0) as producer:
        for i in range(3):
            producer.send("admin-producers", b"v%d" % i, partition=0).result(10)
    written, idle = TopicPartition("admin-producers", 0), TopicPartition("admin-producers", 1)
    found = admin.describe_producers([written, idle])
    assert found[idle] == []
    (state,) = found[written]
    assert (state.producer_epoch, state.last_sequence, state.last_offset) == (0, 2, 2)
    assert state.last_timestamp_ms > 0
    assert admin.describe_producers([written], producer_id=state.producer_id + 1) == {written: []}
    assert admin.describe_producers([]) == {}
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.describe_producers([TopicPartition("admin-producers", 9)])


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda a: a.create_topic("dup-topic", 1), TopicAlreadyExistsError),
        (lambda a: a.create_topic("bad/name", 1), InvalidTopicError),
        (lambda a: a.create_topic("cfg-topic", 1, {"no.such.key": "1"}), InvalidConfigError),
        (lambda a: a.create_topic("cfg-topic", 1, {"retention.ms": "soon"}), InvalidConfigError),
        (lambda a: a.describe_topic("missing-topic"), UnknownTopicOrPartitionError),
        (lambda a: a.delete_topic("missing-topic"), UnknownTopicOrPartitionError),
    ],
)
def test_broker_refusals_become_their_error_classes(
    admin: AdminClient, call: object, error: type[Exception]
) -> None:
    if "dup-topic" not in {t.name for t in admin.list_topics()}:
        admin.create_topic("dup-topic", 1)
    with pytest.raises(error) as caught:
        call(admin)  # type: ignore[operator]
    assert caught.value.code == error.code  # type: ignore[attr-defined]


def test_bad_arguments_are_value_errors(admin: AdminClient) -> None:
    with pytest.raises(ValueError, match="partitions"):
        admin.create_topic("x", 0)


def test_a_broker_that_is_down_gives_broker_unavailable_after_the_timeout() -> None:
    with AdminClient("127.0.0.1:9", request_timeout_ms=300) as admin:
        started = time.monotonic()
        with pytest.raises(BrokerUnavailableError, match="unreachable"):
            admin.list_topics()
        assert 0.25 < time.monotonic() - started < 3
    with pytest.raises(ClosedError):
        admin.list_topics()


def test_a_restarting_broker_is_waited_for_within_the_timeout() -> None:
    with (
        InProcessBroker() as broker,
        AdminClient(broker.address, request_timeout_ms=10_000) as admin,
    ):
        admin.create_topic("survives", 1)
        broker.restart()
        assert "survives" in {t.name for t in admin.list_topics()}


def test_groups_list_and_describe(broker: InProcessBroker, admin: AdminClient) -> None:
    from tidelog.client import Consumer

    admin.create_topic("admin-groups", 1)
    with Producer(broker.address) as producer:
        for _ in range(4):
            producer.send("admin-groups", b"x")
    tp = TopicPartition("admin-groups", 0)
    with Consumer(broker.address, group_id="admin-g", enable_auto_commit=False) as consumer:
        consumer.commit({tp: 1})
    assert "admin-g" in {g.group_id for g in admin.list_groups()}
    group = admin.describe_group("admin-g")
    (lag,) = [p for p in group.partitions if p.tp == tp]
    assert (lag.committed_offset, lag.log_end_offset, lag.lag) == (1, 4, 3)


def test_reassignment_on_a_single_node(admin: AdminClient) -> None:
    """A single node has one place for a replica, itself: moving there is done already,
    anything else is an invalid assignment, and nothing is ever being moved."""
    from tidelog.storage.errors import InvalidReplicaAssignmentError, NoReassignmentInProgressError

    admin.create_topic("single-moves", 1)
    here, there = TopicPartition("single-moves", 0), TopicPartition("single-moves", 5)
    assert admin.alter_partition_reassignments({here: [0]}) == {here: None}
    answers = admin.alter_partition_reassignments({here: [1]})
    assert isinstance(answers[here], InvalidReplicaAssignmentError)
    answers = admin.alter_partition_reassignments({here: None, there: [0]})
    assert isinstance(answers[here], NoReassignmentInProgressError)
    assert isinstance(answers[there], UnknownTopicOrPartitionError)
    assert admin.list_partition_reassignments() == {}
    with pytest.raises(TypeError, match="broker ids"):
        admin.alter_partition_reassignments({here: ["0"]})  # type: ignore[list-item]
