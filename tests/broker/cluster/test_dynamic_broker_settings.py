"""Dynamic broker configs that Kafka changes live and Tidelog now does too (#27):
``unclean.leader.election.enable`` and ``min.insync.replicas`` as cluster-wide defaults
(read by the controller's elections and by produce), and the replication throttles
``leader.replication.throttled.rate`` / ``follower.replication.throttled.rate`` (read by
the leaders and the replica fetchers), each set and removed without a restart on three
broker processes."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from tests.broker.cluster.conftest import require_zookeeper
from tests.broker.cluster.waiting import eventually
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.client import AdminClient, Producer, TopicPartition
from tidelog.client.grpc_connection import grpc_connections
from tidelog.client.types import AlterConfigOp, ConfigResource
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.errors import NotEnoughReplicasError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
TIMEOUT_MS = 20_000


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    settings = {
        "replica.lag.time.max.ms": 3_000,
        "replica.fetch.backoff.ms": 200,
        "auto.leader.rebalance.enable": "false",
    }
    with LocalCluster(brokers=3, session_timeout_ms=3_000, settings=settings) as running:
        yield running


def admin(cluster: LocalCluster) -> AdminClient:
    return AdminClient(cluster.bootstrap, request_timeout_ms=TIMEOUT_MS)


def set_default(cluster: LocalCluster, changes: list[AlterConfigOp]) -> None:
    with admin(cluster) as client:
        client.incremental_alter_configs(ConfigResource.broker(), changes)


def described(cluster: LocalCluster, broker_id: int, key: str) -> tuple[str | None, str, bool]:
    with admin(cluster) as client:
        entry = client.describe_configs(ConfigResource.broker(broker_id), [key])[key]
    return entry.value, entry.source, entry.read_only


def leader_seen_by(cluster: LocalCluster, broker_id: int, topic: str) -> int:
    """The leader of ``topic``-0 in broker ``broker_id``'s view (-1: offline)."""
    connect = grpc_connections(
        client_id="test", request_timeout_ms=TIMEOUT_MS, reconnect_backoff_max_ms=500
    )
    connection = connect(cluster.address(broker_id))
    try:
        return connection.describe_topic(topic, timeout_ms=TIMEOUT_MS).partitions[0].leader
    finally:
        connection.close()


def test_unclean_election_enabled_cluster_wide_lets_a_stale_replica_lead(
    cluster: LocalCluster,
) -> None:
    with admin(cluster) as client:
        client.create_topic("stale", 1, {"min.insync.replicas": "1"}, replication_factor=2)
        eventually(lambda: len(client.describe_topic("stale").partitions[0].isr) == 2, 60)
        placed = client.describe_topic("stale").partitions[0]
    leader = placed.leader
    (stale,) = (b for b in placed.replicas if b != leader)
    cluster.kill(stale)
    with AdminClient(cluster.address(leader), request_timeout_ms=TIMEOUT_MS) as client:
        eventually(lambda: client.describe_topic("stale").partitions[0].isr == (leader,), 60)
    with Producer(cluster.address(leader), acks="all") as producer:
        producer.send("stale", b"only-on-the-leader", partition=0).result(timeout=30)
    cluster.kill(leader)
    cluster.start_broker(stale)
    survivors = ",".join(cluster.address(b) for b in cluster.broker_ids if b != leader)
    try:
        with AdminClient(survivors, request_timeout_ms=TIMEOUT_MS) as client:
            eventually(lambda: stale in {b.id for b in client.describe_cluster().brokers}, 60)
            # Once the old leader's session is gone: out of the ISR, the stale replica may
            # not lead, the partition is offline.
            eventually(lambda: leader_seen_by(cluster, stale, "stale") == -1, 60)
            # The cluster-wide default, changed live (the topic sets none of its own).
            client.incremental_alter_configs(
                ConfigResource.broker(),
                [AlterConfigOp("unclean.leader.election.enable", "set", "true")],
            )
            eventually(lambda: leader_seen_by(cluster, stale, "stale") == stale, 60)
            value, source, read_only = described(cluster, stale, "unclean.leader.election.enable")
            assert (value, source, read_only) == ("true", "DYNAMIC_DEFAULT_BROKER_CONFIG", False)
    finally:
        set_default(cluster, [AlterConfigOp("unclean.leader.election.enable", "delete")])
        cluster.start_broker(leader)


