"""A dead follower leaves the ISR at the same leader epoch, between real broker processes.

The controller removes a dead broker from every ISR it was in without bumping the leader
epoch (KRaft's rule since KAFKA-15021, ``broker.cluster.election``); the leader takes the
smaller ISR from its metadata view (``Partition.update_isr``) and ``acks=all`` goes on.
``replica.lag.time.max.ms`` is long here, so the leader's own lag check cannot be what
shrinks the ISR within the test: a leader that ignored the controller's ISR at its epoch
would hold every ``acks=all`` write for the dead follower (and its own later shrink,
made from the old ISR, would be refused by ZooKeeper).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.broker.cluster.conftest import require_zookeeper
from tests.broker.cluster.waiting import eventually
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.client import AdminClient, Consumer, Producer, TopicPartition

pytestmark = pytest.mark.slow

TOPIC = "follower-dies"


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    settings = {"replica.lag.time.max.ms": 120_000, "replica.fetch.backoff.ms": 200}
    with LocalCluster(brokers=3, session_timeout_ms=3_000, settings=settings) as running:
        yield running


def test_a_killed_follower_leaves_the_isr_at_the_same_epoch_and_acks_all_goes_on(
    cluster: LocalCluster,
) -> None:
    with AdminClient(cluster.address(1), request_timeout_ms=20_000) as admin:
        eventually(lambda: len(admin.describe_cluster().brokers) == 3)
        admin.create_topic(TOPIC, 1, replication_factor=3, config={"min.insync.replicas": "2"})
        eventually(lambda: len(admin.describe_topic(TOPIC).partitions[0].isr) == 3)
        before = admin.describe_topic(TOPIC).partitions[0]
        controller = admin.describe_cluster().controller_id
    # A follower that is not the controller: its death is the controller's doing alone.
    follower = next(b for b in before.replicas if b not in (before.leader, controller))
    others = [b for b in cluster.broker_ids if b != follower]
    bootstrap = ",".join(cluster.address(b) for b in others)
    with Producer(bootstrap, acks="all", linger_ms=2, delivery_timeout_ms=60_000) as producer:
        for i in range(100):
            producer.send(TOPIC, b"%d" % i).result(timeout=30)
        cluster.kill(follower)
        started = time.monotonic()
        for i in range(100, 200):
            producer.send(TOPIC, b"%d" % i).result(timeout=60)
        took = time.monotonic() - started
    # Well before the leader's own lag check (120 s) could have dropped the follower.
    assert took < 60, took
    with AdminClient(bootstrap, request_timeout_ms=20_000) as admin:
        after = admin.describe_topic(TOPIC).partitions[0]
        assert after.leader == before.leader
        assert after.leader_epoch == before.leader_epoch  # no new epoch for an ISR shrink
        assert follower not in after.isr
        assert len(after.isr) == 2
    cluster.start_broker(follower)
    with AdminClient(bootstrap, request_timeout_ms=20_000) as admin:
        # Back: it catches up and the leader writes it into the ISR again (a write made
        # from the ISR the controller left, so ZooKeeper takes it).
        eventually(lambda: len(admin.describe_topic(TOPIC).partitions[0].isr) == 3, 60)
        assert admin.describe_topic(TOPIC).partitions[0].leader_epoch == before.leader_epoch
    values: list[int] = []
    with Consumer(cluster.address(follower), auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(TOPIC, 0)])
        deadline = time.monotonic() + 30
        while len(values) < 200 and time.monotonic() < deadline:
            values += [int(r.value or b"") for r in consumer.poll(timeout_ms=200)]
    assert values == list(range(200))
