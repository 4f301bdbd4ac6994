"""The share-group calls of ``AdminClient`` (issue #32): describe a share group with its
per-partition statistics, and its share offsets (list, alter, reset, delete). Deleting a
share group is ``AdminClient.delete_group``, which serves both kinds.

``ShareGroupAdminCalls`` is mixed into ``AdminClient`` (as ``client.admin_groups``'s
``GroupAdminCalls`` is): it checks the arguments (``TypeError`` / ``ValueError`` before
any call) and sends each call to the group's coordinator over gRPC (found with
``FindCoordinator`` and followed when it moves). Reset targets are resolved at each
partition's leader, as ``kafka-share-groups.sh --reset-offsets`` does, then written as an
alter. Changing a share group's offsets is refused while it has members
(``GroupNotEmptyError``), as Kafka's.

Thread-safe, as ``AdminClient`` is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tidelog.client import group_admin
from tidelog.client.config import AdminConfig
from tidelog.client.connection import Connection
from tidelog.client.grpc_connection import GrpcConnection
from tidelog.client.routing import ClusterConnections
from tidelog.client.types import TopicPartition
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.storage.errors import InvalidRequestError, error_for_code

__all__ = [
    "ShareGroupAdminCalls",
    "ShareGroupDescription",
    "ShareMember",
    "ShareOffset",
    "SharePartitionStats",
]


@dataclass(frozen=True, slots=True)
class ShareMember:
    """One member of a share group and the partitions assigned to it."""

    member_id: str
    client_id: str
    client_host: str
    member_epoch: int
    subscribed_topics: tuple[str, ...]
    assignment: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class SharePartitionStats:
    """One share partition as the leader sees it: the start offset (SPSO; below it
    everything is done), the end offset (the first offset never handed out), the records
    in flight (``acquired``), ``available`` again, ``acknowledged``, ``archived``, the
    delivery-count histogram of the window ({delivery count: records}) and the records
    copied to the dead-letter topic (``dead_lettered``)."""

    tp: TopicPartition
    start_offset: int
    end_offset: int
    acquired: int
    available: int
    acknowledged: int
    archived: int
    delivery_counts: Mapping[int, int]
    dead_lettered: int


@dataclass(frozen=True, slots=True)
class ShareGroupDescription:
    """A share group: state, epochs, members, and the statistics of its share partitions
    (those its coordinator leads: all of them on a single node)."""

    group_id: str
    state: str
    group_epoch: int
    assignment_epoch: int
    members: tuple[ShareMember, ...]
    partitions: tuple[SharePartitionStats, ...]


@dataclass(frozen=True, slots=True)
class ShareOffset:
    """One share partition's start offset (-1: the group never read it), its lag (records
    not yet done up to the high watermark; -1 unknown) and the partition's leader epoch."""

    start_offset: int
    lag: int
    leader_epoch: int


def _call(connection: Connection, method: str, request: Any, timeout_ms: int) -> Any:
    if not isinstance(connection, GrpcConnection):
        raise InvalidRequestError(f"{method} needs a gRPC connection")
    transport = connection.transport
    return transport.call(
        getattr(transport.stub, method), request, what=method, timeout_ms=timeout_ms
    )


def _by_topic(partitions: Iterable[TopicPartition]) -> list[pb.TopicPartitions]:
    grouped: dict[str, list[int]] = {}
    for tp in partitions:
        grouped.setdefault(tp.topic, []).append(tp.partition)
    return [pb.TopicPartitions(topic=t, partitions=ps) for t, ps in grouped.items()]


def _check_group(group_id: object) -> None:
    if not isinstance(group_id, str) or not group_id:
        raise ValueError(f"group_id must be a non-empty str, got {group_id!r}")


