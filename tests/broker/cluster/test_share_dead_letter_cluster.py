"""A share group's dead-letter topic in a cluster (issue #32 step 5, ``broker.core.
share_dlq`` with ``ClusterRoutes``): three broker processes on a real ZooKeeper, the
group's configs set over the wire (at its coordinator, read by the share partition's
leader from there), and the dead-letter transaction's roles on different brokers: the
transactional id's coordinator (leader of its ``__transaction_state`` partition), the
dead-letter partition's leader and the share coordinator (leader of the share
partition's ``__share_group_state`` partition) are three different brokers.

Proven:

* The group's configs, set on another broker's Kafka listener (as Kafka's tools send
  them: forwarded to the group's coordinator) or with the AdminClient (sent there), are
  described at the coordinator, and reach the share partition's leader on another
  broker; a call already forwarded is ``NOT_COORDINATOR`` elsewhere.
* With the share partition's leader also the transaction coordinator (so the copies go
  to another broker's Produce and the archiving to another broker's transactional
  WriteShareGroupState), REJECTed records and one released at the delivery limit are in
  the dead-letter topic exactly once (read_committed, nothing aborted either), with
  their headers, and never delivered again.
* With the share partition's leader also the dead-letter partition's leader (so
  InitProducerId, AddPartitionsToTxn and EndTxn go to another broker, and the archiving
  to a third) and SIGKILLed between the copy and the commit
  (``TIDELOG_DLQ_TEST_STOP_AT=after_copy``, on that broker only): after the failover
  every rejected record is in the dead-letter topic exactly once for read_committed
  readers, none is lost, and no accepted record comes back.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator

import grpc
import pytest
from kafka.protocol.admin import IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse

from tests.broker.cluster.conftest import partition_leaders, require_zookeeper
from tests.broker.cluster.waiting import eventually
from tests.client.test_share_dead_letter import read_all
from tests.kafka import raw
from tidelog.broker.cluster.peer_stubs import answered_code
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.broker.core.share_dlq import STOP_ENV
from tidelog.broker.core.topic_ids import topic_id
from tidelog.broker.groups.offset_records import partition_for as offsets_partition_for
from tidelog.broker.share.dead_letter import transactional_id
from tidelog.broker.share.records import ShareStateKey
from tidelog.broker.share.records import partition_for as state_partition_for
from tidelog.broker.share.state_log import SHARE_STATE_TOPIC
from tidelog.broker.transactions.log_records import partition_for as txn_partition_for
from tidelog.broker.transactions.txn_log import TRANSACTION_STATE_TOPIC
from tidelog.client import (
    AdminClient,
    ConsumerRecord,
    Producer,
    ShareConsumer,
)
from tidelog.client.types import AlterConfigOp, ConfigResource
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

OFFSETS_TOPIC = "__consumer_offsets"
PARTITIONS = {OFFSETS_TOPIC: 3, TRANSACTION_STATE_TOPIC: 5, SHARE_STATE_TOPIC: 5}
LOCK_MS = 600_000
KILLED = 1  # the broker carrying the test hook
SETTINGS = {
    "offsets.topic.num.partitions": PARTITIONS[OFFSETS_TOPIC],
    "transaction.state.log.num.partitions": PARTITIONS[TRANSACTION_STATE_TOPIC],
    "share.coordinator.state.topic.num.partitions": PARTITIONS[SHARE_STATE_TOPIC],
    "replica.fetch.backoff.ms": 200,
    "group.share.min.heartbeat.interval.ms": 100,
    "group.share.heartbeat.interval.ms": 100,
    "group.share.min.session.timeout.ms": 1_000,
    "group.share.session.timeout.ms": 20_000,
    "group.share.max.record.lock.duration.ms": LOCK_MS,
    "group.share.record.lock.duration.ms": LOCK_MS,
}
BROKERS = {1, 2, 3}


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    with LocalCluster(
        brokers=3,
        kafka=True,
        session_timeout_ms=3_000,
        settings=SETTINGS,
        broker_env={KILLED: {STOP_ENV: "after_copy"}},
    ) as running:
        yield running


class Roles:
    """Who leads what for one (group, topic-0): the group's coordinator, the
    transactional id's coordinator and the share coordinator."""

    def __init__(self, leaders: dict[str, dict[int, int]], group: str, topic: str) -> None:
        self.group = group
        self.coordinator = leaders[OFFSETS_TOPIC][
            offsets_partition_for(group, PARTITIONS[OFFSETS_TOPIC])
        ]
        self.transactions = leaders[TRANSACTION_STATE_TOPIC][
            txn_partition_for(
                transactional_id(group, topic, 0), PARTITIONS[TRANSACTION_STATE_TOPIC]
            )
        ]
        self.state = leaders[SHARE_STATE_TOPIC][
            state_partition_for(
                ShareStateKey(group, topic_id(topic), 0), PARTITIONS[SHARE_STATE_TOPIC]
            )
        ]


