"""The pure cluster values: bootstrap lists, leader lookup, and the metadata cache's timing."""

from __future__ import annotations

import pytest

from tidelog.client.cluster import (
    NO_LEADER,
    BrokerNode,
    ClusterMetadata,
    MetadataCache,
    PartitionMetadata,
    TopicMetadata,
    parse_bootstrap_list,
)
from tidelog.client.types import TopicPartition


def test_bootstrap_list_keeps_order_and_drops_blanks_and_duplicates() -> None:
    assert parse_bootstrap_list(" a:1 ,b:2,a:1,[::1]:3") == ("a:1", "b:2", "[::1]:3")


@pytest.mark.parametrize("value", ["", "a:1,", "a:1,b", "a:0", "a:65536", ",a:1", 7])
def test_bad_bootstrap_lists_are_refused(value: object) -> None:
    with pytest.raises(ValueError, match="bootstrap_servers"):
        parse_bootstrap_list(value)


def _metadata(leader: int) -> ClusterMetadata:
    return ClusterMetadata(
        cluster_id="c",
        controller_id=1,
        broker_id=0,
        brokers={0: BrokerNode(0, "h0", 1), 1: BrokerNode(1, "::1", 2)},
        topics={
            "t": TopicMetadata("t", (PartitionMetadata(0, leader, 3, (leader,), (leader,)),)),
            "gone": TopicMetadata("gone", (), error_code="UNKNOWN_TOPIC_OR_PARTITION"),
        },
    )


def test_leader_lookup() -> None:
    metadata = _metadata(1)
    assert metadata.leader_for(TopicPartition("t", 0)) == BrokerNode(1, "::1", 2)
    assert metadata.leader_for(TopicPartition("t", 0)).address == "[::1]:2"  # type: ignore[union-attr]
    assert metadata.controller == BrokerNode(1, "::1", 2)
    assert metadata.partition_count("t") == 1
    assert metadata.partition_count("gone") is None
    assert metadata.leader_for(TopicPartition("t", 1)) is None
    assert metadata.leader_for(TopicPartition("gone", 0)) is None
    assert _metadata(NO_LEADER).leader_for(TopicPartition("t", 0)) is None
    assert _metadata(7).leader_for(TopicPartition("t", 0)) is None  # broker not listed


def test_cache_refreshes_when_empty_then_at_max_age() -> None:
    cache = MetadataCache(max_age_ms=1_000)
    assert cache.refresh_due(0)
    cache.attempted(0)
    cache.update(_metadata(0), 0)
    assert not cache.refresh_due(999)
    assert cache.refresh_due(1_000)


def test_forced_refreshes_back_off_from_100_ms_to_1_s_and_reset_on_success() -> None:
    cache = MetadataCache(max_age_ms=60_000)
    now = 0
    cache.attempted(now)
    cache.update(_metadata(0), now)
    waits = []
    for _ in range(7):
        cache.mark_stale()
        due = cache.next_refresh_ms()
        waits.append(due - now)
        now = max(now, due)
        cache.attempted(now)
        cache.update(_metadata(0), now)
    assert waits == [100, 200, 400, 800, 1_000, 1_000, 1_000]
    cache.confirmed()
    cache.mark_stale()
    assert cache.next_refresh_ms() - now == 0  # a call got through: no backoff left
