"""The consumer's unary lookups and commits: offsets, partitions, committed offsets.

Thin functions over ``client.routing.ClusterConnections`` that send each call where it
belongs and follow it when it moves:

- ``list_offsets``: ``ListOffsets`` to each partition's leader (-2 earliest, -1 latest,
  else a timestamp in ms); partitions whose leader moved are asked again of the new one;
- ``partitions_of``: the partition numbers of a topic (``DescribeTopic``, any broker);
- ``commit_offsets``/``fetch_committed``: ``OffsetCommit``/``OffsetFetch`` to the group's
  coordinator (found with ``FindCoordinator``, found again on ``NOT_COORDINATOR``), shared
  by group members (member id and epoch) and consumers without membership (member id "");
  ``fetch_committed_offsets`` also returns each offset's committed leader epoch;
- ``offsets_for_leader_epochs``: ``OffsetForLeaderEpoch`` to each partition's leader, as
  ``list_offsets`` (the consumer's position validation, KIP-320).

Stateless and thread-safe.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from tidelog.client.connection import CommittedOffset, Connection, EpochEndResult
from tidelog.client.routing import ClusterConnections
from tidelog.client.types import TopicPartition
from tidelog.storage.errors import TidelogError, UnstableOffsetCommitError

__all__ = [
    "commit_offsets",
    "fetch_committed",
    "fetch_committed_offsets",
    "list_offsets",
    "offsets_for_leader_epochs",
    "partitions_of",
]

# How long a read_committed consumer waits before asking again for an offset pending in
# a transaction (Kafka's consumer: retry.backoff.ms, 100 ms).
_UNSTABLE_BACKOFF_S = 0.1


def list_offsets(
    connections: ClusterConnections,
    queries: Mapping[TopicPartition, int],
    timeout_ms: int | None,
    *,
    isolation_level: int = 0,
) -> dict[TopicPartition, tuple[int, int]]:
    """``(offset, timestamp_ms)`` per partition; offset -1 where no record is that recent.

    Latest (-1) is the high watermark, or the last stable offset with ``isolation_level``
    1 (read_committed), as Kafka's ListOffsets answers.

    Raises a partition's error (``UnknownTopicOrPartitionError``...; an offline
    partition's ``LeaderNotAvailableError`` once ``timeout_ms`` passed) or the call's.
    """

    def ask(
        connection: Connection, batch: dict[TopicPartition, int], timeout: int
    ) -> dict[TopicPartition, tuple[int, int] | TidelogError]:
        answers = connection.list_offsets(
            batch, timeout_ms=timeout, isolation_level=isolation_level
        )
        return {
            tp: (r.offset, r.timestamp_ms) if r.error is None else r.error
            for tp, r in answers.items()
        }

    return connections.run_per_leader(queries, ask, what="ListOffsets", timeout_ms=timeout_ms)


def offsets_for_leader_epochs(
    connections: ClusterConnections,
    queries: Mapping[TopicPartition, tuple[int, int]],
    timeout_ms: int | None,
) -> dict[TopicPartition, EpochEndResult]:
    """Per partition ``(leader epoch, current leader epoch or -1)``: where that epoch ends
    on the leader (``EpochEndResult``). Raises as ``list_offsets``."""

    def ask(
        connection: Connection, batch: dict[TopicPartition, tuple[int, int]], timeout: int
    ) -> dict[TopicPartition, EpochEndResult | TidelogError]:
        answers = connection.offsets_for_leader_epochs(batch, timeout_ms=timeout)
        return {tp: r if r.error is None else r.error for tp, r in answers.items()}

    return connections.run_per_leader(
        queries, ask, what="OffsetForLeaderEpoch", timeout_ms=timeout_ms
    )


def partitions_of(connections: ClusterConnections, topic: str, timeout_ms: int | None) -> list[int]:
    """The partition numbers of ``topic``; ``UnknownTopicOrPartitionError`` if none."""
    description = connections.run(
        connections.route_any(),
        lambda connection, timeout: connection.describe_topic(topic, timeout_ms=timeout),
        what=f"DescribeTopic {topic}",
        timeout_ms=timeout_ms,
    )
    return [p.partition for p in description.partitions]


def commit_offsets(
    connections: ClusterConnections,
    group_id: str,
    offsets: Mapping[TopicPartition, int],
    *,
    member_id: str,
    member_epoch: int,
    timeout_ms: int,
    leader_epochs: Mapping[TopicPartition, int] | None = None,
) -> dict[TopicPartition, TidelogError]:
    """One ``OffsetCommit`` to the coordinator; returns the partitions that failed.
    ``leader_epochs``: the committed leader epoch of some partitions (KIP-320).

    Raises the call's error (``StaleMemberEpochError``, ``UnknownMemberIdError``,
    ``GroupNotEmptyError`` for a commit without membership while the group has members,
    ``BrokerUnavailableError``...).
    """
    return connections.run(
        connections.route_coordinator(group_id),
        lambda connection, timeout: connection.commit_offsets(
            group_id,
            offsets,
            member_id=member_id,
            member_epoch=member_epoch,
            timeout_ms=timeout,
            leader_epochs=leader_epochs,
        ),
        what=f"OffsetCommit {group_id}",
        timeout_ms=timeout_ms,
        group_id=group_id,
    )


def fetch_committed(
    connections: ClusterConnections,
    group_id: str,
    partitions: Iterable[TopicPartition],
    timeout_ms: int,
) -> dict[TopicPartition, int]:
    """The group's committed offsets of ``partitions`` (those without one are left out)."""
    found = fetch_committed_offsets(connections, group_id, partitions, timeout_ms)
    return {tp: committed.offset for tp, committed in found.items()}


def fetch_committed_offsets(
    connections: ClusterConnections,
    group_id: str,
    partitions: Iterable[TopicPartition],
    timeout_ms: int,
    *,
    require_stable: bool = False,
) -> dict[TopicPartition, CommittedOffset]:
    """``fetch_committed`` with each offset's committed leader epoch (-1: unknown).

    ``require_stable`` (KIP-447; a read_committed consumer's, as Kafka's consumer sets
    it): while the group's offset of a partition is pending in an undecided transaction
    the coordinator answers ``UNSTABLE_OFFSET_COMMIT``, and the call is made again every
    ``_UNSTABLE_BACKOFF_S`` until the marker is written or ``timeout_ms`` passes (then the
    error is raised). Without it a consumer that takes over right after a transaction's
    commit could start from the offset before it and process its input twice.
    """
    wanted = list(partitions)
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        left = max(int((deadline - time.monotonic()) * 1000), 1)
        try:
            return connections.run(
                connections.route_coordinator(group_id),
                lambda connection, timeout: connection.fetch_committed_offsets(
                    group_id, wanted, timeout_ms=timeout, require_stable=require_stable
                ),
                what=f"OffsetFetch {group_id}",
                timeout_ms=left,
                group_id=group_id,
            )
        except UnstableOffsetCommitError:
            if time.monotonic() + _UNSTABLE_BACKOFF_S >= deadline:
                raise
            time.sleep(_UNSTABLE_BACKOFF_S)
