"""The rules of a manual replica assignment (``broker.core.replica_assignment``), with
Kafka's KRaft controller's messages, on plain values."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.broker.core.replica_assignment import (
    check_growth_assignment,
    check_replicas,
    check_topic_assignment,
)
from tidelog.storage.errors import InvalidReplicaAssignmentError, InvalidRequestError

BROKERS = {1, 2, 3, 4}


def test_a_topic_assignment_is_kept_as_given_in_partition_order() -> None:
    placed = check_topic_assignment([(1, [3, 1]), (0, [2, 3]), (2, [1, 2])], BROKERS)
    assert placed == {0: (2, 3), 1: (3, 1), 2: (1, 2)}
    assert list(placed) == [0, 1, 2]


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ([(0, [])], "The manual partition assignment includes an empty replica list."),
        (
            [(0, [1, 9, 7])],
            "The manual partition assignment includes broker 7, but no such broker is registered.",
        ),
        (
            [(0, [2, 1, 2])],
            "The manual partition assignment includes the broker 2 more than once.",
        ),
        (
            [(0, [1, 2]), (1, [3])],
            "The manual partition assignment includes a partition with 1 replica(s), but "
            "this is not consistent with previous partitions, which have 2 replica(s).",
        ),
        (
            [(0, [1]), (0, [2])],
            "Found multiple manual partition assignments for partition 0",
        ),
        (
            [(0, [1]), (2, [2])],
            "partitions should be a consecutive 0-based integer sequence",
        ),
        ([(1, [1])], "partitions should be a consecutive 0-based integer sequence"),
    ],
)
def test_a_topic_assignment_kafka_refuses(
    assignment: list[tuple[int, list[int]]], message: str
) -> None:
    with pytest.raises(InvalidReplicaAssignmentError) as caught:
        check_topic_assignment(assignment, BROKERS)
    assert caught.value.code == "INVALID_REPLICA_ASSIGNMENT"
    assert str(caught.value) == message


def test_a_count_or_a_factor_beside_an_assignment_is_an_invalid_request() -> None:
    with pytest.raises(InvalidRequestError, match="replication factor was not set to -1"):
        check_topic_assignment([(0, [1])], BROKERS, replication_factor=1)
    with pytest.raises(InvalidRequestError, match="numPartitions was not set to -1"):
        check_topic_assignment([(0, [1])], BROKERS, partitions=1)
    # Kafka checks the factor first.
    with pytest.raises(InvalidRequestError, match="replication factor"):
        check_topic_assignment([(0, [1])], BROKERS, partitions=0, replication_factor=0)


def test_unchecked_brokers_are_left_to_the_controller() -> None:
    assert check_replicas([7, 8], None, None) == (7, 8)
    with pytest.raises(InvalidReplicaAssignmentError):
        check_replicas([7, 7], None, None)


def test_growth_takes_one_list_per_new_partition_of_the_topics_factor() -> None:
    assert check_growth_assignment(
        [[4, 1], [1, 2]], BROKERS, current=3, total=5, replication_factor=2
    ) == {3: (4, 1), 4: (1, 2)}
    with pytest.raises(InvalidReplicaAssignmentError) as caught:
        check_growth_assignment([[4, 1]], BROKERS, current=3, total=5, replication_factor=2)
    assert str(caught.value) == (
        "Attempted to add 2 additional partition(s), but only 1 assignment(s) were specified."
    )
    with pytest.raises(InvalidReplicaAssignmentError, match="which have 2 replica"):
        check_growth_assignment([[4, 1, 2]], BROKERS, current=3, total=4, replication_factor=2)
    with pytest.raises(InvalidReplicaAssignmentError, match="broker 5, but no such"):
        check_growth_assignment([[4, 5]], BROKERS, current=3, total=4, replication_factor=2)


@given(
    st.lists(
        st.lists(st.integers(0, 6), min_size=0, max_size=4),
        min_size=1,
        max_size=6,
    )
)
def test_an_accepted_assignment_keeps_every_rule(lists: list[list[int]]) -> None:
    """Whatever is accepted has partitions 0..n-1, equal lengths, distinct registered
    brokers, each list unchanged; whatever breaks a rule is refused."""
    registered = {0, 1, 2, 3, 4}
    keeps_rules = all(
        r and len(set(r)) == len(r) and set(r) <= registered and len(r) == len(lists[0])
        for r in lists
    )
    try:
        placed = check_topic_assignment(list(enumerate(lists)), registered)
    except InvalidReplicaAssignmentError:
        assert not keeps_rules
        return
    assert keeps_rules
    assert placed == {p: tuple(r) for p, r in enumerate(lists)}
