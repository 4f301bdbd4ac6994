"""A group formed over Kafka's classic protocol is visible to Tidelog's own tools: the
admin client and ``tidelog groups list/describe`` show its members, their client ids and
assigned partitions, beside its committed offsets and lag (as Kafka's
``kafka-consumer-groups --describe`` shows classic and consumer groups alike)."""

from __future__ import annotations

import time

import kafka
import pytest

from tests.kafka.clients import TIMEOUT_S, Out, produce
from tests.kafka.conftest import KafkaBroker, unique
from tidelog.client import AdminClient
from tidelog.client.cli import main

pytestmark = pytest.mark.timeout(120)


def test_a_classic_group_shows_its_members_and_assignment(
    kafka_broker: KafkaBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    topic, group = unique("classic"), unique("classic-g")
    admin = kafka.KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
    try:
        admin.create_topics([kafka.admin.NewTopic(topic, 2, 1)])
    finally:
        admin.close()
    records = [Out(None, b"v%d" % i, partition=i % 2) for i in range(6)]
    produce("kafka-python", kafka_broker.bootstrap, kafka_broker.address, topic, records)
    consumer = kafka.KafkaConsumer(
        topic,
        bootstrap_servers=kafka_broker.bootstrap,
        group_id=group,
        client_id="classic-member",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=10_000,
        heartbeat_interval_ms=300,
    )
    try:
        got = 0
        deadline = time.monotonic() + TIMEOUT_S
        while got < 6 and time.monotonic() < deadline:
            got += sum(len(batch) for batch in consumer.poll(timeout_ms=300).values())
        assert got == 6
        consumer.commit()
        held = sorted((tp.topic, tp.partition) for tp in consumer.assignment())
        assert held == [(topic, 0), (topic, 1)]

        with AdminClient(kafka_broker.address, request_timeout_ms=10_000) as tidelog:
            described = tidelog.describe_group(group)
            listed = {g.group_id: g for g in tidelog.list_groups()}
        assert (described.state, len(described.members)) == ("Stable", 1)
        member = described.members[0]
        assert member.client_id == "classic-member"
        assert member.subscribed_topics == (topic,)
        assert sorted((tp.topic, tp.partition) for tp in member.assignment) == held
        lag = {p.tp.partition: (p.committed_offset, p.lag) for p in described.partitions}
        assert lag == {0: (3, 0), 1: (3, 0)}
        assert {p.member_id for p in described.partitions} == {member.member_id}
        assert (listed[group].state, listed[group].members) == ("Stable", 1)

        # Kafka's own DescribeGroups names the member's address (not its port).
        kafka_admin = kafka.KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
        try:
            (seen,) = kafka_admin.describe_groups([group])[group]["members"]
        finally:
            kafka_admin.close()
        assert (seen["client_id"], seen["client_host"]) == ("classic-member", "127.0.0.1")

        status = main(["groups", "describe", group, "--bootstrap", kafka_broker.address])
        rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip()]
        assert status == 0
        assert rows[0] == ["Group:", group, "State:", "Stable", "Members:", "1"]
        assert rows[2][1] == "classic-member"
    finally:
        consumer.close()

    # Once the last member left, the group is its committed offsets only (Kafka's Empty).
    with AdminClient(kafka_broker.address, request_timeout_ms=10_000) as tidelog:
        after = tidelog.describe_group(group)
    assert (after.state, after.members) == ("Empty", ())
    assert [p.committed_offset for p in after.partitions] == [3, 3]