def _internal_leaders(admin: AdminClient) -> dict[str, dict[int, int]]:
    found: dict[str, dict[int, int]] = {}

    def all_led() -> bool:
        try:
            for topic in PARTITIONS:
                found[topic] = partition_leaders(admin, topic)
        except Exception:  # not created yet
            return False
        return all(
            len(found[t]) == n and -1 not in found[t].values() for t, n in PARTITIONS.items()
        )

    eventually(all_led, 90)
    return found


def _group(admin: AdminClient, prefix: str, topic: str, fits: Callable[[Roles], bool]) -> Roles:
    leaders = _internal_leaders(admin)
    for n in range(5_000):
        roles = Roles(leaders, f"{prefix}-{n}", topic)
        if fits(roles):
            return roles
    raise AssertionError(f"no group id gives the roles wanted: {leaders}")


def _create(admin: AdminClient, topic: str, leader: int) -> None:
    others = sorted(BROKERS - {leader})
    admin.create_topic(topic, replica_assignment=[[leader, *others]])
    eventually(lambda: partition_leaders(admin, topic)[0] == leader, 60)
    eventually(lambda: len(admin.describe_topic(topic).partitions[0].isr) == 3, 60)


def _group_configs(dlq: str) -> dict[str, str]:
    return {
        "errors.deadletterqueue.topic.name": dlq,
        "share.delivery.count.limit": "2",
        "share.auto.offset.reset": "earliest",
    }


def _configure(admin: AdminClient, group: str, dlq: str) -> None:
    """With Tidelog's AdminClient (gRPC, sent to the group's coordinator)."""
    admin.incremental_alter_configs(
        ConfigResource.group(group),
        [AlterConfigOp(k, "set", v) for k, v in _group_configs(dlq).items()],
    )


def _configure_on_kafka(address: str, group: str, dlq: str) -> None:
    """As ``kafka-configs.sh --entity-type groups`` does: IncrementalAlterConfigs of a
    GROUP resource (32) to whichever broker ``address`` is (the Kafka listener)."""
    alter = IncrementalAlterConfigsRequest[1]
    request = alter(
        resources=[
            alter.AlterConfigsResource(
                resource_type=32,
                resource_name=group,
                configs=[
                    alter.AlterConfigsResource.AlterableConfig(name=k, config_operation=0, value=v)
                    for k, v in _group_configs(dlq).items()
                ],
            )
        ],
        validate_only=False,
    )
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        answer = raw.call(sock, request, "test-dlq-cluster")
    assert answer is not None
    (result,) = IncrementalAlterConfigsResponse[1].decode(answer, header=True).responses
    assert result.error_code == 0, result.error_message


def _produce(bootstrap: str, topic: str, count: int) -> None:
    with Producer(bootstrap, acks="all") as producer:
        for i in range(count):
            producer.send(
                topic, key=b"k%d" % i, value=b"v%d" % i, headers=[("origin", b"%d" % i)]
            ).result(timeout=30)


