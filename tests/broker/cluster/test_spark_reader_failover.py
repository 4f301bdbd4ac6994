"""The Spark source's reader through a leader change: every record of the range, no
false data loss (``OFFSET_NOT_AVAILABLE`` and ``NOT_LEADER_OR_FOLLOWER`` are "try again").

The reader (``spark_sink.reader.read_ranges``) runs here as a Spark task runs it, without
a SparkSession: the Spark machinery around it is tested in ``tests/spark``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pytest

from tests.broker.cluster.conftest import require_zookeeper
from tests.broker.cluster.waiting import eventually
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.client import AdminClient, Producer, TopicPartition
from tidelog.spark_sink.offsets import OffsetRange
from tidelog.spark_sink.options import ReadOptions
from tidelog.spark_sink.reader import read_ranges

pytestmark = pytest.mark.slow
COUNT = 6_000


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    settings = {"replica.fetch.backoff.ms": 200}
    with LocalCluster(brokers=3, session_timeout_ms=3_000, settings=settings) as running:
        yield running


def test_a_range_is_read_whole_across_a_leader_kill(cluster: LocalCluster) -> None:
    with AdminClient(cluster.bootstrap, request_timeout_ms=20_000) as admin:
        eventually(lambda: len(admin.describe_cluster().brokers) == 3)
        admin.create_topic("spark-failover", 1, {"min.insync.replicas": "2"}, replication_factor=3)
        # Every broker's view catches up on its own: ask until the one asked knows it.
        eventually(lambda: len(admin.describe_topic("spark-failover").partitions[0].isr) == 3)
        leader = admin.describe_topic("spark-failover").partitions[0].leader
    with Producer(cluster.bootstrap, acks="all") as producer:
        for i in range(COUNT):
            producer.send("spark-failover", b"%d" % i)
        producer.flush(timeout_ms=60_000)
    tp = TopicPartition("spark-failover", 0)
    options = ReadOptions(
        bootstrap_servers=cluster.bootstrap,
        assign=(tp,),
        fail_on_data_loss=True,
        request_timeout_ms=60_000,
    )
    cluster.kill(leader)  # the task starts while the partition changes leader
    try:
        batches = list(read_ranges(options, [OffsetRange(tp, 0, COUNT)], [0]))
    finally:
        cluster.start_broker(leader)
    table = pa.Table.from_batches(batches)
    assert table.column("offset").to_pylist() == list(range(COUNT))
    assert [int(v) for v in table.column("value").to_pylist()] == list(range(COUNT))
