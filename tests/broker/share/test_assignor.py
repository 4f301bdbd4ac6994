"""The share-group assignor (``broker.share.assignor``): its guarantees as properties over
random groups, and the shapes a work queue meets (more members than partitions)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.broker.share.assignor import Assignment, assign, sharing
from tidelog.storage.types import TopicPartition

pytestmark = pytest.mark.timeout(120)

TOPICS = ("a", "b", "c")

_counts = st.dictionaries(st.sampled_from(TOPICS), st.integers(0, 6), max_size=3)
_subscriptions = st.dictionaries(
    st.text("mnopqrstuvwxyz", min_size=1, max_size=3),
    st.frozensets(st.sampled_from((*TOPICS, "missing")), max_size=3),
    max_size=12,
)


def _check(
    subscriptions: dict[str, frozenset[str]],
    counts: dict[str, int],
    result: dict[str, Assignment],
) -> None:
    """Every guarantee of the module docstring, for one result."""
    assert set(result) == set(subscriptions)
    for topic, count in counts.items():
        subscribers = [m for m, topics in subscriptions.items() if topic in topics]
        per_partition = Counter(
            tp.partition for m in subscribers for tp in result[m] if tp.topic == topic
        )
        if not subscribers or count == 0:
            assert not per_partition
            continue
        share = sharing(len(subscribers), count)
        # Sharing: every partition has exactly `share` members.
        assert per_partition == dict.fromkeys(range(count), share)
        # Balance: the subscribers' counts of this topic differ by one at most, none is 0.
        loads = [sum(tp.topic == topic for tp in result[m]) for m in subscribers]
        assert max(loads) - min(loads) <= 1
        assert min(loads) >= 1
    for member, assigned in result.items():
        for tp in assigned:
            # Only subscribers, only partitions that exist.
            assert tp.topic in subscriptions[member]
            assert 0 <= tp.partition < counts.get(tp.topic, 0)


@given(_subscriptions, _counts)
@settings(max_examples=300, deadline=None)
def test_from_nothing_every_guarantee_holds(
    subscriptions: dict[str, frozenset[str]], counts: dict[str, int]
) -> None:
    _check(subscriptions, counts, assign(subscriptions, counts, {}))


@given(_subscriptions, _counts, st.data())
@settings(max_examples=300, deadline=None)
def test_from_any_current_assignment_every_guarantee_holds_and_it_is_a_fixed_point(
    subscriptions: dict[str, frozenset[str]], counts: dict[str, int], data: st.DataObject
) -> None:
    partitions = st.builds(TopicPartition, st.sampled_from(TOPICS), st.integers(-1, 7))
    current = {
        m: frozenset(data.draw(st.lists(partitions, max_size=6), label=m)) for m in subscriptions
    }
    result = assign(subscriptions, counts, current)
    _check(subscriptions, counts, result)
    assert assign(subscriptions, counts, result) == result


def _one_topic(members: list[str]) -> dict[str, frozenset[str]]:
    return {m: frozenset({"a"}) for m in members}


@given(st.integers(1, 12), st.integers(1, 6), st.data())
@settings(max_examples=300, deadline=None)
def test_a_member_leaving_moves_nobody_else_while_the_sharing_holds(
    members: int, partitions: int, data: st.DataObject
) -> None:
    ids = [f"m{i:02}" for i in range(members + 1)]
    before = assign(_one_topic(ids), {"a": partitions}, {})
    leaver = data.draw(st.sampled_from(ids))
    rest = [m for m in ids if m != leaver]
    after = assign(_one_topic(rest), {"a": partitions}, before)
    _check(_one_topic(rest), {"a": partitions}, after)
    if sharing(len(rest), partitions) == sharing(len(ids), partitions):
        for member in rest:
            assert before[member] <= after[member], member


@given(st.integers(1, 12), st.integers(1, 6))
@settings(max_examples=300, deadline=None)
def test_a_member_joining_takes_little_from_the_others(members: int, partitions: int) -> None:
    ids = [f"m{i:02}" for i in range(members)]
    before = assign(_one_topic(ids), {"a": partitions}, {})
    after = assign(_one_topic([*ids, "new"]), {"a": partitions}, before)
    _check(_one_topic([*ids, "new"]), {"a": partitions}, after)
    share = sharing(members + 1, partitions)
    if share == sharing(members, partitions):
        # Every old member keeps as much as its new quota allows, and the newcomer's
        # pairs are exactly the ones the others gave up.
        quota = share * partitions // (members + 1)
        for member in ids:
            assert len(before[member] & after[member]) >= min(len(before[member]), quota)
        moved = sum(len(before[m] - after[m]) for m in ids)
        assert moved == len(after["new"])


def test_more_members_than_partitions_share_every_partition() -> None:
    members = {f"c{i}": frozenset({"jobs"}) for i in range(4)}
    result = assign(members, {"jobs": 2}, {})
    assert all(len(assigned) == 1 for assigned in result.values())
    per_partition = Counter(tp.partition for assigned in result.values() for tp in assigned)
    assert per_partition == {0: 2, 1: 2}


def test_three_members_on_two_partitions_read_both_equally() -> None:
    result = assign({m: frozenset({"jobs"}) for m in "xyz"}, {"jobs": 2}, {})
    assert sorted(len(a) for a in result.values()) == [1, 1, 2]
    assert Counter(tp.partition for a in result.values() for tp in a) == {0: 2, 1: 2}


def test_fewer_members_than_partitions_split_them() -> None:
    result = assign({m: frozenset({"jobs"}) for m in "xy"}, {"jobs": 5}, {})
    assert sorted(len(a) for a in result.values()) == [2, 3]
    assert frozenset().union(*result.values()) == {TopicPartition("jobs", p) for p in range(5)}


def test_nothing_for_a_topic_that_does_not_exist_yet() -> None:
    assert assign({"m": frozenset({"later"})}, {}, {}) == {"m": frozenset()}