def test_min_insync_replicas_changed_cluster_wide_applies_to_acks_all(
    cluster: LocalCluster,
) -> None:
    for broker in cluster.broker_ids:
        if not cluster.is_running(broker):
            cluster.start_broker(broker)
    with admin(cluster) as client:
        eventually(lambda: len(client.describe_cluster().brokers) == 3, 60)
        client.create_topic("mir", 1, replication_factor=2)
        eventually(lambda: len(client.describe_topic("mir").partitions[0].isr) == 2, 60)
    with Producer(cluster.bootstrap, acks="all", retries=0) as producer:
        producer.send("mir", b"two in sync", partition=0).result(timeout=30)
        set_default(cluster, [AlterConfigOp("min.insync.replicas", "set", "3")])

        def refused() -> bool:
            try:
                producer.send("mir", b"x", partition=0).result(timeout=30)
            except NotEnoughReplicasError:
                return True
            return False

        eventually(refused, 60)
        set_default(cluster, [AlterConfigOp("min.insync.replicas", "delete")])
        eventually(lambda: not refused(), 60)


def _fetch_as(cluster: LocalCluster, leader: int, replica: int, topic: str) -> bytes | None:
    """A follower's fetch of ``topic``-0 from offset 0, as broker ``replica``, without
    waiting: what the leader's throttle lets through now (None: refused)."""
    with grpc.insecure_channel(cluster.address(leader)) as channel:
        answer = pb_grpc.BrokerStub(channel).Fetch(
            pb.FetchRequest(
                max_wait_ms=0,
                min_bytes=0,
                replica_id=replica,
                partitions=[
                    pb.FetchPartition(
                        topic=topic, partition=0, fetch_offset=0, partition_max_bytes=1 << 20
                    )
                ],
            ),
            timeout=10,
        )
    (result,) = answer.results
    if result.error_code:  # the leader's view does not show the reassignment yet
        return None
    return bytes(result.records)


def test_replication_throttles_set_live_slow_a_reassignment_and_lifted_let_it_finish(
    cluster: LocalCluster,
) -> None:
    """At 1 byte/s the leader answers an adding replica's fetches with no records once
    its second of credit is spent (the first batch always goes whole, then the debt
    lasts for days): the move cannot finish. Lifted live, it does."""
    for broker in cluster.broker_ids:
        if not cluster.is_running(broker):
            cluster.start_broker(broker)
    with admin(cluster) as client:
        eventually(lambda: len(client.describe_cluster().brokers) == 3, 60)
        client.create_topic("throttled", 1, replication_factor=1)
        leader = client.describe_topic("throttled").partitions[0].leader
    adding = next(b for b in cluster.broker_ids if b != leader)
    with Producer(cluster.address(leader), acks="all") as producer:
        for i in range(20):  # 20 batches of 1 KB
            producer.send("throttled", b"%04d" % i + b"x" * 1_000, partition=0).result(30)
    rates = ["leader.replication.throttled.rate", "follower.replication.throttled.rate"]
    set_default(cluster, [AlterConfigOp(key, "set", "1") for key in rates])
    for broker in cluster.broker_ids:
        for key in rates:
            eventually(
                lambda b=broker, k=key: (
                    described(cluster, b, k) == ("1", "DYNAMIC_DEFAULT_BROKER_CONFIG", False)
                )
            )
    tp = TopicPartition("throttled", 0)
    try:
        with admin(cluster) as client:
            assert client.alter_partition_reassignments({tp: [leader, adding]}) == {tp: None}
        # Throttled: the adding replica's fetches get nothing (its own fetcher spent
        # the budget, or this fetch spends it), while a consumer's would.
        eventually(lambda: _fetch_as(cluster, leader, adding, "throttled") == b"")
        with admin(cluster) as client:
            assert tp in client.list_partition_reassignments([tp])
    finally:
        set_default(cluster, [AlterConfigOp(key, "delete") for key in rates])
    eventually(lambda: bool(_fetch_as(cluster, leader, adding, "throttled")))

    def moved() -> bool:
        with admin(cluster) as client:
            found = client.describe_topic("throttled").partitions[0]
            return not client.list_partition_reassignments([tp]) and set(found.isr) == {
                leader,
                adding,
            }

    eventually(moved, 60)
    value, source, _ = described(cluster, adding, rates[0])
    assert (value, source) == ("0", "DEFAULT_CONFIG")
