"""The sink's pure parts: column checks and the canonical order. No Spark session."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from tidelog.client.keyed_producer import ProducerRecord
from tidelog.spark_sink.options import WriteOptions
from tidelog.spark_sink.writer import canonical_order, check_sink_schema

HEADERS = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)

records = st.builds(
    ProducerRecord,
    st.none() | st.binary(max_size=4),
    st.none() | st.binary(max_size=4),
    st.lists(
        st.tuples(st.sampled_from(["a", "b"]), st.none() | st.binary(max_size=2)), max_size=2
    ).map(tuple),
)


@given(st.lists(records, max_size=30), st.randoms())
def test_canonical_order_ignores_arrival_order(rows: list[ProducerRecord], random: object) -> None:
    shuffled = list(rows)
    random.shuffle(shuffled)  # type: ignore[attr-defined]
    assert canonical_order(shuffled) == canonical_order(rows)
    assert sorted(map(repr, canonical_order(rows))) == sorted(map(repr, rows))


def _schema(**columns: object) -> StructType:
    return StructType([StructField(name, kind) for name, kind in columns.items()])  # type: ignore[arg-type]


def test_sink_columns_are_checked() -> None:
    with_topic = WriteOptions(topic="t")
    check_sink_schema(
        _schema(key=StringType(), value=BinaryType(), partition=IntegerType(), headers=HEADERS),
        with_topic,
    )
    check_sink_schema(_schema(value=StringType(), topic=StringType()), WriteOptions())
    bad = [
        (_schema(key=StringType()), with_topic, "needs a value column"),
        (_schema(value=LongType()), with_topic, "value must be string or binary"),
        (_schema(value=StringType(), vale=StringType()), with_topic, "does not know"),
        (_schema(value=StringType(), partition=LongType()), with_topic, "partition must"),
        (_schema(value=StringType(), headers=ArrayType(StringType())), with_topic, "headers"),
        (_schema(value=StringType()), WriteOptions(), "topic option or"),
    ]
    for schema, options, message in bad:
        with pytest.raises(ValueError, match=message):
            check_sink_schema(schema, options)
