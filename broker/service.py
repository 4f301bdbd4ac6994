"""The gRPC servicer of ``tidelog.v1.Broker``: thin by design.

Each method converts the request into plain values, calls one ``BrokerCore`` method,
converts the answer back, and maps errors through ``broker.errors`` (status code, stable
code string in trailing metadata, safe message). Protobuf types stop here; record bytes
pass through untouched in both directions.

Streams: ``ProduceStream`` is pipelined (``broker.produce_stream``) so that appends do not
wait for fsyncs; ``FetchStream`` answers its requests one after the other, each a long poll
that the end of the call interrupts. Every stream message is counted in the metrics as one
request of its method.

Consumer-group RPCs answer ``UNIMPLEMENTED`` until the group coordinator lands.
"""

# The servicer's method names are the proto's RPC names, which gRPC dispatches on.

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc

from broker.core import BrokerCore, OffsetQuery, TopicView
from broker.errors import abort_with, to_wire
from broker.fetch import FetchSpec, PartitionFetched, PartitionFetchSpec
from broker.fetch_waiters import Waiter
from broker.produce import Acks, PartitionAppend, PartitionProduced, PartitionRecords, parse_acks
from broker.produce_stream import ProducePipeline
from proto.tidelog.v1 import broker_pb2 as pb
from proto.tidelog.v1 import broker_pb2_grpc as pb_grpc

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
            # Absent fields mean a new producer (the proto makes them optional for that).
            producer_id, epoch = self._core.init_producer_id(
                request.producer_id if request.HasField("producer_id") else -1,
                request.producer_epoch if request.HasField("producer_epoch") else -1,
            )
            return pb.InitProducerIdResponse(producer_id=producer_id, producer_epoch=epoch)

        return self._call("InitProducerId", context, body)

    # --- consumer groups: not in this broker yet -----------------------------------------

    def _unimplemented(self, context: grpc.ServicerContext) -> None:
        context.abort(
            grpc.StatusCode.UNIMPLEMENTED, "consumer groups are not implemented by this broker"
        )

    def ConsumerGroupHeartbeat(
        self, request: pb.ConsumerGroupHeartbeatRequest, context: grpc.ServicerContext
    ) -> pb.ConsumerGroupHeartbeatResponse:
        self._unimplemented(context)
        return pb.ConsumerGroupHeartbeatResponse()

    def OffsetCommit(
        self, request: pb.OffsetCommitRequest, context: grpc.ServicerContext
    ) -> pb.OffsetCommitResponse:
        self._unimplemented(context)
        return pb.OffsetCommitResponse()

    def OffsetFetch(
        self, request: pb.OffsetFetchRequest, context: grpc.ServicerContext
    ) -> pb.OffsetFetchResponse:
        self._unimplemented(context)
        return pb.OffsetFetchResponse()

    def ListGroups(
        self, request: pb.ListGroupsRequest, context: grpc.ServicerContext
    ) -> pb.ListGroupsResponse:
        self._unimplemented(context)
        return pb.ListGroupsResponse()

    def DescribeGroup(
        self, request: pb.DescribeGroupRequest, context: grpc.ServicerContext
    ) -> pb.DescribeGroupResponse:
        self._unimplemented(context)
        return pb.DescribeGroupResponse()

    def ResetGroupOffsets(
        self, request: pb.ResetGroupOffsetsRequest, context: grpc.ServicerContext
    ) -> pb.ResetGroupOffsetsResponse:
        self._unimplemented(context)
        return pb.ResetGroupOffsetsResponse()

    def DeleteGroup(
        self, request: pb.DeleteGroupRequest, context: grpc.ServicerContext
    ) -> pb.DeleteGroupResponse:
        self._unimplemented(context)
        return pb.DeleteGroupResponse()


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
