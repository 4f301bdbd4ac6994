"""The gRPC servicer of ``tidelog.v1.Broker``: thin by design.

Each method converts the request into plain values, calls one ``BrokerCore`` method,
converts the answer back, and maps errors through ``broker.errors`` (status code, stable
code string in trailing metadata, safe message). Protobuf types stop here; record bytes
pass through untouched in both directions.

Streams: ``ProduceStream`` is pipelined (``broker.produce_stream``) so that appends do not
wait for fsyncs; ``FetchStream`` answers its requests one after the other, each a long poll
that the end of the call interrupts. Every stream message is counted in the metrics as one
request of its method.

Consumer groups: the servicer converts topic/partition lists to and from
``TopicPartition`` sets; the coordinator is ``broker.groups`` (``docs/groups.md``).
"""

# The servicer's method names are the proto's RPC names, which gRPC dispatches on.

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc

from broker.core import BrokerCore, OffsetQuery, TopicView
from broker.errors import abort_with, to_wire
from broker.fetch import FetchSpec, PartitionFetched, PartitionFetchSpec
from broker.fetch_waiters import Waiter
from broker.groups.assignor import TopicPartition
from broker.groups.coordinator import HeartbeatRequest
from broker.groups.manager import (
    GroupDescription,
    OffsetCommitEntry,
    OffsetResult,
    ResetKind,
    ResetTarget,
)
from broker.produce import Acks, PartitionAppend, PartitionProduced, PartitionRecords, parse_acks
from broker.produce_stream import ProducePipeline
from proto.tidelog.v1 import broker_pb2 as pb
from proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from storage.errors import InvalidRequestError

