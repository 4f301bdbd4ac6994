"""Reading topics with Spark: batch reads from offset zero, options, partitioning."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.spark.conftest import TopicFactory, produce
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient

pytestmark = [
    pytest.mark.spark,
]


def _read(spark: Any, broker: InProcessBroker, **options: str) -> Any:
    reader = spark.read.format("tidelog").option("bootstrap.servers", broker.address)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_batch_read_from_offset_zero_returns_exact_rows(
    spark: Any, broker: InProcessBroker, new_topic: TopicFactory
) -> None:
    topic = new_topic(partitions=2)
    produce(
        broker.address,
        topic,
        [b"v%d" % i for i in range(10)],
        partition=0,
        keys=[b"k%d" % i for i in range(10)],
        headers=[("h", b"x")],
    )
    produce(broker.address, topic, [b"w%d" % i for i in range(5)], partition=1)
    rows = _read(spark, broker, subscribe=topic, includeHeaders="true").collect()
    got = sorted((r.partition, r.offset, r.key, r.value) for r in rows)
    want = [(0, i, b"k%d" % i, b"v%d" % i) for i in range(10)]
    want += [(1, i, None, b"w%d" % i) for i in range(5)]
    assert got == want
    first = next(r for r in rows if r.partition == 0 and r.offset == 0)
    assert first.topic == topic
    assert first.timestampType == 0
    assert [(h.key, h.value) for h in first.headers] == [("h", b"x")]
    assert next(r for r in rows if r.partition == 1).headers is None

    appended = new_topic(message_timestamp_type="LogAppendTime")
    produce(broker.address, appended, [b"x"], timestamps_ms=[1_000])
    (row,) = _read(spark, broker, subscribe=appended).collect()
    assert row.timestampType == 1
    assert row.timestamp.year >= 2024  # the broker's append time, not the producer's 1970


def test_offsets_timestamps_assign_and_split_partitions(
    spark: Any, broker: InProcessBroker, new_topic: TopicFactory
) -> None:
    topic = new_topic(partitions=2)
    base_ms = int(time.time() * 1000) - 60_000
    produce(
        broker.address,
        topic,
        [b"v%d" % i for i in range(20)],
        partition=0,
        timestamps_ms=[base_ms + i for i in range(20)],
    )
    produce(broker.address, topic, [b"w%d" % i for i in range(4)], partition=1)

    def offsets(df: Any) -> list[tuple[int, int]]:
        return sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())

    ranged = _read(
        spark,
        broker,
        subscribe=topic,
        startingOffsets=f'{{"{topic}":{{"0":5,"1":-2}}}}',
        endingOffsets=f'{{"{topic}":{{"0":15,"1":-1}}}}',
        maxRecordsPerPartition="3",
    )
    assert ranged.rdd.getNumPartitions() == 4 + 2  # 10 records in 3s, 4 records in 3s
    assert offsets(ranged) == [(0, i) for i in range(5, 15)] + [(1, i) for i in range(4)]

    since = _read(spark, broker, assign=f'{{"{topic}":[0]}}', startingTimestamp=str(base_ms + 12))
    assert offsets(since) == [(0, i) for i in range(12, 20)]

    spread = _read(spark, broker, subscribe=topic, minPartitions="5")
    assert spread.rdd.getNumPartitions() >= 5
    assert len(offsets(spread)) == 24


def test_explicit_registration_and_bad_options(spark: Any, broker: InProcessBroker) -> None:
    from tidelog.spark_sink import TidelogDataSource

    spark.dataSource.register(TidelogDataSource)  # the one-line form; harmless twice
    with pytest.raises(Exception, match="exactly one of the options"):
        _read(spark, broker).collect()


def test_compacted_topic_gaps_are_read_exactly(
    spark: Any, broker: InProcessBroker, admin: AdminClient, new_topic: TopicFactory
) -> None:
    topic = new_topic(cleanup_policy="compact", segment_bytes=300, min_cleanable_dirty_ratio=0.01)
    for round_ in range(6):  # a batch (so a segment) per round: the cleaner has work
        produce(
            broker.address,
            topic,
            [b"r%d-%d" % (round_, k) for k in range(4)],
            keys=[b"k%d" % k for k in range(4)],
        )
    end = admin.describe_topic(topic).partitions[0].high_watermark
    deadline = time.monotonic() + 60
    while True:
        rows = _read(spark, broker, subscribe=topic, maxRecordsPerPartition="5").collect()
        if len(rows) < end or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(rows) < end, "the cleaner did not compact"
    latest = {}
    for row in sorted(rows, key=lambda r: r.offset):
        latest[row.key] = row.value
    assert latest == {b"k%d" % k: b"r5-%d" % k for k in range(4)}
    assert len({r.offset for r in rows}) == len(rows)
