"""The gRPC handlers of share groups (issue #32): ShareGroupHeartbeat, DescribeShareGroup
and the offset admin (DescribeShareGroupOffsets, AlterShareGroupOffsets,
DeleteShareGroupOffsets; ``broker.core.share_admin``) at the group's coordinator,
ShareFetch and ShareAcknowledge at each partition's leader; between brokers the share
coordinator's calls (Read/Initialize/WriteShareGroupState, ReadShareGroupStateSummary,
DeleteShareGroupState) and DescribeSharePartition at a leader. Thin: protobuf to the core's
values (``broker.core.share_ops``) and back. A core built without share groups refuses
them (``INVALID_REQUEST``).

ShareFetch long-polls on the executor thread that runs it (``ShareOps.fetch``), so its
``max_wait_ms`` is capped there; the client keeps it below its call's timeout.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from tidelog.broker.cluster.share_peers import (
    batches_from_pb,
    key_from_pb,
    state_epoch_of,
    state_to_pb,
    stats_to_pb,
    summary_to_pb,
)
from tidelog.broker.core.context import RequestContext
from tidelog.broker.core.facade import BrokerCore
from tidelog.broker.core.share_ops import (
    ShareAcknowledged,
    ShareAckRange,
    ShareFetchCancel,
    ShareFetchSpec,
    ShareOps,
)
from tidelog.broker.core.share_state_routing import StateCall
from tidelog.broker.share.groups_coordinator import ShareHeartbeatRequest
from tidelog.broker.share.records import ShareStateKey
from tidelog.broker.share.state_log import ShareStateLog
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.storage.errors import InvalidRequestError
from tidelog.storage.types import TopicPartition

__all__ = ["SHARE_HANDLERS", "share_fetch"]

_DEFAULT_MAX_RECORDS = 500


def _shares(core: BrokerCore) -> ShareOps:
    if core.shares is None:
        raise InvalidRequestError("this broker serves no share groups")
    return core.shares


def _topic_partitions(partitions: Iterable[TopicPartition]) -> list[pb.TopicPartitions]:
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return [pb.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()]


def _acks(acks: Iterable[pb.ShareAcknowledgement]) -> tuple[ShareAckRange, ...]:
    return tuple(
        ShareAckRange(a.topic, a.partition, a.first_offset, a.last_offset, a.kind) for a in acks
    )


def _ack_results(results: Iterable[ShareAcknowledged]) -> list[pb.ShareAcknowledgeResult]:
    return [
        pb.ShareAcknowledgeResult(
            topic=r.topic,
            partition=r.partition,
            error_code=r.error_code,
            error_message=r.error_message,
        )
        for r in results
    ]


def _heartbeat(
    core: BrokerCore, request: pb.ShareGroupHeartbeatRequest, context: RequestContext
) -> pb.ShareGroupHeartbeatResponse:
    topics = frozenset(request.subscribed_topic_names)
    answer = _shares(core).heartbeat(
        ShareHeartbeatRequest(
            group_id=request.group_id,
            member_id=request.member_id,
            member_epoch=request.member_epoch,
            subscribed_topics=topics or None,
            rack_id=request.rack_id or None,
            client_id=request.client_id or context.client_id,
            client_host=context.peer,
        )
    )
    return pb.ShareGroupHeartbeatResponse(
        member_id=answer.member_id,
        member_epoch=answer.member_epoch,
        heartbeat_interval_ms=answer.heartbeat_interval_ms,
        assignment_changed=answer.assignment_changed,
        assignment=_topic_partitions(answer.assignment),
    )


def share_fetch(
    core: BrokerCore,
    request: pb.ShareFetchRequest,
    context: RequestContext,
    cancel: ShareFetchCancel | None = None,
) -> pb.ShareFetchResponse:
    """ShareFetch, unary or one request of a ``ShareFetchStream`` (``cancel``: set when
    the stream ends, ``broker.grpc.share_stream``)."""
    fetched, acks = _shares(core).fetch(
        ShareFetchSpec(
            group_id=request.group_id,
            member_id=request.member_id,
            partitions=tuple(
                TopicPartition(t.topic, p) for t in request.partitions for p in t.partitions
            ),
            acknowledgements=_acks(request.acknowledgements),
            max_records=request.max_records or _DEFAULT_MAX_RECORDS,
            max_wait_ms=request.max_wait_ms,
            cancel=cancel,
        )
    )
    return pb.ShareFetchResponse(
        partitions=[
            pb.ShareFetchPartition(
                topic=f.topic,
                partition=f.partition,
                error_code=f.error_code,
                error_message=f.error_message,
                acquired=[
                    pb.ShareAcquiredRange(
                        first_offset=r.first_offset,
                        last_offset=r.last_offset,
                        delivery_count=r.delivery_count,
                    )
                    for r in f.acquired
                ],
                records=f.records,
            )
            for f in fetched
        ],
        acknowledgements=_ack_results(acks),
    )


def _acknowledge(
    core: BrokerCore, request: pb.ShareAcknowledgeRequest, context: RequestContext
) -> pb.ShareAcknowledgeResponse:
    results = _shares(core).acknowledge(
        request.group_id,
        request.member_id,
        _acks(request.acknowledgements),
        close_session=request.close_session,
    )
    return pb.ShareAcknowledgeResponse(results=_ack_results(results))


def _describe(
    core: BrokerCore, request: pb.DescribeShareGroupRequest, context: RequestContext
) -> pb.DescribeShareGroupResponse:
    described = _shares(core).describe(request.group_id)
    view = described.view
    return pb.DescribeShareGroupResponse(
        group_id=view.group_id,
        state=view.state.value,
        group_epoch=view.group_epoch,
        assignment_epoch=view.assignment_epoch,
        assignor_name=view.assignor_name,
        members=[
            pb.ShareGroupMember(
                member_id=m.member_id,
                client_id=m.client_id,
                client_host=m.client_host,
                rack_id=m.rack_id or "",
                member_epoch=m.member_epoch,
                subscribed_topic_names=sorted(m.subscribed_topics),
                assignment=_topic_partitions(m.assignment),
            )
            for m in view.members
        ],
        partitions=[
            pb.SharePartitionSummary(
                topic=p.topic,
                partition=p.partition,
                start_offset=p.start_offset,
                end_offset=p.end_offset,
                acquired=p.acquired,
                available=p.available,
                archived=p.archived,
                acknowledged=p.acknowledged,
                delivery_counts=[
                    pb.DeliveryCountBucket(delivery_count=count, records=records)
                    for count, records in p.delivery_counts
                ],
                dead_lettered=p.dead_lettered,
            )
            for p in described.partitions
        ],
    )


def _describe_offsets(
    core: BrokerCore, request: pb.DescribeShareGroupOffsetsRequest, context: RequestContext
) -> pb.DescribeShareGroupOffsetsResponse:
    named = [TopicPartition(t.topic, p) for t in request.partitions for p in t.partitions]
    offsets = _shares(core).describe_offsets(request.group_id, named or None)
    return pb.DescribeShareGroupOffsetsResponse(
        offsets=[
            pb.ShareGroupOffset(
                topic=o.tp.topic,
                partition=o.tp.partition,
                start_offset=o.start_offset,
                leader_epoch=o.leader_epoch,
                lag=o.lag,
                error_code=o.error_code,
                error_message=o.error_message,
            )
            for o in offsets
        ]
    )


def _alter_offsets(
    core: BrokerCore, request: pb.AlterShareGroupOffsetsRequest, context: RequestContext
) -> pb.AlterShareGroupOffsetsResponse:
    offsets = {TopicPartition(o.topic, o.partition): o.start_offset for o in request.offsets}
    results = _shares(core).alter_offsets(request.group_id, offsets)
    return pb.AlterShareGroupOffsetsResponse(
        results=[
            pb.SharePartitionResult(
                topic=r.tp.topic,
                partition=r.tp.partition,
                error_code=r.error_code,
                error_message=r.error_message,
            )
            for r in results
        ]
    )


def _delete_offsets(
    core: BrokerCore, request: pb.DeleteShareGroupOffsetsRequest, context: RequestContext
) -> pb.DeleteShareGroupOffsetsResponse:
    results = _shares(core).delete_offsets(request.group_id, list(request.topics))
    return pb.DeleteShareGroupOffsetsResponse(
        results=[
            pb.ShareTopicResult(
                topic=r.topic, error_code=r.error_code, error_message=r.error_message
            )
            for r in results
        ]
    )


def _state_call(
    core: BrokerCore, key: ShareStateKey, call: StateCall
) -> pb.ShareGroupStateResponse:
    # Another broker's share partition leader at this broker as the key's share
    # coordinator (CLUSTER_ACTION; broker.core.share_state_routing).
    return state_to_pb(_shares(core).serve_state(key, call))


def _read_state(
    core: BrokerCore, request: pb.ReadShareGroupStateRequest, context: RequestContext
) -> pb.ShareGroupStateResponse:
    key, epoch = _key(request.key)
    return _state_call(core, key, lambda s: s.read_state(key, epoch))


def _initialize_state(
    core: BrokerCore, request: pb.InitializeShareGroupStateRequest, context: RequestContext
) -> pb.ShareGroupStateResponse:
    key, epoch = _key(request.key)
    start = request.start_offset
    if start < 0:
        raise InvalidRequestError("start_offset must not be negative")
    state_epoch = state_epoch_of(request.key)
    return _state_call(core, key, lambda s: s.initialize(key, start, epoch, state_epoch))


def _write_state(
    core: BrokerCore, request: pb.WriteShareGroupStateRequest, context: RequestContext
) -> pb.ShareGroupStateResponse:
    key, epoch = _key(request.key)
    try:
        batches = batches_from_pb(request.batches)
    except ValueError as exc:
        raise InvalidRequestError(f"bad share state batch: {exc}") from None
    start = request.start_offset
    if start < -1:
        raise InvalidRequestError("start_offset must be -1 (unchanged) or an offset")
    state_epoch = state_epoch_of(request.key)
    if request.HasField("producer_id") != request.HasField("producer_epoch"):
        raise InvalidRequestError("set both producer_id and producer_epoch, or neither")
    if request.HasField("producer_id"):
        # A dead-letter transaction's archiving: pending here until its marker.
        transaction = (request.producer_id, request.producer_epoch)
        if transaction[0] < 0 or not 0 <= transaction[1] <= 0x7FFF:
            raise InvalidRequestError("a transactional write needs a producer id and epoch")
        return _state_call(
            core,
            key,
            lambda s: s.write(key, epoch, start, batches, transaction, state_epoch),
        )
    return _state_call(
        core, key, lambda s: s.write(key, epoch, start, batches, state_epoch=state_epoch)
    )


def _read_summary(
    core: BrokerCore, request: pb.ReadShareGroupStateSummaryRequest, context: RequestContext
) -> pb.ReadShareGroupStateSummaryResponse:
    # The share-group admin in a cluster (CLUSTER_ACTION; broker.core.share_admin).
    if not request.group_id:
        raise InvalidRequestError("group_id must not be empty")
    summaries = _shares(core).serve_summaries(request.group_id, request.state_partition)
    return pb.ReadShareGroupStateSummaryResponse(states=[summary_to_pb(s) for s in summaries])


def _delete_state(
    core: BrokerCore, request: pb.DeleteShareGroupStateRequest, context: RequestContext
) -> pb.DeleteShareGroupStateResponse:
    key, _ = _key(request.key)

    def delete(store: ShareStateLog) -> None:
        store.delete(key)

    _shares(core).serve_state(key, delete)
    return pb.DeleteShareGroupStateResponse()


def _describe_partition(
    core: BrokerCore, request: pb.DescribeSharePartitionRequest, context: RequestContext
) -> pb.DescribeSharePartitionResponse:
    state_epoch = request.state_epoch if request.HasField("state_epoch") else None
    at = _shares(core).describe_partition_here(
        request.group_id, request.topic, request.partition, state_epoch, request.with_stats
    )
    answer = pb.DescribeSharePartitionResponse(
        high_watermark=at.high_watermark, leader_epoch=at.leader_epoch
    )
    if at.stats is not None:
        answer.stats.CopyFrom(stats_to_pb(request.topic, request.partition, at.stats))
    return answer


def _key(ref: pb.ShareStateKeyRef) -> tuple[ShareStateKey, int]:
    try:
        return key_from_pb(ref)
    except ValueError as exc:
        raise InvalidRequestError(f"bad share state key: {exc}") from None


SHARE_HANDLERS: dict[str, Callable[[BrokerCore, Any, RequestContext], Any]] = {
    "ShareGroupHeartbeat": _heartbeat,
    "ShareFetch": share_fetch,
    "ShareAcknowledge": _acknowledge,
    "DescribeShareGroup": _describe,
    "DescribeShareGroupOffsets": _describe_offsets,
    "AlterShareGroupOffsets": _alter_offsets,
    "DeleteShareGroupOffsets": _delete_offsets,
    "ReadShareGroupState": _read_state,
    "InitializeShareGroupState": _initialize_state,
    "WriteShareGroupState": _write_state,
    "ReadShareGroupStateSummary": _read_summary,
    "DeleteShareGroupState": _delete_state,
    "DescribeSharePartition": _describe_partition,
}