class ShareGroupAdminCalls:
    """``AdminClient``'s share-group calls. Thread-safe; needs the two attributes below."""

    config: AdminConfig
    _connections: ClusterConnections

    def _at_coordinator(
        self, group_id: str, method: str, request: Any, timeout_ms: int | None
    ) -> Any:
        return self._connections.run(
            self._connections.route_coordinator(group_id),
            lambda connection, timeout: _call(connection, method, request, timeout),
            what=f"{method} {group_id}",
            timeout_ms=self._share_timeout(timeout_ms),
            group_id=group_id,
        )

    def _share_timeout(self, timeout_ms: int | None) -> int:
        return self.config.request_timeout_ms if timeout_ms is None else timeout_ms

    def describe_share_group(
        self, group_id: str, *, timeout_ms: int | None = None
    ) -> ShareGroupDescription:
        """Members, assignments and per-partition statistics of a share group.

        Raises ``GroupIdNotFoundError`` for no share group of that id.
        """
        _check_group(group_id)
        answer = self._at_coordinator(
            group_id,
            "DescribeShareGroup",
            pb.DescribeShareGroupRequest(group_id=group_id),
            timeout_ms,
        )
        return ShareGroupDescription(
            answer.group_id,
            answer.state,
            answer.group_epoch,
            answer.assignment_epoch,
            tuple(
                ShareMember(
                    m.member_id,
                    m.client_id,
                    m.client_host,
                    m.member_epoch,
                    tuple(m.subscribed_topic_names),
                    tuple(TopicPartition(t.topic, p) for t in m.assignment for p in t.partitions),
                )
                for m in answer.members
            ),
            tuple(
                SharePartitionStats(
                    TopicPartition(p.topic, p.partition),
                    p.start_offset,
                    p.end_offset,
                    p.acquired,
                    p.available,
                    p.acknowledged,
                    p.archived,
                    {b.delivery_count: b.records for b in p.delivery_counts},
                    p.dead_lettered,
                )
                for p in answer.partitions
            ),
        )

    def list_share_group_offsets(
        self,
        group_id: str,
        partitions: Iterable[TopicPartition] | None = None,
        *,
        timeout_ms: int | None = None,
    ) -> dict[TopicPartition, ShareOffset]:
        """The share group's start offsets (Kafka's ``listShareGroupOffsets``), sorted: of
        ``partitions`` (one the group never read shows -1), or of every share partition it
        has (None).

        Raises ``GroupIdNotFoundError`` for no share group of that id; a partition's error
        (``UnknownTopicOrPartitionError``...) for the first partition that has one.
        """
        _check_group(group_id)
        wanted = None if partitions is None else list(dict.fromkeys(partitions))
        for tp in wanted or ():
            if not isinstance(tp, TopicPartition):
                raise TypeError(f"expected TopicPartitions, got {tp!r}")
        if wanted == []:
            return {}
        request = pb.DescribeShareGroupOffsetsRequest(
            group_id=group_id, partitions=_by_topic(wanted or ())
        )
        answer = self._at_coordinator(group_id, "DescribeShareGroupOffsets", request, timeout_ms)
        out = {}
        for o in answer.offsets:
            if o.error_code:
                raise error_for_code(o.error_code, o.error_message)
            out[TopicPartition(o.topic, o.partition)] = ShareOffset(
                o.start_offset, o.lag, o.leader_epoch
            )
        return dict(sorted(out.items()))

    def alter_share_group_offsets(
        self,
        group_id: str,
        offsets: Mapping[TopicPartition, int],
        *,
        timeout_ms: int | None = None,
    ) -> None:
        """Set where an empty share group's partitions start (Kafka's
        ``alterShareGroupOffsets``): each starts over at its offset, nothing in flight.

        Raises ``ValueError`` for a negative offset; ``GroupNotEmptyError`` while the group
        has members; ``GroupIdNotFoundError``; the first failed partition's error after the
        others were moved.
        """
        _check_group(group_id)
        for tp, offset in offsets.items():
            if not isinstance(tp, TopicPartition):
                raise TypeError(f"expected TopicPartition keys, got {tp!r}")
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                raise ValueError(f"offset for {tp} must be a non-negative int, got {offset!r}")
        request = pb.AlterShareGroupOffsetsRequest(
            group_id=group_id,
            offsets=[
                pb.ShareStartOffset(topic=tp.topic, partition=tp.partition, start_offset=o)
                for tp, o in offsets.items()
            ],
        )
        answer = self._at_coordinator(group_id, "AlterShareGroupOffsets", request, timeout_ms)
        for r in answer.results:
            if r.error_code:
                raise error_for_code(r.error_code, r.error_message)

    def reset_share_group_offsets(
        self,
        group_id: str,
        partitions: str | Iterable[TopicPartition] | None = None,
        *,
        to_earliest: bool = False,
        to_latest: bool = False,
        to_offset: int | None = None,
        to_timestamp_ms: int | None = None,
        timeout_ms: int | None = None,
    ) -> dict[TopicPartition, int]:
        """Move an empty share group's start offsets (``kafka-share-groups.sh
        --reset-offsets``); returns the new start offset per partition.

        ``partitions``: a topic (all its partitions), some partitions, or None (every
        share partition the group has). Exactly one target, as
        ``AdminClient.reset_group_offsets`` (an offset is clamped to the log). Raises as
        ``alter_share_group_offsets``, and ``ValueError`` for no target or several.
        """
        _check_group(group_id)
        target = group_admin.reset_target(
            to_earliest=to_earliest,
            to_latest=to_latest,
            to_offset=to_offset,
            to_timestamp_ms=to_timestamp_ms,
        )
        left = self._connections.time_left(self._share_timeout(timeout_ms))
        chosen: str | list[TopicPartition]
        if partitions is None:
            chosen = list(self.list_share_group_offsets(group_id, timeout_ms=left()))
        elif isinstance(partitions, str):
            chosen = partitions
        else:
            chosen = list(dict.fromkeys(partitions))
            for tp in chosen:
                if not isinstance(tp, TopicPartition):
                    raise TypeError(f"expected TopicPartitions or a topic name, got {tp!r}")
        offsets = group_admin.resolve_reset(self._connections, chosen, target, left())
        self.alter_share_group_offsets(group_id, offsets, timeout_ms=left())
        return offsets

    def delete_share_group_offsets(
        self, group_id: str, topics: Iterable[str], *, timeout_ms: int | None = None
    ) -> None:
        """Forget an empty share group's state on every partition of each topic (Kafka's
        ``deleteShareGroupOffsets``): its next member starts them at
        ``share.auto.offset.reset``.

        Raises ``ValueError`` for no topics; ``GroupNotEmptyError`` while the group has
        members; ``GroupIdNotFoundError``; the first failed topic's error
        (``UnknownTopicOrPartitionError``) after the others were deleted.
        """
        _check_group(group_id)
        names = list(dict.fromkeys(topics))
        if not names or not all(isinstance(n, str) and n for n in names):
            raise ValueError(f"topics must be non-empty names, got {names!r}")
        request = pb.DeleteShareGroupOffsetsRequest(group_id=group_id, topics=names)
        answer = self._at_coordinator(group_id, "DeleteShareGroupOffsets", request, timeout_ms)
        for r in answer.results:
            if r.error_code:
                raise error_for_code(r.error_code, r.error_message)
