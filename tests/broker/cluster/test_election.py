"""Kafka's election rules, as pure functions (``broker.cluster.election``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tidelog.broker.cluster.election import (
    elect_for_shutdown,
    elect_preferred,
    leadership_predates_leader,
    reconcile,
)
from tidelog.broker.cluster.znodes import NO_LEADER, PartitionState

REPLICAS = (1, 2, 3)


def state(leader: int, *isr: int, epoch: int = 4) -> PartitionState:
    return PartitionState(leader, epoch, tuple(isr), 7)


def test_offline_election_takes_the_first_live_isr_member_in_assignment_order() -> None:
    elected = reconcile(REPLICAS, state(1, 1, 3, 2), {2, 3}, controller_epoch=8)
    assert elected is not None
    assert elected.state == PartitionState(2, 5, (3, 2), 8)
    assert not elected.unclean


def test_no_clean_candidate_means_offline_unless_unclean_is_allowed() -> None:
    offline = reconcile(REPLICAS, state(1, 1), {2, 3}, controller_epoch=8)
    assert offline is not None
    # The dead last ISR member stays in the ISR (ZooKeeper mode), remembered as the last
    # known leader.
    assert offline.state == PartitionState(NO_LEADER, 5, (1,), 8, last_known_leader=1)
    assert reconcile(REPLICAS, offline.state, {2, 3}, controller_epoch=8) is None  # still
    unclean = reconcile(REPLICAS, state(1, 1), {3, 2}, unclean_allowed=True, controller_epoch=8)
    assert unclean is not None
    assert unclean.unclean
    assert unclean.state == PartitionState(2, 5, (2,), 8)


def test_preferred_election() -> None:
    moved = elect_preferred(REPLICAS, state(2, 2, 1), {1, 2}, controller_epoch=8)
    assert moved is not None
    assert moved.state.leader == 1
    assert elect_preferred(REPLICAS, state(1, 1, 2), {1, 2}, controller_epoch=8) is None  # already
    assert elect_preferred(REPLICAS, state(2, 2), {1, 2}, controller_epoch=8) is None  # not in ISR
    assert elect_preferred(REPLICAS, state(2, 2, 1), {2}, controller_epoch=8) is None  # dead


def test_controlled_shutdown_moves_leadership_and_membership() -> None:
    moved = elect_for_shutdown(REPLICAS, state(1, 1, 2, 3), {1, 2, 3}, {1}, controller_epoch=8)
    assert moved is not None
    assert moved.state == PartitionState(2, 5, (2, 3), 8)
    follower = elect_for_shutdown(REPLICAS, state(2, 1, 2, 3), {1, 2, 3}, {1}, controller_epoch=8)
    assert follower is not None
    assert follower.state == PartitionState(2, 5, (2, 3), 8)
    alone = elect_for_shutdown(REPLICAS, state(1, 1), {1, 2, 3}, {1}, controller_epoch=8)
    assert alone is None  # nobody in the ISR to take over: keep leading until it stops


def test_a_dead_follower_leaves_the_isr_at_the_same_leader_epoch() -> None:
    # KRaft's rule (KAFKA-15021): only a new leader bumps the epoch; the leader takes the
    # smaller ISR from its view (Partition.update_isr).
    shrunk = reconcile(REPLICAS, state(1, 1, 2, 3), {1, 2}, controller_epoch=8)
    assert shrunk is not None
    assert shrunk.state == PartitionState(1, 4, (1, 2), 8)
    assert reconcile(REPLICAS, state(1, 1, 2), {1, 2}, controller_epoch=8) is None


@given(
    isr=st.lists(st.sampled_from(REPLICAS), min_size=1, max_size=3, unique=True),
    live=st.sets(st.sampled_from(REPLICAS)),
    unclean=st.booleans(),
)
def test_an_elected_leader_is_live_and_clean_unless_flagged(
    isr: list[int], live: set[int], unclean: bool
) -> None:
    before = state(isr[0], *isr)
    if isr[0] in live:
        live = live - {isr[0]}  # the leader is gone: an election
    elected = reconcile(REPLICAS, before, live, unclean_allowed=unclean, controller_epoch=8)
    assert elected is not None
    if elected.state.leader == NO_LEADER:
        assert not (live & set(isr))
        assert not (unclean and live)
        return
    assert elected.state.leader in live
    assert elected.state.leader_epoch == before.leader_epoch + 1
    assert elected.state.leader in elected.state.isr
    assert set(elected.state.isr) <= live
    assert elected.unclean == (elected.state.leader not in isr)


def test_a_leadership_predates_a_leader_that_registered_after_it_was_written() -> None:
    written = 1_000
    # Broker 1 registered (zxid 1,200) after the state naming it leader was written.
    assert leadership_predates_leader(state(1, 1, 2), written, {1: 1_200, 2: 900})
    # Registered before: a grant to this life.
    assert not leadership_predates_leader(state(2, 1, 2), written, {1: 1_200, 2: 900})
    # A leader that is not live is the ordinary offline case, and no leader is none.
    assert not leadership_predates_leader(state(3, 3), written, {1: 1_200})
    assert not leadership_predates_leader(state(NO_LEADER, 1), written, {1: 1_200})
