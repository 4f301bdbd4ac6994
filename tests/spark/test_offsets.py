"""The pure parts of the source: offset JSON, specs, admission control, range splitting,
and the options dataclasses. No Spark session."""

from __future__ import annotations

import json
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.client.types import TopicPartition
from tidelog.spark_sink.offsets import (
    OffsetRange,
    cap_offsets,
    from_json,
    offset_dict,
    parse_assign,
    parse_offset_spec,
    split_ranges,
    to_json,
)
from tidelog.spark_sink.options import ReadOptions, WriteOptions, epoch_of_batch

topics = st.sampled_from(["a", "b", "events", "t.1", "z-z"])
tps = st.builds(TopicPartition, topics, st.integers(0, 40))
offset_maps = st.dictionaries(tps, st.integers(0, 2**62))


@given(offset_maps)
def test_offsets_round_trip_through_json(offsets: dict[TopicPartition, int]) -> None:
    assert from_json(to_json(offsets)) == offsets
    # Spark serialises the dict with json.dumps: the same offsets give the same text.
    assert from_json(json.dumps(offset_dict(offsets))) == offsets


@given(offset_maps, st.randoms())
def test_key_order_is_fixed_whatever_the_insertion_order(
    offsets: dict[TopicPartition, int], random: object
) -> None:
    items = list(offsets.items())
    random.shuffle(items)  # type: ignore[attr-defined]
    assert json.dumps(offset_dict(dict(items))) == json.dumps(offset_dict(offsets))
    document = offset_dict(offsets)
    assert list(document) == sorted(document)
    for partitions in document.values():
        assert [int(p) for p in partitions] == sorted(int(p) for p in partitions)


def test_offset_specs() -> None:
    assert parse_offset_spec(" Earliest ", name="s").kind == "earliest"
    spec = parse_offset_spec('{"t":{"1":-2,"0":23}}', name="s")
    assert spec.as_dict() == {TopicPartition("t", 0): 23, TopicPartition("t", 1): -2}
    for bad in ['{"t":{"0":-3}}', '{"t":{"x":1}}', '{"t":{"0":1.5}}', "soon", '{"t":[1]}']:
        with pytest.raises(ValueError, match=r"^s"):
            parse_offset_spec(bad, name="s")
    with pytest.raises(ValueError, match="not allowed"):
        parse_offset_spec('{"t":{"0":-2}}', name="endingOffsets", allow_earliest_offset=False)
    assert parse_assign('{"b":[1],"a":[0,2]}') == (
        TopicPartition("a", 0),
        TopicPartition("a", 2),
        TopicPartition("b", 1),
    )


@given(
    st.dictionaries(tps, st.tuples(st.integers(0, 1000), st.integers(0, 1000)), min_size=1),
    st.integers(1, 3000),
)
def test_cap_offsets_admits_at_most_the_cap_fairly(
    bounds: dict[TopicPartition, tuple[int, int]], cap: int
) -> None:
    start = {tp: min(a, b) for tp, (a, b) in bounds.items()}
    latest = {tp: max(a, b) for tp, (a, b) in bounds.items()}
    end = cap_offsets(start, latest, cap)
    assert set(end) == set(latest)
    assert all(start[tp] <= end[tp] <= latest[tp] for tp in end)
    admitted = {tp: end[tp] - start[tp] for tp in end}
    backlog = {tp: latest[tp] - start[tp] for tp in end}
    assert sum(admitted.values()) == min(cap, sum(backlog.values()))
    # Max-min fair: a partition that got less than its backlog got at least as much as
    # anyone else (give or take the one record of an uneven division).
    for tp, got in admitted.items():
        if got < backlog[tp]:
            assert all(other <= got + 1 for other in admitted.values())
    assert cap_offsets(start, latest, cap) == end  # deterministic


@given(
    st.lists(st.tuples(st.integers(0, 500), st.integers(0, 500)), max_size=6),
    st.integers(1, 200),
    st.integers(0, 12),
)
def test_split_ranges_covers_every_offset_once(
    bounds: list[tuple[int, int]], max_records: int, min_partitions: int
) -> None:
    ranges = [
        OffsetRange(TopicPartition("t", i), min(a, b), max(a, b)) for i, (a, b) in enumerate(bounds)
    ]
    pieces = split_ranges(
        ranges, max_records_per_partition=max_records, min_partitions=min_partitions
    )
    want = sorted((r.tp.partition, o) for r in ranges for o in range(r.start, r.end))
    got = sorted((p.tp.partition, o) for p in pieces for o in range(p.start, p.end))
    assert got == want
    assert all(0 < p.size <= max_records for p in pieces)
    total = sum(r.size for r in ranges)
    assert len(pieces) >= min(min_partitions, total)


def test_read_options_are_validated_and_picklable() -> None:
    options = ReadOptions.from_mapping(
        {
            "Kafka.Bootstrap.Servers": "127.0.0.1:9",
            "subscribe": "a, b",
            "maxOffsetsPerTrigger": "10",
            "failOnDataLoss": "false",
            "path": "ignored",
        },
        streaming=True,
    )
    assert options.subscribe == ("a", "b")
    assert options.starting.kind == "latest"
    assert options.max_offsets_per_trigger == 10
    assert not options.fail_on_data_loss
    assert pickle.loads(pickle.dumps(options)) == options
    batch = ReadOptions.from_mapping({"assign": '{"a":[0]}'}, streaming=False)
    assert batch.starting.kind == "earliest"
    assert batch.bootstrap_servers == "127.0.0.1:7410"
    bad = [
        ({}, "exactly one"),
        ({"subscribe": "a", "assign": '{"a":[0]}'}, "exactly one"),
        ({"subscribe": "a", "maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger"),
        ({"subscribe": "a", "failOnDataLoss": "maybe"}, "failOnDataLoss"),
        ({"subscribe": "a", "endingOffsets": "latest"}, "batch reads only"),
        ({"subscribe": "a", "subscribePattren": "x"}, "unknown tidelog read option"),
        ({"subscribePattern": "("}, "regex"),
    ]
    for mapping, message in bad:
        with pytest.raises(ValueError, match=message):
            ReadOptions.from_mapping(mapping, streaming=True)


def test_write_options_and_batch_epochs() -> None:
    options = WriteOptions.from_mapping({"topic": "out", "acks": "-1", "writeOrder": "INPUT"})
    assert (options.topic, options.acks, options.write_order) == ("out", "all", "input")
    assert pickle.loads(pickle.dumps(options)) == options
    with pytest.raises(ValueError, match="acks"):
        WriteOptions.from_mapping({"acks": "0"})
    with pytest.raises(ValueError, match="unknown tidelog write option"):
        WriteOptions.from_mapping({"topics": "x"})
    assert epoch_of_batch(0) == (0, 0)
    assert epoch_of_batch(32766) == (0, 32766)
    assert epoch_of_batch(32767) == (1, 0)


def test_package_surface() -> None:
    import pyspark_tidelog
    from tidelog import spark_sink

    assert set(spark_sink.__all__) == {
        "DataLossError",
        "ReadOptions",
        "TidelogDataSource",
        "WriteOptions",
    }
    assert pyspark_tidelog.DefaultSource is spark_sink.TidelogDataSource
    assert spark_sink.TidelogDataSource.name() == "tidelog"
