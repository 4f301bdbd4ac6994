"""Review of the ``tidelog`` source and sink: edge cases found before release.

Most of these drive the executor and driver code directly (``read_ranges``, the stream
reader's planning calls, ``write_rows``) against the session's real broker, without a
Spark job: the cases are about what the code does at the edges, and a Spark job would only
add minutes. ``test_deleted_topic_under_a_running_query_is_skipped`` runs a real query.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.spark.conftest import TopicFactory, consume_all, produce
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient, TidelogError, TopicPartition, UnknownTopicOrPartitionError
from tidelog.client.keyed_producer import MAX_EPOCH
from tidelog.spark_sink.offsets import OffsetRange, cap_offsets, offset_dict, parse_offset_spec
from tidelog.spark_sink.options import ReadOptions, WriteOptions
from tidelog.spark_sink.reader import DataLossError, read_ranges

pytestmark = [
    pytest.mark.spark,
]


def _offsets_read(options: ReadOptions, offset_range: OffsetRange) -> list[int]:
    batches = read_ranges(options, [offset_range], [0])
    return [offset for batch in batches for offset in batch.column("offset").to_pylist()]


def _read_options(broker: InProcessBroker, topic: str, **kwargs: Any) -> ReadOptions:
    return ReadOptions(bootstrap_servers=broker.address, subscribe=(topic,), **kwargs)


# --- reading: ranges the log no longer holds ---------------------------------------------


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_range_above_the_log_end_never_returns_records_outside_it(
    broker: InProcessBroker, new_topic: TopicFactory, fail_on_data_loss: bool
) -> None:
    """A range planned before the topic was recreated with fewer records: the fetch is
    out of range *above* the end. The reader used to "skip ahead" to the log start (0)
    and return offsets 0..2, outside the range, with a message about offsets "10 to 0"
    being deleted."""
    topic = new_topic()
    produce(broker.address, topic, [b"a", b"b", b"c"])
    options = _read_options(broker, topic, fail_on_data_loss=fail_on_data_loss)
    offset_range = OffsetRange(TopicPartition(topic, 0), 10, 20)
    if fail_on_data_loss:
        with pytest.raises(DataLossError, match=r"ends at 3, before offsets 10 to 20"):
            _offsets_read(options, offset_range)
    else:
        assert _offsets_read(options, offset_range) == []


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_topic_deleted_under_a_task_is_data_loss_not_a_timeout(
    broker: InProcessBroker,
    admin: AdminClient,
    new_topic: TopicFactory,
    fail_on_data_loss: bool,
) -> None:
    """A deleted topic's fetches only ever retry (UNKNOWN_TOPIC_OR_PARTITION is
    retriable): the reader used to wait requestTimeoutMs and fail with a TimeoutError,
    whatever failOnDataLoss said."""
    topic = new_topic()
    produce(broker.address, topic, [b"a", b"b", b"c"])
    admin.delete_topic(topic)
    options = _read_options(
        broker, topic, fail_on_data_loss=fail_on_data_loss, request_timeout_ms=20_000
    )
    began = time.monotonic()
    if fail_on_data_loss:
        with pytest.raises(DataLossError, match="no longer exists"):
            _offsets_read(options, OffsetRange(TopicPartition(topic, 0), 0, 3))
    else:
        assert _offsets_read(options, OffsetRange(TopicPartition(topic, 0), 0, 3)) == []
    assert time.monotonic() - began < 10, "waited for the request timeout"


def test_a_broker_that_is_down_fails_reads_and_writes_within_the_timeout() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    from pyspark.sql import Row

    from tidelog.spark_sink.broker_view import BrokerView
    from tidelog.spark_sink.writer import write_rows

    read = ReadOptions(bootstrap_servers=address, subscribe=("t",), request_timeout_ms=1_500)
    write = WriteOptions(bootstrap_servers=address, topic="t", request_timeout_ms=1_500)
    calls: list[Callable[[], object]] = [
        lambda: _offsets_read(read, OffsetRange(TopicPartition("t", 0), 0, 3)),
        lambda: BrokerView(read).partitions(),
        lambda: write_rows(write, iter([Row(value="v")]), "down", 0, 0),
        lambda: write_rows(write, iter([Row(value="v", partition=0)]), "down", 0, 0),
    ]
    for call in calls:
        began = time.monotonic()
        with pytest.raises((TimeoutError, TidelogError)):
            call()
        assert time.monotonic() - began < 5


def test_deleted_topic_under_a_running_query_is_skipped(
    spark: Any,
    broker: InProcessBroker,
    admin: AdminClient,
    new_topic: TopicFactory,
    tmp_path: Path,
) -> None:
    """failOnDataLoss=false: a subscribed topic deleted while the query runs drops out
    of the offsets; the other topic goes on being read."""
    kept, doomed = new_topic(), new_topic()
    produce(broker.address, kept, [b"k%d" % i for i in range(3)])
    produce(broker.address, doomed, [b"d%d" % i for i in range(3)])
    out = tmp_path / "out"
    query = (
        spark.readStream.format("tidelog")
        .option("bootstrap.servers", broker.address)
        .option("subscribe", f"{kept},{doomed}")
        .option("startingOffsets", "earliest")
        .option("failOnDataLoss", "false")
        .option("requestTimeoutMs", "20000")
        .load()
        .select("topic", "offset")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        query.processAllAvailable()
        admin.delete_topic(doomed)
        produce(broker.address, kept, [b"k%d" % i for i in range(3, 5)])
        query.processAllAvailable()
        assert query.exception() is None
        last = query.lastProgress["sources"][0]["endOffset"]
    finally:
        query.stop()
    rows = sorted((r.topic, r.offset) for r in spark.read.parquet(str(out)).collect())
    assert rows == sorted([(kept, i) for i in range(5)] + [(doomed, i) for i in range(3)])
    assert doomed not in last


# --- admission control ---------------------------------------------------------------------


def test_a_cap_below_the_partition_count_serves_every_partition_in_turn() -> None:
    """10 partitions, a cap of 3 records per micro-batch, three hot partitions whose
    backlog keeps growing. The remainder of the division used to go to the same
    partitions every time (the last in backlog order: the hot ones), so the seven
    others were never read."""
    tps = [TopicPartition("t", p) for p in range(10)]
    start = dict.fromkeys(tps, 0)
    latest = dict.fromkeys(tps, 100)
    for _ in range(30):
        for hot in tps[7:]:
            latest[hot] += 1_000
        end = cap_offsets(start, latest, 3)
        assert sum(end[tp] - start[tp] for tp in tps) == 3
        start = end
    assert all(start[tp] > 0 for tp in tps), start


@given(
    st.lists(st.integers(1, 50), min_size=1, max_size=12),
    st.integers(1, 11),
)
def test_equal_backlogs_under_a_small_cap_are_served_evenly(backlogs: list[int], cap: int) -> None:
    tps = [TopicPartition("t", p) for p in range(len(backlogs))]
    start = dict.fromkeys(tps, 0)
    latest = {tp: 1_000 * n for tp, n in zip(tps, backlogs, strict=True)}
    for _ in range(len(tps)):
        end = cap_offsets(start, latest, cap)
        assert sum(end[tp] - start[tp] for tp in tps) == cap
        start = end
    # After as many batches as partitions, every partition was served.
    assert all(start[tp] > 0 for tp in tps)


def test_a_new_partition_is_capped_from_its_log_start(
    broker: InProcessBroker, admin: AdminClient, tmp_path: Path
) -> None:
    """A topic that appears under subscribePattern after the query started, whose log
    start retention already moved: the cap used to count its backlog from 0, admitting
    offsets that no longer exist (micro-batches that read nothing)."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from tidelog.spark_sink.source import TidelogInputPartition, TidelogStreamReader

    prefix = f"review-cap-{time.monotonic_ns()}"
    options = ReadOptions(
        bootstrap_servers=broker.address,
        subscribe_pattern=f"{prefix}-.*",
        max_offsets_per_trigger=5,
    )
    reader = TidelogStreamReader(options)
    try:
        start = reader.initialOffset()
        assert start == {}
        topic = f"{prefix}-a"
        admin.create_topic(topic, 1, {"segment.bytes": "1024"})
        for _ in range(4):  # one batch, so one segment, each
            produce(broker.address, topic, [b"y" * 100 for _ in range(10)])
        admin.alter_topic_config(topic, {"retention.bytes": "1"})
        deadline = time.monotonic() + 30
        while (log_start := admin.describe_topic(topic).partitions[0].log_start_offset) < 10:
            assert time.monotonic() < deadline, "retention did not run"
            time.sleep(0.1)
        end = reader.latestOffset(start, ReadMaxRows(5))
        assert end == offset_dict({TopicPartition(topic, 0): log_start + 5})
        (piece,) = reader.partitions(start, end)
        assert isinstance(piece, TidelogInputPartition)
        assert _offsets_read(options, piece.offset_range) == list(range(log_start, log_start + 5))
    finally:
        reader.stop()


