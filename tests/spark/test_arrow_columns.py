"""The reader's Arrow path: columns decoded in C give the batches records would give.

``columns_to_arrow`` over either column builder against ``records_to_arrow`` over the
same records (hypothesis, no broker), and ``read_ranges`` against the records a consumer
reads (the session's broker, no Spark job).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.spark.conftest import TopicFactory, produce
from tidelog.broker.testing import InProcessBroker
from tidelog.client import Consumer, TopicPartition
from tidelog.client.columns import NATIVE_COLUMNS, finish_columns, new_column_builder
from tidelog.client.types import ConsumerRecord
from tidelog.spark_sink.offsets import OffsetRange
from tidelog.spark_sink.options import ReadOptions
from tidelog.spark_sink.reader import read_ranges
from tidelog.spark_sink.schema import columns_to_arrow, records_to_arrow
from tidelog.storage.columns import decode_batch_into
from tidelog.storage.records import BatchBuilder, Compression, decode_batch_as

pytestmark = [pytest.mark.spark]

T0 = 1_700_000_000_000
records = st.lists(
    st.tuples(
        st.integers(0, 2**40),
        st.none() | st.binary(max_size=20),
        st.none() | st.binary(max_size=50),
        st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=5)), max_size=3),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records,
    st.sampled_from([Compression.NONE, Compression.LZ4]),
    st.booleans(),
    st.integers(0, 5),
)
def test_columns_give_the_arrow_batch_records_give(
    specs: list[Any], compression: Compression, include_headers: bool, skip: int
) -> None:
    builder = BatchBuilder(compression=compression, base_offset=40)
    for timestamp, key, value, headers in specs:
        builder.append(timestamp, key, value, headers)
    batch = builder.build()
    _, decoded = decode_batch_as(batch, 0, ConsumerRecord, ("t", 3), times=(None, None))
    expected = records_to_arrow(decoded[skip:], 1, include_headers)
    for pure in (False, True) if NATIVE_COLUMNS else (True,):
        columns = new_column_builder(include_headers, pure=pure)
        decode_batch_into(columns, batch, min_offset=40 + skip)
        arrow = columns_to_arrow(finish_columns(columns), "t", 3, 1, include_headers)
        arrow.validate(full=True)
        assert arrow.equals(expected)
        assert arrow.schema == expected.schema


_MS = st.none() | st.integers(0, 2**42)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(records, _MS, _MS), min_size=1, max_size=4), st.booleans())
def test_time_columns_from_batch_times_match_the_records(
    batches: list[Any], use_corrected: bool
) -> None:
    builder = new_column_builder(False)
    decoded: list[ConsumerRecord] = []
    batch_times: list[tuple[int, int | None, int | None]] = []
    offset = 0
    for specs, sent, received in batches:
        batch_builder = BatchBuilder(base_offset=offset)
        for timestamp, key, value, _ in specs:
            batch_builder.append(timestamp, key, value)
        batch = batch_builder.build()
        offset += len(specs)
        _, rows = decode_batch_as(batch, 0, ConsumerRecord, ("t", 3), times=(sent, received))
        decoded += rows
        before = builder.rows
        decode_batch_into(builder, batch)
        batch_times.append((builder.rows - before, sent, received))
    expected = records_to_arrow(decoded, 0, False, use_corrected)
    arrow = columns_to_arrow(finish_columns(builder), "t", 3, 0, False, batch_times, use_corrected)
    assert arrow.equals(expected)
    corrected = arrow.column("correctedTimestamp").to_pylist()
    timestamps = arrow.column("timestamp").to_pylist()
    assert (corrected == timestamps) == (
        use_corrected or all(r.corrected_timestamp_ms == r.timestamp_ms for r in decoded)
    )


def test_an_empty_builder_gives_an_empty_batch() -> None:
    for include_headers in (False, True):
        empty = finish_columns(new_column_builder(include_headers))
        arrow = columns_to_arrow(empty, "t", 0, 0, include_headers)
        assert arrow.num_rows == 0
        assert arrow.equals(records_to_arrow([], 0, include_headers))


def test_timestamps_past_what_microseconds_hold_are_refused_not_wrapped() -> None:
    builder = BatchBuilder()
    builder.append(2**62, None, b"v")
    columns = new_column_builder(False)
    decode_batch_into(columns, builder.build())
    with pytest.raises(pa.ArrowInvalid):
        columns_to_arrow(finish_columns(columns), "t", 0, 0, False)


@pytest.mark.parametrize(("include_headers", "use_corrected"), [(False, False), (True, True)])
def test_read_ranges_returns_the_records_of_the_range(
    broker: InProcessBroker, new_topic: TopicFactory, include_headers: bool, use_corrected: bool
) -> None:
    topic = new_topic()
    values = [b"value-%d" % i for i in range(300)]
    produce(broker.address, topic, values[:120], headers=[("h", b"x"), ("n", None)])
    produce(broker.address, topic, values[120:], keys=[b"k"] * 180)
    tp = TopicPartition(topic, 0)
    with Consumer(broker.address, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        everything: list[ConsumerRecord] = []
        while len(everything) < 300:
            everything += consumer.poll(timeout_ms=1_000)
    assert all(r.received_timestamp_ms is not None for r in everything)
    options = ReadOptions(
        bootstrap_servers=broker.address,
        subscribe=(topic,),
        include_headers=include_headers,
        use_corrected_timestamp=use_corrected,
    )
    # Starts and ends inside batches (the producer sends each record alone here, but
    # the fetch hands back many batches per answer).
    batches = list(read_ranges(options, [OffsetRange(tp, 7, 251)], [0]))
    assert batches
    table = pa.Table.from_batches(batches)
    expected = records_to_arrow(everything[7:251], 0, include_headers, use_corrected)
    assert table.equals(pa.Table.from_batches([expected]))


@pytest.mark.skipif(not NATIVE_COLUMNS, reason="the column path needs the C extension")
def test_reading_never_imports_pandas(broker: InProcessBroker, new_topic: TopicFactory) -> None:
    """``pa.array`` of a list and ``pa.scalar`` import pandas (when installed): a second or
    more of a fresh Spark Python worker's first task. The column path uses neither."""
    topic = new_topic()
    produce(broker.address, topic, [b"v%d" % i for i in range(50)], headers=[("h", b"x")])
    script = (
        "import sys\n"
        "from client import TopicPartition\n"
        "from spark_sink.offsets import OffsetRange\n"
        "from spark_sink.options import ReadOptions\n"
        "from spark_sink.reader import read_ranges\n"
        f"options = ReadOptions(bootstrap_servers={broker.address!r}, subscribe=({topic!r},),"
        " include_headers=True)\n"
        f"ranges = [OffsetRange(TopicPartition({topic!r}, 0), 0, 50)]\n"
        "rows = sum(b.num_rows for b in read_ranges(options, ranges, [0]))\n"
        "print(rows, 'pandas' in sys.modules)\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.split() == ["50", "False"], done.stderr
