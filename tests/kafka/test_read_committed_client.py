"""Tidelog's own consumer, its command line and its AdminClient at both isolation levels,
over transactional data that confluent-kafka's transactional producer writes through the
Kafka listener of a real single node (issue #28, step 7b): commit, abort, two producers'
transactions interleaved on one partition, an open transaction holding the last stable
offset back. read_committed hands out exactly the committed records, in offset order, and
stops at the last stable offset; read_uncommitted hands out both kinds of data records;
neither ever hands out a control record (the markers' offsets are never seen)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka.admin import AdminClient as KafkaAdmin
from confluent_kafka.admin import NewTopic
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.broker.cluster.waiting import eventually
from tests.cli import tidelog
from tests.kafka.conftest import KafkaBroker, unique, wait_until_decided
from tidelog.client import AdminClient, Consumer, Producer, TopicPartition

pytestmark = pytest.mark.timeout(180)

TIMEOUT_S = 30.0


@pytest.fixture
def topic(kafka_broker: KafkaBroker) -> str:
    name = unique("rc")
    admin = KafkaAdmin({"bootstrap.servers": kafka_broker.bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=1)])[name].result(timeout=TIMEOUT_S)
    return name


def transactional(kafka_broker: KafkaBroker) -> KafkaProducer:
    made = KafkaProducer(
        {
            "bootstrap.servers": kafka_broker.bootstrap,
            "transactional.id": unique("app"),
            "transaction.timeout.ms": 60_000,
            "linger.ms": 0,
        }
    )
    made.init_transactions(TIMEOUT_S)
    return made


def write(producer: KafkaProducer, topic: str, value: str) -> None:
    """One record, in the log before the next write (so the interleaving is as written)."""
    producer.produce(topic, value.encode(), partition=0)
    assert producer.flush(TIMEOUT_S) == 0


@pytest.fixture
def consumers(kafka_broker: KafkaBroker) -> Iterator[dict[str, Consumer]]:
    made = {
        level: Consumer(
            kafka_broker.address,
            isolation_level=level,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=100,
        )
        for level in ("read_committed", "read_uncommitted")
    }
    try:
        yield made
    finally:
        for consumer in made.values():
            consumer.close()


def read_until(consumer: Consumer, tp: TopicPartition, end: int) -> list[tuple[int, bytes]]:
    """``(offset, value)`` of every record ``consumer`` hands out of ``tp`` from offset 0
    until its position reaches ``end``."""
    consumer.assign([tp])
    consumer.seek(tp, 0)
    out: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + TIMEOUT_S
    while consumer.position(tp) < end:
        assert time.monotonic() < deadline, f"position {consumer.position(tp)} never reached {end}"
        out += [(r.offset, r.value or b"") for r in consumer.poll(timeout_ms=200)]
    return out


def test_interleaved_transactions_commit_and_abort(
    kafka_broker: KafkaBroker, topic: str, consumers: dict[str, Consumer]
) -> None:
    tp = TopicPartition(topic, 0)
    a, b = transactional(kafka_broker), transactional(kafka_broker)
    a.begin_transaction()
    b.begin_transaction()
    write(a, topic, "a1")
    write(b, topic, "b1")
    write(a, topic, "a2")
    a.commit_transaction(TIMEOUT_S)  # COMMIT (a)
    write(b, topic, "b2")
    b.abort_transaction(TIMEOUT_S)  # ABORT (b)
    with Producer(kafka_broker.address) as plain:
        plain.send(topic, value=b"p1", partition=0).result(TIMEOUT_S)
    a.begin_transaction()
    write(a, topic, "a3")
    a.commit_transaction(TIMEOUT_S)  # COMMIT (a)
    b.begin_transaction()
    write(b, topic, "b3")
    b.commit_transaction(TIMEOUT_S)  # COMMIT (b): b's next transaction counts again

    # The answers to commit and abort come before the markers are written (Kafka's too),
    # so where the markers landed among the writes is not fixed: values, in order.
    end = wait_until_decided(kafka_broker.address, tp)
    committed = read_until(consumers["read_committed"], tp, end)
    assert [value for _, value in committed] == [b"a1", b"a2", b"p1", b"a3", b"b3"]
    uncommitted = read_until(consumers["read_uncommitted"], tp, end)
    assert [value for _, value in uncommitted] == [
        b"a1", b"b1", b"a2", b"b2", b"p1", b"a3", b"b3"
    ]  # fmt: skip
    # Four markers were stepped over (their offsets never handed out), at either level.
    assert end == 11
    assert len({o for o, _ in uncommitted}) == 7
    for consumer in consumers.values():
        assert consumer.position(tp) == end
        assert consumer.end_offsets([tp]) == {tp: end}
        assert consumer.current_lag(tp) == 0


def test_an_open_transaction_holds_read_committed_at_the_last_stable_offset(
    kafka_broker: KafkaBroker, topic: str, consumers: dict[str, Consumer]
) -> None:
    tp = TopicPartition(topic, 0)
    a, b = transactional(kafka_broker), transactional(kafka_broker)
    a.begin_transaction()
    write(a, topic, "c1")  # 0
    a.commit_transaction(TIMEOUT_S)  # 1
    assert wait_until_decided(kafka_broker.address, tp) == 2  # the marker is in
    b.begin_transaction()
    write(b, topic, "open")  # 2: undecided, so the last stable offset stays at 2
    a.begin_transaction()
    write(a, topic, "c2")  # 3: committed, but behind the open transaction
    a.commit_transaction(TIMEOUT_S)  # 4

    reader = consumers["read_committed"]
    assert reader.end_offsets([tp]) == {tp: 2}
    eventually(lambda: consumers["read_uncommitted"].end_offsets([tp]) == {tp: 5})
    assert read_until(reader, tp, 2) == [(0, b"c1")]
    # Nothing past the last stable offset, however long it polls, until b decides.
    for _ in range(5):
        assert reader.poll(timeout_ms=200) == []
    assert reader.position(tp) == 2
    assert reader.current_lag(tp) == 0
    assert reader.highwater(tp) == 5
    assert read_until(consumers["read_uncommitted"], tp, 5) == [
        (0, b"c1"), (2, b"open"), (3, b"c2")
    ]  # fmt: skip
    # A read_committed consumer that starts at the end starts at the last stable offset.
    with Consumer(
        kafka_broker.address, isolation_level="read_committed", auto_offset_reset="latest"
    ) as late:
        late.assign([tp])
        assert late.position(tp) == 2

    b.commit_transaction(TIMEOUT_S)  # 5: the open transaction commits
    got: list[tuple[int, bytes]] = []

    def caught_up() -> bool:
        got.extend((r.offset, r.value or b"") for r in reader.poll(timeout_ms=100))
        return reader.position(tp) == 6

    eventually(caught_up, TIMEOUT_S)
    assert got == [(2, b"open"), (3, b"c2")]
    assert reader.end_offsets([tp]) == {tp: 6}
    with AdminClient(kafka_broker.address) as admin:
        assert admin.list_offsets({tp: "latest"}, isolation_level="read_committed")[tp] is not None


def test_admin_list_offsets_at_both_levels(kafka_broker: KafkaBroker, topic: str) -> None:
    tp = TopicPartition(topic, 0)
    a = transactional(kafka_broker)
    a.begin_transaction()
    write(a, topic, "undecided")
    with AdminClient(kafka_broker.address) as admin:
        latest = {
            level: admin.list_offsets({tp: "latest"}, isolation_level=level)[tp]
            for level in ("read_uncommitted", "read_committed")
        }
        assert {level: found.offset for level, found in latest.items() if found} == {
            "read_uncommitted": 1,
            "read_committed": 0,
        }
        with pytest.raises(ValueError, match="isolation_level"):
            admin.list_offsets({tp: "latest"}, isolation_level="serializable")
    a.abort_transaction(TIMEOUT_S)


def test_the_command_line_reads_committed(kafka_broker: KafkaBroker, topic: str) -> None:
    a = transactional(kafka_broker)
    a.begin_transaction()
    write(a, topic, "kept")
    a.commit_transaction(TIMEOUT_S)
    a.begin_transaction()
    write(a, topic, "dropped")
    a.abort_transaction(TIMEOUT_S)
    a.begin_transaction()
    write(a, topic, "kept-too")
    a.commit_transaction(TIMEOUT_S)
    assert wait_until_decided(kafka_broker.address, TopicPartition(topic, 0)) == 6

    def consume(*extra: str) -> list[str]:
        done = tidelog(
            "consume", topic, "--from-beginning", "--idle-timeout-ms", "1500",
            "--format", "{offset}:{value}", "--bootstrap", kafka_broker.address, *extra,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    assert consume("--isolation-level", "read_committed") == ["0:kept", "4:kept-too"]
    assert consume() == ["0:kept", "2:dropped", "4:kept-too"]
    refused = tidelog("consume", topic, "--isolation-level", "dirty")
    assert refused.returncode != 0
    assert "invalid choice" in refused.stderr


_PRODUCERS = 3


@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["write", "write", "commit", "abort"]), st.integers(0, 2)),
        min_size=4,
        max_size=14,
    )
)
def test_random_interleavings_read_back_exactly_the_committed_records(
    kafka_broker: KafkaBroker, steps: list[tuple[str, int]]
) -> None:
    """Three transactional producers on one partition in a random order of writes,
    commits and aborts (every transaction decided at the end): read_committed reads
    exactly the committed values in offset order, read_uncommitted every value."""
    name = unique("rc-mix")
    admin = KafkaAdmin({"bootstrap.servers": kafka_broker.bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=1)])[name].result(timeout=TIMEOUT_S)
    producers = [transactional(kafka_broker) for _ in range(_PRODUCERS)]
    open_values: dict[int, list[bytes]] = {}
    written: list[bytes] = []
    committed: set[bytes] = set()
    for n, (kind, index) in enumerate(steps + [("commit", i) for i in range(_PRODUCERS)]):
        producer = producers[index]
        if kind == "write":
            if index not in open_values:
                producer.begin_transaction()
                open_values[index] = []
            write(producer, name, f"{index}-{n}")
            open_values[index].append(f"{index}-{n}".encode())
            written.append(f"{index}-{n}".encode())
        elif index in open_values:
            values = open_values.pop(index)
            if kind == "commit":
                producer.commit_transaction(TIMEOUT_S)
                committed.update(values)
            else:
                producer.abort_transaction(TIMEOUT_S)
    tp = TopicPartition(name, 0)
    for level, expected in (
        ("read_committed", [v for v in written if v in committed]),
        ("read_uncommitted", written),
    ):
        end = wait_until_decided(kafka_broker.address, tp)
        with Consumer(kafka_broker.address, isolation_level=level, fetch_max_wait_ms=100) as c:
            assert [value for _, value in read_until(c, tp, end)] == expected, level
