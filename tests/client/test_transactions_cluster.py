"""Tidelog's transactional producer in a 3-broker cluster (RF=3, ``min.insync.replicas``
2) where a partition's leader and the transaction coordinator are different brokers.

A commit whose flush timed out (the leader stopped) and that is called again must not
send EndTxn while a record of the transaction is still unsent: the coordinator would
decide the transaction without it, and the record, stored later, would land after the
transaction's marker (refused, or in no transaction at all). Found under the CDC
connector's retried commits (``tests/cdc/test_cluster_outages.py``); Kafka's sender holds
EndTxn while batches are incomplete.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from tests.broker.cluster.conftest import require_zookeeper
from tests.broker.cluster.waiting import eventually
from tests.cdc.topics import read_topic
from tests.kafka.test_transactions_cluster import coordinator_of, placement
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.client.admin import AdminClient
from tidelog.client.producer import Producer
from tidelog.storage.errors import KafkaTimeoutError

pytestmark = pytest.mark.timeout(180)

TOPIC = "txn-retried-commit"


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    settings = {
        "default.replication.factor": 3,
        "min.insync.replicas": 2,
        "replica.lag.time.max.ms": 2_000,
        "auto.leader.rebalance.enable": "false",
    }
    with LocalCluster(3, kafka=True, session_timeout_ms=3_000, settings=settings) as running:
        yield running


def _producer_led_elsewhere(cluster: LocalCluster) -> tuple[Producer, int]:
    """A transactional producer whose coordinator is not the topic's leader; the leader."""
    leader = placement(cluster, 1, TOPIC)[0][0]
    for n in range(100):
        transactional_id = f"retried-commit-{n}"
        if coordinator_of(cluster, 1, transactional_id) not in (leader, -1):
            producer = Producer(
                cluster.bootstrap,
                transactional_id=transactional_id,
                acks="all",
                request_timeout_ms=1_000,
                max_block_ms=1_000,
            )
            producer.init_transactions(30_000)
            return producer, leader
    raise AssertionError("every id's coordinator is the leader")


def test_a_retried_commit_waits_for_the_records_in_flight(cluster: LocalCluster) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic(TOPIC, 1)
    eventually(lambda: len(placement(cluster, 1, TOPIC).get(0, (-1, []))[1]) == 3, 30)
    producer, leader = _producer_led_elsewhere(cluster)
    try:
        producer.begin_transaction()
        producer.send(TOPIC, value=b"a")
        producer.commit_transaction(30_000)

        producer.begin_transaction()
        cluster.kill(leader, signal.SIGSTOP)
        try:
            pending = producer.send(TOPIC, value=b"b")
            with pytest.raises(KafkaTimeoutError):
                producer.commit_transaction(1_000)  # b cannot be stored
            # Called again at once, the leader still stopped (a new one is elected only
            # after its ZooKeeper session expires): it may time out again, but it must
            # not return with b unsent.
            try:
                producer.commit_transaction(1_000)
                returned = True
            except KafkaTimeoutError:
                returned = False
            assert not returned or pending.done(), "committed with a record still in flight"
        finally:
            cluster.kill(leader, signal.SIGCONT)

        def committed() -> bool:
            producer.commit_transaction(2_000)
            return True

        eventually(committed, 60)
        assert pending.exception(0) is None
        producer.begin_transaction()
        producer.send(TOPIC, value=b"c")
        producer.commit_transaction(30_000)
    finally:
        producer.close(timeout_ms=1_000)
    # The commit answers once the coordinator has decided; the markers that make c
    # visible to read_committed readers are written after (as Kafka's), so wait for them.
    seen: list[list[bytes | None]] = []

    def all_visible() -> bool:
        seen.append([r.value for r in read_topic(cluster.bootstrap, TOPIC, "read_committed")])
        return seen[-1] == [b"a", b"b", b"c"]

    try:
        eventually(all_visible, 30)
    except AssertionError:
        raise AssertionError(f"read_committed reads were {seen[-3:]}") from None
