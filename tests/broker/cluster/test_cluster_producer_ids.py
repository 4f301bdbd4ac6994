"""Producer ids across three real broker processes (``LocalCluster``) and a real ZooKeeper.

Before ids came from ZooKeeper every broker counted from 0 on its own, so producers that
initialised on different brokers shared ids and their batches on a shared partition were
refused or dropped as duplicates; and a keyed producer had one id per broker.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from tests.broker.cluster.conftest import require_zookeeper
from tests.broker.cluster.waiting import eventually
from tidelog.broker.cluster.producer_ids import PRODUCER_ID_BLOCK_SIZE
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.client import AdminClient, Consumer, Producer, TopicPartition
from tidelog.client.keyed_producer import KeyedProducer, ProducerRecord
from tidelog.client.types import ConsumerRecord
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc

pytestmark = pytest.mark.slow
TIMEOUT_S = 10


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    with LocalCluster(brokers=3, session_timeout_ms=3_000) as running:
        yield running


def init_producer_id(
    cluster: LocalCluster, broker_id: int, producer_id: int = -1, epoch: int = -1
) -> tuple[int, int]:
    """InitProducerId sent to one broker, whichever it is."""
    with grpc.insecure_channel(cluster.address(broker_id)) as channel:
        answer = pb_grpc.BrokerStub(channel).InitProducerId(
            pb.InitProducerIdRequest(producer_id=producer_id, producer_epoch=epoch),
            timeout=TIMEOUT_S,
        )
    return answer.producer_id, answer.producer_epoch


def test_new_ids_from_different_brokers_are_distinct(cluster: LocalCluster) -> None:
    answers = {
        broker_id: [init_producer_id(cluster, broker_id) for _ in range(3)]
        for broker_id in cluster.broker_ids
    }
    ids = [pid for got in answers.values() for pid, _ in got]
    assert len(set(ids)) == len(ids), answers
    # Each broker draws from a block of its own.
    blocks = {
        broker_id: {pid // PRODUCER_ID_BLOCK_SIZE for pid, _ in got}
        for broker_id, got in answers.items()
    }
    assert all(len(b) == 1 for b in blocks.values())
    assert len(set().union(*blocks.values())) == 3
    # An epoch bump may go to a broker that did not hand the id out.
    pid, epoch = answers[1][0]
    assert init_producer_id(cluster, 2, pid, epoch) == (pid, epoch + 1)
    assert init_producer_id(cluster, 3, pid, epoch + 1) == (pid, epoch + 2)


def test_idempotent_producers_on_different_brokers_share_a_partition(
    cluster: LocalCluster,
) -> None:
    with AdminClient(cluster.address(1), request_timeout_ms=20_000) as admin:
        eventually(lambda: len(admin.describe_cluster().brokers) == 3)
        admin.create_topic("shared", 1, replication_factor=1)
        eventually(lambda: admin.describe_topic("shared").partitions[0].leader > 0)
    producers = [
        Producer(cluster.address(broker_id), acks="all", enable_idempotence=True)
        for broker_id in cluster.broker_ids
    ]
    try:
        futures = [
            producer.send("shared", b"%d-%d" % (index, n), partition=0)
            for n in range(20)
            for index, producer in enumerate(producers)
        ]
        for future in futures:
            future.result(timeout=30)
    finally:
        for producer in producers:
            producer.close()
    records: list[ConsumerRecord] = []
    with Consumer(cluster.address(1), auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("shared", 0)])
        deadline = time.monotonic() + 30
        while len(records) < 60 and time.monotonic() < deadline:
            records += consumer.poll(timeout_ms=200)
    # With one id for all three, the second and third producers' batches would have been
    # refused (out of order) or dropped as duplicates of the first one's.
    assert sorted(r.value for r in records if r.value is not None) == sorted(
        b"%d-%d" % (index, n) for n in range(20) for index in range(3)
    )


def test_a_keyed_producer_has_one_id_whichever_broker_it_asks(cluster: LocalCluster) -> None:
    key = "spark:query-1:0:0"
    ids = []
    for broker_id in cluster.broker_ids:
        for _ in range(broker_id):  # brokers that counted on their own would now disagree
            init_producer_id(cluster, broker_id)
        with KeyedProducer(cluster.address(broker_id), key) as producer:
            ids.append(producer.producer_id)
    assert len(set(ids)) == 1, ids
    with KeyedProducer(cluster.address(1), "spark:query-1:1:0") as other:
        assert other.producer_id != ids[0]
    # What one task attempt stored through broker 1 is seen by the next one through
    # broker 3, so it skips it: effectively once across brokers.
    with AdminClient(cluster.address(1), request_timeout_ms=20_000) as admin:
        eventually(lambda: len(admin.describe_cluster().brokers) == 3)
        admin.create_topic("keyed", 1, replication_factor=1)
        eventually(lambda: admin.describe_topic("keyed").partitions[0].leader > 0)
    # Broker 3 answers metadata from its own view, which may learn the topic a moment
    # later (UNKNOWN_TOPIC_OR_PARTITION until then, retriable, as Kafka's); CI caught it.
    with AdminClient(cluster.address(3), request_timeout_ms=20_000) as admin:
        eventually(lambda: admin.describe_topic("keyed").partitions[0].leader > 0)
    tp = TopicPartition("keyed", 0)
    records = [ProducerRecord(None, b"%d" % n) for n in range(5)]
    with KeyedProducer(cluster.address(1), key) as first:
        first.write_once({tp: records[:3]}, epoch=7)
    with KeyedProducer(cluster.address(3), key) as second:
        assert second.stored_sequences([tp], 7) == {tp: 3}
        summary = second.write_once({tp: records}, epoch=7)
    assert summary.skipped == 3
    assert summary.written == 2


def test_a_broker_killed_mid_block_hands_out_no_id_twice(cluster: LocalCluster) -> None:
    before = [init_producer_id(cluster, broker_id)[0] for broker_id in cluster.broker_ids]
    cluster.kill(2)  # SIGKILL: broker 2's block is only partly used
    cluster.start_broker(2)
    after: list[int] = []

    def ask_broker_2() -> bool:
        after.append(init_producer_id(cluster, 2)[0])
        return True

    eventually(ask_broker_2)
    # Its next life claims a fresh block after every block claimed so far.
    assert after[0] > max(before)
    assert after[0] % PRODUCER_ID_BLOCK_SIZE == 0
    # A key survives the death too: it lives in ZooKeeper, not on the broker.
    with KeyedProducer(cluster.address(1), "spark:query-1:0:0") as one:
        expected = one.producer_id
    with KeyedProducer(cluster.address(2), "spark:query-1:0:0") as two:
        assert two.producer_id == expected
