"""The committed leader epoch survives a coordinator move (issue #25 item 3), a real
leader change shows in OffsetForLeaderEpoch, and Tidelog's consumer detects a real
truncation (an unclean election) instead of reading past it: three broker processes on a
real ZooKeeper."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from tests.broker.cluster.conftest import require_zookeeper
from tests.broker.cluster.waiting import eventually
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.client import AdminClient, Consumer, LogTruncationError, Producer, TopicPartition
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
TIMEOUT_S = 10


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    settings = {"offsets.topic.num.partitions": 1, "replica.fetch.backoff.ms": 200}
    with LocalCluster(brokers=3, session_timeout_ms=3_000, settings=settings) as running:
        yield running


def _stub(cluster: LocalCluster, broker_id: int) -> pb_grpc.BrokerStub:
    return pb_grpc.BrokerStub(grpc.insecure_channel(cluster.address(broker_id)))


def _coordinator(cluster: LocalCluster, via: int) -> int:
    request = pb.FindCoordinatorRequest(group_id="g")
    return int(_stub(cluster, via).FindCoordinator(request, timeout=TIMEOUT_S).coordinator.id)


def _committed(cluster: LocalCluster, broker_id: int) -> list[tuple[int, int, int]]:
    answer = _stub(cluster, broker_id).OffsetFetch(
        pb.OffsetFetchRequest(group_id="g"), timeout=TIMEOUT_S
    )
    return [(o.partition, o.offset, o.leader_epoch) for o in answer.offsets]


def _epoch_end(cluster: LocalCluster, broker_id: int, epoch: int) -> tuple[str, int, int]:
    answer = _stub(cluster, broker_id).OffsetForLeaderEpoch(
        pb.OffsetForLeaderEpochRequest(
            partitions=[
                pb.OffsetForLeaderEpochPartition(topic="t", partition=0, leader_epoch=epoch)
            ]
        ),
        timeout=TIMEOUT_S,
    )
    (result,) = answer.results
    return result.error_code, result.leader_epoch, result.end_offset


def test_the_epoch_survives_a_coordinator_move_and_leader_epochs_end_where_they_did(
    cluster: LocalCluster,
) -> None:
    with AdminClient(cluster.bootstrap, request_timeout_ms=20_000) as admin:
        eventually(lambda: len(admin.describe_cluster().brokers) == 3, 60)
        admin.create_topic("t", 1, {"min.insync.replicas": "2"}, replication_factor=3)
        eventually(lambda: len(admin.describe_topic("t").partitions[0].isr) == 3, 60)
    with Producer(cluster.bootstrap, acks="all") as producer:
        for i in range(5):
            producer.send("t", b"r%d" % i, partition=0).result(timeout=30)
    with AdminClient(cluster.bootstrap, request_timeout_ms=20_000) as admin:
        placed = admin.describe_topic("t").partitions[0]
    first_epoch, first_leader = placed.leader_epoch, placed.leader
    assert _epoch_end(cluster, first_leader, first_epoch) == ("", first_epoch, 5)

    coordinator = _coordinator(cluster, 1)
    answer = _stub(cluster, coordinator).OffsetCommit(
        pb.OffsetCommitRequest(
            group_id="g",
            offsets=[
                pb.CommittedOffset(topic="t", partition=0, offset=5, leader_epoch=first_epoch)
            ],
        ),
        timeout=TIMEOUT_S,
    )
    assert [r.error_code for r in answer.results] == [""]

    # The coordinator dies: another broker loads the offsets partition from its replica.
    cluster.kill(coordinator)
    survivor = next(b for b in cluster.broker_ids if b != coordinator)

    def moved() -> bool:
        try:
            return _coordinator(cluster, survivor) not in (-1, coordinator)
        except grpc.RpcError:
            return False

    eventually(moved, 60)
    successor = _coordinator(cluster, survivor)

    def loaded() -> list[tuple[int, int, int]] | None:
        try:
            return _committed(cluster, successor)
        except grpc.RpcError:
            return None  # COORDINATOR_LOAD_IN_PROGRESS / NOT_COORDINATOR meanwhile

    eventually(lambda: loaded() is not None, 60)
    assert _committed(cluster, successor) == [(0, 5, first_epoch)]

    # If "t"-0's leader died with it, the new leader is at a newer epoch and knows where
    # the old one ended; either way the committed epoch ends at offset 5.
    with AdminClient(
        ",".join(cluster.address(b) for b in cluster.broker_ids if b != coordinator),
        request_timeout_ms=20_000,
    ) as admin:
        eventually(lambda: admin.describe_topic("t").partitions[0].leader not in (-1, coordinator))
        placed = admin.describe_topic("t").partitions[0]
    assert _epoch_end(cluster, placed.leader, first_epoch) == ("", first_epoch, 5)
    if placed.leader_epoch > first_epoch:
        assert _epoch_end(cluster, placed.leader, placed.leader_epoch)[1] == placed.leader_epoch
    cluster.start_broker(coordinator)


def test_the_consumer_detects_a_truncation_by_an_unclean_election(cluster: LocalCluster) -> None:
    """Leader A takes records alone (follower B dead, out of the ISR), a consumer reads
    and commits them; A dies, B comes back and is elected uncleanly without them and
    takes new records at the same offsets. A consumer resuming from the commit must not
    read on from there: it raises LogTruncationError naming where the logs diverged."""
    for broker in cluster.broker_ids:
        if not cluster.is_running(broker):
            cluster.start_broker(broker)
    tp = TopicPartition("u", 0)
    config = {"min.insync.replicas": "1", "unclean.leader.election.enable": "true"}
    with AdminClient(cluster.bootstrap, request_timeout_ms=20_000) as admin:
        eventually(lambda: len(admin.describe_cluster().brokers) == 3, 60)
        admin.create_topic("u", 1, config, replication_factor=2)
        eventually(lambda: len(admin.describe_topic("u").partitions[0].isr) == 2, 60)
        placed = admin.describe_topic("u").partitions[0]
    leader = placed.leader
    (follower,) = (b for b in placed.replicas if b != leader)
    with Producer(cluster.address(leader), acks="all") as producer:
        for i in range(3):
            producer.send("u", b"shared-%d" % i, partition=0).result(timeout=30)
    cluster.kill(follower)
    with AdminClient(cluster.address(leader), request_timeout_ms=20_000) as admin:
        eventually(lambda: admin.describe_topic("u").partitions[0].isr == (leader,), 60)
    with Producer(cluster.address(leader), acks="all") as producer:
        for i in range(3):
            producer.send("u", b"lost-%d" % i, partition=0).result(timeout=30)

    def consumer(bootstrap: str) -> Consumer:
        return Consumer(
            bootstrap, group_id="u-readers", auto_offset_reset="none", enable_auto_commit=False
        )

    with consumer(cluster.address(leader)) as first:
        first.assign([tp])
        first.seek(tp, 0)
        read: list[bytes] = []
        for _ in range(100):
            read += [r.value or b"" for r in first.poll(timeout_ms=200)]
            if len(read) >= 6:
                break
        assert read == [b"shared-0", b"shared-1", b"shared-2", b"lost-0", b"lost-1", b"lost-2"]
        first.commit()  # offset 6, with the epoch of the batches it came from

    cluster.kill(leader)
    cluster.start_broker(follower)
    survivors = ",".join(cluster.address(b) for b in cluster.broker_ids if b != leader)
    with AdminClient(survivors, request_timeout_ms=20_000) as admin:
        eventually(lambda: admin.describe_topic("u").partitions[0].leader == follower, 60)
    with Producer(survivors, acks="all") as producer:
        for i in range(4):  # offsets 3..6: the old position 6 is inside the log again
            producer.send("u", b"new-%d" % i, partition=0).result(timeout=30)
    try:
        with consumer(survivors) as second:
            second.assign([tp])
            with pytest.raises(LogTruncationError) as raised:
                second.position(tp)  # resumes at the commit, validated with the new leader
            assert raised.value.divergent_offsets == {tp: 3}
            second.seek(tp, 3)
            read = []
            for _ in range(100):
                read += [r.value or b"" for r in second.poll(timeout_ms=200)]
                if len(read) >= 4:
                    break
            assert read == [b"new-%d" % i for i in range(4)]
    finally:
        cluster.start_broker(leader)
