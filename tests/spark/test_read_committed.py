"""The source's ``isolation.level`` (issue #28, step 7b) over transactional data that
confluent-kafka's transactional producer writes through the Kafka listener of a broker of
this module: read_committed batch reads and micro-batches end at the last stable offset
and leave aborted records out; read_uncommitted (the default, as Spark's Kafka source)
reads every data record; no row is ever a transaction marker."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka.admin import AdminClient as KafkaAdmin
from confluent_kafka.admin import NewTopic

from tests.kafka.conftest import wait_until_decided
from tidelog.broker.testing import InProcessBroker
from tidelog.client import TopicPartition
from tidelog.spark_sink.options import ReadOptions

pytestmark = [pytest.mark.spark]

TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def txn_broker() -> Iterator[tuple[InProcessBroker, str]]:
    """A broker with a Kafka listener (the session's ``broker`` has none)."""
    with InProcessBroker(settings={"kafka.listen": "127.0.0.1:0"}) as running:
        assert running.server.kafka_port is not None
        yield running, f"127.0.0.1:{running.server.kafka_port}"


def _transactional(bootstrap: str) -> Any:
    made = KafkaProducer(
        {"bootstrap.servers": bootstrap, "transactional.id": uuid.uuid4().hex, "linger.ms": 0}
    )
    made.init_transactions(TIMEOUT_S)
    return made


def _write(producer: Any, topic: str, value: bytes) -> None:
    producer.produce(topic, value, partition=0)
    assert producer.flush(TIMEOUT_S) == 0


def _read(spark: Any, address: str, topic: str, **options: str) -> list[tuple[int, bytes]]:
    reader = spark.read.format("tidelog").option("bootstrap.servers", address)
    for key, value in {"subscribe": topic, **options}.items():
        reader = reader.option(key, value)
    return sorted((r.offset, bytes(r.value)) for r in reader.load().collect())


def test_read_committed_batches_end_at_the_last_stable_offset(
    spark: Any, txn_broker: tuple[InProcessBroker, str], tmp_path: Path
) -> None:
    broker, bootstrap = txn_broker
    topic = f"spark-rc-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdmin({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result(TIMEOUT_S)
    a, b = _transactional(bootstrap), _transactional(bootstrap)
    a.begin_transaction()
    b.begin_transaction()
    _write(a, topic, b"c1")  # 0
    _write(b, topic, b"x1")  # 1: aborted
    _write(a, topic, b"c2")  # 2
    a.commit_transaction(TIMEOUT_S)  # 3
    b.abort_transaction(TIMEOUT_S)  # 4
    # Both markers in (they are written after the answers) before the next write.
    assert wait_until_decided(broker.address, TopicPartition(topic, 0)) == 5
    a.begin_transaction()
    _write(a, topic, b"open")  # 5: undecided: the last stable offset stays at 5

    assert _read(spark, broker.address, topic, **{"isolation.level": "read_committed"}) == [
        (0, b"c1"),
        (2, b"c2"),
    ]
    assert _read(spark, broker.address, topic) == [
        (0, b"c1"), (1, b"x1"), (2, b"c2"), (5, b"open")
    ]  # fmt: skip

    # A stream: its first micro-batch ends at the last stable offset; once the open
    # transaction commits, the next run from the checkpoint reads the rest.
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run() -> Any:
        query = (
            spark.readStream.format("tidelog")
            .option("bootstrap.servers", broker.address)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("kafka.isolation.level", "read_committed")
            .load()
            .select("offset", "value")
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(90)
        return query

    first = run()
    ends = [p["sources"][0]["endOffset"] for p in first.recentProgress if p["numInputRows"]]
    assert [json.loads(end) for end in ends] == [{topic: {"0": 5}}]
    a.commit_transaction(TIMEOUT_S)  # 6
    assert wait_until_decided(broker.address, TopicPartition(topic, 0)) == 7
    run()
    rows = spark.read.parquet(str(out)).collect()
    assert sorted((r.offset, bytes(r.value)) for r in rows) == [
        (0, b"c1"), (2, b"c2"), (5, b"open")
    ]  # fmt: skip


def test_isolation_options_are_checked() -> None:
    def parse(**options: str) -> str:
        return ReadOptions.from_mapping(
            {"subscribe": "t", **options}, streaming=False
        ).isolation_level

    assert parse() == "read_uncommitted"
    assert parse(**{"kafka.isolation.level": "READ_COMMITTED"}) == "read_committed"
    assert parse(**{"isolation.level": "read_committed", "kafka.isolation.level": "read_committed"})
    with pytest.raises(ValueError, match="disagree"):
        parse(**{"isolation.level": "read_committed", "kafka.isolation.level": "read_uncommitted"})
    with pytest.raises(ValueError, match="read_uncommitted or read_committed"):
        parse(**{"isolation.level": "serializable"})
