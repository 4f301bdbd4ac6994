"""The cluster as Kafka clients see it (``broker.kafka.cluster``): which brokers Metadata
lists and what each partition answers, as Kafka's ZooKeeper-era metadata cache does. Pure:
no broker."""

from __future__ import annotations

from tidelog.broker.core.placement import PartitionPlacement
from tidelog.broker.kafka.cluster import broker_entries, coordinator_endpoint, partition_entry

# Brokers 1 and 2 live with Kafka listeners, 3 live without one; 4 is not live.
BROKERS = {1: ("10.0.0.1", 9092), 2: ("10.0.0.2", 9093), 3: None}


def test_only_brokers_with_a_kafka_listener_are_listed() -> None:
    assert broker_entries(BROKERS) == [
        {"node_id": 1, "host": "10.0.0.1", "port": 9092, "rack": None},
        {"node_id": 2, "host": "10.0.0.2", "port": 9093, "rack": None},
    ]
    assert [b["broker_id"] for b in broker_entries(BROKERS, "broker_id")] == [1, 2]


def test_a_live_leader_is_answered_with_the_clusters_lists() -> None:
    placement = PartitionPlacement(2, 7, (2, 4, 1), (2, 1))
    assert partition_entry(0, placement, BROKERS, 12) == {
        "error_code": 0,
        "partition_index": 0,
        "leader_id": 2,
        "leader_epoch": 7,
        "replica_nodes": [2, 4, 1],
        "isr_nodes": [2, 1],
        "offline_replicas": [4],
    }


def test_no_leader_or_a_dead_leader_is_leader_not_available() -> None:
    for leader in (-1, 4):
        entry = partition_entry(3, PartitionPlacement(leader, 5, (4, 1), (4,)), BROKERS, 12)
        assert (entry["error_code"], entry["leader_id"], entry["leader_epoch"]) == (5, -1, 5)
        assert entry["offline_replicas"] == [4]


def test_a_leader_without_a_kafka_listener_is_listener_not_found_from_v6() -> None:
    placement = PartitionPlacement(3, 1, (3, 1), (3, 1))
    assert partition_entry(0, placement, BROKERS, 6)["error_code"] == 72
    assert partition_entry(0, placement, BROKERS, 5)["error_code"] == 5
    assert partition_entry(0, placement, BROKERS, 6)["leader_id"] == -1


def test_coordinator_endpoint() -> None:
    assert coordinator_endpoint(2, BROKERS) == ("10.0.0.2", 9093)
    assert coordinator_endpoint(3, BROKERS) is None  # live, no Kafka listener
    assert coordinator_endpoint(4, BROKERS) is None  # not live
