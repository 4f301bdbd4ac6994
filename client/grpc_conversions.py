"""The protobuf conversions of ``GrpcConnection`` (``client.grpc_connection``): message
builders, answer readers and the two stream adapters.

Pure functions from the client's domain values (``client.connection``, ``client.types``)
to ``tidelog.v1`` messages and back; the stream adapters wrap a ``client.transport``
``BidiStream`` so it speaks ``ProduceCall``/``ProduceAnswer`` and
``FetchCall``/``FetchAnswer``. Nothing here opens a channel or blocks but the stream
adapters' iteration. Record bytes pass through untouched. A per-partition error code
becomes the exact ``TidelogError`` its code names (``storage.errors.error_for_code``);
code 0 is None. Topics keep the order in which the caller first named them.

Thread-safety: the functions are pure; a stream adapter is as thread-safe as its
``BidiStream`` (one sender, one reader).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from tidelog.client.connection import (
    FetchAnswer,
    FetchCall,
    FetchResult,
    PartitionProduceResult,
    ProduceAnswer,
    ProduceCall,
)
from tidelog.client.transport import BidiStream
from tidelog.client.types import (
    ConfigResource,
    PartitionDescription,
    TopicDescription,
    TopicPartition,
)
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.storage.errors import TidelogError, error_for_code

__all__ = [
    "GrpcFetchStream",
    "GrpcProduceStream",
    "config_resource",
    "partition_errors",
    "produce_answer",
    "produce_request",
    "source_name",
    "topic_description",
    "topic_partitions",
]


def topic_partitions(partitions: Iterable[TopicPartition]) -> list[pb.TopicPartitions]:
    """``partitions`` grouped by topic, as the requests name them (topics in first-seen
    order)."""
    grouped: dict[str, list[int]] = {}
    for tp in partitions:
        grouped.setdefault(tp.topic, []).append(tp.partition)
    return [pb.TopicPartitions(topic=t, partitions=ps) for t, ps in grouped.items()]


def partition_errors(results: Iterable[Any]) -> dict[TopicPartition, TidelogError | None]:
    """Per partition of an admin answer (``topic``, ``partition``, ``error_code``): None,
    or the error its code names."""
    return {
        TopicPartition(r.topic, r.partition): (
            error_for_code(r.error_code, f"{r.topic}-{r.partition}: {r.error_code}")
            if r.error_code
            else None
        )
        for r in results
    }


def _fetch_partition(
    tp: TopicPartition, offset: int, max_bytes: int, leader_epoch: int | None
) -> pb.FetchPartition:
    part = pb.FetchPartition(
        topic=tp.topic, partition=tp.partition, fetch_offset=offset, partition_max_bytes=max_bytes
    )
    if leader_epoch is not None and leader_epoch >= 0:
        part.current_leader_epoch = leader_epoch
    return part


def produce_request(call: ProduceCall) -> pb.ProduceRequest:
    topics: dict[str, list[pb.ProducePartitionData]] = {}
    for tp, records in call.batches:
        data = pb.ProducePartitionData(partition=tp.partition, records=records)
        epoch = call.leader_epochs.get(tp)
        if epoch is not None and epoch >= 0:
            data.current_leader_epoch = epoch
        topics.setdefault(tp.topic, []).append(data)
    request = pb.ProduceRequest(
        correlation_id=call.correlation_id,
        acks=call.acks,
        timeout_ms=call.timeout_ms,
        topics=[
            pb.ProduceTopicData(topic=topic, partitions=parts) for topic, parts in topics.items()
        ],
    )
    if call.sent_timestamp_ms is not None:
        request.sent_timestamp_ms = call.sent_timestamp_ms
    if call.transactional_id is not None:
        request.transactional_id = call.transactional_id
    return request


def produce_answer(response: pb.ProduceResponse) -> ProduceAnswer:
    return ProduceAnswer(
        response.correlation_id,
        {
            TopicPartition(r.topic, r.partition): (
                PartitionProduceResult(error=error_for_code(r.error_code, r.error_message))
                if r.error_code
                else PartitionProduceResult(r.base_offset, r.log_append_time_ms, r.duplicate)
            )
            for r in response.results
        },
        response.throttle_time_ms,
    )


class GrpcProduceStream:
    """``ProduceStream`` over a gRPC ``ProduceStream`` call; converts on the way."""

    def __init__(self, stream: BidiStream[pb.ProduceRequest, pb.ProduceResponse]) -> None:
        self._stream = stream

    def send(self, call: ProduceCall) -> None:
        # Building the message copies the record bytes: callers send outside their locks.
        self._stream.send(produce_request(call))

    def responses(self) -> Iterator[ProduceAnswer]:
        for response in self._stream.responses():
            yield produce_answer(response)

    def close(self) -> None:
        self._stream.close()

    def cancel(self) -> None:
        self._stream.cancel()


def config_resource(resource: ConfigResource) -> pb.ConfigResource:
    kinds = {
        "topic": pb.CONFIG_RESOURCE_TYPE_TOPIC,
        "broker": pb.CONFIG_RESOURCE_TYPE_BROKER,
        "group": pb.CONFIG_RESOURCE_TYPE_GROUP,
    }
    return pb.ConfigResource(type=kinds[resource.type], name=resource.name)


def source_name(source: int) -> str:
    return pb.ConfigSource.Name(source).removeprefix("CONFIG_SOURCE_")  # type: ignore[arg-type]


def topic_description(answer: pb.TopicDescription) -> TopicDescription:
    """A ``TopicDescription`` message as the public value."""
    return TopicDescription(
        name=answer.name,
        partitions=tuple(
            PartitionDescription(
                partition=p.partition,
                log_start_offset=p.log_start_offset,
                log_end_offset=p.log_end_offset,
                high_watermark=p.high_watermark,
                size_bytes=p.size_bytes,
                segments=p.segments,
                leader=p.leader,
                replicas=tuple(p.replicas),
                isr=tuple(p.isr),
                leader_epoch=p.leader_epoch,
                elr=tuple(p.elr),
                last_known_elr=tuple(p.last_known_elr),
            )
            for p in sorted(answer.partitions, key=lambda p: p.partition)
        ),
        config=dict(sorted(answer.config.items())),
        internal=answer.internal,
    )


class GrpcFetchStream:
    """``FetchStream`` over a gRPC ``FetchStream`` call; converts on the way."""

    def __init__(self, stream: BidiStream[pb.FetchRequest, pb.FetchResponse]) -> None:
        self._stream = stream

    def send(self, call: FetchCall) -> None:
        self._stream.send(
            pb.FetchRequest(
                correlation_id=call.correlation_id,
                max_wait_ms=call.max_wait_ms,
                min_bytes=call.min_bytes,
                max_bytes=call.max_bytes,
                partitions=[
                    _fetch_partition(tp, offset, max_bytes, call.leader_epochs.get(tp))
                    for tp, offset, max_bytes in call.partitions
                ],
                isolation_level=call.isolation_level,
            )
        )

    def responses(self) -> Iterator[FetchAnswer]:
        for response in self._stream.responses():
            results = []
            for r in response.results:
                tp = TopicPartition(r.topic, r.partition)
                error = (
                    error_for_code(r.error_code, f"{tp}: {r.error_message}")
                    if r.error_code
                    else None
                )
                # r.records: the one copy out of protobuf; the consumer keeps this object.
                results.append(
                    FetchResult(
                        tp,
                        r.records,
                        r.high_watermark,
                        r.log_start_offset,
                        error,
                        r.batch_times,
                        r.last_stable_offset,
                        tuple((a.producer_id, a.first_offset) for a in r.aborted_transactions),
                    )
                )
            yield FetchAnswer(response.correlation_id, results)

    def close(self) -> None:
        self._stream.close()

    def cancel(self) -> None:
        self._stream.cancel()
