"""The consumer's unary lookups and commits: offsets, partitions, committed offsets.

Thin functions over ``Transport.call`` (each one RPC with a deadline) that turn answers
into plain values and per-partition error codes into the exact ``TidelogError``:

- ``list_offsets``: ``ListOffsets`` (-2 earliest, -1 latest, else a timestamp in ms);
- ``partitions_of``: the partition numbers of a topic (``DescribeTopic``);
- ``commit_offsets``/``fetch_committed``: ``OffsetCommit``/``OffsetFetch``, shared by
  group members (member id and epoch) and consumers without membership (member id "").

Stateless and thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from client.transport import Transport
from client.types import TopicPartition
from proto.tidelog.v1 import broker_pb2 as pb
from storage.errors import TidelogError, error_for_code

__all__ = ["commit_offsets", "fetch_committed", "list_offsets", "partitions_of"]


def list_offsets(
    transport: Transport, queries: Mapping[TopicPartition, int], timeout_ms: int | None
) -> dict[TopicPartition, tuple[int, int]]:
    """``(offset, timestamp_ms)`` per partition; offset -1 where no record is that recent.

    Raises a partition's error (``UnknownTopicOrPartitionError``...) or the call's.
    """
    response = transport.call(
        transport.stub.ListOffsets,
        pb.ListOffsetsRequest(
            partitions=[
                pb.ListOffsetsPartition(topic=tp.topic, partition=tp.partition, timestamp_ms=ts)
                for tp, ts in queries.items()
            ]
        ),
        what="ListOffsets",
        timeout_ms=timeout_ms,
    )
    out: dict[TopicPartition, tuple[int, int]] = {}
    for result in response.results:
        tp = TopicPartition(result.topic, result.partition)
        if result.error_code:
            raise error_for_code(result.error_code, f"{tp}: {result.error_message}")
        out[tp] = (result.offset, result.timestamp_ms)
    return out


def partitions_of(transport: Transport, topic: str, timeout_ms: int | None) -> list[int]:
    """The partition numbers of ``topic``; ``UnknownTopicOrPartitionError`` if none."""
    description = transport.call(
        transport.stub.DescribeTopic,
        pb.DescribeTopicRequest(name=topic),
        what=f"DescribeTopic {topic}",
        timeout_ms=timeout_ms,
    )
    return [p.partition for p in description.partitions]


def commit_offsets(
    transport: Transport,
    group_id: str,
    offsets: Mapping[TopicPartition, int],
    *,
    member_id: str,
    member_epoch: int,
    timeout_ms: int,
) -> dict[TopicPartition, TidelogError]:
    """One ``OffsetCommit``; returns the partitions that failed, with their errors.

    Raises the call's error (``StaleMemberEpochError``, ``UnknownMemberIdError``,
    ``GroupNotEmptyError`` for a commit without membership while the group has members,
    ``BrokerUnavailableError``...).
    """
    response = transport.call(
        transport.stub.OffsetCommit,
        pb.OffsetCommitRequest(
            group_id=group_id,
            member_id=member_id,
            member_epoch=member_epoch,
            offsets=[
                pb.CommittedOffset(topic=tp.topic, partition=tp.partition, offset=offset)
                for tp, offset in offsets.items()
            ],
        ),
        what="OffsetCommit",
        timeout_ms=timeout_ms,
    )
    return {
        TopicPartition(r.topic, r.partition): error_for_code(
            r.error_code, f"{r.topic}-{r.partition}: {r.error_message}"
        )
        for r in response.results
        if r.error_code
    }


def fetch_committed(
    transport: Transport, group_id: str, partitions: Iterable[TopicPartition], timeout_ms: int
) -> dict[TopicPartition, int]:
    """The group's committed offsets of ``partitions`` (those without one are left out)."""
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    response = transport.call(
        transport.stub.OffsetFetch,
        pb.OffsetFetchRequest(
            group_id=group_id,
            partitions=[pb.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()],
        ),
        what="OffsetFetch",
        timeout_ms=timeout_ms,
    )
    out: dict[TopicPartition, int] = {}
    for entry in response.offsets:
        if entry.error_code:
            raise error_for_code(
                entry.error_code, f"{entry.topic}-{entry.partition}: {entry.error_message}"
            )
        if entry.offset >= 0:
            out[TopicPartition(entry.topic, entry.partition)] = entry.offset
    return out
