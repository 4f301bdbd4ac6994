"""A share group's configs changed while its share partition is loaded, in a cluster
where the partition's leader is not the group's coordinator (three broker processes on a
real ZooKeeper): the coordinator stores the change, the leader re-reads it at its next
refresh (``broker.core.share_group_configs``) and applies it with no restart. The single
node's case is ``tests/client/test_share_live_configs.py``.

Proven: after IncrementalAlterConfigs (sent to the coordinator) lowers the lock duration
from ten minutes to two seconds and the delivery limit from five to two, records the
leader hands out come back when their short lock expires (a second delivery), the record
acquired before the change never does, and a record at its second delivery is archived
(released, or its lock expired): the broker's limit of five would have made it available.
No record is delivered a third time.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.broker.cluster.conftest import partition_leaders, require_zookeeper
from tests.broker.cluster.waiting import eventually
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.broker.groups.offset_records import partition_for as offsets_partition_for
from tidelog.client import AdminClient, Producer, ShareConsumer
from tidelog.client.types import AlterConfigOp, ConfigResource

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

OFFSETS_TOPIC = "__consumer_offsets"
OFFSETS_PARTITIONS = 3
LONG_LOCK_MS = 600_000
SETTINGS = {
    "offsets.topic.num.partitions": OFFSETS_PARTITIONS,
    "replica.fetch.backoff.ms": 200,
    "group.share.min.heartbeat.interval.ms": 100,
    "group.share.heartbeat.interval.ms": 100,
    "group.share.min.session.timeout.ms": 1_000,
    "group.share.session.timeout.ms": 20_000,
    "group.share.min.record.lock.duration.ms": 100,
    "group.share.max.record.lock.duration.ms": LONG_LOCK_MS,
    "group.share.record.lock.duration.ms": LONG_LOCK_MS,
    "group.share.delivery.count.limit": 5,
}
BROKERS = {1, 2, 3}


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    with LocalCluster(brokers=3, session_timeout_ms=3_000, settings=SETTINGS) as running:
        yield running


def _coordinator(admin: AdminClient, group: str) -> int:
    found: dict[int, int] = {}

    def led() -> bool:
        try:
            found.update(partition_leaders(admin, OFFSETS_TOPIC))
        except Exception:  # not created yet
            return False
        return len(found) == OFFSETS_PARTITIONS and -1 not in found.values()

    eventually(led, 90)
    return found[offsets_partition_for(group, OFFSETS_PARTITIONS)]


def _produce(bootstrap: str, topic: str) -> None:
    with Producer(bootstrap, acks="all") as producer:
        producer.send(topic, value=b"job").result(timeout=30)


def test_changed_configs_reach_a_leader_that_is_not_the_coordinator(
    cluster: LocalCluster,
) -> None:
    topic, group = "live-configs", "live-workers"
    with AdminClient(cluster.bootstrap, request_timeout_ms=20_000) as admin:
        coordinator = _coordinator(admin, group)
        leader = min(BROKERS - {coordinator})
        admin.create_topic(topic, replica_assignment=[[leader, *sorted(BROKERS - {leader})]])
        eventually(lambda: partition_leaders(admin, topic)[0] == leader, 60)
        consumer = ShareConsumer(
            cluster.bootstrap, group, acknowledgement_mode="explicit", request_timeout_ms=15_000
        )
        try:
            consumer.subscribe([topic])
            eventually(lambda: bool(consumer.assignment()), 60)
            consumer.poll(timeout_ms=0)  # the share partition starts at the log end
            _produce(cluster.bootstrap, topic)
            first: list[int] = []
            eventually(
                lambda: bool(first.extend(r.offset for r in consumer.poll(200)) or first), 60
            )
            assert first == [0]

            admin.incremental_alter_configs(
                ConfigResource.group(group),
                [
                    AlterConfigOp("share.record.lock.duration.ms", "set", "2000"),
                    AlterConfigOp("share.delivery.count.limit", "set", "2"),
                ],
            )
            deliveries: list[tuple[int, int]] = []

            def archived_at_the_new_limit() -> bool:
                if not any(count == 2 for _, count in deliveries):
                    _produce(cluster.bootstrap, topic)  # one acquired after the refresh
                for record in consumer.poll(timeout_ms=500):
                    count = consumer.delivery_count(record)
                    deliveries.append((record.offset, count))
                    if count == 2:
                        consumer.acknowledge(record, kind="release")
                consumer.commit_sync()  # its lock may have expired first: archived too
                stats = admin.describe_share_group(group).partitions
                return bool(stats) and stats[0].archived >= 1

            eventually(archived_at_the_new_limit, 120, interval_s=0)
            assert any(count == 2 for _, count in deliveries)
            assert max(count for _, count in deliveries) == 2
            assert (0, 2) not in deliveries  # acquired before the change: its long lock
        finally:
            consumer.close()
