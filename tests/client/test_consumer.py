"""The consumer against a real in-process broker."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.client.conftest import TopicFactory
from tidelog.broker.testing import InProcessBroker
from tidelog.client import (
    AdminClient,
    Consumer,
    OffsetAndTimestamp,
    OffsetOutOfRangeError,
    Producer,
    TopicPartition,
)
from tidelog.client.columns import finish_columns, new_column_builder
from tidelog.client.types import ConsumerRecord


def produce(address: str, topic: str, count: int, *, start: int = 0, **settings: object) -> None:
    with Producer(address, linger_ms=1, **settings) as producer:
        for i in range(start, start + count):
            producer.send(topic, value=b"value-%d" % i, key=b"key-%d" % i, timestamp_ms=1_000 + i)
        producer.flush(timeout_ms=10_000)


def poll_until(
    consumer: Consumer, count: int, timeout_s: float = 10, max_records: int | None = None
) -> list[ConsumerRecord]:
    records: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout_s
    while len(records) < count and time.monotonic() < deadline:
        records += consumer.poll(timeout_ms=100, max_records=max_records)
    return records


def poll_until_error(consumer: Consumer, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        consumer.poll(timeout_ms=100)


def values(records: list[ConsumerRecord]) -> list[bytes | None]:
    return [r.value for r in records]


def consumer_for(broker: InProcessBroker, **settings: object) -> Consumer:
    settings.setdefault("fetch_max_wait_ms", 100)
    return Consumer(broker.address, **settings)


def test_replay_from_offset_zero(broker: InProcessBroker, topic: str) -> None:
    produce(broker.address, topic, 1_000)
    with consumer_for(broker) as consumer:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        records = poll_until(consumer, 1_000)
        assert [r.offset for r in records] == list(range(1_000))
        seventh = records[7]
        assert seventh[:7] == (topic, 0, 7, 1_007, b"key-7", b"value-7", ())
        # This producer stamps its send time; the broker its receive time.
        assert seventh.sent_timestamp_ms is not None
        assert seventh.received_timestamp_ms is not None
        assert seventh.corrected_timestamp_ms == (
            1_007 + seventh.received_timestamp_ms - seventh.sent_timestamp_ms
        )
        assert consumer.position(tp) == 1_000
        assert consumer.highwater(tp) == 1_000
        assert consumer.assignment() == {tp}


def test_poll_columns_reads_what_poll_reads(broker: InProcessBroker, topic: str) -> None:
    produce(broker.address, topic, 1_000, compression="lz4")
    tp = TopicPartition(topic, 0)
    with consumer_for(broker) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 3)
        expected = poll_until(consumer, 997)
    builder = new_column_builder(False)
    with consumer_for(broker, max_poll_records=100) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 3)
        deadline = time.monotonic() + 10
        while builder.rows < 997 and time.monotonic() < deadline:
            before = builder.rows
            assert consumer.poll_columns(builder, timeout_ms=100) == builder.rows - before
        assert consumer.position(tp) == 1_000
        assert consumer.poll_columns(builder, timeout_ms=0) == 0
        with pytest.raises(ValueError, match="max_records"):
            consumer.poll_columns(builder, max_records=0)
    columns = finish_columns(builder)
    assert list(memoryview(columns.offsets).cast("q")) == [r.offset for r in expected]
    assert list(memoryview(columns.timestamps).cast("q")) == [r.timestamp_ms for r in expected]
    assert columns.value_data == b"".join(values(expected))  # type: ignore[arg-type]
    assert columns.key_data == b"".join(r.key or b"" for r in expected)


def test_max_records_and_max_poll_records(broker: InProcessBroker, topic: str) -> None:
    produce(broker.address, topic, 50)
    with consumer_for(broker, auto_offset_reset="earliest", max_poll_records=20) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        first = poll_until(consumer, 1)
        assert len(first) == 20
        assert len(consumer.poll(timeout_ms=1_000, max_records=7)) == 7


def test_subscribe_reads_every_partition(broker: InProcessBroker, new_topic: TopicFactory) -> None:
    topic = new_topic(partitions=3)
    produce(broker.address, topic, 300)
    with consumer_for(broker, auto_offset_reset="earliest") as consumer:
        consumer.subscribe([topic])
        assert consumer.subscription() == {topic}
        records = poll_until(consumer, 300)
        assert consumer.assignment() == {TopicPartition(topic, p) for p in range(3)}
    assert sorted(values(records)) == sorted(b"value-%d" % i for i in range(300))
    for partition in range(3):
        offsets = [r.offset for r in records if r.partition == partition]
        assert offsets == list(range(len(offsets)))


def test_iteration_stops_after_consumer_timeout(broker: InProcessBroker, topic: str) -> None:
    produce(broker.address, topic, 30)
    with consumer_for(broker, auto_offset_reset="earliest", consumer_timeout_ms=300) as consumer:
        consumer.subscribe(topic)
        started = time.monotonic()
        records = list(consumer)
    assert [r.offset for r in records] == list(range(30))
    assert time.monotonic() - started < 5


def test_seek_position_and_seek_to_end(broker: InProcessBroker, topic: str) -> None:
    produce(broker.address, topic, 100)
    tp = TopicPartition(topic, 0)
    with consumer_for(broker, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        poll_until(consumer, 10)
        consumer.seek(tp, 42)
        assert consumer.position(tp) == 42
        assert poll_until(consumer, 1)[0].offset == 42
        consumer.seek_to_end(tp)
        assert consumer.position(tp) == 100
        assert consumer.poll(timeout_ms=200) == []
        produce(broker.address, topic, 1, start=100)
        assert [r.offset for r in poll_until(consumer, 1)] == [100]
        consumer.seek_to_beginning()
        assert consumer.position(tp) == 0
        with pytest.raises(KeyError, match="not assigned"):
            consumer.position(TopicPartition(topic, 9))
        with pytest.raises(ValueError, match="offset"):
            consumer.seek(tp, -1)


def test_auto_offset_reset_latest_reads_only_new_records(
    broker: InProcessBroker, topic: str
) -> None:
    produce(broker.address, topic, 10)
    with consumer_for(broker) as consumer:  # latest is the default, as Kafka's
        consumer.assign([TopicPartition(topic, 0)])
        assert consumer.poll(timeout_ms=200) == []
        produce(broker.address, topic, 5, start=10)
        assert [r.offset for r in poll_until(consumer, 5)] == [10, 11, 12, 13, 14]


def test_auto_offset_reset_none_raises(broker: InProcessBroker, topic: str) -> None:
    produce(broker.address, topic, 5)
    tp = TopicPartition(topic, 0)
    with consumer_for(broker, auto_offset_reset="none") as consumer:
        consumer.assign([tp])
        with pytest.raises(OffsetOutOfRangeError, match="auto_offset_reset"):
            consumer.poll(timeout_ms=200)
        consumer.seek(tp, 50)  # past the end
        with pytest.raises(OffsetOutOfRangeError):
            poll_until_error(consumer)
        consumer.seek(tp, 3)
        assert [r.offset for r in poll_until(consumer, 2)] == [3, 4]


def test_out_of_range_resets_by_policy(broker: InProcessBroker, topic: str) -> None:
    produce(broker.address, topic, 5)
    tp = TopicPartition(topic, 0)
    with consumer_for(broker, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 500)
        assert [r.offset for r in poll_until(consumer, 5)] == [0, 1, 2, 3, 4]


def test_offsets_for_times_and_beginning_end_offsets(broker: InProcessBroker, topic: str) -> None:
    produce(broker.address, topic, 20)  # timestamps 1000..1019
    tp = TopicPartition(topic, 0)
    with consumer_for(broker) as consumer:
        assert consumer.offsets_for_times({tp: 1_005}) == {tp: OffsetAndTimestamp(5, 1_005)}
        assert consumer.offsets_for_times({tp: 9_999_999}) == {tp: None}
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: 20}
        assert consumer.partitions_for_topic(topic) == {0}
        consumer.assign([tp])
        found = consumer.offsets_for_times({tp: 1_010})[tp]
        assert found is not None
        consumer.seek(tp, found.offset)
        assert poll_until(consumer, 1)[0].timestamp_ms == 1_010


def test_compaction_gaps_and_replay_rebuild_the_latest_state() -> None:
    settings = {"log.cleaner.backoff.ms": 50}
    with InProcessBroker(settings=settings) as broker:
        with AdminClient(broker.address) as admin:
            admin.create_topic(
                "compacted",
                1,
                {
                    "cleanup.policy": "compact",
                    "segment.bytes": 600,
                    "min.cleanable.dirty.ratio": 0.01,
                    "min.compaction.lag.ms": 0,
                },
            )
        latest: dict[bytes, bytes] = {}
        with Producer(broker.address, linger_ms=0) as producer:
            for i in range(60):
                key, value = b"k%d" % (i % 5), b"v%d" % i
                producer.send("compacted", value=value, key=key).result(timeout=10)
                latest[key] = value
        tp = TopicPartition("compacted", 0)
        with consumer_for(broker, auto_offset_reset="earliest") as consumer:
            consumer.assign([tp])
            deadline = time.monotonic() + 20
            while True:  # until the cleaner has removed something
                consumer.seek_to_beginning(tp)
                records = []
                while consumer.position(tp) < 60:
                    records += consumer.poll(timeout_ms=100)
                if len(records) < 60 or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            offsets = [r.offset for r in records]
            assert len(records) < 60, "the cleaner never ran"
            assert offsets == sorted(set(offsets))
            assert {r.key: r.value for r in records} == latest  # replay rebuilds the state
            gap = next(o for o in range(60) if o not in offsets)
            consumer.seek(tp, gap)  # an offset compaction removed: the next survivor
            first = poll_until(consumer, 1)[0]
            # The cleaner may have removed more since: never an earlier offset, though.
            assert first.offset >= min(o for o in offsets if o > gap)


def test_records_before_the_fetch_offset_in_a_batch_are_skipped(
    broker: InProcessBroker, topic: str
) -> None:
    with Producer(broker.address, linger_ms=50) as producer:
        futures = [producer.send(topic, value=b"%d" % i) for i in range(10)]
        producer.flush(timeout_ms=10_000)
    assert len({f.result(0).offset for f in futures}) == 10
    tp = TopicPartition(topic, 0)
    with consumer_for(broker) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 6)  # the broker answers the whole batch, from offset 0
        assert [r.offset for r in poll_until(consumer, 4)] == [6, 7, 8, 9]


def test_consumers_read_while_producers_write(
    broker: InProcessBroker, new_topic: TopicFactory
) -> None:
    topic = new_topic(partitions=2)
    total = 4_000
    stop = threading.Event()

    def write() -> None:
        with Producer(broker.address, linger_ms=1, batch_size=2_048) as producer:
            for i in range(total):
                producer.send(topic, value=b"%d" % i, key=b"%d" % (i % 7))
                if i % 500 == 0:
                    time.sleep(0.01)  # let the consumers catch up now and then

    readers: list[list[ConsumerRecord]] = [[], []]

    def read(index: int) -> None:
        with consumer_for(broker, auto_offset_reset="earliest") as consumer:
            consumer.subscribe([topic])
            while len(readers[index]) < total and not stop.is_set():
                readers[index] += consumer.poll(timeout_ms=100)

    threads = [threading.Thread(target=read, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    write()
    for thread in threads:
        thread.join(20)
    stop.set()
    for records in readers:
        assert sorted(int(v or b"") for v in values(records)) == list(range(total))


def test_the_next_fetch_is_in_flight_while_the_application_works(
    broker: InProcessBroker, topic: str
) -> None:
    produce(broker.address, topic, 5_000)
    with consumer_for(
        broker, auto_offset_reset="earliest", max_partition_fetch_bytes=4_096
    ) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        first = poll_until(consumer, 1)
        assert first
        # The answer we are handing out was followed at once by the next fetch, or its
        # answer is already queued: either way nothing waits for the application.
        time.sleep(0.05)
        state = consumer._subscriptions.partitions[TopicPartition(topic, 0)]
        assert state.fetch_position is not None
        assert state.fetch_position > first[-1].offset + 1


def test_commit_and_committed(broker: InProcessBroker, topic: str) -> None:
    produce(broker.address, topic, 10)
    tp = TopicPartition(topic, 0)
    with consumer_for(
        broker, group_id="g1", auto_offset_reset="earliest", enable_auto_commit=False
    ) as consumer:
        consumer.assign([tp])
        poll_until(consumer, 10)
        assert consumer.committed(tp) is None
        consumer.commit()
        assert consumer.committed(tp) == 10
        consumer.commit({tp: 4})
        assert consumer.committed(tp) == 4
    with consumer_for(broker, group_id="g1") as again:
        again.assign([tp])
        assert again.position(tp) == 4  # the committed offset wins over the reset policy


def test_auto_commit_on_close_and_resume_from_the_committed_offset(
    broker: InProcessBroker, topic: str
) -> None:
    produce(broker.address, topic, 8)
    tp = TopicPartition(topic, 0)
    with consumer_for(broker, group_id="g2", auto_offset_reset="earliest") as consumer:
        consumer.subscribe([topic])
        assert len(poll_until(consumer, 5, max_records=5)) == 5
    with consumer_for(broker, group_id="g2", enable_auto_commit=False) as again:
        assert again.committed(tp) == 5
        again.subscribe([topic])
        assert [r.offset for r in poll_until(again, 3)] == [5, 6, 7]
    with consumer_for(broker) as plain, pytest.raises(ValueError, match="group_id"):
        plain.commit()


def test_poll_returns_nothing_when_the_broker_is_down_and_recovers(tmp_path: Path) -> None:
    with InProcessBroker(tmp_path) as doomed:
        address, port = doomed.address, doomed.port
        with AdminClient(address) as admin:
            admin.create_topic("t", 1)
        produce(address, "t", 3)
        consumer = Consumer(address, auto_offset_reset="earliest", fetch_max_wait_ms=100)
        consumer.assign([TopicPartition("t", 0)])
        assert len(poll_until(consumer, 3)) == 3
    started = time.monotonic()
    assert consumer.poll(timeout_ms=300) == []  # down: nothing, and no hang
    assert time.monotonic() - started < 3
    with InProcessBroker(tmp_path, port=port):
        produce(address, "t", 2, start=3)
        assert [r.offset for r in poll_until(consumer, 2)] == [3, 4]
    consumer.close()


def test_a_subscription_whose_first_lookup_failed_reads_once_the_broker_is_up(
    tmp_path: Path,
) -> None:
    """The partition lookup of a subscription is retried within a poll or two after a
    failure (a broker not yet up), not a whole ``metadata_max_age_ms`` later."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"127.0.0.1:{port}"
    with Consumer(address, auto_offset_reset="earliest", request_timeout_ms=1_000) as consumer:
        consumer.subscribe(["late"])
        assert consumer.poll(timeout_ms=300) == []  # the lookup fails: no broker yet
        with InProcessBroker(tmp_path / "data", port=port) as broker:
            with AdminClient(broker.address) as admin:
                admin.create_topic("late", 1)
            with Producer(broker.address) as producer:
                producer.send("late", b"hello").result(timeout=10)
            records: list[ConsumerRecord] = []
            deadline = time.monotonic() + 15
            while not records and time.monotonic() < deadline:
                records = consumer.poll(timeout_ms=200)
    assert [r.value for r in records] == [b"hello"]
