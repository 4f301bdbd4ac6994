"""The ``tidelog`` source against three real broker processes and a real ZooKeeper.

A topic whose partitions are led by all three brokers, records produced through a
bootstrap list naming one broker, and Spark given that one broker too: a batch read and
a streaming read (``availableNow``, more records, ``availableNow`` again from the
checkpoint) each return every record exactly once. That every partition is read from its
leader is checked on the brokers' own metrics: each broker's ``tidelog_records_out`` for
the topic grows by exactly the records of the partitions it leads.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.broker.cluster.conftest import require_zookeeper
from tests.client.test_cluster_client import create_spread_topic
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.client import AdminClient, Producer

pytestmark = [pytest.mark.spark, pytest.mark.slow]

TOPIC = "spread-spark"
PARTITIONS = 6


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    with LocalCluster(brokers=3, session_timeout_ms=3_000, metrics=True) as running:
        yield running


@pytest.fixture(scope="module")
def leaders(cluster: LocalCluster) -> dict[int, int]:
    """``TOPIC``'s partitions and their leaders: every broker leads some."""
    with AdminClient(cluster.address(1), request_timeout_ms=20_000) as admin:
        found = create_spread_topic(admin, TOPIC, PARTITIONS)
    assert set(found.values()) == {1, 2, 3}
    return found


def produce(cluster: LocalCluster, first: int, count: int) -> None:
    """Values ``first .. first + count - 1``, value ``i`` to partition ``i % PARTITIONS``,
    through broker 1 only."""
    with Producer(cluster.address(1), acks="all", linger_ms=5) as producer:
        futures = [
            producer.send(TOPIC, b"%d" % i, partition=i % PARTITIONS)
            for i in range(first, first + count)
        ]
        for future in futures:
            future.result(timeout=30)


def records_out(cluster: LocalCluster) -> dict[int, float]:
    """Per broker: the records it has answered to fetches of ``TOPIC`` (its metrics)."""
    out: dict[int, float] = {}
    for broker_id in cluster.broker_ids:
        url = f"http://{cluster.metrics_address(broker_id)}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
        out[broker_id] = sum(
            sample.value
            for family in text_string_to_metric_families(text)
            if family.name == "tidelog_records_out"
            for sample in family.samples
            if sample.name == "tidelog_records_out_total" and sample.labels.get("topic") == TOPIC
        )
    return out


def led_records(leaders: dict[int, int], values: range) -> dict[int, float]:
    """Per broker: how many of ``values`` sit in the partitions it leads."""
    out = dict.fromkeys(sorted(set(leaders.values())), 0.0)
    for i in values:
        out[leaders[i % PARTITIONS]] += 1
    return out


def grown(before: dict[int, float], after: dict[int, float]) -> dict[int, float]:
    return {b: after[b] - before[b] for b in after}


def rows_of(rows: list[Any]) -> list[tuple[int, int, int]]:
    """``(partition, offset, value)`` per row, sorted."""
    return sorted((r.partition, r.offset, int(r.value)) for r in rows)


def expected(values: range) -> list[tuple[int, int, int]]:
    """What a read of values ``0 .. n-1`` (produced in order) returns."""
    return sorted((i % PARTITIONS, i // PARTITIONS, i) for i in values)


def test_a_batch_read_spanning_three_brokers_reads_each_record_once_from_its_leader(
    spark: Any, cluster: LocalCluster, leaders: dict[int, int]
) -> None:
    produce(cluster, 0, 120)
    before = records_out(cluster)
    rows = (
        spark.read.format("tidelog")
        .option("bootstrap.servers", cluster.address(2))
        .option("subscribe", TOPIC)
        .load()
        .select("partition", "offset", "value")
        .collect()
    )
    assert rows_of(rows) == expected(range(120))
    assert grown(before, records_out(cluster)) == led_records(leaders, range(120))


def test_a_stream_spanning_three_brokers_reads_each_record_once_from_its_leader(
    spark: Any, cluster: LocalCluster, leaders: dict[int, int], tmp_path: Path
) -> None:
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run_available_now(**limit: str) -> int:
        """One availableNow query from the checkpoint; how many micro-batches read rows."""
        reader = (
            spark.readStream.format("tidelog")
            .option("bootstrap.servers", cluster.address(3))
            .option("subscribe", TOPIC)
            .option("startingOffsets", "earliest")
        )
        for key, value in limit.items():
            reader = reader.option(key, value)
        query = (
            reader.load()
            .select("partition", "offset", "value")
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(120)  # availableNow stops by itself
        assert query.exception() is None
        return sum(1 for progress in query.recentProgress if progress["numInputRows"])

    # Whatever the batch test left (it may run first, or alone), then 60 more.
    with AdminClient(cluster.address(1), request_timeout_ms=20_000) as admin:
        present = sum(p.high_watermark for p in admin.describe_topic(TOPIC).partitions)
    produce(cluster, present, 60)
    first = range(present + 60)
    before = records_out(cluster)
    run_available_now()
    assert rows_of(spark.read.parquet(str(out)).collect()) == expected(first)
    after_first = records_out(cluster)
    assert grown(before, after_first) == led_records(leaders, first)

    produce(cluster, len(first), 90)
    run_available_now()
    everything = range(len(first) + 90)
    assert rows_of(spark.read.parquet(str(out)).collect()) == expected(everything)
    # The second run read only the new records, each from its leader.
    assert grown(after_first, records_out(cluster)) == led_records(
        leaders, range(len(first), len(everything))
    )

    # Once more in micro-batches of at most 50 offsets, which split the producer's
    # batches: still every record once. Each broker served its own records, and more only
    # as whole stored batches that a micro-batch's range cut into (at most once a batch).
    before = records_out(cluster)
    produce(cluster, len(everything), 120)
    batches = run_available_now(maxOffsetsPerTrigger="50")
    assert batches >= 3
    final = range(len(everything) + 120)
    assert rows_of(spark.read.parquet(str(out)).collect()) == expected(final)
    served = grown(before, records_out(cluster))
    needed = led_records(leaders, range(len(everything), len(final)))
    assert all(needed[b] <= served[b] <= batches * needed[b] for b in served), (served, needed)