# --- writing ----------------------------------------------------------------------------------


def test_a_header_with_a_null_key_is_refused(
    broker: InProcessBroker, new_topic: TopicFactory
) -> None:
    """It used to be written as a header named "None"."""
    from pyspark.sql import Row

    from tidelog.spark_sink.writer import write_rows

    topic = new_topic()
    options = WriteOptions(bootstrap_servers=broker.address, topic=topic)
    rows = [Row(value="v", headers=[Row(key=None, value=b"x")])]
    with pytest.raises(ValueError, match="header with a null key"):
        write_rows(options, iter(rows), f"review-{topic}", 0, 0)
    assert consume_all(broker.address, topic) == []


def test_a_partition_out_of_range_writes_nothing_and_a_retry_works(
    broker: InProcessBroker, new_topic: TopicFactory
) -> None:
    from pyspark.sql import Row

    from tidelog.spark_sink.writer import write_rows

    topic = new_topic(partitions=2)
    options = WriteOptions(bootstrap_servers=broker.address, topic=topic)
    bad = [Row(value="a", partition=0), Row(value="b", partition=2)]
    with pytest.raises(UnknownTopicOrPartitionError, match="no partition 2"):
        write_rows(options, iter(bad), f"review-{topic}", 0, 0)
    with pytest.raises(UnknownTopicOrPartitionError):
        write_rows(options, iter([Row(value="c", partition=-1)]), f"review-{topic}", 0, 0)
    assert consume_all(broker.address, topic, 2) == []
    good = [Row(value="a", partition=0), Row(value="b", partition=1)]
    message = write_rows(options, iter(good), f"review-{topic}", 0, 0)
    assert (message.written, message.skipped) == (2, 0)
    missing = WriteOptions(bootstrap_servers=broker.address, topic=f"{topic}-missing")
    with pytest.raises(UnknownTopicOrPartitionError, match="unknown topic"):
        write_rows(missing, iter([Row(value="a")]), f"review-{topic}-m", 0, 0)


