"""Share-group administration (issue #32) with a real broker and real share consumers:
``AdminClient``'s describe with per-partition statistics, share offsets (list, alter,
reset, delete), ``delete_group`` and ``list_groups`` with types, and ``tidelog groups``
on a share group (``kafka-share-groups.sh``'s behaviour).
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from tests.broker.cluster.waiting import eventually
from tests.broker.conftest import error_code
from tests.client.test_group_admin_cli import cli, table
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient, Consumer, Producer, ShareConsumer, TopicPartition
from tidelog.client.types import ConsumerRecord
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.errors import GroupIdNotFoundError, GroupNotEmptyError

pytestmark = pytest.mark.timeout(120)

LOCK_MS = 600_000  # no lock expires during a test
SETTINGS = {
    "group.share.min.heartbeat.interval.ms": 100,
    "group.share.heartbeat.interval.ms": 100,
    "group.share.max.record.lock.duration.ms": LOCK_MS,
    "group.share.record.lock.duration.ms": LOCK_MS,
}


@pytest.fixture(scope="module")
def broker() -> Iterator[InProcessBroker]:
    with InProcessBroker(settings=SETTINGS) as running:
        yield running


_count = iter(range(1_000_000))


def _topic(admin: AdminClient, partitions: int = 1) -> str:
    name = f"share-admin-{next(_count)}"
    admin.create_topic(name, partitions)
    return name


def _joined(
    broker: InProcessBroker, group: str, topic: str, *, fetch: bool = True
) -> ShareConsumer:
    """A member of ``group`` that holds its partitions and (``fetch``) fetched once with
    nothing to get (so the share partitions exist, at the log end)."""
    consumer = ShareConsumer(
        broker.address, group, acknowledgement_mode="explicit", request_timeout_ms=10_000
    )
    consumer.subscribe([topic])
    eventually(lambda: bool(consumer.assignment()), 20)
    if fetch:
        assert consumer.poll(timeout_ms=0) == []
    return consumer


def _produce(broker: InProcessBroker, topic: str, count: int) -> None:
    with Producer(broker.address) as producer:
        for i in range(count):
            producer.send(topic, value=b"%d" % i, partition=0)
        producer.flush()


def _poll(consumer: ShareConsumer, count: int) -> dict[int, ConsumerRecord]:
    got: dict[int, ConsumerRecord] = {}

    def check() -> bool:
        got.update((r.offset, r) for r in consumer.poll(timeout_ms=200))
        return len(got) >= count

    eventually(check, 30, interval_s=0)
    return got


def _empty(admin: AdminClient, group: str) -> None:
    eventually(lambda: admin.describe_share_group(group).state == "Empty", 20)


def test_describe_statistics_offsets_alter_reset_delete(broker: InProcessBroker) -> None:
    with AdminClient(broker.address) as admin:
        topic = _topic(admin)
        tp = TopicPartition(topic, 0)
        group = f"{topic}-g"
        consumer = _joined(broker, group, topic)
        try:
            _produce(broker, topic, 4)
            records = _poll(consumer, 4)
            consumer.acknowledge(records[0], "release")  # available again, count kept
            consumer.acknowledge(records[1], "reject")  # archived
            consumer.acknowledge(records[2], "accept")  # acknowledged; 3 stays in flight
            assert set(consumer.commit_sync().values()) == {None}

            described = admin.describe_share_group(group)
            assert (described.state, len(described.members)) == ("Stable", 1)
            assert described.members[0].assignment == (tp,)
            [stats] = described.partitions
            assert (stats.tp, stats.start_offset, stats.end_offset) == (tp, 0, 4)
            assert (stats.acquired, stats.available, stats.acknowledged, stats.archived) == (
                1,
                1,
                1,
                1,
            )
            assert stats.delivery_counts == {1: 4}
            assert stats.dead_lettered == 0
            # Lag: up to the high watermark (4), less what is done in the window (2).
            offsets = admin.list_share_group_offsets(group)
            assert list(offsets) == [tp]
            assert (offsets[tp].start_offset, offsets[tp].lag) == (0, 2)
            with pytest.raises(GroupNotEmptyError):
                admin.alter_share_group_offsets(group, {tp: 3})
            with pytest.raises(GroupNotEmptyError):
                admin.delete_share_group_offsets(group, [topic])
            with pytest.raises(GroupNotEmptyError):
                admin.delete_group(group)
        finally:
            consumer.close()
        _empty(admin, group)

        # Alter: the share partition starts over at 3; a new member gets 3 and on.
        admin.alter_share_group_offsets(group, {tp: 3})
        assert admin.list_share_group_offsets(group)[tp].start_offset == 3
        [stats] = admin.describe_share_group(group).partitions
        assert (stats.start_offset, stats.end_offset, stats.acquired) == (3, 3, 0)
        consumer = _joined(broker, group, topic, fetch=False)
        try:
            assert sorted(_poll(consumer, 1)) == [3]
        finally:
            consumer.close()
        _empty(admin, group)

        # Reset (resolved at the leader, then an alter), then delete the topic's state.
        assert admin.reset_share_group_offsets(group, topic, to_earliest=True) == {tp: 0}
        assert admin.list_share_group_offsets(group)[tp].start_offset == 0
        admin.delete_share_group_offsets(group, [topic])
        assert admin.list_share_group_offsets(group) == {}
        never = admin.list_share_group_offsets(group, [tp])[tp]
        assert (never.start_offset, never.lag) == (-1, -1)

        # Delete the group: gone from the listing and from describe.
        assert [(g.group_type, g.state) for g in admin.list_groups() if g.group_id == group] == [
            ("share", "Empty")
        ]
        admin.delete_group(group)
        assert group not in {g.group_id for g in admin.list_groups()}
        with pytest.raises(GroupIdNotFoundError):
            admin.describe_share_group(group)


def test_list_groups_by_type_and_a_consumer_group_is_no_share_group(
    broker: InProcessBroker,
) -> None:
    with AdminClient(broker.address) as admin:
        topic = _topic(admin)
        share_group, consumer_group = f"{topic}-share", f"{topic}-consumer"
        share = _joined(broker, share_group, topic)
        consumer = Consumer(broker.address, group_id=consumer_group)
        try:
            consumer.subscribe([topic])
            eventually(lambda: bool(consumer.poll(0) or consumer.assignment()), 20)
            listed = {g.group_id: g.group_type for g in admin.list_groups()}
            assert (listed[share_group], listed[consumer_group]) == ("share", "consumer")
            shares = {g.group_id for g in admin.list_groups(types=["share"])}
            assert share_group in shares
            assert consumer_group not in shares
            consumers = {g.group_id for g in admin.list_groups(types=["consumer"])}
            assert consumer_group in consumers
            assert share_group not in consumers
            # gRPC ListGroups itself: each group's type, and the type filter (KIP-848's
            # ListGroups v5 types_filter).
            with grpc.insecure_channel(broker.address) as channel:
                stub = pb_grpc.BrokerStub(channel)
                answer = stub.ListGroups(pb.ListGroupsRequest(types=["share"]), timeout=10)
                assert {g.type for g in answer.groups} == {"share"}
                assert share_group in {g.group_id for g in answer.groups}
                answer = stub.ListGroups(pb.ListGroupsRequest(), timeout=10)
                typed = {g.group_id: g.type for g in answer.groups}
                assert (typed[share_group], typed[consumer_group]) == ("share", "consumer")
            with pytest.raises(GroupIdNotFoundError, match="not a share group"):
                admin.list_share_group_offsets(consumer_group)
            with pytest.raises(ValueError, match="unknown group types"):
                admin.list_groups(types=["streams"])
        finally:
            consumer.close()
            share.close()


def test_groups_commands_on_a_share_group(
    broker: InProcessBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    with AdminClient(broker.address) as admin:
        topic = _topic(admin)
        group = f"{topic}-cli"
        consumer = _joined(broker, group, topic)
        address = broker.address
        try:
            _produce(broker, topic, 3)
            records = _poll(consumer, 3)
            consumer.acknowledge(records[0], "release")
            consumer.acknowledge(records[1], "reject")
            consumer.commit_sync()

            status, out, _ = cli(capsys, "groups", "list", "--bootstrap", address)
            assert status == 0
            assert [group, "share", "Stable", "1"] in table(out)
            status, out, _ = cli(capsys, "groups", "describe", group, "--bootstrap", address)
            assert status == 0
            rows = table(out)
            assert rows[0] == ["Share", "group:", group, "State:", "Stable", "Members:", "1"]
            assert rows[1] == ["MEMBER", "CLIENT", "HOST", "EPOCH", "PARTITIONS"]
            assert rows[2][-1] == f"{topic}-0"
            assert rows[3][:9] == [
                "TOPIC",
                "PARTITION",
                "START",
                "END",
                "LAG",
                "IN-FLIGHT",
                "AVAILABLE",
                "ARCHIVED",
                "DELIVERIES",
            ]
            # offset 0 available, 1 archived, 2 in flight: each delivered once; lag 3 - 1.
            assert rows[4] == [topic, "0", "0", "3", "2", "1", "1", "1", "1:3", "0"]
            status, _, _ = cli(
                capsys, "groups", "reset-offsets", group, "--topic", topic, "--to-latest",
                "--bootstrap", address,
            )  # fmt: skip
            assert status != 0  # the group has a member
        finally:
            consumer.close()
        _empty(admin, group)

        status, out, _ = cli(
            capsys, "groups", "reset-offsets", group, "--topic", topic, "--to-latest",
            "--bootstrap", address,
        )  # fmt: skip
        assert status == 0
        assert table(out)[1:] == [[topic, "0", "3"]]
        assert admin.list_share_group_offsets(group)[TopicPartition(topic, 0)].start_offset == 3
        status, _, err = cli(
            capsys, "groups", "delete-offsets", group, "--topic", topic, "--bootstrap", address
        )
        assert status == 0, err
        assert admin.list_share_group_offsets(group) == {}
        status, _, err = cli(capsys, "groups", "delete", group, "--bootstrap", address)
        assert status == 0, err
        assert group not in {g.group_id for g in admin.list_groups()}


def test_describe_counts_dead_lettered_records(
    broker: InProcessBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rejected record of a group with a dead-letter topic (step 5) shows in
    ``dead_lettered`` once copied, through the AdminClient and ``tidelog groups``."""
    with AdminClient(broker.address) as admin:
        topic = _topic(admin)
        group = f"{topic}-dlq"
        # The group config through the core, as tests/client/test_share_dead_letter.py
        # does: AdminClient's ConfigResource has no GROUP type yet.
        shares = broker.server.core.shares
        assert shares is not None
        shares.share_groups.alter_group_configs(
            group, {"errors.deadletterqueue.topic.name": f"{topic}-dead"}
        )
        consumer = _joined(broker, group, topic)
        try:
            _produce(broker, topic, 2)
            records = _poll(consumer, 2)
            consumer.acknowledge(records[0], "reject")
            consumer.acknowledge(records[1], "accept")
            assert set(consumer.commit_sync().values()) == {None}

            def copied() -> bool:
                [stats] = admin.describe_share_group(group).partitions
                return stats.dead_lettered == 1

            eventually(copied, 20)
            status, out, _ = cli(capsys, "groups", "describe", group, "--bootstrap", broker.address)
            assert status == 0
            rows = table(out)
            assert rows[-1][0] == topic
            assert rows[-1][-1] == "1"  # DEAD-LETTERED
        finally:
            consumer.close()


def test_a_member_cannot_join_while_an_admin_changes_the_group(broker: InProcessBroker) -> None:
    """The emptiness check and the change are one step (``broker.core.share_admin``): while
    an admin call holds the group's admin lock (as an alter holds it from its emptiness
    check to its last change), a joining member's heartbeat waits and is then refused
    retriably (``COORDINATOR_LOAD_IN_PROGRESS``); once the admin is done it joins."""
    shares = broker.server.core.shares
    assert shares is not None
    with AdminClient(broker.address) as admin:
        topic = _topic(admin)
    group = f"{topic}-g"
    join = pb.ShareGroupHeartbeatRequest(
        group_id=group, member_id="m", member_epoch=0, subscribed_topic_names=[topic]
    )
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        with shares._admin(group):  # an admin call in progress
            with pytest.raises(grpc.RpcError) as caught:
                stub.ShareGroupHeartbeat(join, timeout=30)
            assert error_code(caught.value) == "COORDINATOR_LOAD_IN_PROGRESS"
        assert stub.ShareGroupHeartbeat(join, timeout=30).member_epoch > 0
