"""Static group membership (KIP-345) and ``group.initial.rebalance.delay.ms`` through real
Kafka clients: confluent-kafka (``group.instance.id``) and kafka-python
(``group_instance_id``), each member a consumer in its own thread recording every
assignment and revocation its client reports.

- A static member restarted within its session gets its old partitions back while the
  other two keep consuming and see no rebalance at all.
- A second live consumer with the same instance id takes it over: the first is fenced
  (``FENCED_INSTANCE_ID``, fatal in both clients).
- A static member that does not come back within its session is removed and the others
  take its partitions.
- Members starting together in a new group get one assignment, not one per arrival.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import confluent_kafka
import kafka
import kafka.admin
import kafka.errors
import pytest
from kafka.protocol.admin.groups import DescribeGroupsRequest, DescribeGroupsResponse
from kafka.protocol.consumer import OffsetCommitResponse
from kafka.protocol.consumer.group import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)

from tests.kafka import raw
from tests.kafka.clients import TIMEOUT_S, Out, produce
from tests.kafka.conftest import KafkaBroker, unique
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient

pytestmark = pytest.mark.timeout(180)

FAMILIES = ("confluent-kafka", "kafka-python")
# confluent-kafka with group.protocol=consumer: a KIP-848 member of the core's groups.
KIP848 = "confluent-kafka-kip848"
FENCED = 82  # FENCED_INSTANCE_ID
SESSION_MS = 20_000  # a restart fits well inside it, even on a loaded machine


class Member:
    """One consumer of ``topic`` in ``group`` on its own thread. ``events`` holds
    ("assign" | "revoke", partitions) as the client reported them; ``values`` what it
    read; ``fatal`` the error that ended it, if any. Thread-safe enough for tests: lists
    are appended by the member's thread and read by the test."""

    def __init__(
        self,
        family: str,
        bootstrap: str,
        topic: str,
        group: str,
        instance_id: str | None,
        session_ms: int = SESSION_MS,
    ) -> None:
        self.family = family
        self.events: list[tuple[str, frozenset[int]]] = []
        self.values: list[bytes] = []
        self.fatal: str | None = None
        self._stop = threading.Event()
        self._args = (bootstrap, topic, group, instance_id, session_ms)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def held(self) -> frozenset[int]:
        """The partitions its client holds now, by its last callback."""
        held: frozenset[int] = frozenset()
        for kind, partitions in list(self.events):
            held = held | partitions if kind == "assign" else held - partitions
        return held

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(TIMEOUT_S)
        assert not self._thread.is_alive()

    def _run(self) -> None:
        try:
            if self.family.startswith("confluent-kafka"):
                self._run_confluent(*self._args)
            else:
                self._run_kafka_python(*self._args)
        except kafka.errors.FencedInstanceIdError as exc:
            self.fatal = f"FENCED_INSTANCE_ID: {exc}"

    def _run_confluent(
        self, bootstrap: str, topic: str, group: str, instance_id: str | None, session_ms: int
    ) -> None:
        config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "heartbeat.interval.ms": 500,
            "session.timeout.ms": session_ms,
        }
        if instance_id is not None:
            config["group.instance.id"] = instance_id
        if self.family == KIP848:
            # The broker dictates heartbeats and sessions (group.consumer.* settings).
            del config["heartbeat.interval.ms"], config["session.timeout.ms"]
            config["group.protocol"] = "consumer"

        def on_error(error: confluent_kafka.KafkaError) -> None:
            if error.fatal():  # librdkafka reports fencing here, then as _FATAL in poll
                self.fatal = f"{error.name()}: {error.str()}"

        config["error_cb"] = on_error
        consumer = confluent_kafka.Consumer(config)

        def assigned(_: object, tps: list[confluent_kafka.TopicPartition]) -> None:
            self.events.append(("assign", frozenset(tp.partition for tp in tps)))

        def revoked(_: object, tps: list[confluent_kafka.TopicPartition]) -> None:
            self.events.append(("revoke", frozenset(tp.partition for tp in tps)))

        consumer.subscribe([topic], on_assign=assigned, on_revoke=revoked)
        try:
            while not self._stop.is_set():
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                error = msg.error()
                if error is None:
                    self.values.append(msg.value())
                elif error.fatal() or error.code() == confluent_kafka.KafkaError._FATAL:
                    self.fatal = self.fatal or f"{error.name()}: {error.str()}"
                    return
        finally:
            if self.fatal is None:
                consumer.close()

    def _run_kafka_python(
        self, bootstrap: str, topic: str, group: str, instance_id: str | None, session_ms: int
    ) -> None:
        member = self

        class Listener(kafka.ConsumerRebalanceListener):  # type: ignore[misc]
            def on_partitions_revoked(self, revoked: Any) -> None:
                member.events.append(("revoke", frozenset(tp.partition for tp in revoked)))

            def on_partitions_assigned(self, assigned: Any) -> None:
                member.events.append(("assign", frozenset(tp.partition for tp in assigned)))

        consumer = kafka.KafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=group,
            group_instance_id=instance_id,
            auto_offset_reset="earliest",
            session_timeout_ms=session_ms,
            heartbeat_interval_ms=500,
        )
        # Metadata first: a leader assigning without it hands out nothing and rejoins, the
        # path where kafka-python 3.0.12 can lose its JoinGroup answer (see test_groups.py).
        consumer.partitions_for_topic(topic)
        consumer.subscribe([topic], listener=Listener())
        try:
            while not self._stop.is_set():
                for batch in consumer.poll(timeout_ms=200).values():
                    self.values.extend(m.value for m in batch)
        finally:
            consumer.close()


