"""Produce and consume the same way with every client family, for the Kafka listener tests.

Each client is driven with its defaults unless a test says otherwise: kafka-python (an
idempotent, acks=all producer by default), confluent-kafka (librdkafka), aiokafka, and
Tidelog's own client over gRPC. Records come back normalized as ``Rec`` so that what one
family wrote can be compared with what another read, field for field.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import aiokafka
import confluent_kafka
import kafka

from tidelog import client

TIMEOUT_S = 20.0
FAMILIES = ("kafka-python", "confluent-kafka", "aiokafka", "tidelog")


class Rec(NamedTuple):
    """One record as every family sees it."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int


class Out(NamedTuple):
    """One record to produce (``partition`` None: the client's partitioner decides)."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int | None = None
    partition: int | None = None


def produce(
    family: str, bootstrap: str, address: str, topic: str, records: Sequence[Out], **config: Any
) -> list[int]:
    """Produce ``records`` in order with ``family``; returns each record's partition as the
    client reported it."""
    if family == "kafka-python":
        return _produce_kafka_python(bootstrap, topic, records, **config)
    if family == "confluent-kafka":
        return _produce_confluent(bootstrap, topic, records, **config)
    if family == "aiokafka":
        return asyncio.run(
            asyncio.wait_for(_produce_aiokafka(bootstrap, topic, records, **config), TIMEOUT_S)
        )
    if family == "tidelog":
        return _produce_tidelog(address, topic, records)
    raise ValueError(family)


def consume(
    family: str, bootstrap: str, address: str, topic: str, partitions: Sequence[int], count: int
) -> list[Rec]:
    """Read ``count`` records from the beginning of ``partitions`` by assign and seek;
    sorted by (partition, offset). Fails if they do not all arrive within TIMEOUT_S."""
    if family == "kafka-python":
        got = _consume_kafka_python(bootstrap, topic, partitions, count)
    elif family == "confluent-kafka":
        got = _consume_confluent(bootstrap, topic, partitions, count)
    elif family == "aiokafka":
        got = asyncio.run(
            asyncio.wait_for(_consume_aiokafka(bootstrap, topic, partitions, count), TIMEOUT_S)
        )
    elif family == "tidelog":
        got = _consume_tidelog(address, topic, partitions, count)
    else:
        raise ValueError(family)
    assert len(got) == count, f"{family} read {len(got)} of {count} records"
    return sorted(got)


# --- kafka-python -------------------------------------------------------------------------


def _produce_kafka_python(
    bootstrap: str, topic: str, records: Sequence[Out], **config: Any
) -> list[int]:
    producer = kafka.KafkaProducer(bootstrap_servers=bootstrap, **config)
    try:
        futures = [
            producer.send(
                topic,
                value=r.value,
                key=r.key,
                headers=list(r.headers),
                partition=r.partition,
                timestamp_ms=r.timestamp_ms,
            )
            for r in records
        ]
        producer.flush(TIMEOUT_S)
        return [f.get(TIMEOUT_S).partition for f in futures]
    finally:
        producer.close(TIMEOUT_S)


def _consume_kafka_python(
    bootstrap: str, topic: str, partitions: Sequence[int], count: int
) -> list[Rec]:
    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        consumer.assign([kafka.TopicPartition(topic, p) for p in partitions])
        consumer.seek_to_beginning()
        got: list[Rec] = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < count and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                got.extend(
                    Rec(
                        m.partition,
                        m.offset,
                        m.key,
                        m.value,
                        tuple((k, v) for k, v in m.headers),
                        m.timestamp,
                    )
                    for m in batch
                )
        return got
    finally:
        consumer.close()


# --- confluent-kafka ----------------------------------------------------------------------


def _produce_confluent(
    bootstrap: str, topic: str, records: Sequence[Out], **config: Any
) -> list[int]:
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, **config})
    reported: dict[int, int] = {}
    errors: list[Any] = []

    def delivered(index: int) -> Any:
        def report(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(err)
            else:
                reported[index] = msg.partition()

        return report

    for i, r in enumerate(records):
        kwargs: dict[str, Any] = {
            "value": r.value,
            "key": r.key,
            "headers": list(r.headers),
            "on_delivery": delivered(i),
        }
        if r.partition is not None:
            kwargs["partition"] = r.partition
        if r.timestamp_ms is not None:
            kwargs["timestamp"] = r.timestamp_ms
        producer.produce(topic, **kwargs)
    left = producer.flush(TIMEOUT_S)
    assert left == 0, f"{left} records not delivered"
    assert not errors, errors
    return [reported[i] for i in range(len(records))]


def _consume_confluent(
    bootstrap: str, topic: str, partitions: Sequence[int], count: int
) -> list[Rec]:
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused-assign-only",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign(
            [
                confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                for p in partitions
            ]
        )
        got: list[Rec] = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append(
                Rec(
                    msg.partition(),
                    msg.offset(),
                    msg.key(),
                    msg.value(),
                    tuple(msg.headers() or ()),
                    msg.timestamp()[1],
                )
            )
        return got
    finally:
        consumer.close()


# --- aiokafka -----------------------------------------------------------------------------


async def _produce_aiokafka(
    bootstrap: str, topic: str, records: Sequence[Out], **config: Any
) -> list[int]:
    producer = aiokafka.AIOKafkaProducer(bootstrap_servers=bootstrap, **config)
    await producer.start()
    try:
        futures = [
            await producer.send(
                topic,
                value=r.value,
                key=r.key,
                partition=r.partition,
                timestamp_ms=r.timestamp_ms,
                headers=list(r.headers),
            )
            for r in records
        ]
        return [(await f).partition for f in futures]
    finally:
        await producer.stop()


async def _consume_aiokafka(
    bootstrap: str, topic: str, partitions: Sequence[int], count: int
) -> list[Rec]:
    consumer = aiokafka.AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([aiokafka.TopicPartition(topic, p) for p in partitions])
        await consumer.seek_to_beginning()
        got: list[Rec] = []
        while len(got) < count:
            for batch in (await consumer.getmany(timeout_ms=500)).values():
                got.extend(
                    Rec(m.partition, m.offset, m.key, m.value, tuple(m.headers), m.timestamp)
                    for m in batch
                )
        return got
    finally:
        await consumer.stop()


# --- Tidelog's own client (gRPC) ------------------------------------------------------------


def _produce_tidelog(address: str, topic: str, records: Sequence[Out]) -> list[int]:
    with client.Producer(address, linger_ms=0) as producer:
        futures = [
            producer.send(
                topic,
                value=r.value,
                key=r.key,
                headers=list(r.headers),
                partition=r.partition,
                timestamp_ms=r.timestamp_ms,
            )
            for r in records
        ]
        producer.flush(int(TIMEOUT_S * 1000))
        return [f.result(TIMEOUT_S).partition for f in futures]


def _consume_tidelog(address: str, topic: str, partitions: Sequence[int], count: int) -> list[Rec]:
    with client.Consumer(address, enable_auto_commit=False) as consumer:
        tps = [client.TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        got: list[Rec] = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < count and time.monotonic() < deadline:
            got.extend(
                Rec(
                    m.partition,
                    m.offset,
                    m.key,
                    m.value,
                    tuple((k, v if v is not None else b"") for k, v in m.headers),
                    m.timestamp_ms,
                )
                for m in consumer.poll(timeout_ms=500)
            )
        return got
