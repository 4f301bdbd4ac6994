"""Adding partitions from the client side: ``AdminClient.create_partitions``, the command
line ``tidelog topics alter NAME --partitions N`` (a subprocess), and producers and
group-less consumers that pick the new partitions up at their metadata refresh."""

from __future__ import annotations

import time

import pytest

from tests.client.conftest import TopicFactory
from tests.client.test_cli import assert_one_line_error, tidelog
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient, Consumer, Producer, TopicPartition
from tidelog.client.partitioner import partition_for_key
from tidelog.storage.errors import (
    InvalidPartitionsError,
    InvalidRequestError,
    InvalidTopicError,
    UnknownTopicOrPartitionError,
)

METADATA_MAX_AGE_MS = 100


def _wait_for(condition: object, what: str, timeout_s: float = 15.0) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_admin_grows_a_topic(admin: AdminClient, new_topic: TopicFactory) -> None:
    topic = new_topic(partitions=2)
    assert admin.create_partitions(topic, 5) == 5
    description = admin.describe_topic(topic)
    assert [p.partition for p in description.partitions] == [0, 1, 2, 3, 4]
    assert [t.partitions for t in admin.list_topics() if t.name == topic] == [5]


def test_admin_validate_only(admin: AdminClient, new_topic: TopicFactory) -> None:
    topic = new_topic(partitions=1)
    assert admin.create_partitions(topic, 3, validate_only=True) == 3
    assert len(admin.describe_topic(topic).partitions) == 1


def test_admin_errors_are_the_brokers_exceptions(
    admin: AdminClient, new_topic: TopicFactory
) -> None:
    topic = new_topic(partitions=3)
    with pytest.raises(UnknownTopicOrPartitionError, match="unknown topic"):
        admin.create_partitions(f"{topic}-missing", 4)
    with pytest.raises(InvalidPartitionsError, match="must be larger"):
        admin.create_partitions(topic, 3)
    with pytest.raises(InvalidPartitionsError, match="must be larger"):
        admin.create_partitions(topic, 2, validate_only=True)
    with pytest.raises(InvalidPartitionsError, match="at most"):
        admin.create_partitions(topic, 1_000_000)
    with pytest.raises(InvalidTopicError):
        admin.create_partitions("no spaces", 2)
    with pytest.raises(InvalidRequestError, match="internal topic"):
        admin.create_partitions("__consumer_offsets", 100)
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="total_count"):
            admin.create_partitions(topic, bad)  # type: ignore[arg-type]
    assert len(admin.describe_topic(topic).partitions) == 3


def test_cli_topics_alter_partitions(broker: InProcessBroker, admin: AdminClient) -> None:
    address = broker.address
    admin.create_topic("cli-grow", 2)
    grown = tidelog("topics", "alter", "cli-grow", "--partitions", "4", "--bootstrap", address)
    assert grown.returncode == 0, grown.stderr
    assert 'Topic "cli-grow" now has 4 partition(s).' in grown.stderr
    assert len(admin.describe_topic("cli-grow").partitions) == 4

    both = tidelog(
        "topics", "alter", "cli-grow", "--partitions", "5", "--set", "retention.ms=60000",
        "--bootstrap", address,
    )  # fmt: skip
    assert both.returncode == 0, both.stderr
    assert "now has 5 partition(s)" in both.stderr
    assert 'Updated topic "cli-grow".' in both.stderr
    description = admin.describe_topic("cli-grow")
    assert (len(description.partitions), description.config["retention.ms"]) == (5, "60000")

    listed = tidelog("topics", "list", "--bootstrap", address)
    assert ["cli-grow", "5"] in [line.split() for line in listed.stdout.splitlines()]

    not_larger = tidelog(
        "topics", "alter", "cli-grow", "--partitions", "3", "--set", "retention.ms=1",
        "--bootstrap", address,
    )  # fmt: skip
    assert_one_line_error(not_larger, 1, "[INVALID_PARTITIONS]")
    assert admin.describe_topic("cli-grow").config["retention.ms"] == "60000"  # untouched
    missing = tidelog("topics", "alter", "no-such", "--partitions", "3", "--bootstrap", address)
    assert_one_line_error(missing, 1, "[UNKNOWN_TOPIC_OR_PARTITION]")
    internal = tidelog(
        "topics", "alter", "__consumer_offsets", "--partitions", "99", "--bootstrap", address
    )
    assert_one_line_error(internal, 1, "internal topic")
    zero = tidelog("topics", "alter", "cli-grow", "--partitions", "0", "--bootstrap", address)
    assert zero.returncode == 2
    assert "must be at least 1" in zero.stderr
    nothing = tidelog("topics", "alter", "cli-grow", "--bootstrap", address)
    assert_one_line_error(nothing, 2, "give --partitions N")


