"""The cluster as Kafka clients see it: which brokers to list, each partition's leader.

Pure: a map of the live brokers to their Kafka endpoints and the core's placements in,
the plain values of Metadata, DescribeCluster and FindCoordinator answers out.

``KafkaBrokers`` maps every live broker's id to its Kafka endpoint ``(host, port)``, or to
None for a live broker without a Kafka listener (cluster mode: the brokers' registrations,
``broker.cluster.znodes``; a single node: itself). Following Kafka's ZooKeeper-era
metadata cache (``ZkMetadataCache.getPartitionMetadata``):

- only brokers with a Kafka endpoint are listed (Kafka lists the brokers that have the
  listener the client came in on);
- a partition whose leader is -1 (offline, or no election yet) or not a live broker (it
  died and the controller has not elected another yet) answers ``LEADER_NOT_AVAILABLE``
  with leader -1; one whose leader is live but has no Kafka listener answers
  ``LISTENER_NOT_FOUND`` (Metadata v6+; ``LEADER_NOT_AVAILABLE`` before), leader -1;
  either way the client refreshes its metadata and retries;
- replicas and ISR are the cluster's, unfiltered (Kafka filters them for v0 only);
  ``offline_replicas`` are the replicas whose broker is not live;
- the leader epoch is the cluster's, also when there is no leader.

KIP-951 leader discovery (``leader_hint``): a Produce (v10+) or Fetch (v16+) answered
``NOT_LEADER_OR_FOLLOWER`` (or, for Fetch, ``FENCED_LEADER_EPOCH``) carries the
partition's current leader and epoch as this broker sees them, and the response lists
that leader's Kafka endpoint (``node_endpoints``), so the client moves to it without a
Metadata round trip. As Kafka's ``KafkaApis.getCurrentLeader``: the leader id and epoch
are sent whatever they are (-1 when there is none); the endpoint only for a live leader
with a Kafka listener (a leader the client could not reach is no hint).
"""

from __future__ import annotations

from collections.abc import Mapping

from tidelog.broker.core.placement import NO_LEADER, PartitionPlacement
from tidelog.broker.kafka.codec import Plain
from tidelog.broker.kafka.errors import NONE, error_code_for

__all__ = [
    "KafkaBrokers",
    "broker_entries",
    "coordinator_endpoint",
    "leader_hint",
    "partition_entry",
]

KafkaBrokers = Mapping[int, tuple[str, int] | None]

_LEADER_NOT_AVAILABLE = error_code_for("LEADER_NOT_AVAILABLE")
_LISTENER_NOT_FOUND = error_code_for("LISTENER_NOT_FOUND")
_FIRST_LISTENER_NOT_FOUND_VERSION = 6  # Metadata; older versions cannot carry the code


def broker_entries(
    brokers: KafkaBrokers,
    id_field: str = "node_id",
    racks: Mapping[int, str | None] | None = None,
) -> list[Plain]:
    """The brokers with a Kafka endpoint, by id: Metadata's ``brokers`` (``node_id``) or
    DescribeCluster's (``broker_id``), each with its ``broker.rack`` (null: none)."""
    racks = racks or {}
    return [
        {
            id_field: broker_id,
            "host": endpoint[0],
            "port": endpoint[1],
            "rack": racks.get(broker_id),
        }
        for broker_id, endpoint in sorted(brokers.items())
        if endpoint is not None
    ]


def partition_entry(
    index: int, placement: PartitionPlacement, brokers: KafkaBrokers, api_version: int
) -> Plain:
    """One partition of a Metadata answer (rules in the module docstring)."""
    leader = placement.leader
    error = NONE
    if leader == NO_LEADER or leader not in brokers:
        error, leader = _LEADER_NOT_AVAILABLE, NO_LEADER
    elif brokers[leader] is None:
        error = (
            _LISTENER_NOT_FOUND
            if api_version >= _FIRST_LISTENER_NOT_FOUND_VERSION
            else _LEADER_NOT_AVAILABLE
        )
        leader = NO_LEADER
    return {
        "error_code": error,
        "partition_index": index,
        "leader_id": leader,
        "leader_epoch": placement.leader_epoch,
        "replica_nodes": list(placement.replicas),
        "isr_nodes": list(placement.isr),
        "offline_replicas": [r for r in placement.replicas if r not in brokers],
    }


def coordinator_endpoint(broker_id: int, brokers: KafkaBrokers) -> tuple[str, int] | None:
    """The Kafka endpoint of coordinator ``broker_id``; None if it is not live or has no
    Kafka listener (the caller answers ``COORDINATOR_NOT_AVAILABLE``, which clients
    retry)."""
    return brokers.get(broker_id)


def leader_hint(
    placement: PartitionPlacement,
    brokers: KafkaBrokers,
    racks: Mapping[int, str | None] | None = None,
) -> tuple[Plain, Plain | None]:
    """KIP-951 (module docstring): the ``current_leader`` of a partition answered
    ``NOT_LEADER_OR_FOLLOWER``, and its leader's ``node_endpoints`` entry (None: not
    live, or no Kafka listener)."""
    leader = placement.leader
    current = {"leader_id": leader, "leader_epoch": placement.leader_epoch}
    endpoint = brokers.get(leader) if leader != NO_LEADER else None
    if endpoint is None:
        return current, None
    node = {
        "node_id": leader,
        "host": endpoint[0],
        "port": endpoint[1],
        "rack": (racks or {}).get(leader),
    }
    return current, node
