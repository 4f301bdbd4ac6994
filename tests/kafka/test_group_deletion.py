"""DeleteGroups (api key 42) and OffsetDelete (47, KIP-496) on the Kafka listener, through
Kafka's own admin clients: confluent-kafka's ``delete_consumer_groups`` and kafka-python's
``delete_groups`` / ``delete_group_offsets`` (kafka-python also finds the coordinators
with the batched FindCoordinator v4, KIP-699). A group with members is refused
(``NON_EMPTY_GROUP``), an unknown one is ``GROUP_ID_NOT_FOUND``; an offset of a topic a
live member subscribes to is refused (``GROUP_SUBSCRIBED_TO_TOPIC``), by a classic member
(kafka-python) and by a KIP-848 member (Tidelog's own consumer) alike."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import confluent_kafka
import confluent_kafka.admin
import kafka
import kafka.admin
import kafka.errors
import pytest

from tests.kafka.clients import TIMEOUT_S
from tests.kafka.conftest import KafkaBroker, unique
from tidelog import client
from tidelog.broker.groups.manager import OffsetCommitEntry
from tidelog.storage.types import TopicPartition

pytestmark = pytest.mark.timeout(120)

FAST_GROUP = {"session_timeout_ms": 10000, "heartbeat_interval_ms": 300}


def _topic(broker: KafkaBroker, partitions: int = 2) -> str:
    topic = unique("del")
    broker.broker.server.core.create_topic(topic, partitions, {})
    return topic


def _commit(broker: KafkaBroker, group: str, offsets: dict[TopicPartition, int]) -> None:
    """Committed offsets for an empty group (an admin commit at the core)."""
    entries = [OffsetCommitEntry(tp, offset) for tp, offset in offsets.items()]
    results = broker.broker.server.core.commit_offsets(group, "", -1, entries)
    assert [r.error_code for r in results] == [""] * len(entries)


def _committed(broker: KafkaBroker, group: str) -> dict[TopicPartition, int]:
    return {r.tp: r.offset for r in broker.broker.server.core.fetch_offsets(group, None)}


@contextmanager
def _classic_member(broker: KafkaBroker, topic: str, group: str) -> Iterator[None]:
    """A live kafka-python (classic protocol) member of ``group`` subscribed to ``topic``."""
    consumer = kafka.KafkaConsumer(
        topic,
        bootstrap_servers=broker.bootstrap,
        group_id=group,
        enable_auto_commit=False,
        **FAST_GROUP,
    )
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(timeout_ms=200)
        assert consumer.assignment(), "the member never got its assignment"
        yield
    finally:
        consumer.close()


@contextmanager
def _kip848_member(broker: KafkaBroker, topic: str, group: str) -> Iterator[None]:
    """A live KIP-848 member (Tidelog's own consumer, over gRPC) subscribed to ``topic``."""
    with client.Consumer(broker.address, group_id=group, enable_auto_commit=False) as consumer:
        consumer.subscribe([topic])
        deadline = time.monotonic() + TIMEOUT_S
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(timeout_ms=200)
        assert consumer.assignment(), "the member never got its assignment"
        yield


def _confluent_admin(broker: KafkaBroker) -> confluent_kafka.admin.AdminClient:
    return confluent_kafka.admin.AdminClient({"bootstrap.servers": broker.bootstrap})


def _confluent_delete(broker: KafkaBroker, groups: list[str]) -> dict[str, str]:
    """Group -> "OK" or the name of the error confluent-kafka reports for it."""
    admin = _confluent_admin(broker)  # kept alive until the answers are in
    futures = admin.delete_consumer_groups(groups, request_timeout=TIMEOUT_S)
    answers: dict[str, str] = {}
    for group, future in futures.items():
        try:
            future.result(timeout=TIMEOUT_S)
        except confluent_kafka.KafkaException as exc:
            answers[group] = exc.args[0].name()
        else:
            answers[group] = "OK"
    return answers


@pytest.mark.parametrize("member", ["classic", "kip848"])
def test_confluent_delete_consumer_groups(kafka_broker: KafkaBroker, member: str) -> None:
    topic = _topic(kafka_broker)
    empty, busy, unknown = unique("empty"), unique("busy"), unique("unknown")
    _commit(kafka_broker, empty, {TopicPartition(topic, 0): 3, TopicPartition(topic, 1): 4})
    _commit(kafka_broker, busy, {TopicPartition(topic, 0): 1})
    live = _classic_member if member == "classic" else _kip848_member
    with live(kafka_broker, topic, busy):
        answers = _confluent_delete(kafka_broker, [empty, busy, unknown])
    assert answers == {empty: "OK", busy: "NON_EMPTY_GROUP", unknown: "GROUP_ID_NOT_FOUND"}
    assert _committed(kafka_broker, empty) == {}
    assert _committed(kafka_broker, busy) == {TopicPartition(topic, 0): 1}
    # Once the member left, the group can go.
    assert _confluent_delete(kafka_broker, [busy]) == {busy: "OK"}
    assert _committed(kafka_broker, busy) == {}


def test_kafka_python_delete_groups(kafka_broker: KafkaBroker) -> None:
    topic = _topic(kafka_broker)
    empty, busy, unknown = unique("empty"), unique("busy"), unique("unknown")
    _commit(kafka_broker, empty, {TopicPartition(topic, 0): 3})
    admin = kafka.KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
    try:
        with _classic_member(kafka_broker, topic, busy):
            answers = admin.delete_groups([empty, busy, unknown])
        answers.update(admin.delete_groups([""], group_coordinator_id=0))
    finally:
        admin.close()
    assert answers == {
        empty: "OK",
        busy: "NonEmptyGroupError",
        unknown: "GroupIdNotFoundError",
        "": "InvalidGroupIdError",
    }
    assert _committed(kafka_broker, empty) == {}


@pytest.mark.parametrize("member", ["classic", "kip848"])
def test_kafka_python_delete_group_offsets(kafka_broker: KafkaBroker, member: str) -> None:
    consumed, other = _topic(kafka_broker), _topic(kafka_broker)
    group = unique("offsets")
    _commit(
        kafka_broker,
        group,
        {
            TopicPartition(consumed, 0): 5,
            TopicPartition(consumed, 1): 6,
            TopicPartition(other, 0): 7,
            TopicPartition(other, 1): 8,
        },
    )
    admin = kafka.KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
    live = _classic_member if member == "classic" else _kip848_member
    try:
        with live(kafka_broker, consumed, group):
            answers = admin.delete_group_offsets(
                group,
                [
                    kafka.TopicPartition(consumed, 0),
                    kafka.TopicPartition(other, 0),
                    kafka.TopicPartition(other, 7),  # no such partition
                ],
            )
        assert answers == {
            kafka.TopicPartition(consumed, 0): kafka.errors.GroupSubscribedToTopicError,
            kafka.TopicPartition(other, 0): kafka.errors.NoError,
            kafka.TopicPartition(other, 7): kafka.errors.UnknownTopicOrPartitionError,
        }
        # The member's own topic is untouched; the other topic's partition 0 is gone.
        assert _committed(kafka_broker, group) == {
            TopicPartition(consumed, 0): 5,
            TopicPartition(consumed, 1): 6,
            TopicPartition(other, 1): 8,
        }
        # The member gone, its topic's offsets may go too.
        answers = admin.delete_group_offsets(group, [kafka.TopicPartition(consumed, 0)])
        assert answers == {kafka.TopicPartition(consumed, 0): kafka.errors.NoError}
        assert TopicPartition(consumed, 0) not in _committed(kafka_broker, group)
        with pytest.raises(kafka.errors.GroupIdNotFoundError):
            admin.delete_group_offsets(unique("unknown"), [kafka.TopicPartition(other, 1)])
        with pytest.raises(kafka.errors.InvalidGroupIdError):
            admin.delete_group_offsets("", [kafka.TopicPartition(other, 1)], group_coordinator_id=0)
    finally:
        admin.close()
