"""A share group's configs changed while its share partitions are loaded apply live
(``broker.core.share_group_configs``, ``SharePartitionManager.reconfigure``), on a real
single broker; the cluster case, where the leader is not the group's coordinator, is
``tests/broker/cluster/test_share_live_configs_cluster.py``.

Proven: after IncrementalAlterConfigs lowers ``share.record.lock.duration.ms`` from ten
minutes and ``share.delivery.count.limit`` from five, with no restart, a record acquired
after the change comes back once its short lock expires, while one acquired before keeps
its ten-minute lock; a RELEASE at the new limit archives the record (never delivered
again), which the broker's default limit would have made available. A dead-letter topic
removed archives at once the record that waited to be copied there (its copies failed),
so the share partition's start moves past it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.broker.cluster.waiting import eventually
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient, ConsumerRecord, Producer, ShareConsumer
from tidelog.client.types import AlterConfigOp, ConfigResource
from tidelog.storage.errors import InvalidRecordStateError

LONG_LOCK_MS = 600_000
SETTINGS = {
    "group.share.min.heartbeat.interval.ms": 100,
    "group.share.heartbeat.interval.ms": 100,
    "group.share.min.session.timeout.ms": 1_000,
    "group.share.session.timeout.ms": 20_000,
    "group.share.min.record.lock.duration.ms": 100,
    "group.share.max.record.lock.duration.ms": LONG_LOCK_MS,
    "group.share.record.lock.duration.ms": LONG_LOCK_MS,
    "group.share.delivery.count.limit": 5,
}


@pytest.fixture(scope="module")
def broker() -> Iterator[InProcessBroker]:
    with InProcessBroker(settings=SETTINGS) as running:
        yield running


def _produce(bootstrap: str, topic: str, count: int) -> None:
    with Producer(bootstrap) as producer:
        for i in range(count):
            producer.send(topic, value=b"%d" % i, partition=0)
        producer.flush()


def _poll_until(
    consumer: ShareConsumer, done: Callable[[list[tuple[int, int]]], bool]
) -> list[tuple[ConsumerRecord, int]]:
    """Poll until ``done`` of the (offset, delivery count) pairs received so far; return
    each record received with its delivery count."""
    got: list[tuple[ConsumerRecord, int]] = []

    def check() -> bool:
        got.extend((r, consumer.delivery_count(r)) for r in consumer.poll(timeout_ms=200))
        return done([(r.offset, count) for r, count in got])

    eventually(check, 60, interval_s=0)
    return got


def test_a_changed_lock_duration_and_delivery_limit_apply_without_a_restart(
    broker: InProcessBroker,
) -> None:
    topic, group = "live-configs", "live-workers"
    with AdminClient(broker.address) as admin:
        admin.create_topic(topic, 1)
        consumer = ShareConsumer(
            broker.address, group, acknowledgement_mode="explicit", request_timeout_ms=10_000
        )
        try:
            consumer.subscribe([topic])
            eventually(lambda: bool(consumer.assignment()), 20)
            assert consumer.poll(timeout_ms=0) == []  # starts at the log end
            _produce(broker.address, topic, 1)
            _poll_until(consumer, lambda seen: seen == [(0, 1)])

            admin.incremental_alter_configs(
                ConfigResource.group(group),
                [
                    AlterConfigOp("share.record.lock.duration.ms", "set", "2000"),
                    AlterConfigOp("share.delivery.count.limit", "set", "2"),
                ],
            )
            _produce(broker.address, topic, 1)
            got = _poll_until(consumer, lambda seen: len(seen) >= 2)
            # Offset 1, acquired after the change, came back when its 2 s lock expired;
            # offset 0 keeps the lock it was acquired with (had it the new one, it would
            # have expired first and come back first).
            assert [(r.offset, count) for r, count in got] == [(1, 1), (1, 2)]

            # Its second delivery is the new limit: released (or, on a slow machine, its
            # lock expired first) it is archived, where the broker's 5 would make it
            # available again.
            consumer.acknowledge(got[-1][0], kind="release")
            outcome = consumer.commit_sync()
            assert (
                outcome == {}
                or set(outcome.values()) <= {None}
                or all(isinstance(e, InvalidRecordStateError) for e in outcome.values())
            )
            (stats,) = admin.describe_share_group(group).partitions
            assert (stats.archived, stats.acquired) == (1, 1)
            _produce(broker.address, topic, 1)
            after = _poll_until(consumer, lambda now: len(now) >= 1)
            assert [r.offset for r, _ in after] == [2]  # offset 1 was not delivered again
        finally:
            consumer.close()


def test_a_removed_dead_letter_topic_archives_what_waited_for_it(
    broker: InProcessBroker,
) -> None:
    """Copies into a compacted dead-letter topic fail (the records have no key), so a
    rejected record waits to be dead-lettered and holds the share partition's start;
    removing the group's dead-letter topic archives it at once, no restart."""
    topic, group, dlq = "live-dlq", "live-dlq-workers", "live-dlq-compacted"
    with AdminClient(broker.address) as admin:
        admin.create_topic(topic, 1)
        admin.create_topic(dlq, 1, {"cleanup.policy": "compact"})
        resource = ConfigResource.group(group)
        admin.incremental_alter_configs(
            resource, [AlterConfigOp("errors.deadletterqueue.topic.name", "set", dlq)]
        )
        consumer = ShareConsumer(
            broker.address, group, acknowledgement_mode="explicit", request_timeout_ms=10_000
        )
        try:
            consumer.subscribe([topic])
            eventually(lambda: bool(consumer.assignment()), 20)
            assert consumer.poll(timeout_ms=0) == []
            _produce(broker.address, topic, 2)
            got = _poll_until(consumer, lambda seen: len(seen) >= 2)
            consumer.acknowledge(got[0][0], kind="reject")
            consumer.acknowledge(got[1][0])
            assert set(consumer.commit_sync().values()) == {None}
            (stats,) = admin.describe_share_group(group).partitions
            assert (stats.start_offset, stats.archived, stats.dead_lettered) == (0, 1, 0)

            admin.incremental_alter_configs(
                resource, [AlterConfigOp("errors.deadletterqueue.topic.name", "delete")]
            )
            (stats,) = admin.describe_share_group(group).partitions
            assert (stats.start_offset, stats.dead_lettered) == (2, 0)
        finally:
            consumer.close()
