"""DeleteRecords (KIP-107) in a three-broker cluster: the leader answers once every
in-sync replica's log start moved (each follower learns it from a fetch answer and
checkpoints it before reporting it back), reads below it are out of range with the new
start, and it survives a follower's crash and the leader's (the new leader starts there).
"""

from __future__ import annotations

from collections.abc import Iterator

import confluent_kafka
import confluent_kafka.admin
import grpc
import pytest

from tests.broker.cluster.conftest import require_zookeeper
from tests.broker.cluster.test_replication_processes import create_replicated
from tests.broker.cluster.waiting import eventually
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.client import AdminClient, Producer, TopicPartition
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.checkpoint import LOG_START_OFFSET_CHECKPOINT, read_offsets
from tidelog.storage.errors import OffsetOutOfRangeError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TOPIC = "trimmed"


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    settings = {"replica.lag.time.max.ms": 5_000, "replica.fetch.backoff.ms": 200}
    with LocalCluster(
        brokers=3, session_timeout_ms=3_000, settings=settings, kafka=True
    ) as running:
        yield running


def checkpointed_start(cluster: LocalCluster, broker_id: int) -> int:
    """The log start broker ``broker_id`` has made durable for ``TOPIC``-0."""
    found = read_offsets(cluster.data_dir(broker_id) / LOG_START_OFFSET_CHECKPOINT)
    return found.get((TOPIC, 0), 0)


def earliest(admin: AdminClient, tp: TopicPartition) -> int:
    found = admin.list_offsets({tp: "earliest"})[tp]
    assert found is not None
    return found.offset


def fetch_below(cluster: LocalCluster, broker_id: int, offset: int) -> pb.FetchPartitionResult:
    with grpc.insecure_channel(cluster.address(broker_id)) as channel:
        answer = pb_grpc.BrokerStub(channel).Fetch(
            pb.FetchRequest(
                partitions=[pb.FetchPartition(topic=TOPIC, partition=0, fetch_offset=offset)]
            ),
            timeout=10,
        )
    (result,) = answer.results
    return result


def test_every_replica_moves_and_keeps_its_log_start(cluster: LocalCluster) -> None:
    tp = TopicPartition(TOPIC, 0)
    with AdminClient(cluster.bootstrap, request_timeout_ms=20_000) as admin:
        create_replicated(admin, TOPIC, 1, **{"min.insync.replicas": "2"})
        leader = admin.describe_topic(TOPIC).partitions[0].leader
        with Producer(cluster.bootstrap, acks="all", linger_ms=2) as producer:
            for i in range(100):
                producer.send(TOPIC, b"%d" % i, partition=0).result(timeout=30)

        assert admin.delete_records({tp: 40}) == {tp: 40}
        # Answered only once every in-sync replica's start reached 40, which each
        # checkpoints before reporting it: durable everywhere already, no waiting here.
        assert {b: checkpointed_start(cluster, b) for b in cluster.broker_ids} == dict.fromkeys(
            cluster.broker_ids, 40
        )
        assert earliest(admin, tp) == 40
        below = fetch_below(cluster, leader, 39)
        assert (below.error_code, below.log_start_offset) == ("OFFSET_OUT_OF_RANGE", 40)
        with pytest.raises(OffsetOutOfRangeError):
            admin.delete_records({tp: 101})  # above the high watermark

        # A follower crashes and comes back: its log starts at 40.
        follower = next(b for b in cluster.broker_ids if b != leader)
        cluster.kill(follower)
        cluster.start_broker(follower)
        assert checkpointed_start(cluster, follower) == 40
        eventually(lambda: all(len(p.isr) == 3 for p in admin.describe_topic(TOPIC).partitions))

        # The leader crashes: the new leader (a follower that had moved) starts at 40 too.
        cluster.kill(leader)

        def moved_on() -> bool:
            now = admin.describe_topic(TOPIC).partitions[0].leader
            return now not in (leader, -1)

        eventually(moved_on)
        new_leader = admin.describe_topic(TOPIC).partitions[0].leader
        eventually(lambda: earliest(admin, tp) == 40)
        below = fetch_below(cluster, new_leader, 39)
        assert (below.error_code, below.log_start_offset) == ("OFFSET_OUT_OF_RANGE", 40)
        # The new leader deletes further; the old leader, back, follows it.
        assert admin.delete_records({tp: 60}) == {tp: 60}  # ISR: the two live replicas
        cluster.start_broker(leader)
        eventually(lambda: checkpointed_start(cluster, leader) == 60)


def test_a_kafka_client_deletes_records_at_each_leader(cluster: LocalCluster) -> None:
    """confluent-kafka's AdminClient through the Kafka listeners: each partition's
    request goes to its leader (the client routes by Metadata), answered once its ISR
    followed."""
    with AdminClient(cluster.bootstrap, request_timeout_ms=20_000) as admin:
        create_replicated(admin, "kafka-trimmed", 3)
    with Producer(cluster.bootstrap, acks="all", linger_ms=2) as producer:
        for i in range(60):
            producer.send("kafka-trimmed", b"%d" % i, partition=i % 3).result(timeout=30)
    kafka_admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    wanted = [confluent_kafka.TopicPartition("kafka-trimmed", p, 5 + p) for p in range(3)]
    futures = kafka_admin.delete_records(wanted, operation_timeout=20)
    lows = {tp.partition: f.result(30).low_watermark for tp, f in futures.items()}
    assert lows == {0: 5, 1: 6, 2: 7}
    with AdminClient(cluster.bootstrap, request_timeout_ms=20_000) as admin:
        tps = [TopicPartition("kafka-trimmed", p) for p in range(3)]
        starts = admin.list_offsets(dict.fromkeys(tps, "earliest"))
        assert {tp.partition: found.offset for tp, found in starts.items() if found} == lows
