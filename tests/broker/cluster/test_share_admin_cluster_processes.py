"""Share-group offset admin in a cluster (issue #32): three broker processes on a real
ZooKeeper, where the group's coordinator (the leader of ``__consumer_offsets``), the share
coordinator of its share partition (the leader of the key's ``__share_group_state``
partition) and the topic partition's leader are three different brokers, so every admin
call crosses brokers: ReadShareGroupStateSummary and DeleteShareGroupState at the share
coordinator, InitializeShareGroupState with a newer state epoch (an alter), and
DescribeSharePartition at the leader (high watermark, statistics, dropping memory that an
alter or a delete made stale).

What is proven, through ``AdminClient`` and once through the Kafka listener's own codec:
describe (start offset, lag, the leader's statistics), alter (a reset to the earliest
offset redelivers every record from the start to the next member; an alter to an
offset), delete offsets (the
group has no share partition left) and delete group (its state gone at the share
coordinator); and, with the state reset at the share coordinator behind the leader's
back, the leader's next write fenced by the state epoch and the share partition reloaded.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest

from tests.broker.cluster.conftest import partition_leaders, require_zookeeper
from tests.broker.cluster.waiting import eventually
from tests.kafka import raw
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.broker.core.topic_ids import topic_id
from tidelog.broker.groups.offset_store import OFFSETS_TOPIC
from tidelog.broker.share.records import ShareStateKey, partition_for
from tidelog.broker.share.state_log import SHARE_STATE_TOPIC
from tidelog.client import AdminClient, Producer, ShareConsumer, TopicPartition
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.errors import GroupIdNotFoundError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TOPIC = "tasks"
TP = TopicPartition(TOPIC, 0)
RECORDS = 10
STATE_PARTITIONS = 5
LOCK_MS = 600_000
DESCRIBE_OFFSETS = 90
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
    with LocalCluster(brokers=3, session_timeout_ms=3_000, settings=SETTINGS, kafka=True) as c:
        yield c


@contextmanager
def _stub(cluster: LocalCluster, broker_id: int) -> Iterator[pb_grpc.BrokerStub]:
    with grpc.insecure_channel(cluster.address(broker_id)) as channel:
        yield pb_grpc.BrokerStub(channel)


def _three_roles(
    cluster: LocalCluster, admin: AdminClient, topic: str = TOPIC
) -> tuple[int, int, int, str]:
    """Create ``topic``: (group coordinator, partition leader, share coordinator, group
    id), all three brokers different."""
    eventually(lambda: len(admin.describe_cluster().brokers) == 3, 60)
    eventually(lambda: -1 not in partition_leaders(admin, OFFSETS_TOPIC).values(), 60)
    eventually(lambda: -1 not in partition_leaders(admin, SHARE_STATE_TOPIC).values(), 60)
    coordinator = partition_leaders(admin, OFFSETS_TOPIC)[0]
    others = [b for b in cluster.broker_ids if b != coordinator]
    # The partition's preferred leader is a broker that does not coordinate the group.
    admin.create_topic(
        topic, None, {"min.insync.replicas": "2"}, replica_assignment=[[*others, coordinator]]
    )
    eventually(lambda: len(admin.describe_topic(topic).partitions[0].isr) == 3, 60)
    eventually(lambda: partition_leaders(admin, topic)[0] == others[0], 60)
    leader = others[0]
    state_leaders = partition_leaders(admin, SHARE_STATE_TOPIC)
    for n in range(1_000):
        group = f"{topic}-admins-{n}"
        state = state_leaders[
            partition_for(ShareStateKey(group, topic_id(topic), 0), STATE_PARTITIONS)
        ]
        if state not in (coordinator, leader, -1):
            return coordinator, leader, state, group
    raise AssertionError("no group id maps to a state partition led by the third broker")


def _consume_all(consumer: ShareConsumer, expected: set[bytes]) -> list[bytes]:
    """Poll and accept until every value of ``expected`` was acknowledged; every value
    delivered, in order of delivery."""
    delivered: list[bytes] = []
    acknowledged: set[bytes] = set()

    def done() -> bool:
        records = consumer.poll(1_000)
        for record in records:
            assert record.value is not None
            delivered.append(record.value)
            consumer.acknowledge(record, "accept")
        outcomes = consumer.commit_sync()
        if records and all(error is None for error in outcomes.values()):
            acknowledged.update(r.value for r in records if r.value is not None)
        return acknowledged >= expected

    eventually(done, 90)
    return delivered


def _member(cluster: LocalCluster, group: str, topic: str = TOPIC) -> ShareConsumer:
    consumer = ShareConsumer(
        cluster.bootstrap,
        group,
        max_poll_records=RECORDS,
        request_timeout_ms=15_000,
        acknowledgement_mode="explicit",
    )
    consumer.subscribe([topic])
    return consumer


def _members(admin: AdminClient, group: str) -> int:
    return len(admin.describe_share_group(group).members)


def test_describe_alter_and_delete_a_share_group_across_three_brokers(
    cluster: LocalCluster,
) -> None:
    with AdminClient(cluster.bootstrap, request_timeout_ms=20_000) as admin:
        coordinator, leader, share_coordinator, group = _three_roles(cluster, admin)
        assert len({coordinator, leader, share_coordinator}) == 3

        # A first member starts the share partition at the log end (empty: 0), read back
        # through ReadShareGroupStateSummary at the share coordinator.
        first = _member(cluster, group)
        try:

            def initialized() -> bool:
                first.poll(200)
                return TP in admin.list_share_group_offsets(group)

            eventually(initialized, 60)
            values = [b"task-%02d" % i for i in range(RECORDS)]
            with Producer(cluster.bootstrap, acks="all") as producer:
                for value in values:
                    producer.send(TOPIC, value, partition=0).result(timeout=30)
            _consume_all(first, set(values))
        finally:
            first.close()
        eventually(lambda: _members(admin, group) == 0, 30)

        # Describe: the start offset and lag from the share coordinator and the leader,
        # the statistics from the leader.
        offset = admin.list_share_group_offsets(group)[TP]
        assert (offset.start_offset, offset.lag) == (RECORDS, 0)
        assert offset.leader_epoch == admin.describe_topic(TOPIC).partitions[0].leader_epoch
        (stats,) = admin.describe_share_group(group).partitions
        assert (stats.tp, stats.start_offset, stats.end_offset, stats.acquired) == (
            TP,
            RECORDS,
            RECORDS,
            0,
        )

        # Alter: reset to the earliest offset (resolved at the leader, then altered at
        # the share coordinator). The leader drops its memory; the next member gets every
        # record again.
        assert admin.reset_share_group_offsets(group, TOPIC, to_earliest=True) == {TP: 0}
        offset = admin.list_share_group_offsets(group)[TP]
        assert (offset.start_offset, offset.lag) == (0, RECORDS)
        (stats,) = admin.describe_share_group(group).partitions
        assert (stats.start_offset, stats.end_offset, stats.acknowledged) == (0, 0, 0)
        second = _member(cluster, group)
        try:
            again = _consume_all(second, set(values))
        finally:
            second.close()
        assert sorted(set(again)) == values
        eventually(lambda: _members(admin, group) == 0, 30)

        # DescribeShareGroupOffsets v1 through the Kafka listener of the group's
        # coordinator (the listener's own codec): the same answer.
        host, port = cluster.kafka_address(coordinator).rsplit(":", 1)
        with socket.create_connection((host, int(port)), 10) as sock:
            session = raw.SaslSession(sock, "share-admin")
            answer = session.call_plain(
                DESCRIBE_OFFSETS,
                1,
                {
                    "groups": [
                        {"group_id": group, "topics": [{"topic_name": TOPIC, "partitions": [0]}]}
                    ]
                },
            )
        (described,) = answer["groups"]
        assert described["error_code"] == 0
        (topic,) = described["topics"]
        (partition,) = topic["partitions"]
        assert (partition["error_code"], partition["start_offset"], partition["lag"]) == (
            0,
            RECORDS,
            0,
        )

        # Delete offsets: the group has no share partition left, its leader no memory.
        admin.delete_share_group_offsets(group, [TOPIC])
        assert admin.list_share_group_offsets(group) == {}
        assert admin.list_share_group_offsets(group, [TP])[TP].start_offset == -1
        assert admin.describe_share_group(group).partitions == ()

        # Delete the group (with state again first): the state goes at the share
        # coordinator, then the group.
        admin.alter_share_group_offsets(group, {TP: 3})
        assert admin.list_share_group_offsets(group)[TP].start_offset == 3
        admin.delete_group(group)
        with pytest.raises(GroupIdNotFoundError):
            admin.describe_share_group(group)
    key = ShareStateKey(group, topic_id(TOPIC), 0)
    with _stub(cluster, share_coordinator) as stub:
        summary = stub.ReadShareGroupStateSummary(
            pb.ReadShareGroupStateSummaryRequest(
                group_id=group, state_partition=partition_for(key, STATE_PARTITIONS)
            ),
            timeout=10,
        )
    assert list(summary.states) == []


def test_a_leader_whose_memory_predates_a_reset_is_fenced_and_reloads(
    cluster: LocalCluster,
) -> None:
    """The state-epoch fence across brokers, without the admin's notice to the leader: the
    share coordinator's state is reset behind the leader's back (InitializeShareGroupState
    with the next state epoch, as an admin's alter writes it); the leader's next write
    (an acquisition) names the epoch it loaded at, is refused (FENCED_STATE_EPOCH), and
    the leader reloads and hands out from the new start."""
    topic = "fenced"
    tp = TopicPartition(topic, 0)
    with AdminClient(cluster.bootstrap, request_timeout_ms=20_000) as admin:
        _, _, share_coordinator, group = _three_roles(cluster, admin, topic)
        member = _member(cluster, group, topic)
        try:

            def initialized() -> bool:
                member.poll(200)
                return tp in admin.list_share_group_offsets(group)

            eventually(initialized, 60)
            values = [b"old-%d" % i for i in range(5)]
            with Producer(cluster.bootstrap, acks="all") as producer:
                for value in values:
                    producer.send(topic, value, partition=0).result(timeout=30)
                _consume_all(member, set(values))
                assert admin.list_share_group_offsets(group)[tp].start_offset == 5

                key = ShareStateKey(group, topic_id(topic), 0)
                with _stub(cluster, share_coordinator) as stub:
                    (summary,) = stub.ReadShareGroupStateSummary(
                        pb.ReadShareGroupStateSummaryRequest(
                            group_id=group, state_partition=partition_for(key, STATE_PARTITIONS)
                        ),
                        timeout=10,
                    ).states
                    ref = pb.ShareStateKeyRef(
                        group_id=group,
                        topic_id=key.topic_id.bytes,
                        partition=0,
                        leader_epoch=summary.leader_epoch,
                        state_epoch=summary.state_epoch + 1,
                    )
                    reset = stub.InitializeShareGroupState(
                        pb.InitializeShareGroupStateRequest(key=ref, start_offset=0), timeout=10
                    )
                assert (reset.start_offset, reset.state_epoch) == (0, summary.state_epoch + 1)
                # The leader still holds everything as acknowledged; a new record makes it
                # write, from memory older than the reset.
                producer.send(topic, b"new", partition=0).result(timeout=30)
            again = _consume_all(member, {*values, b"new"})
        finally:
            member.close()
    assert set(values) <= set(again)
