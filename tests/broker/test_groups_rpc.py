"""Consumer groups end to end: the generated stub against an in-process broker.

Members here are small fakes following the client contract of ``docs/groups.md``: one
heartbeat in flight, ``owned_partitions`` = the assignment of the latest answer (on_revoke
and on_assign are instant). Every protocol step is one heartbeat, so the tests heartbeat
in rounds rather than wait; session expiry runs on a manual clock, except for the one test
of the real-time timer.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator

import grpc
import pytest

from tests.broker.conftest import TIMEOUT_S, create_topic, error_code, make_batch, produce
from tidelog.broker.groups.offset_store import OFFSETS_TOPIC
from tidelog.broker.testing import InProcessBroker
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.clock import ManualClock

SESSION_MS = 1_000
SETTINGS: dict[str, object] = {
    "group.consumer.heartbeat.interval.ms": 50,
    "group.consumer.min.session.timeout.ms": 100,
    "group.consumer.session.timeout.ms": SESSION_MS,
    "group.consumer.max.session.timeout.ms": 10_000,
    "offsets.topic.num.partitions": 2,
}


class Member:
    """A consumer-group member as the client library will drive it (minus the threads)."""

    def __init__(
        self,
        stub: pb_grpc.BrokerStub,
        group_id: str,
        topics: list[str],
        session_timeout_ms: int = SESSION_MS,
    ) -> None:
        self.stub = stub
        self.group_id = group_id
        self.topics = topics
        self.session_timeout_ms = session_timeout_ms
        self.member_id = ""
        self.epoch = 0
        self.owned: set[tuple[str, int]] = set()
        self.interval_ms = 0

    def heartbeat(self) -> pb.ConsumerGroupHeartbeatResponse:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(self.owned):
            by_topic.setdefault(topic, []).append(partition)
        answer = self.stub.ConsumerGroupHeartbeat(
            pb.ConsumerGroupHeartbeatRequest(
                group_id=self.group_id,
                member_id=self.member_id,
                member_epoch=self.epoch,
                session_timeout_ms=self.session_timeout_ms,
                rebalance_timeout_ms=30_000,
                subscribed_topic_names=self.topics,
                owned_partitions=[
                    pb.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()
                ],
                client_id="test",
            ),
            timeout=TIMEOUT_S,
        )
        self.member_id = answer.member_id
        self.epoch = answer.member_epoch
        self.interval_ms = answer.heartbeat_interval_ms
        assert answer.has_assignment
        self.owned = {(t.topic, p) for t in answer.assignment for p in t.partitions}
        return answer

    def leave(self) -> None:
        self.owned = set()
        self.epoch = -1
        answer = self.heartbeat()
        assert answer.member_epoch == -1
        self.epoch = 0

    def commit(self, offsets: dict[tuple[str, int], int]) -> list[pb.CommittedOffset]:
        return commit(self.stub, self.group_id, offsets, self.member_id, self.epoch)


def commit(
    stub: pb_grpc.BrokerStub,
    group_id: str,
    offsets: dict[tuple[str, int], int],
    member_id: str = "",
    epoch: int = -1,
) -> list[pb.CommittedOffset]:
    answer = stub.OffsetCommit(
        pb.OffsetCommitRequest(
            group_id=group_id,
            member_id=member_id,
            member_epoch=epoch,
            offsets=[
                pb.CommittedOffset(topic=t, partition=p, offset=o, metadata="m")
                for (t, p), o in offsets.items()
            ],
        ),
        timeout=TIMEOUT_S,
    )
    return list(answer.results)


def fetch_offsets(stub: pb_grpc.BrokerStub, group_id: str) -> dict[tuple[str, int], int]:
    answer = stub.OffsetFetch(pb.OffsetFetchRequest(group_id=group_id), timeout=TIMEOUT_S)
    return {(o.topic, o.partition): o.offset for o in answer.offsets}


def settle(*members: Member, rounds: int = 4) -> None:
    for _ in range(rounds):
        for member in members:
            member.heartbeat()


def all_of(topic: str, partitions: int) -> set[tuple[str, int]]:
    return {(topic, p) for p in range(partitions)}


def failure(call: object) -> grpc.RpcError:
    assert callable(call)
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def broker(clock: ManualClock) -> Iterator[InProcessBroker]:
    with InProcessBroker(settings=SETTINGS, clock=clock) as running:
        yield running


@pytest.fixture
def stub(broker: InProcessBroker) -> Iterator[pb_grpc.BrokerStub]:
    with broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        create_topic(stub, "t", partitions=4)
        yield stub


# --- membership ------------------------------------------------------------------------------


def test_two_members_split_four_partitions_and_one_leaves(stub: pb_grpc.BrokerStub) -> None:
    a = Member(stub, "g", ["t"])
    a.heartbeat()
    assert a.owned == all_of("t", 4)
    assert a.interval_ms == 50
    b = Member(stub, "g", ["t"])
    b.heartbeat()
    assert b.owned == set()  # a still holds them
    settle(a, b)
    assert len(a.owned) == len(b.owned) == 2
    assert a.owned.isdisjoint(b.owned)
    assert a.epoch == b.epoch == 2

    a.leave()
    b.heartbeat()
    assert b.owned == all_of("t", 4)


def test_a_member_that_stops_heartbeating_loses_its_partitions(
    stub: pb_grpc.BrokerStub, clock: ManualClock
) -> None:
    a = Member(stub, "g", ["t"])
    b = Member(stub, "g", ["t"])
    settle(a, b)
    assert len(b.owned) == 2
    clock.advance(SESSION_MS // 2)
    b.heartbeat()  # b stays alive, a goes quiet
    clock.advance(SESSION_MS // 2 + 1)
    settle(b, rounds=2)
    assert b.owned == all_of("t", 4)
    error = failure(a.heartbeat)
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert error_code(error) == "UNKNOWN_MEMBER_ID"
    # The client then rejoins with epoch 0 (its old id is accepted).
    a.epoch, a.owned = 0, set()
    settle(a, b)
    assert len(a.owned) == len(b.owned) == 2


def test_the_expiry_timer_runs_on_its_own() -> None:
    settings = {**SETTINGS, "group.consumer.min.session.timeout.ms": 100}
    with InProcessBroker(settings=settings) as broker, broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        create_topic(stub, "t", partitions=1)
        Member(stub, "quiet", ["t"], session_timeout_ms=100).heartbeat()
        listed = stub.ListGroups(pb.ListGroupsRequest(), timeout=TIMEOUT_S).groups
        assert [(g.group_id, g.state, g.members) for g in listed] == [("quiet", "Stable", 1)]
        deadline = time.monotonic() + 5
        while stub.ListGroups(pb.ListGroupsRequest(), timeout=TIMEOUT_S).groups:
            assert time.monotonic() < deadline, "the member was never expired"
            time.sleep(0.02)


def test_a_second_group_is_independent(stub: pb_grpc.BrokerStub) -> None:
    a = Member(stub, "g1", ["t"])
    b = Member(stub, "g1", ["t"])
    x = Member(stub, "g2", ["t"])
    settle(a, b, x)
    assert x.owned == all_of("t", 4)
    assert len(a.owned) == 2
    x.commit({("t", 0): 3})
    assert fetch_offsets(stub, "g1") == {}
    assert fetch_offsets(stub, "g2") == {("t", 0): 3}


def test_new_partitions_and_subscriptions_rebalance(stub: pb_grpc.BrokerStub) -> None:
    a = Member(stub, "g", ["t", "later"])
    settle(a, rounds=1)
    assert a.owned == all_of("t", 4)
    create_topic(stub, "later", partitions=2)
    a.heartbeat()
    assert a.owned == all_of("t", 4) | all_of("later", 2)
    a.topics = ["later"]
    settle(a, rounds=2)
    assert a.owned == all_of("later", 2)


def test_heartbeat_errors(stub: pb_grpc.BrokerStub) -> None:
    a = Member(stub, "g", ["t"])
    a.heartbeat()
    stranger = Member(stub, "g", ["t"])
    stranger.member_id, stranger.epoch = "nobody", 3
    error = failure(stranger.heartbeat)
    assert (error.code(), error_code(error)) == (grpc.StatusCode.NOT_FOUND, "UNKNOWN_MEMBER_ID")
    a.epoch += 5
    error = failure(a.heartbeat)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_code(error) == "FENCED_MEMBER_EPOCH"
    nameless = Member(stub, "", ["t"])
    error = failure(nameless.heartbeat)
    assert (error.code(), error_code(error)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_REQUEST",
    )


# --- offsets ----------------------------------------------------------------------------------


def test_commits_survive_a_restart_and_members_rejoin(
    broker: InProcessBroker, stub: pb_grpc.BrokerStub, clock: ManualClock
) -> None:
    a = Member(stub, "g", ["t"])
    a.heartbeat()
    results = a.commit({("t", 0): 5, ("t", 3): 7})
    assert [r.error_code for r in results] == ["", ""]
    assert fetch_offsets(stub, "g") == {("t", 0): 5, ("t", 3): 7}
    broker.restart()
    with broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        assert fetch_offsets(stub, "g") == {("t", 0): 5, ("t", 3): 7}
        answer = stub.OffsetFetch(
            pb.OffsetFetchRequest(
                group_id="g", partitions=[pb.TopicPartitions(topic="t", partitions=[0, 1])]
            ),
            timeout=TIMEOUT_S,
        )
        assert [(o.partition, o.offset, o.metadata) for o in answer.offsets] == [
            (0, 5, "m"),
            (1, -1, ""),
        ]
        # Membership is in memory only. A member joining right after the restart gets
        # nothing while the old members may still hold partitions; the old member
        # learns it is unknown and rejoins; after the hold both get their share.
        b = Member(stub, "g", ["t"])
        b.heartbeat()
        assert b.owned == set()
        a.stub = stub
        error = failure(a.heartbeat)
        assert error_code(error) == "UNKNOWN_MEMBER_ID"
        a.epoch, a.owned = 0, set()
        settle(a, b)
        assert a.owned == b.owned == set()
        clock.advance(2 * 50 - 1)  # startup_grant_delay_ms: heartbeat interval x 2
        settle(a, b)
        assert a.owned == b.owned == set()
        clock.advance(1)
        settle(a, b)
        assert a.owned | b.owned == all_of("t", 4)
        assert len(a.owned) == len(b.owned) == 2
        # A group with no history is not held.
        c = Member(stub, "fresh", ["t"])
        c.heartbeat()
        assert c.owned == all_of("t", 4)


def test_a_commit_for_a_partition_the_member_no_longer_owns_is_rejected(
    stub: pb_grpc.BrokerStub,
) -> None:
    a = Member(stub, "g", ["t"])
    a.heartbeat()  # a owns all four
    b = Member(stub, "g", ["t"])
    settle(a, b)  # two of them moved to b
    (mine,) = sorted(a.owned)[:1]
    (theirs,) = sorted(b.owned)[:1]
    results = a.commit({mine: 1, theirs: 2})
    assert [(r.topic, r.partition, r.error_code) for r in results] == [
        (*mine, ""),
        (*theirs, "STALE_MEMBER_EPOCH"),
    ]
    assert fetch_offsets(stub, "g") == {mine: 1}

    error = failure(lambda: commit(stub, "g", {mine: 2}, a.member_id, a.epoch - 1))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_code(error) == "STALE_MEMBER_EPOCH"
    error = failure(lambda: commit(stub, "g", {mine: 2}, "nobody", 1))
    assert error_code(error) == "UNKNOWN_MEMBER_ID"
    error = failure(lambda: commit(stub, "g", {mine: 2}))
    assert error_code(error) == "NON_EMPTY_GROUP"
    results = a.commit({("t", 99): 1, mine: -1})
    assert [r.error_code for r in results] == ["UNKNOWN_TOPIC_OR_PARTITION", "INVALID_REQUEST"]
    assert fetch_offsets(stub, "g") == {mine: 1}


def test_a_simple_commit_into_an_empty_group(stub: pb_grpc.BrokerStub) -> None:
    results = commit(stub, "solo", {("t", 1): 4})
    assert [(r.partition, r.offset, r.error_code) for r in results] == [(1, 4, "")]
    assert fetch_offsets(stub, "solo") == {("t", 1): 4}


def test_lag_is_log_end_minus_committed() -> None:
    with InProcessBroker(settings=SETTINGS, metrics=True) as broker, broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        create_topic(stub, "t", partitions=2)
        produce(stub, "t", 0, make_batch([b"x"] * 10))
        produce(stub, "t", 1, make_batch([b"y"] * 3))
        commit(stub, "g", {("t", 0): 4})
        a = Member(stub, "g", ["t"])
        a.heartbeat()
        described = stub.DescribeGroup(pb.DescribeGroupRequest(group_id="g"), timeout=TIMEOUT_S)
        assert (described.state, described.group_epoch) == ("Stable", 1)
        (member,) = described.members
        assert (member.member_id, member.client_id, member.member_epoch) == (a.member_id, "test", 1)
        assert list(member.subscribed_topic_names) == ["t"]
        assert [(t.topic, list(t.partitions)) for t in member.assignment] == [("t", [0, 1])]
        rows = [
            (p.topic, p.partition, p.committed_offset, p.log_end_offset, p.lag, p.member_id)
            for p in described.partitions
        ]
        assert rows == [("t", 0, 4, 10, 6, a.member_id), ("t", 1, -1, 3, 3, a.member_id)]

        url = f"http://127.0.0.1:{broker.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            text = response.read().decode()
        assert 'tidelog_consumer_group_lag{group="g",partition="0",topic="t"} 6.0' in text
        assert 'tidelog_consumer_group_lag{group="g",partition="1",topic="t"} 3.0' in text
        assert (
            'tidelog_consumer_group_committed_offset{group="g",partition="0",topic="t"} 4.0' in text
        )
        assert 'tidelog_consumer_group_members{group="g"} 1.0' in text


def test_reset_offsets_only_while_the_group_is_empty(stub: pb_grpc.BrokerStub) -> None:
    base_ms = 1_700_000_000_000
    produce(stub, "t", 0, make_batch([b"v"] * 10, timestamp_ms=base_ms))  # timestamps base + i
    commit(stub, "g", {("t", 0): 8})
    a = Member(stub, "g", ["t"])
    a.heartbeat()

    def reset(**target: object) -> list[tuple[int, int, str]]:
        answer = stub.ResetGroupOffsets(
            pb.ResetGroupOffsetsRequest(
                group_id="g", partitions=[pb.TopicPartitions(topic="t", partitions=[0])], **target
            ),
            timeout=TIMEOUT_S,
        )
        return [(o.partition, o.offset, o.error_code) for o in answer.offsets]

    error = failure(lambda: reset(to_earliest=True))
    assert (error.code(), error_code(error)) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "NON_EMPTY_GROUP",
    )
    assert fetch_offsets(stub, "g") == {("t", 0): 8}

    a.leave()
    assert reset(to_earliest=True) == [(0, 0, "")]
    assert reset(to_latest=True) == [(0, 10, "")]
    assert reset(to_offset=3) == [(0, 3, "")]
    assert reset(to_offset=99) == [(0, 10, "")]  # clamped to the log end
    assert reset(to_timestamp_ms=base_ms + 6) == [(0, 6, "")]
    assert reset(to_timestamp_ms=base_ms + 60) == [(0, 10, "")]  # nothing that new: the end
    assert fetch_offsets(stub, "g") == {("t", 0): 10}
    error = failure(lambda: reset())
    assert error_code(error) == "INVALID_REQUEST"

    # A topic without a partition list: all its partitions; nothing named: what is committed.
    answer = stub.ResetGroupOffsets(
        pb.ResetGroupOffsetsRequest(
            group_id="g", partitions=[pb.TopicPartitions(topic="t")], to_earliest=True
        ),
        timeout=TIMEOUT_S,
    )
    assert [(o.partition, o.offset) for o in answer.offsets] == [(0, 0), (1, 0), (2, 0), (3, 0)]
    answer = stub.ResetGroupOffsets(
        pb.ResetGroupOffsetsRequest(group_id="g", to_latest=True), timeout=TIMEOUT_S
    )
    assert [(o.partition, o.offset) for o in answer.offsets] == [(0, 10), (1, 0), (2, 0), (3, 0)]
    answer = stub.ResetGroupOffsets(
        pb.ResetGroupOffsetsRequest(
            group_id="g", partitions=[pb.TopicPartitions(topic="nope")], to_latest=True
        ),
        timeout=TIMEOUT_S,
    )
    assert [(o.topic, o.error_code) for o in answer.offsets] == [
        ("nope", "UNKNOWN_TOPIC_OR_PARTITION")
    ]


def test_delete_group(broker: InProcessBroker, stub: pb_grpc.BrokerStub) -> None:
    a = Member(stub, "g", ["t"])
    a.heartbeat()
    a.commit({("t", 0): 2})
    error = failure(
        lambda: stub.DeleteGroup(pb.DeleteGroupRequest(group_id="g"), timeout=TIMEOUT_S)
    )
    assert error_code(error) == "NON_EMPTY_GROUP"
    a.leave()
    listed = stub.ListGroups(pb.ListGroupsRequest(), timeout=TIMEOUT_S).groups
    assert [(g.group_id, g.state, g.members) for g in listed] == [("g", "Empty", 0)]
    stub.DeleteGroup(pb.DeleteGroupRequest(group_id="g"), timeout=TIMEOUT_S)
    assert list(stub.ListGroups(pb.ListGroupsRequest(), timeout=TIMEOUT_S).groups) == []
    error = failure(
        lambda: stub.DeleteGroup(pb.DeleteGroupRequest(group_id="g"), timeout=TIMEOUT_S)
    )
    assert (error.code(), error_code(error)) == (grpc.StatusCode.NOT_FOUND, "GROUP_ID_NOT_FOUND")
    error = failure(
        lambda: stub.DescribeGroup(pb.DescribeGroupRequest(group_id="g"), timeout=TIMEOUT_S)
    )
    assert error_code(error) == "GROUP_ID_NOT_FOUND"
    broker.restart()  # the tombstones are durable
    with broker.channel() as channel:
        assert fetch_offsets(pb_grpc.BrokerStub(channel), "g") == {}


def test_the_offsets_topic_is_internal_and_follows_topic_deletion(stub: pb_grpc.BrokerStub) -> None:
    listed = stub.ListTopics(pb.ListTopicsRequest(include_internal=True), timeout=TIMEOUT_S)
    assert (OFFSETS_TOPIC, 2, True) in [(t.name, t.partitions, t.internal) for t in listed.topics]
    error = failure(
        lambda: stub.DeleteTopic(pb.DeleteTopicRequest(name=OFFSETS_TOPIC), timeout=TIMEOUT_S)
    )
    assert error_code(error) == "INVALID_REQUEST"
    refused = produce(stub, OFFSETS_TOPIC, 0, make_batch([b"forged"]))
    assert refused.error_code == "INVALID_TOPIC_EXCEPTION"

    commit(stub, "g", {("t", 0): 3})
    stub.DeleteTopic(pb.DeleteTopicRequest(name="t"), timeout=TIMEOUT_S)
    assert fetch_offsets(stub, "g") == {}


# --- deleting some offsets (OffsetDelete, KIP-496) -------------------------------------------


def offset_delete(
    stub: pb_grpc.BrokerStub, group_id: str, partitions: list[tuple[str, int]]
) -> dict[tuple[str, int], str]:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    answer = stub.OffsetDelete(
        pb.OffsetDeleteRequest(
            group_id=group_id,
            partitions=[pb.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()],
        ),
        timeout=TIMEOUT_S,
    )
    return {(r.topic, r.partition): r.error_code or "OK" for r in answer.results}


def test_offset_delete_spares_subscribed_topics_and_survives_a_restart(
    broker: InProcessBroker, stub: pb_grpc.BrokerStub
) -> None:
    create_topic(stub, "u", partitions=2)
    commit(stub, "g", {("u", 0): 5, ("u", 1): 6})
    a = Member(stub, "g", ["t"])
    settle(a)
    assert [r.error_code for r in a.commit({("t", 0): 2})] == [""]
    assert offset_delete(stub, "g", [("t", 0), ("u", 0), ("u", 9)]) == {
        ("t", 0): "GROUP_SUBSCRIBED_TO_TOPIC",
        ("u", 0): "OK",
        ("u", 9): "UNKNOWN_TOPIC_OR_PARTITION",
    }
    assert fetch_offsets(stub, "g") == {("t", 0): 2, ("u", 1): 6}
    broker.restart()  # the tombstone is in the offsets log
    with broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        assert fetch_offsets(stub, "g") == {("t", 0): 2, ("u", 1): 6}
        # Its member forgotten with the restart, the group's own topic may go too.
        assert offset_delete(stub, "g", [("t", 0)]) == {("t", 0): "OK"}
        assert fetch_offsets(stub, "g") == {("u", 1): 6}
        error = failure(lambda: offset_delete(stub, "nobody", [("u", 1)]))
        assert (error.code(), error_code(error)) == (
            grpc.StatusCode.NOT_FOUND,
            "GROUP_ID_NOT_FOUND",
        )


def _subscription(*topics: str) -> bytes:
    """Kafka's ConsumerProtocolSubscription v0 of ``topics`` (no user data)."""
    out = b"\x00\x00" + len(topics).to_bytes(4, "big")
    for name in topics:
        out += len(name).to_bytes(2, "big") + name.encode()
    return out + b"\xff\xff\xff\xff"