__all__ = ["BrokerService"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# A long poll answers this much before the call's own deadline, so the answer arrives.
_DEADLINE_MARGIN_MS = 50
_DAY_S = 86_400.0


@dataclass(frozen=True, slots=True)
class _PendingProduce:
    correlation_id: int
    acks: Acks
    appends: list[PartitionAppend]
    started: float


class BrokerService(pb_grpc.BrokerServicer):
    """``tidelog.v1.Broker`` over a ``BrokerCore``. Thread-safe (the core is)."""

    def __init__(self, core: BrokerCore) -> None:
        self._core = core
        self._metrics = core.metrics

    # --- plumbing -------------------------------------------------------------------------

    def _call(self, method: str, context: grpc.ServicerContext, body: Callable[[], T]) -> T:
        """Run one request: time it, count it, map its error."""
        started = time.perf_counter()
        try:
            answer = body()
        except Exception as exc:
            wire = to_wire(exc)
            self._observe(method, wire.code or wire.status.name, started)
            abort_with(context, exc)
        self._observe(method, "OK", started)
        return answer

    def _observe(self, method: str, code: str, started: float) -> None:
        self._metrics.observe_request(method, code, time.perf_counter() - started)

    # --- topics ---------------------------------------------------------------------------

    def CreateTopic(
        self, request: pb.CreateTopicRequest, context: grpc.ServicerContext
    ) -> pb.TopicDescription:
        return self._call(
            "CreateTopic",
            context,
            lambda: _topic_description(
                self._core.create_topic(request.name, request.partitions, dict(request.config))
            ),
        )

    def DeleteTopic(
        self, request: pb.DeleteTopicRequest, context: grpc.ServicerContext
    ) -> pb.DeleteTopicResponse:
        def body() -> pb.DeleteTopicResponse:
            self._core.delete_topic(request.name)
            return pb.DeleteTopicResponse()

        return self._call("DeleteTopic", context, body)

    def ListTopics(
        self, request: pb.ListTopicsRequest, context: grpc.ServicerContext
    ) -> pb.ListTopicsResponse:
        def body() -> pb.ListTopicsResponse:
            topics = self._core.list_topics(request.include_internal)
            return pb.ListTopicsResponse(
                topics=[
                    pb.TopicSummary(name=t.name, partitions=t.partitions, internal=t.internal)
                    for t in topics
                ]
            )

        return self._call("ListTopics", context, body)

    def DescribeTopic(
        self, request: pb.DescribeTopicRequest, context: grpc.ServicerContext
    ) -> pb.TopicDescription:
        return self._call(
            "DescribeTopic",
            context,
            lambda: _topic_description(self._core.describe_topic(request.name)),
        )

    def AlterTopicConfig(
        self, request: pb.AlterTopicConfigRequest, context: grpc.ServicerContext
    ) -> pb.TopicDescription:
        return self._call(
            "AlterTopicConfig",
            context,
            lambda: _topic_description(
                self._core.alter_topic_config(request.name, dict(request.set), list(request.delete))
            ),
        )

    def CreatePartitions(
        self, request: pb.CreatePartitionsRequest, context: grpc.ServicerContext
    ) -> pb.CreatePartitionsResponse:
        def body() -> pb.CreatePartitionsResponse:
            answers = self._core.create_partitions(
                [(t.name, t.count) for t in request.topics],
                validate_only=request.validate_only,
            )
            return pb.CreatePartitionsResponse(
                results=[
                    pb.CreatePartitionsTopicResult(
                        name=a.name,
                        error_code=a.error_code,
                        error_message=a.error_message,
                        partitions=a.partitions,
                    )
                    for a in answers
                ]
            )

        return self._call("CreatePartitions", context, body)

    # --- produce --------------------------------------------------------------------------

    def Produce(
        self, request: pb.ProduceRequest, context: grpc.ServicerContext
    ) -> pb.ProduceResponse:
        def body() -> pb.ProduceResponse:
            acks = parse_acks(request.acks)
            answers = self._core.produce(_produce_parts(request), acks)
            return _produce_response(request.correlation_id, answers)

        return self._call("Produce", context, body)

    def ProduceStream(
        self, request_iterator: Iterator[pb.ProduceRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.ProduceResponse]:
        def append(request: pb.ProduceRequest) -> _PendingProduce:
            started = time.perf_counter()
            acks = parse_acks(request.acks)
            appends = self._core.append(_produce_parts(request))
            return _PendingProduce(request.correlation_id, acks, appends, started)

        def complete(pending: _PendingProduce) -> pb.ProduceResponse:
            answers = self._core.complete(pending.appends, pending.acks)
            self._observe("ProduceStream", "OK", pending.started)
            return _produce_response(pending.correlation_id, answers)

        pipeline = ProducePipeline(request_iterator, append, complete, context.is_active)
        started = time.perf_counter()
        try:
            yield from pipeline.responses()
        except Exception as exc:
            wire = to_wire(exc)
            self._observe("ProduceStream", wire.code or wire.status.name, started)
            abort_with(context, exc)

    # --- fetch ----------------------------------------------------------------------------

    def Fetch(self, request: pb.FetchRequest, context: grpc.ServicerContext) -> pb.FetchResponse:
        waiter = Waiter()
        context.add_callback(waiter.cancel)
        return self._call("Fetch", context, lambda: self._fetch(request, context, waiter))

    def FetchStream(
        self, request_iterator: Iterator[pb.FetchRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.FetchResponse]:
        # One waiter for the whole stream: the end of the call cancels whichever fetch waits.
        waiter = Waiter()
        context.add_callback(waiter.cancel)
        for request in request_iterator:
            yield self._call("FetchStream", context, _bind(self._fetch, request, context, waiter))

    def _fetch(
        self, request: pb.FetchRequest, context: grpc.ServicerContext, waiter: Waiter
    ) -> pb.FetchResponse:
        spec = FetchSpec(
            partitions=[
                PartitionFetchSpec(p.topic, p.partition, p.fetch_offset, p.partition_max_bytes)
                for p in request.partitions
            ],
            max_wait_ms=request.max_wait_ms,
            min_bytes=request.min_bytes,
            max_bytes=request.max_bytes,
        )
        remaining_s = context.time_remaining()
        wait_cap_ms = None
        # A call without a deadline reports a huge (or, on some versions, no) time left.
        if remaining_s is not None and math.isfinite(remaining_s) and remaining_s < _DAY_S:
            wait_cap_ms = max(int(remaining_s * 1000) - _DEADLINE_MARGIN_MS, 0)
        answers = self._core.fetch(spec, waiter=waiter, wait_cap_ms=wait_cap_ms)
        return _fetch_response(request.correlation_id, answers)

    # --- offsets and producer ids --------------------------------------------------------

    def ListOffsets(
        self, request: pb.ListOffsetsRequest, context: grpc.ServicerContext
    ) -> pb.ListOffsetsResponse:
        def body() -> pb.ListOffsetsResponse:
            queries = [
                OffsetQuery(p.topic, p.partition, p.timestamp_ms) for p in request.partitions
            ]
            return pb.ListOffsetsResponse(
                results=[
                    pb.ListOffsetsResult(
                        topic=a.topic,
                        partition=a.partition,
                        error_code=a.error_code,
                        error_message=a.error_message,
                        offset=a.offset,
                        timestamp_ms=a.timestamp_ms,
                    )
                    for a in self._core.list_offsets(queries)
                ]
            )

        return self._call("ListOffsets", context, body)

    def InitProducerId(
        self, request: pb.InitProducerIdRequest, context: grpc.ServicerContext
    ) -> pb.InitProducerIdResponse:
        def body() -> pb.InitProducerIdResponse:
            if request.producer_key:
                if request.HasField("producer_id") or request.HasField("producer_epoch"):
                    raise InvalidRequestError(
                        "InitProducerId takes producer_key or producer_id/epoch, not both"
                    )
                producer_id, epoch = self._core.init_keyed_producer_id(request.producer_key)
                return pb.InitProducerIdResponse(producer_id=producer_id, producer_epoch=epoch)
            # Absent fields mean a new producer (the proto makes them optional for that).
            producer_id, epoch = self._core.init_producer_id(
                request.producer_id if request.HasField("producer_id") else -1,
                request.producer_epoch if request.HasField("producer_epoch") else -1,
            )
            return pb.InitProducerIdResponse(producer_id=producer_id, producer_epoch=epoch)

        return self._call("InitProducerId", context, body)

    def DescribeProducers(
        self, request: pb.DescribeProducersRequest, context: grpc.ServicerContext
    ) -> pb.DescribeProducersResponse:
        def body() -> pb.DescribeProducersResponse:
            wanted = [(t.topic, p) for t in request.partitions for p in t.partitions]
            producer_id = request.producer_id if request.HasField("producer_id") else None
            answers = self._core.describe_producers(wanted, producer_id)
            return pb.DescribeProducersResponse(
                partitions=[
                    pb.DescribeProducersPartition(
                        topic=a.topic,
                        partition=a.partition,
                        error_code=a.error_code,
                        error_message=a.error_message,
                        producers=[
                            pb.ProducerState(
                                producer_id=p.producer_id,
                                producer_epoch=p.epoch,
                                last_sequence=p.last_sequence,
                                last_timestamp_ms=p.last_timestamp_ms,
                                last_offset=p.last_offset,
                            )
                            for p in a.producers
                        ],
                    )
                    for a in answers
                ]
            )

        return self._call("DescribeProducers", context, body)

    # --- consumer groups ------------------------------------------------------------------
    # Errors of a whole call (FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID, NON_EMPTY_GROUP, ...)
    # travel as the status and its code string, like every other RPC; the error fields of
    # ConsumerGroupHeartbeatResponse stay empty. Per-partition errors use CommittedOffset's.

    def ConsumerGroupHeartbeat(
        self, request: pb.ConsumerGroupHeartbeatRequest, context: grpc.ServicerContext
    ) -> pb.ConsumerGroupHeartbeatResponse:
        def body() -> pb.ConsumerGroupHeartbeatResponse:
            answer = self._core.consumer_group_heartbeat(
                HeartbeatRequest(
                    group_id=request.group_id,
                    member_id=request.member_id,
                    member_epoch=request.member_epoch,
                    subscribed_topics=frozenset(request.subscribed_topic_names),
                    owned=_partition_set(request.owned_partitions),
                    session_timeout_ms=request.session_timeout_ms,
                    rebalance_timeout_ms=request.rebalance_timeout_ms,
                    client_id=request.client_id,
                )
            )
            return pb.ConsumerGroupHeartbeatResponse(
                member_id=answer.member_id,
                member_epoch=answer.member_epoch,
                heartbeat_interval_ms=answer.heartbeat_interval_ms,
                has_assignment=True,
                assignment=_topic_partitions(answer.assignment),
            )

        return self._call("ConsumerGroupHeartbeat", context, body)

    def OffsetCommit(
        self, request: pb.OffsetCommitRequest, context: grpc.ServicerContext
    ) -> pb.OffsetCommitResponse:
        def body() -> pb.OffsetCommitResponse:
            entries = [
                OffsetCommitEntry(TopicPartition(o.topic, o.partition), o.offset, o.metadata)
                for o in request.offsets
            ]
            results = self._core.commit_offsets(
                request.group_id, request.member_id, request.member_epoch, entries
            )
            return pb.OffsetCommitResponse(results=_committed_offsets(results))

        return self._call("OffsetCommit", context, body)

    def OffsetFetch(
        self, request: pb.OffsetFetchRequest, context: grpc.ServicerContext
    ) -> pb.OffsetFetchResponse:
        def body() -> pb.OffsetFetchResponse:
            results = self._core.fetch_offsets(request.group_id, _selection(request.partitions))
            return pb.OffsetFetchResponse(offsets=_committed_offsets(results))

        return self._call("OffsetFetch", context, body)

    def ListGroups(
        self, request: pb.ListGroupsRequest, context: grpc.ServicerContext
    ) -> pb.ListGroupsResponse:
        def body() -> pb.ListGroupsResponse:
            return pb.ListGroupsResponse(
                groups=[
                    pb.GroupSummary(group_id=g.group_id, state=g.state, members=g.members)
                    for g in self._core.list_groups()
                ]
            )

        return self._call("ListGroups", context, body)

    def DescribeGroup(
        self, request: pb.DescribeGroupRequest, context: grpc.ServicerContext
    ) -> pb.DescribeGroupResponse:
        return self._call(
            "DescribeGroup",
            context,
            lambda: _group_description(self._core.describe_group(request.group_id)),
        )

    def ResetGroupOffsets(
        self, request: pb.ResetGroupOffsetsRequest, context: grpc.ServicerContext
    ) -> pb.ResetGroupOffsetsResponse:
        def body() -> pb.ResetGroupOffsetsResponse:
            results = self._core.reset_group_offsets(
                request.group_id, _selection(request.partitions), _reset_target(request)
            )
            return pb.ResetGroupOffsetsResponse(offsets=_committed_offsets(results))

        return self._call("ResetGroupOffsets", context, body)

    def DeleteGroup(
        self, request: pb.DeleteGroupRequest, context: grpc.ServicerContext
    ) -> pb.DeleteGroupResponse:
        def body() -> pb.DeleteGroupResponse:
            self._core.delete_group(request.group_id)
            return pb.DeleteGroupResponse()

        return self._call("DeleteGroup", context, body)


def _bind(
    fetch: Callable[[pb.FetchRequest, grpc.ServicerContext, Waiter], pb.FetchResponse],
    request: pb.FetchRequest,
    context: grpc.ServicerContext,
    waiter: Waiter,
) -> Callable[[], pb.FetchResponse]:
    """``fetch`` with its arguments bound now (a lambda in a loop would bind late)."""
    return lambda: fetch(request, context, waiter)


# --- conversions --------------------------------------------------------------------------


def _topic_description(view: TopicView) -> pb.TopicDescription:
    return pb.TopicDescription(
        name=view.name,
        internal=view.internal,
        config=dict(view.config),
        partitions=[
            pb.PartitionDescription(
                partition=p.partition,
                log_start_offset=p.log_start_offset,
                log_end_offset=p.log_end_offset,
                high_watermark=p.high_watermark,
                size_bytes=p.size_bytes,
                segments=p.segments,
            )
            for p in view.partitions
        ],
    )


def _produce_parts(request: pb.ProduceRequest) -> list[PartitionRecords]:
    return [
        PartitionRecords(topic.topic, part.partition, part.records)
        for topic in request.topics
        for part in topic.partitions
    ]


def _produce_response(
    correlation_id: int, answers: Sequence[PartitionProduced]
) -> pb.ProduceResponse:
    return pb.ProduceResponse(
        correlation_id=correlation_id,
        results=[
            pb.ProducePartitionResult(
                topic=a.topic,
                partition=a.partition,
                error_code=a.error_code,
                error_message=a.error_message,
                base_offset=a.base_offset,
                log_append_time_ms=a.log_append_time_ms,
                log_start_offset=a.log_start_offset,
                duplicate=a.duplicate,
            )
            for a in answers
        ],
    )


def _fetch_response(correlation_id: int, answers: Sequence[PartitionFetched]) -> pb.FetchResponse:
    return pb.FetchResponse(
        correlation_id=correlation_id,
        results=[
            pb.FetchPartitionResult(
                topic=a.topic,
                partition=a.partition,
                error_code=a.error_code,
                error_message=a.error_message,
                high_watermark=a.high_watermark,
                log_start_offset=a.log_start_offset,
                records=a.records,
            )
            for a in answers
        ],
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
