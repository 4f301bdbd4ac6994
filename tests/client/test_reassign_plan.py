"""``client.reassign_plan``: plans that move only what must move, over random clusters
(hypothesis), and Kafka's reassignment JSON."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.client.reassign_plan import plan, plan_from_json, plan_to_json, rack_of
from tidelog.client.types import TopicPartition


@st.composite
def clusters(
    draw: st.DrawFn,
) -> tuple[dict[TopicPartition, tuple[int, ...]], list[int], dict[int, str | None]]:
    """(current replicas, the brokers to keep or use, racks) of a random cluster: some
    brokers removed, some added."""
    old = draw(st.lists(st.integers(0, 12), min_size=1, max_size=7, unique=True))
    new = draw(st.lists(st.integers(0, 12), min_size=1, max_size=7, unique=True))
    factor = draw(st.integers(1, min(len(old), len(new))))
    racks = {b: draw(st.sampled_from(["a", "b", "c", None])) for b in set(old) | set(new)}
    current = {
        TopicPartition("t", p): tuple(draw(st.permutations(old))[:factor])
        for p in range(draw(st.integers(1, 12)))
    }
    return current, new, racks


def _racks(replicas: tuple[int, ...], racks: dict[int, str | None]) -> int:
    return len({rack_of(r, racks) for r in replicas})


@settings(max_examples=300, deadline=None)
@given(clusters(), st.booleans())
def test_a_plan_keeps_every_partition_whole_and_moves_only_what_must_move(
    cluster: tuple[dict[TopicPartition, tuple[int, ...]], list[int], dict[int, str | None]],
    balance: bool,
) -> None:
    current, brokers, racks = cluster
    moves = plan(current, brokers, racks, balance=balance)
    after = {**current, **moves}
    total_racks = len({rack_of(b, racks) for b in brokers})
    for tp, replicas in after.items():
        before = current[tp]
        # The same replication factor, on distinct listed brokers.
        assert len(replicas) == len(before)
        assert len(set(replicas)) == len(replicas)
        assert set(replicas) <= set(brokers)
        # Every replica on a listed broker that did not have to make room stays put...
        kept = [r for r in before if r in brokers]
        replaced = len(before) - len(kept)
        if not balance:
            assert [r for r in replicas if r in kept] == kept
            assert [replicas[i] for i, r in enumerate(before) if r in brokers] == kept
        # ...and each replacement lands on a rack the partition lacked while one is left.
        if not balance or tp not in moves:
            assert _racks(replicas, racks) >= min(
                _racks(tuple(kept), racks) + replaced, total_racks
            )
        # A partition with nothing on a removed broker only moves to balance.
        if replaced == 0 and not balance:
            assert tp not in moves
    # Nothing that need not move: with no removed broker and loads already within one
    # replica of each other, the plan is empty.
    if all(set(r) <= set(brokers) for r in current.values()):
        load = Counter(r for replicas in current.values() for r in replicas)
        counts = [load.get(b, 0) for b in brokers]
        if max(counts) - min(counts) <= 1:
            assert moves == {}
    # Balancing leaves every broker within one replica of another, unless rack spread or
    # duplicates forbid the move that would fix it: never more apart than before.
    if balance:
        load_after = Counter(r for replicas in after.values() for r in replicas)
        counts_after = [load_after.get(b, 0) for b in brokers]
        if max(counts_after) - min(counts_after) > 1:
            donor = max(brokers, key=lambda b: load_after.get(b, 0))
            taker = min(brokers, key=lambda b: load_after.get(b, 0))
            for replicas in after.values():
                if donor in replicas and taker not in replicas:
                    moved = tuple(taker if r == donor else r for r in replicas)
                    assert _racks(moved, racks) < _racks(replicas, racks)


def test_a_broker_added_gets_its_share_and_nothing_else_moves() -> None:
    current = {TopicPartition("t", p): r for p, r in enumerate([(1, 2), (2, 3), (3, 1)] * 2)}
    moves = plan(current, [1, 2, 3, 4])
    load = Counter(r for replicas in {**current, **moves}.values() for r in replicas)
    assert sorted(load.values()) == [3, 3, 3, 3]
    assert len(moves) == 3  # one replica per moved partition
    for tp, replicas in moves.items():
        assert len(set(replicas) & set(current[tp])) == 1


def test_a_removed_broker_is_replaced_on_the_rack_the_partition_lacks() -> None:
    racks = {1: "a", 2: "a", 3: "b", 4: "b", 5: "a"}
    moves = plan({TopicPartition("t", 0): (1, 3)}, [1, 2, 4, 5], racks, balance=False)
    assert moves == {TopicPartition("t", 0): (1, 4)}
    assert plan({TopicPartition("t", 0): (3, 1)}, [1, 2, 4], racks, balance=False) == {
        TopicPartition("t", 0): (4, 1)  # the preferred leader's slot, on rack b again
    }


def test_a_plan_needs_enough_brokers() -> None:
    with pytest.raises(ValueError, match="only 1 broker"):
        plan({TopicPartition("t", 0): (1, 2)}, [1])
    with pytest.raises(ValueError, match="no brokers"):
        plan({TopicPartition("t", 0): (1,)}, [])


def test_kafka_reassignment_json_round_trips() -> None:
    moves = {TopicPartition("a", 1): (3, 1), TopicPartition("a", 0): (2,)}
    assert plan_from_json(plan_to_json(moves)) == moves
    kafka_file = (
        '{"version":1,"partitions":[{"topic":"a","partition":0,"replicas":[2],"log_dirs":["any"]}]}'
    )
    assert plan_from_json(kafka_file) == {TopicPartition("a", 0): (2,)}
    for bad in ("nope", "{}", '{"partitions":[{"topic":"a"}]}', '{"partitions":[1]}'):
        with pytest.raises(ValueError, match="plan"):
            plan_from_json(bad)
