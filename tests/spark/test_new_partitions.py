"""A streaming query picks up partitions added to a subscribed topic
(``AdminClient.create_partitions``) and reads them from their start, as Spark's Kafka
source does: records written to a new partition before the query noticed it are not
skipped, even with ``startingOffsets=latest``."""

from __future__ import annotations

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


def test_partitions_added_to_a_subscribed_topic_are_read_from_their_start(
    spark: Any,
    broker: InProcessBroker,
    admin: AdminClient,
    new_topic: TopicFactory,
    tmp_path: Path,
) -> None:
    topic = new_topic(partitions=2)
    produce(broker.address, topic, [b"skipped"], partition=0)  # before the start: latest
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    df = (
        spark.readStream.format("tidelog")
        .option("bootstrap.servers", broker.address)
        .option("subscribe", topic)
        .option("startingOffsets", "latest")
        .load()
    )
    query = (
        df.select("partition", "offset", "value")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    try:
        query.processAllAvailable()
        produce(broker.address, topic, [b"p1-%d" % i for i in range(3)], partition=1)
        admin.create_partitions(topic, 4)
        # Written before the query looks again: a new partition starts at its log start.
        produce(broker.address, topic, [b"p2-%d" % i for i in range(4)], partition=2)
        produce(broker.address, topic, [b"p3-%d" % i for i in range(2)], partition=3)
        deadline = time.monotonic() + 20
        while True:
            query.processAllAvailable()
            rows = spark.read.parquet(str(out)).collect() if out.exists() else []
            if len(rows) >= 9 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        produce(broker.address, topic, [b"p3-later"], partition=3)
        query.processAllAvailable()
        rows = spark.read.parquet(str(out)).collect()
    finally:
        query.stop()
    got = sorted((r.partition, r.offset, bytes(r.value)) for r in rows)
    assert got == (
        [(1, i, b"p1-%d" % i) for i in range(3)]
        + [(2, i, b"p2-%d" % i) for i in range(4)]
        + [(3, i, b"p3-%d" % i) for i in range(2)]
        + [(3, 2, b"p3-later")]
    )
