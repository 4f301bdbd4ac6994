"""Writing to topics with Spark: batch writes, windowed aggregations written back, and
the effectively-once streaming write under a micro-batch that fails and is re-run."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.spark.conftest import TopicFactory, consume_all, produce
from tidelog.broker.testing import InProcessBroker

pytestmark = [
    pytest.mark.spark,
]


def test_batch_write_columns(spark: Any, broker: InProcessBroker, new_topic: TopicFactory) -> None:
    topic = new_topic(partitions=3)
    rows = [
        ("k1", "v1", 2, [("h", bytearray(b"x"))]),
        (None, "v2", 0, None),
        ("k3", "v3", None, None),
    ]
    df = spark.createDataFrame(
        rows,
        "key string, value string, partition int, headers array<struct<key:string,value:binary>>",
    )
    df.write.format("tidelog").mode("append").option("bootstrap.servers", broker.address).option(
        "topic", topic
    ).save()
    got = {r.value: r for r in consume_all(broker.address, topic)}
    assert set(got) == {b"v1", b"v2", b"v3"}
    assert (got[b"v1"].partition, got[b"v1"].key) == (2, b"k1")
    assert got[b"v1"].headers == (("h", b"x"),)
    assert (got[b"v2"].partition, got[b"v2"].key) == (0, None)


def test_windowed_counts_written_back_to_a_topic(
    spark: Any, broker: InProcessBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    from pyspark.sql import functions as f

    # Old event times: keep the topic from retention (the test broker checks often).
    source, sink = new_topic(partitions=2, retention_ms=-1), new_topic()
    base_ms = 1_700_000_000_000  # a multiple of 10 s
    keys: list[bytes | None] = [b"k%d" % (i % 3) for i in range(30)]
    # 30 events over 30 s, then one at +200 s that moves the watermark (1 minute behind
    # the latest event) past the first three windows, which append mode then emits.
    produce(
        broker.address,
        source,
        [b"e%d" % i for i in range(31)],
        keys=[*keys, b"late"],
        timestamps_ms=[base_ms + i * 1000 for i in range(30)] + [base_ms + 200_000],
    )
    events = (
        spark.readStream.format("tidelog")
        .option("bootstrap.servers", broker.address)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .load()
    )
    counts = (
        events.withWatermark("timestamp", "1 minute")
        .groupBy(f.window("timestamp", "10 seconds"), f.col("key"))
        .count()
        .select(
            f.col("key"),
            f.to_json(
                f.struct(
                    f.col("window.start").cast("long").alias("start"),
                    f.col("key").cast("string").alias("key"),
                    "count",
                )
            ).alias("value"),
        )
    )
    query = (
        counts.writeStream.format("tidelog")
        .option("bootstrap.servers", broker.address)
        .option("topic", sink)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .outputMode("append")
        .start()
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            query.processAllAvailable()  # the data batch, then the watermark's no-data one
            records = consume_all(broker.address, sink)
            if len(records) >= 9 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        progress = [(p["batchId"], p["numInputRows"], p["sink"]) for p in query.recentProgress]
        query.stop()
    assert records, progress
    latest: dict[tuple[int, str], int] = {}
    for record in records:
        doc = json.loads(record.value)
        assert (doc["start"], doc["key"]) not in latest, "append mode emits a window once"
        latest[(doc["start"], doc["key"])] = doc["count"]
    base_s = base_ms // 1000
    want = {}
    for i in range(30):
        window = base_s + (i // 10) * 10
        key = f"k{i % 3}"
        want[(window, key)] = want.get((window, key), 0) + 1
    assert latest == want


def test_failed_micro_batch_rerun_writes_each_record_once(
    spark: Any, broker: InProcessBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    """Task A writes its rows; task B fails (first attempt only, a marker file says so),
    which fails the batch and the query. The restarted query re-runs the same batch id:
    A's rows are found already stored and skipped, B's are written; each record once."""
    from pyspark.sql import functions as f
    from pyspark.sql.types import BinaryType

    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    produce(broker.address, source, [b"a%03d" % i for i in range(300)], partition=0)
    produce(broker.address, source, [b"b%03d" % i for i in range(300)], partition=1)
    marker = tmp_path / "failed-once"

    address = broker.address

    def fail_once(value):  # type: ignore[no-untyped-def]  # hints would make it a pandas UDF
        if value == b"b150" and not marker.exists():
            marker.write_text("failed")
            # Fail only once the other task has written all its 300 records (15 batches).
            from tidelog.client import AdminClient

            deadline = time.monotonic() + 60
            with AdminClient(address) as check:
                while time.monotonic() < deadline:
                    parts = check.describe_topic(sink).partitions
                    if sum(p.high_watermark for p in parts) >= 300:
                        break
                    time.sleep(0.1)
            raise RuntimeError("injected failure in the first attempt")
        return value

    fail_udf = f.udf(fail_once, BinaryType())

    def start() -> Any:
        df = (
            spark.readStream.format("tidelog")
            .option("bootstrap.servers", broker.address)
            .option("subscribe", source)
            .option("startingOffsets", "earliest")
            .load()
            .select(f.col("key"), fail_udf(f.col("value")).alias("value"))
        )
        return (
            df.writeStream.format("tidelog")
            .option("bootstrap.servers", broker.address)
            .option("topic", sink)
            .option("maxBatchRecords", "20")  # many batches: more than the 5 Kafka keeps
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .start()
        )

    query = start()
    with pytest.raises(Exception, match="injected failure"):
        query.processAllAvailable()
    query.stop()
    written_before = consume_all(broker.address, sink, 2)
    assert len(written_before) == 300, "the first attempt wrote one task's records"

    query = start()  # the same checkpoint: Spark re-runs batch 0 with the same offsets
    try:
        query.processAllAvailable()
        assert query.lastProgress["batchId"] == 0
    finally:
        query.stop()
    values = sorted(r.value for r in consume_all(broker.address, sink, 2))
    want = sorted([b"a%03d" % i for i in range(300)] + [b"b%03d" % i for i in range(300)])
    assert values == want
