"""The Spark benchmark's ceilings (``benchmarks/spark_ceiling.py``) read every row once,
batch and streaming: a ceiling that dropped or repeated rows would flatter or shame the
source it is compared with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.spark_ceiling import CeilingDataSource, write_partition_files
from tests.spark.conftest import TopicFactory, produce
from tidelog.broker.testing import InProcessBroker
from tidelog.client import TopicPartition
from tidelog.spark_sink.offsets import OffsetRange
from tidelog.spark_sink.options import ReadOptions
from tidelog.spark_sink.reader import read_ranges


def _ceiling_files(broker: InProcessBroker, topic: str, ends: list[int], tmp_path: Path) -> str:
    options = ReadOptions.from_mapping(
        {"bootstrap.servers": broker.address, "subscribe": topic}, streaming=False
    )
    paths = write_partition_files(
        [
            read_ranges(options, [OffsetRange(TopicPartition(topic, p), 0, end)], [0])
            for p, end in enumerate(ends)
        ],
        tmp_path,
    )
    return ",".join(paths)


def test_both_ceilings_read_every_row_once(
    spark: Any, broker: InProcessBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic = new_topic(partitions=2)
    produce(broker.address, topic, [f"v{i}".encode() for i in range(30)], partition=0)
    produce(broker.address, topic, [f"w{i}".encode() for i in range(20)], partition=1)
    paths = _ceiling_files(broker, topic, [30, 20], tmp_path)
    spark.dataSource.register(CeilingDataSource)
    expected = sorted(
        [(0, i, f"v{i}".encode()) for i in range(30)]
        + [(1, i, f"w{i}".encode()) for i in range(20)]
    )

    batch = spark.read.format("tidelog_ceiling").option("paths", paths).load().collect()
    assert sorted((r.partition, r.offset, bytes(r.value)) for r in batch) == expected

    name = f"ceiling_{topic.replace('-', '_')}"
    query = (
        spark.readStream.format("tidelog_ceiling")
        .option("paths", paths)
        .load()
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    streamed = spark.sql(f"SELECT partition, offset, value FROM {name}").collect()
    assert sorted((r.partition, r.offset, bytes(r.value)) for r in streamed) == expected
    assert sum(p["numInputRows"] for p in query.recentProgress) == 50
