"""Streaming reads: restarts from the checkpoint, admission control, AvailableNow,
retention overtaking a query, partitions that appear while a query runs."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.spark.conftest import TopicFactory, produce
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient

pytestmark = [
    pytest.mark.spark,
]


def _stream(spark: Any, broker: InProcessBroker, **options: str) -> Any:
    reader = spark.readStream.format("tidelog").option("bootstrap.servers", broker.address)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _to_parquet(df: Any, out: Path, checkpoint: Path, **trigger: Any) -> Any:
    writer = (
        df.select("topic", "partition", "offset", "value")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
    )
    if trigger:
        writer = writer.trigger(**trigger)
    return writer.start()


def _offsets(spark: Any, out: Path) -> list[tuple[int, int]]:
    if not out.exists():
        return []
    rows = spark.read.parquet(str(out)).collect()
    return sorted((r.partition, r.offset) for r in rows)


def test_restart_from_checkpoint_reads_nothing_twice_and_skips_nothing(
    spark: Any, broker: InProcessBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic = new_topic(partitions=2)
    produce(broker.address, topic, [b"a%d" % i for i in range(40)], partition=0)
    produce(broker.address, topic, [b"b%d" % i for i in range(20)], partition=1)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    df = _stream(spark, broker, subscribe=topic, startingOffsets="earliest")

    query = _to_parquet(df, out, checkpoint)
    query.processAllAvailable()
    query.stop()
    assert _offsets(spark, out) == [(0, i) for i in range(40)] + [(1, i) for i in range(20)]

    produce(broker.address, topic, [b"c%d" % i for i in range(15)], partition=1)
    query = _to_parquet(df, out, checkpoint)  # same checkpoint: resumes at 40 / 20
    query.processAllAvailable()
    produce(broker.address, topic, [b"d%d" % i for i in range(5)], partition=0)
    query.processAllAvailable()
    query.stop()
    assert _offsets(spark, out) == [(0, i) for i in range(45)] + [(1, i) for i in range(35)]


def test_max_offsets_per_trigger_and_available_now(
    spark: Any, broker: InProcessBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic = new_topic(partitions=2)
    produce(broker.address, topic, [b"a%d" % i for i in range(70)], partition=0)
    produce(broker.address, topic, [b"b%d" % i for i in range(10)], partition=1)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    df = _stream(
        spark, broker, subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger="30"
    )
    query = _to_parquet(df, out, checkpoint, availableNow=True)
    assert query.awaitTermination(90)  # AvailableNow stops by itself
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    # 30 per batch, spread fairly: partition 1's 10 records go in the first batch.
    assert sizes == [30, 30, 20]
    # The offsets as Spark keeps them: JSON text in a fixed key order.
    first = query.recentProgress[0]["sources"][0]["endOffset"]
    assert first == json.dumps({topic: {"0": 20, "1": 10}})
    assert _offsets(spark, out) == [(0, i) for i in range(70)] + [(1, i) for i in range(10)]


def _wait_log_start(admin: AdminClient, topic: str, above: int) -> int:
    deadline = time.monotonic() + 30
    while True:
        start = admin.describe_topic(topic).partitions[0].log_start_offset
        if start > above:
            return start
        assert time.monotonic() < deadline, "retention did not run"
        time.sleep(0.1)


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_retention_overtaking_a_query(
    spark: Any,
    broker: InProcessBroker,
    admin: AdminClient,
    new_topic: TopicFactory,
    tmp_path: Path,
    fail_on_data_loss: bool,
) -> None:
    topic = new_topic(segment_bytes=1024)
    produce(broker.address, topic, [b"x" * 100 for _ in range(10)])
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    options = {
        "subscribe": topic,
        "startingOffsets": "earliest",
        "failOnDataLoss": str(fail_on_data_loss).lower(),
    }
    query = _to_parquet(_stream(spark, broker, **options), out, checkpoint, availableNow=True)
    assert query.awaitTermination(60)
    assert len(_offsets(spark, out)) == 10

    # More records, then retention deletes every closed segment: offsets 10.. of the
    # next batch are partly gone before the query reads them.
    for _ in range(4):  # one batch, so one segment, each
        produce(broker.address, topic, [b"y" * 100 for _ in range(10)])
    admin.alter_topic_config(topic, {"retention.bytes": "1"})
    log_start = _wait_log_start(admin, topic, 10)
    end = admin.describe_topic(topic).partitions[0].high_watermark

    query = _to_parquet(_stream(spark, broker, **options), out, checkpoint, availableNow=True)
    if fail_on_data_loss:
        with pytest.raises(Exception, match="failOnDataLoss"):
            query.awaitTermination(60)
        assert len(_offsets(spark, out)) == 10
    else:
        assert query.awaitTermination(60)
        assert _offsets(spark, out) == [(0, i) for i in range(10)] + [
            (0, i) for i in range(log_start, end)
        ]


def test_new_topics_matching_the_pattern_are_picked_up(
    spark: Any, broker: InProcessBroker, admin: AdminClient, tmp_path: Path
) -> None:
    prefix = f"pattern-{time.monotonic_ns()}"
    admin.create_topic(f"{prefix}-a", 1)
    produce(broker.address, f"{prefix}-a", [b"a%d" % i for i in range(5)])
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    df = _stream(spark, broker, subscribePattern=f"{prefix}-.*", startingOffsets="earliest")
    query = (
        df.select("topic", "offset")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    try:
        query.processAllAvailable()
        admin.create_topic(f"{prefix}-b", 2)
        produce(broker.address, f"{prefix}-b", [b"b%d" % i for i in range(6)])
        deadline = time.monotonic() + 60
        while True:
            query.processAllAvailable()
            rows = spark.read.parquet(str(out)).collect()
            if len(rows) >= 11 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        query.stop()
    got = sorted((r.topic, r.offset) for r in rows)
    assert [t for t, _ in got].count(f"{prefix}-a") == 5
    assert [t for t, _ in got].count(f"{prefix}-b") == 6


def test_a_trigger_asks_the_broker_once(broker: InProcessBroker, new_topic: TopicFactory) -> None:
    """``reportLatestOffset`` and ``partitions`` reuse what the trigger's ``latestOffset``
    found (they used to ask the broker again, three calls each); ``partitions`` of a batch
    planned from the checkpoint (no ``latestOffset`` before it) still asks, and a pickled
    reader (what tasks get) carries none of it."""
    import pickle

    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from tidelog.client import TopicPartition
    from tidelog.spark_sink.offsets import offset_dict
    from tidelog.spark_sink.options import ReadOptions
    from tidelog.spark_sink.source import TidelogInputPartition, TidelogStreamReader

    topic = new_topic(partitions=2, message_timestamp_type="LogAppendTime")
    produce(broker.address, topic, [b"v%d" % i for i in range(10)])
    options = ReadOptions(bootstrap_servers=broker.address, subscribe=(topic,))
    reader = TidelogStreamReader(options)
    lookups = 0
    real = reader._view.partitions

    def counted(**kwargs: bool) -> Any:
        nonlocal lookups
        lookups += 1
        return real(**kwargs)

    reader._view.partitions = counted  # type: ignore[method-assign]
    try:
        start = offset_dict({TopicPartition(topic, 0): 0, TopicPartition(topic, 1): 0})
        replanned = reader.partitions(start, start)  # a restart: nothing seen yet
        assert lookups == 1
        assert replanned == []
        end = reader.latestOffset(start, ReadAllAvailable())
        assert reader.reportLatestOffset() == end
        pieces = reader.partitions(start, end)
        assert lookups == 2
        assert sum(p.offset_range.size for p in pieces) == 10
        assert all(isinstance(p, TidelogInputPartition) and p.timestamp_type == 1 for p in pieces)
        assert pickle.loads(pickle.dumps(reader))._last_seen is None
    finally:
        reader.stop()
