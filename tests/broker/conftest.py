"""Fixtures for the broker tests: a real in-process broker and the generated stub.

No mocks: every integration test talks gRPC to a ``broker.testing.InProcessBroker`` on
``127.0.0.1`` with a temporary data directory.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import grpc
import pytest

from tidelog.broker.grpc.errors import ERROR_CODE_METADATA_KEY
from tidelog.broker.testing import InProcessBroker
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.records import BatchBuilder

TIMEOUT_S = 10.0


@pytest.fixture
def broker() -> Iterator[InProcessBroker]:
    with InProcessBroker() as running:
        yield running


@pytest.fixture
def channel(broker: InProcessBroker) -> Iterator[grpc.Channel]:
    with broker.channel() as ch:
        yield ch


@pytest.fixture
def stub(channel: grpc.Channel) -> pb_grpc.BrokerStub:
    return pb_grpc.BrokerStub(channel)


def make_batch(
    values: Sequence[bytes],
    *,
    timestamp_ms: int = 1_700_000_000_000,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    key: bytes | None = None,
) -> bytes:
    """One RecordBatch v2 holding ``values``."""
    builder = BatchBuilder(
        producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=base_sequence
    )
    for i, value in enumerate(values):
        builder.append(timestamp_ms + i, key, value)
    return builder.build()


def produce_request(
    topic: str, partition: int, records: bytes, acks: int = 1, correlation_id: int = 0
) -> pb.ProduceRequest:
    return pb.ProduceRequest(
        correlation_id=correlation_id,
        acks=acks,
        topics=[
            pb.ProduceTopicData(
                topic=topic,
                partitions=[pb.ProducePartitionData(partition=partition, records=records)],
            )
        ],
    )


def produce(
    stub: pb_grpc.BrokerStub, topic: str, partition: int, records: bytes, acks: int = 1
) -> pb.ProducePartitionResult:
    """Produce to one partition and return its (single) result."""
    response = stub.Produce(produce_request(topic, partition, records, acks), timeout=TIMEOUT_S)
    assert len(response.results) == 1
    return response.results[0]


def fetch(
    stub: pb_grpc.BrokerStub,
    topic: str,
    partition: int,
    offset: int,
    *,
    max_wait_ms: int = 0,
    min_bytes: int = 0,
    partition_max_bytes: int = 0,
    max_bytes: int = 0,
    timeout_s: float = TIMEOUT_S,
) -> pb.FetchPartitionResult:
    """Fetch one partition and return its result."""
    response = stub.Fetch(
        pb.FetchRequest(
            max_wait_ms=max_wait_ms,
            min_bytes=min_bytes,
            max_bytes=max_bytes,
            partitions=[
                pb.FetchPartition(
                    topic=topic,
                    partition=partition,
                    fetch_offset=offset,
                    partition_max_bytes=partition_max_bytes,
                )
            ],
        ),
        timeout=timeout_s,
    )
    assert len(response.results) == 1
    return response.results[0]


def create_topic(
    stub: pb_grpc.BrokerStub, name: str, partitions: int = 1, **config: str
) -> pb.TopicDescription:
    return stub.CreateTopic(
        pb.CreateTopicRequest(name=name, partitions=partitions, config=config), timeout=TIMEOUT_S
    )


def error_code(error: grpc.RpcError) -> str | None:
    """The ``tidelog-error-code`` trailing metadata of a failed call."""
    for item in error.trailing_metadata() or ():
        if item.key == ERROR_CODE_METADATA_KEY:
            return str(item.value)
    return None
