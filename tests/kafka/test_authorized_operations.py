"""KIP-430 authorized operations over the Kafka listener, with no authorizer: every
operation Kafka supports on the resource's kind, reported only when asked for
(confluent-kafka's ``include_authorized_operations``). With ACLs:
``tests/broker/parity/test_operations.py::test_authorized_operations_follow_the_acls``."""

from __future__ import annotations

import confluent_kafka
import confluent_kafka.admin
import pytest
from confluent_kafka.admin import AclOperation

from tests.kafka.clients import TIMEOUT_S
from tests.kafka.conftest import KafkaBroker, unique

pytestmark = pytest.mark.timeout(60)

TOPIC_OPERATIONS = {
    AclOperation.READ,
    AclOperation.WRITE,
    AclOperation.CREATE,
    AclOperation.DELETE,
    AclOperation.ALTER,
    AclOperation.DESCRIBE,
    AclOperation.DESCRIBE_CONFIGS,
    AclOperation.ALTER_CONFIGS,
}
CLUSTER_OPERATIONS = {
    AclOperation.CREATE,
    AclOperation.ALTER,
    AclOperation.DESCRIBE,
    AclOperation.CLUSTER_ACTION,
    AclOperation.DESCRIBE_CONFIGS,
    AclOperation.ALTER_CONFIGS,
    AclOperation.IDEMPOTENT_WRITE,
}
GROUP_OPERATIONS = {AclOperation.READ, AclOperation.DELETE, AclOperation.DESCRIBE}


def _admin(broker: KafkaBroker) -> confluent_kafka.admin.AdminClient:
    return confluent_kafka.admin.AdminClient({"bootstrap.servers": broker.bootstrap})


def test_every_operation_on_the_cluster_and_a_topic(kafka_broker: KafkaBroker) -> None:
    admin = _admin(kafka_broker)
    topic = unique("authorized-ops")
    admin.create_topics([confluent_kafka.admin.NewTopic(topic, 1, 1)])[topic].result(TIMEOUT_S)

    cluster = admin.describe_cluster(include_authorized_operations=True).result(TIMEOUT_S)
    assert set(cluster.authorized_operations) == CLUSTER_OPERATIONS
    plain = admin.describe_cluster().result(TIMEOUT_S)
    assert not plain.authorized_operations  # not asked: Kafka's "unknown"

    topics = confluent_kafka.TopicCollection([topic])
    (future,) = admin.describe_topics(topics, include_authorized_operations=True).values()
    assert set(future.result(TIMEOUT_S).authorized_operations) == TOPIC_OPERATIONS


def test_every_operation_on_a_group(kafka_broker: KafkaBroker) -> None:
    admin = _admin(kafka_broker)
    topic, group_id = unique("authorized-ops-g"), unique("authorized-group")
    admin.create_topics([confluent_kafka.admin.NewTopic(topic, 1, 1)])[topic].result(TIMEOUT_S)
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": kafka_broker.bootstrap,
            "group.id": group_id,
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe([topic])
        consumer.poll(3)  # joined
        (future,) = admin.describe_consumer_groups(
            [group_id], include_authorized_operations=True
        ).values()
        assert set(future.result(TIMEOUT_S).authorized_operations) == GROUP_OPERATIONS
    finally:
        consumer.close()
