"""Share groups in a cluster (issue #32 step 2b): three broker processes on a real
ZooKeeper, an RF=3 topic whose partition leader is *not* the share coordinator of the
group's share partition (the leader of its ``__share_group_state`` partition), so every
acquisition and acknowledgement is written through ReadShareGroupState /
WriteShareGroupState to another broker.

What is proven: share consumers acknowledge records across brokers; the partition leader
SIGKILLed with records in flight loses nothing: every record acknowledged before the kill
(its commit answered without error) is never delivered again, every record not
acknowledged is delivered again by the new leader, and in the end every record produced
is acknowledged. Acquisition locks last ``LOCK_MS`` (far beyond the test's waits), so a
redelivery after the kill comes from the new leader's reload, not from a lock expiry.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.broker.cluster.conftest import partition_leaders, require_zookeeper
from tests.broker.cluster.waiting import eventually
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.broker.core.topic_ids import topic_id
from tidelog.broker.share.records import ShareStateKey, partition_for
from tidelog.broker.share.state_log import SHARE_STATE_TOPIC
from tidelog.client import AdminClient, ConsumerRecord, Producer, ShareConsumer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TOPIC = "jobs"
RECORDS = 60
STATE_PARTITIONS = 5
LOCK_MS = 600_000
SETTINGS = {
    "offsets.topic.num.partitions": 1,
    "replica.fetch.backoff.ms": 200,
    "share.coordinator.state.topic.num.partitions": STATE_PARTITIONS,
    "group.share.min.heartbeat.interval.ms": 100,
    "group.share.heartbeat.interval.ms": 100,
    "group.share.min.session.timeout.ms": 1_000,
    "group.share.session.timeout.ms": 20_000,
    "group.share.max.record.lock.duration.ms": LOCK_MS,
    "group.share.record.lock.duration.ms": LOCK_MS,
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    with LocalCluster(brokers=3, session_timeout_ms=3_000, settings=SETTINGS) as running:
        yield running


def _group_coordinated_elsewhere(state_leaders: dict[int, int], leader: int) -> str:
    """A group id whose share partition of ``TOPIC``-0 keeps its state on a state
    partition that ``leader`` does not lead."""
    for n in range(1_000):
        group = f"workers-{n}"
        key = ShareStateKey(group, topic_id(TOPIC), 0)
        if state_leaders[partition_for(key, STATE_PARTITIONS)] not in (leader, -1):
            return group
    raise AssertionError("no group id maps to a state partition led elsewhere")


def _poll_and_ack(
    consumer: ShareConsumer, acknowledged: set[bytes], seen_after_ack: list[bytes]
) -> list[ConsumerRecord]:
    """One poll; every record accepted and committed. Values whose commit was answered
    without error join ``acknowledged``; a value delivered again after that is recorded."""
    records = consumer.poll(2_000)
    for record in records:
        assert record.value is not None
        if record.value in acknowledged:
            seen_after_ack.append(record.value)
        consumer.acknowledge(record, "accept")
    outcomes = consumer.commit_sync()
    ok = {tp for tp, error in outcomes.items() if error is None}
    for record in records:
        assert record.value is not None
        if (record.topic, record.partition) in {(tp.topic, tp.partition) for tp in ok}:
            acknowledged.add(record.value)
    return records


def test_acknowledgements_survive_a_partition_leader_sigkill_with_a_remote_coordinator(
    cluster: LocalCluster,
) -> None:
    with AdminClient(cluster.bootstrap, request_timeout_ms=20_000) as admin:
        eventually(lambda: len(admin.describe_cluster().brokers) == 3, 60)
        admin.create_topic(TOPIC, 1, {"min.insync.replicas": "2"}, replication_factor=3)
        eventually(lambda: len(admin.describe_topic(TOPIC).partitions[0].isr) == 3, 60)
        eventually(lambda: -1 not in partition_leaders(admin, SHARE_STATE_TOPIC).values(), 60)
        leader = partition_leaders(admin, TOPIC)[0]
        state_leaders = partition_leaders(admin, SHARE_STATE_TOPIC)
    group = _group_coordinated_elsewhere(state_leaders, leader)
    coordinator = state_leaders[
        partition_for(ShareStateKey(group, topic_id(TOPIC), 0), STATE_PARTITIONS)
    ]
    assert coordinator != leader

    first = ShareConsumer(
        cluster.bootstrap,
        group,
        max_poll_records=10,
        request_timeout_ms=15_000,
        acknowledgement_mode="explicit",
    )
    second = ShareConsumer(
        cluster.bootstrap,
        group,
        max_poll_records=10,
        request_timeout_ms=15_000,
        acknowledgement_mode="explicit",
    )
    try:
        first.subscribe([TOPIC])
        second.subscribe([TOPIC])
        # The group starts at the log end: each member fetches once (the share
        # partition's start is written at the coordinator) before anything is produced.
        first.poll(500)
        second.poll(500)
        values = [b"job-%03d" % i for i in range(RECORDS)]
        with Producer(cluster.bootstrap, acks="all") as producer:
            for value in values:
                producer.send(TOPIC, value, partition=0).result(timeout=30)

        acknowledged: set[bytes] = set()
        seen_after_ack: list[bytes] = []
        eventually(
            lambda: (
                bool(_poll_and_ack(first, acknowledged, seen_after_ack)) and len(acknowledged) >= 20
            ),
            60,
        )
        before_kill = set(acknowledged)
        # Records in flight at the kill: acquired by the second member, never acknowledged.
        in_flight = [r.value for r in second.poll(5_000)]
        assert in_flight, "the second member holds records when the leader dies"
        assert not set(in_flight) & before_kill

        cluster.kill(leader)
        with AdminClient(cluster.bootstrap, request_timeout_ms=20_000) as admin:
            eventually(lambda: partition_leaders(admin, TOPIC)[0] not in (leader, -1), 60)

        # The survivors finish the work: each record not yet acknowledged comes back
        # (the in-flight ones from the reload, not a lock expiry), none acknowledged does.
        def done() -> bool:
            _poll_and_ack(first, acknowledged, seen_after_ack)
            return acknowledged >= set(values)

        eventually(done, 120)
    finally:
        first.close()
        second.close()

    assert not seen_after_ack, f"acknowledged records delivered again: {seen_after_ack}"
    assert before_kill <= acknowledged
    assert set(in_flight) <= acknowledged