def test_the_stream_identity_rolls_over_to_a_new_key_at_batch_32767() -> None:
    from tidelog.spark_sink.writer import stream_identity

    assert stream_identity("spark", "q", 0, 3) == ("spark:q:0:3", 0)
    assert stream_identity("spark", "q", 32766, 3) == ("spark:q:0:3", 32766)
    assert stream_identity("spark", "q", 32767, 3) == ("spark:q:1:3", 0)
    assert stream_identity("spark", "q", 65535, 0) == ("spark:q:2:0", 1)
    # Within one key, consecutive batches have increasing epochs the producer accepts.
    for batch_id in (32765, 32766, 32767, 32768, 10**9):
        key, epoch = stream_identity("p", "q", batch_id, 0)
        before_key, before_epoch = stream_identity("p", "q", batch_id - 1, 0)
        assert 0 <= epoch <= MAX_EPOCH
        assert (key == before_key and epoch == before_epoch + 1) or (
            key != before_key and epoch == 0
        )


# --- options and planning ----------------------------------------------------------------


def test_include_headers_spelled_as_the_options_accept_it_gives_the_headers_column() -> None:
    """ReadOptions takes true/1/yes; the schema used to know only "true", so Spark got
    seven columns and the reader sent eight."""
    from tidelog.spark_sink.source import TidelogDataSource

    for spelling in ("true", " TRUE ", "1", "yes"):
        source = TidelogDataSource({"subscribe": "t", "IncludeHeaders": spelling})
        assert source.schema().fieldNames()[-1] == "headers", spelling
    assert "headers" not in TidelogDataSource({"subscribe": "t"}).schema().fieldNames()
    with pytest.raises(ValueError, match="includeHeaders"):
        TidelogDataSource({"subscribe": "t", "includeHeaders": "perhaps"}).schema()


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_an_assigned_topic_deleted_under_a_query_follows_fail_on_data_loss(
    broker: InProcessBroker, admin: AdminClient, new_topic: TopicFactory, fail_on_data_loss: bool
) -> None:
    """With assign, a deleted topic used to raise UnknownTopicOrPartitionError from
    latestOffset whatever failOnDataLoss said."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from tidelog.spark_sink.source import TidelogStreamReader

    topic = new_topic()
    produce(broker.address, topic, [b"a"])
    options = ReadOptions(
        bootstrap_servers=broker.address,
        assign=(TopicPartition(topic, 0),),
        starting=parse_offset_spec("earliest", name="startingOffsets"),
        fail_on_data_loss=fail_on_data_loss,
    )
    reader = TidelogStreamReader(options)
    try:
        start = reader.initialOffset()
        assert start == offset_dict({TopicPartition(topic, 0): 0})
        admin.delete_topic(topic)
        if fail_on_data_loss:
            with pytest.raises(DataLossError, match="no longer exists"):
                reader.latestOffset(start, ReadAllAvailable())
        else:
            assert reader.latestOffset(start, ReadAllAvailable()) == {}
    finally:
        reader.stop()
    # A fresh query on an assigned partition that does not exist is still refused.
    with pytest.raises(UnknownTopicOrPartitionError):
        TidelogStreamReader(options).initialOffset()


def test_offsets_json_for_partitions_the_query_does_not_read_is_refused(
    broker: InProcessBroker, new_topic: TopicFactory
) -> None:
    from tidelog.spark_sink.source import TidelogBatchReader

    topic = new_topic()
    produce(broker.address, topic, [b"a", b"b"])
    for name in ("startingOffsets", "endingOffsets"):
        for spec in (f'{{"{topic}":{{"1":0}}}}', '{"no-such-topic":{"0":0}}'):
            options = ReadOptions.from_mapping(
                {"bootstrap.servers": broker.address, "subscribe": topic, name: spec},
                streaming=False,
            )
            with pytest.raises(ValueError, match="partitions the query does not read"):
                TidelogBatchReader(options).partitions()
    # startingTimestamp after every record: nothing to read, no error, no wait.
    future = ReadOptions.from_mapping(
        {
            "bootstrap.servers": broker.address,
            "subscribe": topic,
            "startingTimestamp": str(int(time.time() * 1000) + 3_600_000),
        },
        streaming=False,
    )
    assert TidelogBatchReader(future).partitions() == []


def test_a_later_micro_batch_failing_and_rerun_writes_each_record_once(
    spark: Any, broker: InProcessBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    """The proof in test_write.py fails batch 0 (epoch 0); here batch 2 of a capped
    stream fails, so the re-run writes with epoch 2 after epochs 0 and 1 under the same
    producer keys, and batch 3 follows it."""
    from pyspark.sql import functions as f
    from pyspark.sql.types import BinaryType

    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    produce(broker.address, source, [b"a%02d" % i for i in range(40)], partition=0)
    produce(broker.address, source, [b"b%02d" % i for i in range(40)], partition=1)
    marker = tmp_path / "failed-once"

    def fail_once(value):  # type: ignore[no-untyped-def]  # hints would make it a pandas UDF
        if value == b"b25" and not marker.exists():  # batch 2 reads offsets 20..29
            marker.write_text("failed")
            raise RuntimeError("injected failure in batch 2")
        return value

    fail_udf = f.udf(fail_once, BinaryType())

    def start() -> Any:
        return (
            spark.readStream.format("tidelog")
            .option("bootstrap.servers", broker.address)
            .option("subscribe", source)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "20")
            .load()
            .select(f.col("key"), fail_udf(f.col("value")).alias("value"))
            .writeStream.format("tidelog")
            .option("bootstrap.servers", broker.address)
            .option("topic", sink)
            .option("maxBatchRecords", "3")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .start()
        )

    query = start()
    with pytest.raises(Exception, match="injected failure"):
        query.processAllAvailable()
    query.stop()
    query = start()
    try:
        query.processAllAvailable()
        batches = [p["batchId"] for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()
    assert batches == [2, 3]
    values = sorted(r.value for r in consume_all(broker.address, sink, 2))
    assert values == sorted([b"a%02d" % i for i in range(40)] + [b"b%02d" % i for i in range(40)])


def test_available_now_stops_at_the_end_recorded_at_start_while_producers_write(
    broker: InProcessBroker, new_topic: TopicFactory
) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from tidelog.spark_sink.source import TidelogInputPartition, TidelogStreamReader

    topic = new_topic(partitions=2)
    produce(broker.address, topic, [b"a%d" % i for i in range(30)], partition=0)
    options = ReadOptions.from_mapping(
        {"bootstrap.servers": broker.address, "subscribe": topic, "startingOffsets": "earliest"},
        streaming=True,
    )
    reader = TidelogStreamReader(options)
    try:
        start = reader.initialOffset()
        reader.prepareForTriggerAvailableNow()
        produce(broker.address, topic, [b"late%d" % i for i in range(20)], partition=0)
        produce(broker.address, topic, [b"late%d" % i for i in range(5)], partition=1)
        end = reader.latestOffset(start, ReadAllAvailable())
        want = offset_dict({TopicPartition(topic, 0): 30, TopicPartition(topic, 1): 0})
        assert end == want
        assert reader.latestOffset(end, ReadAllAvailable()) == end  # so the query stops
        read = []
        for piece in reader.partitions(start, end):
            assert isinstance(piece, TidelogInputPartition)
            read += _offsets_read(options, piece.offset_range)
        assert read == list(range(30))
    finally:
        reader.stop()