def _share_consumer(bootstrap: str, group: str, topic: str) -> ShareConsumer:
    consumer = ShareConsumer(
        bootstrap, group, acknowledgement_mode="explicit", request_timeout_ms=15_000
    )
    consumer.subscribe([topic])
    return consumer


def _poll_until(consumer: ShareConsumer, offsets: set[int]) -> dict[int, ConsumerRecord]:
    got: dict[int, ConsumerRecord] = {}

    def check() -> bool:
        got.update((r.offset, r) for r in consumer.poll(timeout_ms=500))
        return offsets <= set(got)

    eventually(check, 90, interval_s=0)
    return got


def _copied_offsets(bootstrap: str, dlq: str) -> list[int]:
    copies = read_all(bootstrap, dlq, "read_committed", timeout_s=60)
    return sorted(int(dict(c.headers)["tidelog.dlq.offset"] or b"-1") for c in copies)


def test_dead_letters_exactly_once_with_each_role_on_another_broker(
    cluster: LocalCluster,
) -> None:
    topic, dlq = "jobs-a", "jobs-a-dlq"
    with AdminClient(cluster.bootstrap, request_timeout_ms=20_000) as admin:
        eventually(lambda: len(admin.describe_cluster().brokers) == 3, 60)
        # The share partition's leader coordinates the transaction; the copies and the
        # archiving go to two other brokers; the group's configs live on another too.
        roles = _group(
            admin,
            "dlq-a",
            topic,
            lambda r: (
                r.transactions != KILLED
                and r.state != r.transactions
                and r.coordinator != r.transactions
            ),
        )
        leader = roles.transactions
        (dead_letter_leader,) = BROKERS - {roles.state, roles.transactions}
        _create(admin, topic, leader)
        _create(admin, dlq, dead_letter_leader)
    assert len({roles.transactions, dead_letter_leader, roles.state}) == 3
    assert roles.coordinator != leader
    # The configs live at the group's coordinator; sent to another broker's Kafka
    # listener (as Kafka's tools send them anywhere), they are forwarded there.
    _configure_on_kafka(cluster.kafka_address(leader), roles.group, dlq)
    resource = pb.ConfigResource(type=pb.CONFIG_RESOURCE_TYPE_GROUP, name=roles.group)
    with grpc.insecure_channel(cluster.address(roles.coordinator)) as channel:
        answer = pb_grpc.BrokerStub(channel).DescribeConfigs(
            pb.DescribeConfigsRequest(resource=resource), timeout=20
        )
    assert {e.name: e.value for e in answer.entries}["errors.deadletterqueue.topic.name"] == dlq
    # A call already forwarded is answered where it lands: NOT_COORDINATOR elsewhere.
    with (
        grpc.insecure_channel(cluster.address(leader)) as channel,
        pytest.raises(grpc.RpcError) as refused,
    ):
        pb_grpc.BrokerStub(channel).DescribeConfigs(
            pb.DescribeConfigsRequest(resource=resource, forwarded=True), timeout=20
        )
    assert answered_code(refused.value) == "NOT_COORDINATOR"

    _produce(cluster.bootstrap, topic, 6)  # 0-2 rejected, 3 released twice, 4-5 accepted
    consumer = _share_consumer(cluster.bootstrap, roles.group, topic)
    try:
        first = _poll_until(consumer, set(range(6)))
        for offset in (0, 1, 2):
            consumer.acknowledge(first[offset], "reject")
        consumer.acknowledge(first[3], "release")
        consumer.acknowledge(first[4], "accept")
        consumer.acknowledge(first[5], "accept")
        assert set(consumer.commit_sync().values()) == {None}
        again = _poll_until(consumer, {3})
        assert sorted(again) == [3]
        assert consumer.delivery_count(again[3]) == 2
        consumer.acknowledge(again[3], "release")  # its 2nd delivery ends: the limit
        assert set(consumer.commit_sync().values()) == {None}

        eventually(lambda: _copied_offsets(cluster.bootstrap, dlq) == [0, 1, 2, 3], 90)
        assert consumer.poll(timeout_ms=500) == []  # none of them is delivered again
    finally:
        consumer.close()

    copies = read_all(cluster.bootstrap, dlq, "read_committed", timeout_s=60)
    assert len(copies) == 4
    for copy in copies:
        headers = dict(copy.headers)
        offset = int(headers["tidelog.dlq.offset"] or b"")
        assert (copy.key, copy.value) == (b"k%d" % offset, b"v%d" % offset)
        assert headers["origin"] == b"%d" % offset
        assert headers["tidelog.dlq.group"] == roles.group.encode()
        assert headers["tidelog.dlq.reason"] == (b"delivery-limit" if offset == 3 else b"rejected")
        assert headers["tidelog.dlq.delivery.count"] == (b"2" if offset == 3 else b"1")
    # No attempt was aborted on the way: nothing else was written there at all.
    assert len(read_all(cluster.bootstrap, dlq, "read_uncommitted", timeout_s=60)) == 4