def _classic_join(
    broker: InProcessBroker, group_id: str, protocol_type: str, metadata: bytes
) -> str:
    from tidelog.broker.groups.classic import ClassicError, JoinRequest

    joined = broker.server.core.groups.classic.join(
        JoinRequest(
            group_id=group_id,
            member_id="",
            group_instance_id=None,
            client_id="classic",
            client_host="127.0.0.1",
            session_timeout_ms=10_000,
            rebalance_timeout_ms=10_000,
            protocol_type=protocol_type,
            protocols=(("range", metadata),),
            require_known_member_id=False,
        )
    ).result(timeout=TIMEOUT_S)
    assert joined.error is ClassicError.NONE
    return joined.member_id


def test_classic_members_keep_their_topics_and_their_group(
    broker: InProcessBroker, stub: pb_grpc.BrokerStub
) -> None:
    """A classic member's subscription is read from its protocol metadata; one that does
    not parse counts as every topic, and a group of another protocol type than "consumer"
    is refused as a whole, as Kafka's ``GroupMetadata`` does. DeleteGroup refuses a group
    with classic members (it used to delete their offsets)."""
    create_topic(stub, "u", partitions=1)
    for group_id in ("c", "odd", "connect"):
        commit(stub, group_id, {("t", 0): 1, ("u", 0): 1})
    member = _classic_join(broker, "c", "consumer", _subscription("t"))
    _classic_join(broker, "odd", "consumer", b"\x00")
    _classic_join(broker, "connect", "connect", b"worker")
    assert offset_delete(stub, "c", [("t", 0), ("u", 0)]) == {
        ("t", 0): "GROUP_SUBSCRIBED_TO_TOPIC",
        ("u", 0): "OK",
    }
    assert offset_delete(stub, "odd", [("u", 0)]) == {("u", 0): "GROUP_SUBSCRIBED_TO_TOPIC"}
    error = failure(lambda: offset_delete(stub, "connect", [("u", 0)]))
    assert error_code(error) == "NON_EMPTY_GROUP"
    error = failure(
        lambda: stub.DeleteGroup(pb.DeleteGroupRequest(group_id="c"), timeout=TIMEOUT_S)
    )
    assert error_code(error) == "NON_EMPTY_GROUP"
    assert fetch_offsets(stub, "c") == {("t", 0): 1}
    classic = broker.server.core.groups.classic
    assert classic.leave("c", member).value == "NONE"
    stub.DeleteGroup(pb.DeleteGroupRequest(group_id="c"), timeout=TIMEOUT_S)
    assert fetch_offsets(stub, "c") == {}
    assert classic.subscriptions("c") is None