def test_producer_sends_to_new_partitions_after_its_metadata_refresh(
    broker: InProcessBroker, admin: AdminClient, new_topic: TopicFactory
) -> None:
    topic = new_topic(partitions=2)
    keys = [b"key-%d" % i for i in range(40)]
    with Producer(
        broker.address,
        linger_ms=0,
        batch_size=1,  # keyless records move to another partition after every record
        metadata_max_age_ms=METADATA_MAX_AGE_MS,
    ) as producer:
        for key in keys:
            meta = producer.send(topic, value=b"before", key=key).result(timeout=10)
            assert meta.partition == partition_for_key(key, 2)
        assert admin.create_partitions(topic, 4) == 4

        # Records keep flowing; the sender refreshes once the metadata is older than
        # metadata_max_age_ms, and send() uses the new count from then on.
        def refreshed() -> bool:
            producer.send(topic, value=b"filler", key=keys[0]).result(timeout=10)
            return producer.partitions_for(topic) == {0, 1, 2, 3}

        _wait_for(refreshed, "the producer to learn about 4 partitions")

        keyed = [producer.send(topic, value=b"after", key=key) for key in keys]
        placed = {key: f.result(timeout=10).partition for key, f in zip(keys, keyed, strict=True)}
        assert placed == {key: partition_for_key(key, 4) for key in keys}
        assert {2, 3} <= set(placed.values())

        keyless = [producer.send(topic, value=b"sticky-%d" % i) for i in range(60)]
        sticky = {f.result(timeout=10).partition for f in keyless}
        assert {2, 3} <= sticky
    ends = {p.partition: p.log_end_offset for p in admin.describe_topic(topic).partitions}
    assert min(ends[2], ends[3]) > 0


def test_a_consumer_without_group_reads_new_partitions_of_its_subscription(
    broker: InProcessBroker, admin: AdminClient, new_topic: TopicFactory
) -> None:
    topic = new_topic(partitions=1)
    consumer = Consumer(
        broker.address,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        metadata_max_age_ms=METADATA_MAX_AGE_MS,
        fetch_max_wait_ms=50,
    )
    try:
        consumer.subscribe([topic])

        def assigned() -> bool:
            # A poll's own lookup may give up on a slow metadata answer (it logs it and
            # the next poll asks again): polled until the one partition is assigned.
            assert consumer.poll(timeout_ms=100) == []
            return consumer.assignment() == {TopicPartition(topic, 0)}

        _wait_for(assigned, "the topic's one partition assigned")
        admin.create_partitions(topic, 3)
        with Producer(broker.address, linger_ms=0) as producer:
            for partition in (0, 1, 2):
                producer.send(topic, value=b"p%d" % partition, partition=partition)
            producer.flush(timeout_ms=10_000)
        got: list[tuple[int, bytes | None]] = []

        def all_read() -> bool:
            got.extend((r.partition, r.value) for r in consumer.poll(timeout_ms=100))
            return len(got) >= 3

        _wait_for(all_read, "records of the new partitions")
        assert sorted(got) == [(0, b"p0"), (1, b"p1"), (2, b"p2")]
        assert consumer.assignment() == {TopicPartition(topic, p) for p in range(3)}
    finally:
        consumer.close(autocommit=False)