def test_a_leader_killed_between_copy_and_commit_loses_and_duplicates_nothing(
    cluster: LocalCluster,
) -> None:
    topic, dlq = "jobs-b", "jobs-b-dlq"
    with AdminClient(cluster.bootstrap, request_timeout_ms=20_000) as admin:
        eventually(lambda: len(admin.describe_cluster().brokers) == 3, 60)
        # The share partition's leader (the hooked broker) also leads the dead-letter
        # partition; the transaction's coordinator and the share coordinator are the two
        # others, and so is the group's coordinator.
        roles = _group(
            admin,
            "dlq-b",
            topic,
            lambda r: (
                KILLED not in (r.transactions, r.state, r.coordinator) and r.transactions != r.state
            ),
        )
        _create(admin, topic, KILLED)
        _create(admin, dlq, KILLED)
        _configure(admin, roles.group, dlq)
    assert len({KILLED, roles.transactions, roles.state}) == 3

    _produce(cluster.bootstrap, topic, 6)  # 0-2 rejected, 3-5 accepted
    consumer = _share_consumer(cluster.bootstrap, roles.group, topic)
    try:
        first = _poll_until(consumer, set(range(6)))
        for offset in (0, 1, 2):
            consumer.acknowledge(first[offset], "reject")
        for offset in (3, 4, 5):
            consumer.acknowledge(first[offset], "accept")
        assert set(consumer.commit_sync().values()) == {None}

        # The leader runs the dead-letter transaction and dies after its copies and the
        # archiving are written, before EndTxn.
        eventually(lambda: not cluster.is_running(KILLED), 60)
        assert "DLQ test hook: killed at after_copy" in cluster.output(KILLED)
        with AdminClient(cluster.bootstrap, request_timeout_ms=20_000) as admin:
            eventually(lambda: partition_leaders(admin, topic)[0] not in (KILLED, -1), 60)
            eventually(lambda: partition_leaders(admin, dlq)[0] not in (KILLED, -1), 60)

        # The new leader loads the share partition when a member fetches (the open
        # transaction fenced and aborted), then dead-letters the records again.
        def copied() -> bool:
            assert consumer.poll(timeout_ms=500) == []  # nothing accepted comes back
            return _copied_offsets(cluster.bootstrap, dlq) == [0, 1, 2]

        eventually(copied, 120, interval_s=0)
    finally:
        consumer.close()

    copies = read_all(cluster.bootstrap, dlq, "read_committed", timeout_s=60)
    assert sorted((c.key, c.value) for c in copies) == [(b"k%d" % i, b"v%d" % i) for i in range(3)]
    # The killed leader's copies were written (and aborted): read_uncommitted sees both.
    assert len(read_all(cluster.bootstrap, dlq, "read_uncommitted", timeout_s=60)) == 6