def _topic(bootstrap: str, partitions: int) -> str:
    topic = unique("static")
    admin = kafka.KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([kafka.admin.NewTopic(topic, partitions, 1)])
    finally:
        admin.close()
    return topic


def _fill(broker: KafkaBroker, topic: str, tag: str, count: int, partitions: int) -> set[bytes]:
    values = [f"{tag}-{i}".encode() for i in range(count)]
    produce(
        "kafka-python",
        broker.bootstrap,
        broker.address,
        topic,
        [Out(None, v, partition=i % partitions) for i, v in enumerate(values)],
    )
    return set(values)


def _wait(what: str, ready: Any, timeout_s: float = 40.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _classic_members(broker: InProcessBroker, group: str) -> dict[str | None, str]:
    """instance id -> member id, as the coordinator has them."""
    described = broker.server.core.groups.classic.describe(group)
    return (
        {} if described is None else {m.group_instance_id: m.member_id for m in described.members}
    )


def _kip848_members(broker: InProcessBroker, group: str) -> dict[str | None, str]:
    """instance id -> member id of a KIP-848 group, as the coordinator has them."""
    return {m.instance_id: m.member_id for m in broker.server.core.describe_group(group).members}


def _kip848_stable(broker: InProcessBroker, group: str) -> bool:
    return bool(broker.server.core.describe_group(group).state == "Stable")


def _quiet(ms: list[Member], quiet_s: float = 1.5) -> None:
    """Wait until no member's client reported anything for ``quiet_s`` and each holds
    its share: the joins of members started one after the other may still be settling
    (kafka-python's leader rejoins when it learns more metadata)."""
    deadline = time.monotonic() + 40.0
    last = [len(m.events) for m in ms]
    since = time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, "the group never settled"
        time.sleep(0.1)
        now = [len(m.events) for m in ms]
        if now != last or not _settled(ms, len(ms[0].held) or 1):
            last, since = now, time.monotonic()


@pytest.fixture
def members() -> Iterator[list[Member]]:
    started: list[Member] = []
    yield started
    for m in started:
        m._stop.set()
    for m in started:
        m._thread.join(TIMEOUT_S)


def _settled(ms: list[Member], per_member: int) -> bool:
    return all(len(m.held) == per_member for m in ms) and len(
        frozenset().union(*(m.held for m in ms))
    ) == per_member * len(ms)


@pytest.mark.parametrize("family", [*FAMILIES, KIP848])
def test_a_restarted_static_member_gets_its_partitions_back_without_a_rebalance(
    kafka_broker: KafkaBroker, family: str, members: list[Member]
) -> None:
    topic = _topic(kafka_broker.bootstrap, 6)
    group = unique("restart")
    for i in range(3):
        members.append(Member(family, kafka_broker.bootstrap, topic, group, f"s{i}"))
    _wait("three members with two partitions each", lambda: _settled(members, 2))
    first = _fill(kafka_broker, topic, "before", 60, 6)
    _wait("every record read", lambda: first <= {v for m in members for v in m.values})
    stayed = members[:2]
    if family == KIP848:
        _wait("the group stable", lambda: _kip848_stable(kafka_broker.broker, group))
    _quiet(members)
    history = [list(m.events) for m in stayed]
    old = members[2]
    old_partitions = old.held
    ids_before = (
        _kip848_members(kafka_broker.broker, group)
        if family == KIP848
        else _classic_members(kafka_broker.broker, group)
    )
    old.stop()  # a static member closes without LeaveGroup (KIP-848: leaves with epoch -2)
    time.sleep(2.0)  # away for several heartbeats of the others
    restarted = Member(family, kafka_broker.bootstrap, topic, group, "s2")
    members.append(restarted)
    _wait("the restarted member's assignment", lambda: bool(restarted.held))
    assert restarted.held == old_partitions
    if family == KIP848:
        _wait("the group stable", lambda: _kip848_stable(kafka_broker.broker, group))
        ids_after = _kip848_members(kafka_broker.broker, group)
    else:
        ids_after = _classic_members(kafka_broker.broker, group)
    assert ids_after["s2"] != ids_before["s2"]  # a new member id for the same instance
    assert {k: v for k, v in ids_after.items() if k != "s2"} == {
        k: v for k, v in ids_before.items() if k != "s2"
    }
    with AdminClient(kafka_broker.address) as admin:  # Tidelog's view shows them too
        shown = admin.describe_group(group)
    assert sorted(m.instance_id or "" for m in shown.members) == ["s0", "s1", "s2"]
    second = _fill(kafka_broker, topic, "after", 60, 6)
    readers = [*stayed, restarted]
    _wait("the records produced after", lambda: second <= {v for m in readers for v in m.values})
    # The two that stayed saw no revocation and no assignment at all.
    assert [list(m.events) for m in stayed] == history
    assert all(m.fatal is None for m in readers)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_second_live_member_with_the_same_instance_id_fences_the_first(
    kafka_broker: KafkaBroker, family: str, members: list[Member]
) -> None:
    topic = _topic(kafka_broker.bootstrap, 2)
    group = unique("fence")
    first = Member(family, kafka_broker.bootstrap, topic, group, "dup")
    members.append(first)
    _wait("the first member's assignment", lambda: len(first.held) == 2)
    second = Member(family, kafka_broker.bootstrap, topic, group, "dup")
    members.append(second)
    _wait("the second member's assignment", lambda: len(second.held) == 2)
    _wait("the first member fenced", lambda: first.fatal is not None)
    assert "fenced" in (first.fatal or "").lower(), first.fatal
    assert list(_classic_members(kafka_broker.broker, group)) == ["dup"]
    values = _fill(kafka_broker, topic, "r", 20, 2)
    _wait("the second member reads everything", lambda: values <= set(second.values))
    assert second.fatal is None


@pytest.mark.parametrize("family", FAMILIES)
def test_a_static_member_gone_past_its_session_is_removed(
    kafka_broker: KafkaBroker, family: str, members: list[Member]
) -> None:
    topic = _topic(kafka_broker.bootstrap, 4)
    group = unique("expire")
    stays = Member(family, kafka_broker.bootstrap, topic, group, "a", session_ms=6_000)
    goes = Member(family, kafka_broker.bootstrap, topic, group, "b", session_ms=6_000)
    members.extend([stays, goes])
    _wait("two members with two partitions each", lambda: _settled([stays, goes], 2))
    goes.stop()  # no LeaveGroup: only its session timeout removes it
    gone_at = time.monotonic()
    _wait("the partitions of the member that did not come back", lambda: len(stays.held) == 4)
    assert time.monotonic() - gone_at > 3.0  # not at once: it waited for the session
    assert list(_classic_members(kafka_broker.broker, group)) == ["a"]
    values = _fill(kafka_broker, topic, "r", 40, 4)
    _wait("the member left reads everything", lambda: values <= set(stays.values))
    # The instance id is free again: coming back later is a new join and a rebalance.
    back = Member(family, kafka_broker.bootstrap, topic, group, "b", session_ms=6_000)
    members.append(back)
    _wait("two members again", lambda: _settled([stays, back], 2))


@pytest.mark.parametrize("family", FAMILIES)
def test_members_starting_together_get_one_assignment(family: str) -> None:
    # The delay is the first rebalance's; a member whose client took longer than it to
    # start (kafka-python on a loaded CI machine) joined after it, a second generation.
    settings = {"kafka.listen": "127.0.0.1:0", "group.initial.rebalance.delay.ms": 3_000}
    with InProcessBroker(settings=settings) as broker:
        bootstrap = f"127.0.0.1:{broker.server.kafka_port}"
        topic = _topic(bootstrap, 6)
        group = unique("together")
        started: list[Member] = []
        try:
            for i in range(3):  # staggered: without the delay the first would be alone
                started.append(Member(family, bootstrap, topic, group, f"t{i}"))
                time.sleep(0.5)
            _wait("three members with two partitions each", lambda: _settled(started, 2))
            (snapshot,) = broker.server.core.groups.classic.snapshot(group)
            assert snapshot.generation == 1
            for m in started:
                # kafka-python "revokes" nothing before its first join: not a rebalance.
                seen = [kind for kind, tps in m.events if kind == "assign" or tps]
                assert seen == ["assign"], m.events
        finally:
            for m in started:
                m.stop()


# --- the wire, request by request --------------------------------------------------------


def _raw(sock: socket.socket, request: Any, response_class: Any) -> Any:
    answer = raw.call(sock, request, "test-static")
    assert answer is not None, "the broker hung up"
    return response_class[request.version].decode(answer, header=True)


def _raw_join(sock: socket.socket, group: str, instance_id: str, member_id: str = "") -> Any:
    request = JoinGroupRequest[5](
        group_id=group,
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
        member_id=member_id,
        group_instance_id=instance_id,
        protocol_type="consumer",
        protocols=[JoinGroupRequest[5].JoinGroupRequestProtocol(name="range", metadata=b"m")],
    )
    return _raw(sock, request, JoinGroupResponse)


def test_the_wire_answers_static_members_as_kafka(kafka_broker: KafkaBroker) -> None:
    group = unique("wire")
    host, port = kafka_broker.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        sock.settimeout(TIMEOUT_S)
        first = _raw_join(sock, group, "w")
        assert first.error_code == 0
        assert first.member_id
        sync = SyncGroupRequest[3](
            group_id=group,
            generation_id=first.generation_id,
            member_id=first.member_id,
            group_instance_id="w",
            assignments=[
                SyncGroupRequest[3].SyncGroupRequestAssignment(
                    member_id=first.member_id, assignment=b"a"
                )
            ],
        )
        assert _raw(sock, sync, SyncGroupResponse).assignment == b"a"
        second = _raw_join(sock, group, "w")  # the same instance, restarted
        assert (second.error_code, second.generation_id) == (0, first.generation_id)
        assert second.member_id != first.member_id
        assert second.leader == first.member_id

        def heartbeat(member_id: str) -> int:
            request = HeartbeatRequest[3](
                group_id=group,
                generation_id=first.generation_id,
                member_id=member_id,
                group_instance_id="w",
            )
            return int(_raw(sock, request, HeartbeatResponse).error_code)

        assert (heartbeat(first.member_id), heartbeat(second.member_id)) == (FENCED, 0)
        assert _raw_join(sock, group, "w", first.member_id).error_code == FENCED
        topic = _topic(kafka_broker.bootstrap, 1)
        commit = raw.offset_commit_request(group, topic, {0: (1, -1)}, version=7)
        commit.generation_id_or_member_epoch = first.generation_id
        commit.member_id = first.member_id
        commit.group_instance_id = "w"
        answer = _raw(sock, commit, OffsetCommitResponse)
        assert [p.error_code for t in answer.topics for p in t.partitions] == [FENCED]
        commit.member_id = second.member_id
        answer = _raw(sock, commit, OffsetCommitResponse)
        assert [p.error_code for t in answer.topics for p in t.partitions] == [0]
        described = _raw(
            sock,
            DescribeGroupsRequest[4](groups=[group], include_authorized_operations=False),
            DescribeGroupsResponse,
        )
        (members,) = [g.members for g in described.groups]
        assert [(m.member_id, m.group_instance_id) for m in members] == [(second.member_id, "w")]
        identity = LeaveGroupRequest[3].MemberIdentity
        leave = LeaveGroupRequest[3](
            group_id=group,
            members=[
                identity(member_id="", group_instance_id="w"),
                identity(member_id="", group_instance_id="nobody"),
            ],
        )
        left = _raw(sock, leave, LeaveGroupResponse)
        assert left.error_code == 0
        assert [(m.group_instance_id, m.error_code) for m in left.members] == [
            ("w", 0),
            ("nobody", 25),  # UNKNOWN_MEMBER_ID
        ]
        assert heartbeat(second.member_id) == 25
