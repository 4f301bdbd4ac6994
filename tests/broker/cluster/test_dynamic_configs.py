"""Dynamic configs in a three-broker cluster (#27): a change made through one broker
reaches every broker without a restart (ZooKeeper's /config/brokers and /config/topics,
watched), and survives a broker's restart."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.broker.cluster.conftest import require_zookeeper
from tests.broker.cluster.waiting import eventually
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.client import AdminClient, Producer
from tidelog.client.types import AlterConfigOp, ConfigResource
from tidelog.storage.errors import RecordTooLargeError

pytestmark = pytest.mark.slow
TIMEOUT_MS = 20_000


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    with LocalCluster(brokers=3, session_timeout_ms=3_000) as running:
        yield running


def _sizes_refused(producer: Producer, topic: str, partitions: int, size: int) -> list[bool]:
    refused = []
    for partition in range(partitions):
        try:
            producer.send(topic, b"x" * size, key=b"k", partition=partition).result(10)
        except RecordTooLargeError:
            refused.append(True)
        else:
            refused.append(False)
    return refused


def test_a_broker_default_changed_on_one_broker_applies_on_every_broker(
    cluster: LocalCluster,
) -> None:
    with (
        AdminClient(cluster.bootstrap, request_timeout_ms=TIMEOUT_MS) as admin,
        Producer(cluster.bootstrap, retries=0) as producer,
    ):
        # Three partitions, RF 1: one leader on each broker, each applying its own defaults.
        created = admin.create_topic("dyn", 3, replication_factor=1)
        assert sorted({p.leader for p in created.partitions}) == [1, 2, 3]
        # CreateTopics answers once every partition has a leader in the controller's view;
        # a leader may open its log a moment later (UNKNOWN_TOPIC_OR_PARTITION, retriable,
        # and this producer has retries=0, as Kafka's broker would answer too).
        eventually(lambda: _sizes_refused(producer, "dyn", 3, 5_000) == [False] * 3)
        # The cluster-wide default, sent to one broker (any broker takes it).
        admin.incremental_alter_configs(
            ConfigResource.broker(), [AlterConfigOp("message.max.bytes", "set", "2000")]
        )
        eventually(lambda: _sizes_refused(producer, "dyn", 3, 5_000) == [True] * 3)
        for broker_id in cluster.broker_ids:
            entry = admin.describe_configs(ConfigResource.broker(broker_id), ["message.max.bytes"])
            assert entry["message.max.bytes"].value == "2000"
            assert entry["message.max.bytes"].source == "DYNAMIC_DEFAULT_BROKER_CONFIG"
        # One broker's own value wins over the default on that broker only.
        admin.incremental_alter_configs(
            ConfigResource.broker(2), [AlterConfigOp("message.max.bytes", "set", "100000")]
        )
        leaders = {p.partition: p.leader for p in admin.describe_topic("dyn").partitions}
        expected = [leaders[p] != 2 for p in range(3)]
        eventually(lambda: _sizes_refused(producer, "dyn", 3, 5_000) == expected)
        # A topic's own override, through the controller, reaches its leaders.
        admin.incremental_alter_configs(
            ConfigResource.topic("dyn"), [AlterConfigOp("max.message.bytes", "set", "200000")]
        )
        eventually(lambda: _sizes_refused(producer, "dyn", 3, 5_000) == [False] * 3)
        # Kept in ZooKeeper: a restarted broker comes back with the default.
        admin.incremental_alter_configs(
            ConfigResource.topic("dyn"), [AlterConfigOp("max.message.bytes", "delete")]
        )
        eventually(lambda: _sizes_refused(producer, "dyn", 3, 5_000) == expected)
        restarted = next(b for b in cluster.broker_ids if b != 2)
        cluster.kill(restarted)
        cluster.start_broker(restarted)
        eventually(
            lambda: (
                admin.describe_configs(ConfigResource.broker(restarted), ["message.max.bytes"])[
                    "message.max.bytes"
                ].value
                == "2000"
            ),
            timeout_s=60,
        )
        admin.incremental_alter_configs(
            ConfigResource.broker(), [AlterConfigOp("message.max.bytes", "delete")]
        )
        admin.incremental_alter_configs(
            ConfigResource.broker(2), [AlterConfigOp("message.max.bytes", "delete")]
        )
        eventually(lambda: _sizes_refused(producer, "dyn", 3, 5_000) == [False] * 3, timeout_s=60)
