"""Kafka's rack-unaware replica placement, as the controller uses it for new topics."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.broker.cluster.assignment import assign_replicas, rack_alternated, rack_of
from tidelog.storage.errors import InvalidReplicationFactorError


def test_kafkas_example_five_brokers_ten_partitions() -> None:
    # Kafka's AdminUtils documentation: brokers 0-4, start index 0, shift 0.
    placed = assign_replicas(10, 3, [0, 1, 2, 3, 4], start_index=0, replica_shift=0)
    assert placed[0] == [0, 1, 2]
    assert placed[4] == [4, 0, 1]
    assert placed[5] == [0, 2, 3]  # the shift grew after one round of brokers
    assert placed[9] == [4, 1, 2]


def test_broker_ids_need_not_be_dense_and_growth_continues_the_pattern() -> None:
    whole = assign_replicas(6, 2, [7, 3, 11], start_index=1, replica_shift=2)
    grown = assign_replicas(3, 2, [3, 7, 11], start_index=1, replica_shift=2, first_partition=3)
    assert grown == {p: whole[p] for p in (3, 4, 5)}
    assert all(set(r) <= {3, 7, 11} for r in whole.values())


@pytest.mark.parametrize("factor", [0, 4])
def test_impossible_replication_factors(factor: int) -> None:
    with pytest.raises(InvalidReplicationFactorError, match="replication factor"):
        assign_replicas(3, factor, [1, 2, 3], start_index=0, replica_shift=0)


@given(
    brokers=st.sets(st.integers(0, 50), min_size=1, max_size=7),
    partitions=st.integers(0, 60),
    data=st.data(),
)
def test_replicas_are_distinct_and_leaders_even(
    brokers: set[int], partitions: int, data: st.DataObject
) -> None:
    factor = data.draw(st.integers(1, len(brokers)))
    start = data.draw(st.integers(0, 100))
    shift = data.draw(st.integers(0, 100))
    placed = assign_replicas(
        partitions, factor, list(brokers), start_index=start, replica_shift=shift
    )
    assert sorted(placed) == list(range(partitions))
    for replicas in placed.values():
        assert len(replicas) == factor
        assert len(set(replicas)) == factor
        assert set(replicas) <= brokers
    leaders = Counter(r[0] for r in placed.values())
    if partitions >= len(brokers):
        assert max(leaders.values()) - min(leaders[b] for b in brokers) <= 1
    replicas_per_broker = Counter(b for r in placed.values() for b in r)
    if partitions and partitions % len(brokers) == 0:
        assert len(set(replicas_per_broker.values())) == 1  # every broker holds as many


@given(
    racks=st.dictionaries(
        st.integers(0, 30), st.sampled_from(["a", "b", "c", None]), min_size=1, max_size=8
    ),
    partitions=st.integers(0, 30),
    data=st.data(),
)
def test_rack_aware_placement_spreads_every_partition_over_racks(
    racks: dict[int, str | None], partitions: int, data: st.DataObject
) -> None:
    brokers = sorted(racks)
    factor = data.draw(st.integers(1, len(brokers)))
    placed = assign_replicas(
        partitions,
        factor,
        brokers,
        start_index=data.draw(st.integers(0, 100)),
        replica_shift=data.draw(st.integers(0, 100)),
        racks=racks,
    )
    rack_count = len({rack_of(b, racks) for b in brokers})
    assert sorted(placed) == list(range(partitions))
    for replicas in placed.values():
        assert len(set(replicas)) == factor
        assert set(replicas) <= set(brokers)
        assert len({rack_of(r, racks) for r in replicas}) == min(factor, rack_count)


def test_leaders_alternate_between_racks() -> None:
    racks = {1: "a", 2: "a", 3: "b", 4: "b"}
    assert rack_alternated([1, 2, 3, 4], racks) == [1, 3, 2, 4]
    placed = assign_replicas(4, 2, [1, 2, 3, 4], start_index=0, replica_shift=0, racks=racks)
    assert [r[0] for r in placed.values()] == [1, 3, 2, 4]
    assert all({racks[r] for r in replicas} == {"a", "b"} for replicas in placed.values())
