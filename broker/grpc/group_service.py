"""The gRPC handlers of consumer groups: the KIP-848 heartbeat, offset commits and fetches,
group administration (list, describe, reset, delete, offset delete) and FindCoordinator.

Plain functions ``(core, request, context) -> response`` like the rest of
``broker.grpc.service``'s table (which includes ``GROUP_HANDLERS``). They convert
topic/partition lists to and from ``TopicPartition`` sets; the coordinator is
``broker.groups`` (``docs/groups.md``). Errors of a whole call (FENCED_MEMBER_EPOCH,
UNKNOWN_MEMBER_ID, NON_EMPTY_GROUP, ...) travel as the status and its code string, like
every other RPC; per-partition errors use ``CommittedOffset``'s. A member's described
assignment is what it holds now, partitions it is still giving up included.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tidelog.broker.core.context import RequestContext
from tidelog.broker.core.facade import BrokerCore
from tidelog.broker.groups.assignor import TopicPartition
from tidelog.broker.groups.coordinator import HeartbeatRequest
from tidelog.broker.groups.manager import (
    GroupDescription,
    OffsetCommitEntry,
    OffsetResult,
    ResetKind,
    ResetTarget,
)
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.storage.errors import InvalidRequestError

__all__ = ["GROUP_HANDLERS"]


def _consumer_group_heartbeat(
    core: BrokerCore, request: pb.ConsumerGroupHeartbeatRequest, context: RequestContext
) -> pb.ConsumerGroupHeartbeatResponse:
    answer = core.consumer_group_heartbeat(
        HeartbeatRequest(
            group_id=request.group_id,
            member_id=request.member_id,
            member_epoch=request.member_epoch,
            subscribed_topics=frozenset(request.subscribed_topic_names),
            owned=_partition_set(request.owned_partitions),
            session_timeout_ms=request.session_timeout_ms,
            rebalance_timeout_ms=request.rebalance_timeout_ms,
            client_id=request.client_id,
            instance_id=(
                request.group_instance_id if request.HasField("group_instance_id") else None
            ),
        )
    )
    return pb.ConsumerGroupHeartbeatResponse(
        member_id=answer.member_id,
        member_epoch=answer.member_epoch,
        heartbeat_interval_ms=answer.heartbeat_interval_ms,
        has_assignment=True,
        assignment=_topic_partitions(answer.assignment),
    )


def _offset_commit(
    core: BrokerCore, request: pb.OffsetCommitRequest, context: RequestContext
) -> pb.OffsetCommitResponse:
    entries = [
        OffsetCommitEntry(
            TopicPartition(o.topic, o.partition),
            o.offset,
            o.metadata,
            o.leader_epoch if o.HasField("leader_epoch") else -1,
        )
        for o in request.offsets
    ]
    results = core.commit_offsets(
        request.group_id, request.member_id, request.member_epoch, entries
    )
    return pb.OffsetCommitResponse(results=_committed_offsets(results))


def _offset_fetch(
    core: BrokerCore, request: pb.OffsetFetchRequest, context: RequestContext
) -> pb.OffsetFetchResponse:
    results = core.fetch_offsets(
        request.group_id, _selection(request.partitions), request.require_stable
    )
    return pb.OffsetFetchResponse(offsets=_committed_offsets(results))


def _list_groups(
    core: BrokerCore, request: pb.ListGroupsRequest, context: RequestContext
) -> pb.ListGroupsResponse:
    # Every type, as Kafka's ListGroups v5 (a core without share groups: consumer
    # groups only); ``types`` filters, as its ``types_filter``.
    if core.shares is not None:
        typed = [(g.group_id, g.group_type, g.state, g.members) for g in core.shares.list_groups()]
    else:
        typed = [(g.group_id, "consumer", g.state, g.members) for g in core.list_groups()]
    wanted = {t.lower() for t in request.types}
    return pb.ListGroupsResponse(
        groups=[
            pb.GroupSummary(group_id=g, state=state, members=members, type=kind)
            for g, kind, state, members in typed
            if not wanted or kind in wanted
        ]
    )


def _describe_group(
    core: BrokerCore, request: pb.DescribeGroupRequest, context: RequestContext
) -> pb.DescribeGroupResponse:
    return _group_description(core.describe_group(request.group_id))


def _reset_group_offsets(
    core: BrokerCore, request: pb.ResetGroupOffsetsRequest, context: RequestContext
) -> pb.ResetGroupOffsetsResponse:
    results = core.reset_group_offsets(
        request.group_id, _selection(request.partitions), _reset_target(request)
    )
    return pb.ResetGroupOffsetsResponse(offsets=_committed_offsets(results))


def _delete_group(
    core: BrokerCore, request: pb.DeleteGroupRequest, context: RequestContext
) -> pb.DeleteGroupResponse:
    core.delete_group(request.group_id)
    return pb.DeleteGroupResponse()


def _offset_delete(
    core: BrokerCore, request: pb.OffsetDeleteRequest, context: RequestContext
) -> pb.OffsetDeleteResponse:
    partitions = [TopicPartition(t.topic, p) for t in request.partitions for p in t.partitions]
    results = core.delete_offsets(request.group_id, partitions)
    return pb.OffsetDeleteResponse(
        results=[
            pb.OffsetDeleteResult(
                topic=r.tp.topic,
                partition=r.tp.partition,
                error_code=r.error_code,
                error_message=r.error_message,
            )
            for r in results
        ]
    )


def _find_coordinator(
    core: BrokerCore, request: pb.FindCoordinatorRequest, context: RequestContext
) -> pb.FindCoordinatorResponse:
    if request.key_type not in (0, 1):
        raise InvalidRequestError(f"unknown coordinator key type {request.key_type}")
    transaction = request.key_type == 1
    endpoint = core.find_coordinator(request.group_id, transaction=transaction)
    return pb.FindCoordinatorResponse(
        coordinator=pb.BrokerEndpoint(id=endpoint.broker_id, host=endpoint.host, port=endpoint.port)
    )


def _partition_set(topics: Iterable[pb.TopicPartitions]) -> frozenset[TopicPartition]:
    return frozenset(TopicPartition(t.topic, p) for t in topics for p in t.partitions)


def _topic_partitions(partitions: Iterable[TopicPartition]) -> list[pb.TopicPartitions]:
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return [pb.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()]


def _selection(topics: Iterable[pb.TopicPartitions]) -> dict[str, list[int]] | None:
    """topic -> partitions (an empty list: every partition); None when nothing is named."""
    selection: dict[str, list[int]] = {}
    for t in topics:
        selection.setdefault(t.topic, []).extend(t.partitions)
    return selection or None


def _committed_offsets(results: Sequence[OffsetResult]) -> list[pb.CommittedOffset]:
    return [
        pb.CommittedOffset(
            topic=r.tp.topic,
            partition=r.tp.partition,
            offset=r.offset,
            metadata=r.metadata,
            error_code=r.error_code,
            error_message=r.error_message,
            leader_epoch=r.leader_epoch,
        )
        for r in results
    ]


def _reset_target(request: pb.ResetGroupOffsetsRequest) -> ResetTarget:
    which = request.WhichOneof("target")
    if which == "to_earliest":
        return ResetTarget(ResetKind.EARLIEST)
    if which == "to_latest":
        return ResetTarget(ResetKind.LATEST)
    if which == "to_offset":
        return ResetTarget(ResetKind.OFFSET, request.to_offset)
    if which == "to_timestamp_ms":
        return ResetTarget(ResetKind.TIMESTAMP, request.to_timestamp_ms)
    raise InvalidRequestError(
        "a reset needs a target: to_earliest, to_latest, to_offset or to_timestamp_ms"
    )


def _group_description(group: GroupDescription) -> pb.DescribeGroupResponse:
    return pb.DescribeGroupResponse(
        group_id=group.group_id,
        state=group.state,
        group_epoch=group.group_epoch,
        members=[
            pb.GroupMember(
                member_id=m.member_id,
                client_id=m.client_id,
                member_epoch=m.member_epoch,
                subscribed_topic_names=sorted(m.subscribed_topics),
                # What the member holds now, partitions it is still giving up included.
                assignment=_topic_partitions(m.assigned | m.revoking),
                group_instance_id=m.instance_id,
            )
            for m in group.members
        ],
        partitions=[
            pb.GroupPartitionLag(
                topic=p.tp.topic,
                partition=p.tp.partition,
                committed_offset=p.committed_offset,
                log_end_offset=p.log_end_offset,
                lag=p.lag,
                member_id=p.member_id,
            )
            for p in group.partitions
        ],
    )


GROUP_HANDLERS: dict[str, Callable[[BrokerCore, Any, RequestContext], Any]] = {
    "ConsumerGroupHeartbeat": _consumer_group_heartbeat,
    "OffsetCommit": _offset_commit,
    "OffsetFetch": _offset_fetch,
    "ListGroups": _list_groups,
    "DescribeGroup": _describe_group,
    "ResetGroupOffsets": _reset_group_offsets,
    "DeleteGroup": _delete_group,
    "OffsetDelete": _offset_delete,
    "FindCoordinator": _find_coordinator,
}
