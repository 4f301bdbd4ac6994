"""The controller's reassignment decisions (``broker.cluster.reassignment``) and their
znodes: pure, no ZooKeeper."""

from __future__ import annotations

from tidelog.broker.cluster.reassignment import cancel, complete, invalid_target, start
from tidelog.broker.cluster.znodes import (
    NO_LEADER,
    BrokerRegistration,
    PartitionState,
    TopicAssignment,
    decode_broker,
    decode_topic,
    encode_broker,
    encode_topic,
)

LIVE = {1, 2, 3, 4, 5}


def test_targets_kafka_refuses() -> None:
    assert invalid_target([], LIVE) == "the target replica list is empty"
    assert "twice" in (invalid_target([1, 1], LIVE) or "")
    assert "[9]" in (invalid_target([1, 9], LIVE) or "")
    assert invalid_target([3, 4], LIVE) is None


def test_a_move_starts_with_the_union_and_a_new_epoch() -> None:
    state = PartitionState(1, 4, (1, 2), 7)
    move = start((1, 2), (1, 2), (3, 4), state, LIVE, 8)
    assert (move.replicas, move.adding, move.removing) == ((3, 4, 1, 2), (3, 4), (1, 2))
    assert (move.state.leader, move.state.leader_epoch, move.state.isr) == (1, 5, (1, 2))
    assert move.state.controller_epoch == 8


def test_a_move_completes_once_every_target_replica_is_in_sync() -> None:
    waiting = PartitionState(1, 5, (1, 2, 3), 8)
    assert complete((3, 4, 1, 2), (1, 2), waiting, LIVE, 8) is None
    synced = PartitionState(1, 5, (1, 2, 3, 4), 8)
    done = complete((3, 4, 1, 2), (1, 2), synced, LIVE, 8)
    assert done is not None
    assert (done.replicas, done.adding, done.removing) == ((3, 4), (), ())
    # The old leader is not a target: the first live target replica in the ISR leads.
    assert (done.state.leader, done.state.leader_epoch, done.state.isr) == (3, 6, (3, 4))
    # ... and with it dead, the next one.
    later = complete((3, 4, 1, 2), (1, 2), synced, LIVE - {3}, 8)
    assert later is not None
    assert later.state.leader == 4


def test_a_leader_that_stays_keeps_leading() -> None:
    synced = PartitionState(2, 5, (1, 2, 3), 8, elr=(1,))
    done = complete((2, 3, 1), (1,), synced, LIVE, 8)
    assert done is not None
    assert (done.state.leader, done.state.isr, done.state.elr) == (2, (2, 3), ())


def test_a_cancel_goes_back_and_a_new_target_starts_from_the_original() -> None:
    state = PartitionState(3, 5, (1, 2, 3), 8)
    back = cancel((3, 4, 1, 2), (3, 4), state, LIVE, 9)
    assert back.replicas == (1, 2)
    assert (back.state.leader, back.state.isr, back.state.leader_epoch) == (1, (1, 2), 6)
    nobody = cancel((3, 4, 1, 2), (3, 4), PartitionState(3, 5, (3,), 8), LIVE, 9)
    assert nobody.state.leader == NO_LEADER  # the offline election decides
    again = start((1, 2), (3, 4, 1, 2), (5, 2), state, LIVE, 9)
    assert (again.replicas, again.adding, again.removing) == ((5, 2, 1), (5,), (1,))
    # 3 leaves with its target: the first live in-sync replica of the new union leads.
    assert (again.state.leader, again.state.isr) == (2, (1, 2))


def test_the_topic_znode_carries_the_lists_only_while_moving() -> None:
    plain = TopicAssignment("t", "id", {0: (1, 2), 1: (2, 3)})
    assert b"adding" not in encode_topic(plain)
    moving = TopicAssignment("t", "id", {0: (3, 1, 2), 1: (2, 3)}, {0: (3,)}, {0: (2,)})
    data = encode_topic(moving)
    assert b'"adding_replicas":{"0":[3]}' in data
    read = decode_topic("t", data)
    assert read == moving
    assert read.reassigning(0)
    assert not read.reassigning(1)
    assert (read.target(0), read.original(0)) == ((3, 1), (1, 2))


def test_a_registration_carries_its_rack() -> None:
    racked = BrokerRegistration(1, "h", 9092, 5, rack="r1")
    assert b'"rack":"r1"' in encode_broker(racked)
    assert decode_broker(1, encode_broker(racked)) == racked
    assert decode_broker(1, encode_broker(BrokerRegistration(1, "h", 9092))).rack is None
