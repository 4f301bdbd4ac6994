"""DeleteRecords (KIP-107) is answered as soon as the followers can follow, not when their
parked fetches time out: three broker processes whose followers long-poll their leader for
up to 20 s (``replica.fetch.wait.max.ms``), and DeleteRecords asked with an 8 s timeout,
on both listeners. The leader's log start moving wakes the followers' parked fetches
(``broker.core.fetch``); each learns the new start, checkpoints it and reports it in its
next fetch, which completes the parked DeleteRecords (``broker.core.delete_records``).
Without the wake-up the followers would learn it 20 s later and the answer would be
``REQUEST_TIMED_OUT``: the test asserts the answers and every replica's checkpointed log
start, never a duration.
"""

from __future__ import annotations

from collections.abc import Iterator

import confluent_kafka
import confluent_kafka.admin
import pytest

from tests.broker.cluster.conftest import require_zookeeper
from tests.broker.cluster.test_delete_records_processes import TOPIC, checkpointed_start
from tests.broker.cluster.test_replication_processes import create_replicated
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.client import AdminClient, Producer, TopicPartition

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

FETCH_WAIT_S = 20
DELETE_TIMEOUT_MS = 8_000


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    settings = {
        # A caught-up follower's fetch waits this long at its leader's log end ...
        "replica.fetch.wait.max.ms": FETCH_WAIT_S * 1000,
        # ... and stays in the ISR meanwhile.
        "replica.lag.time.max.ms": 120_000,
    }
    with LocalCluster(brokers=3, session_timeout_ms=3_000, settings=settings, kafka=True) as c:
        yield c


def test_followers_parked_at_the_log_end_follow_a_delete_at_once(cluster: LocalCluster) -> None:
    tp = TopicPartition(TOPIC, 0)
    with AdminClient(cluster.bootstrap, request_timeout_ms=20_000) as admin:
        create_replicated(admin, TOPIC, 1, **{"min.insync.replicas": "2"})
        with Producer(cluster.bootstrap, acks="all", linger_ms=2) as producer:
            # The first one waits until the followers' fetchers, parked on the other
            # partitions they follow, come back and fetch the new one too (a fetcher
            # does not cut its long poll short for a partition added meanwhile).
            producer.send(TOPIC, b"first", partition=0).result(timeout=FETCH_WAIT_S * 2)
            for i in range(1, 50):
                producer.send(TOPIC, b"%d" % i, partition=0).result(timeout=30)
        # Every follower has it all (acks=all): their next fetches park at the log end.
        assert admin.delete_records({tp: 20}, timeout_ms=DELETE_TIMEOUT_MS) == {tp: 20}
        assert {b: checkpointed_start(cluster, b) for b in cluster.broker_ids} == dict.fromkeys(
            cluster.broker_ids, 20
        )

    # The Kafka listener's DeleteRecords waits in the purgatory the same way.
    kafka_admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    futures = kafka_admin.delete_records(
        [confluent_kafka.TopicPartition(TOPIC, 0, 35)],
        request_timeout=30,
        operation_timeout=DELETE_TIMEOUT_MS / 1000,
    )
    (future,) = futures.values()
    assert future.result(30).low_watermark == 35
    assert {b: checkpointed_start(cluster, b) for b in cluster.broker_ids} == dict.fromkeys(
        cluster.broker_ids, 35
    )
