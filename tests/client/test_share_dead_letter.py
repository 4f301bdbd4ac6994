"""A share group's dead-letter topic (issue #32 step 5, ``broker.share.dead_letter``)
against a real broker.

Proven: a REJECTed record and one that reached ``share.delivery.count.limit`` are copied
to the group's dead-letter topic exactly once (read_committed), with the original key,
value and headers and the ``tidelog.dlq.*`` headers, the topic being created when
missing, and are never delivered again; a broker SIGKILLed between a dead-letter
transaction's copy and its commit (the ``TIDELOG_DLQ_TEST_STOP_AT`` hook) neither loses
nor duplicates a dead-lettered record after its restart (the copy it had written is
aborted, visible to read_uncommitted only); a group without a dead-letter topic archives
only; a dead-letter write that keeps failing (every copy too large for the topic) is
logged at ERROR, stalls none of the partition's other records, loses nothing, and the
record is dead-lettered once the topic takes it.

Group configs are set over the wire (``AdminClient.incremental_alter_configs`` on a
``ConfigResource.group``, stored at the group's coordinator in ``__consumer_offsets``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.cluster.waiting import eventually
from tests.broker.test_cli import Daemon
from tidelog.broker.core.share_dlq import STOP_ENV
from tidelog.broker.testing import InProcessBroker
from tidelog.client import (
    AdminClient,
    Consumer,
    ConsumerRecord,
    Producer,
    ShareConsumer,
    TopicPartition,
)
from tidelog.client.types import AlterConfigOp, ConfigResource

LONG_LOCK_MS = 600_000
COMMON = {
    "group.share.min.heartbeat.interval.ms": 100,
    "group.share.heartbeat.interval.ms": 100,
    "group.share.min.session.timeout.ms": 1_000,
    "group.share.session.timeout.ms": 20_000,
    "group.share.max.record.lock.duration.ms": LONG_LOCK_MS,
    "group.share.record.lock.duration.ms": LONG_LOCK_MS,
    "group.share.delivery.count.limit": 2,
}
DLQ_CONFIG = "errors.deadletterqueue.topic.name"


@pytest.fixture(scope="module")
def broker() -> Iterator[InProcessBroker]:
    with InProcessBroker(settings=COMMON) as running:
        yield running


def _set_group_configs(broker: InProcessBroker, group: str, configs: dict[str, str]) -> None:
    with AdminClient(broker.address) as admin:
        admin.incremental_alter_configs(
            ConfigResource.group(group), [AlterConfigOp(k, "set", v) for k, v in configs.items()]
        )


def _consumer(address: str, group: str, topic: str) -> ShareConsumer:
    consumer = ShareConsumer(
        address, group, acknowledgement_mode="explicit", request_timeout_ms=10_000
    )
    consumer.subscribe([topic])
    eventually(lambda: bool(consumer.assignment()), 20)
    assert consumer.poll(timeout_ms=0) == []  # the share partition starts at the log end
    return consumer


def _poll_until(consumer: ShareConsumer, offsets: set[int]) -> dict[int, ConsumerRecord]:
    got: dict[int, ConsumerRecord] = {}

    def check() -> bool:
        got.update((r.offset, r) for r in consumer.poll(timeout_ms=200))
        return offsets <= set(got)

    eventually(check, 30, interval_s=0)
    return got


def _produce(address: str, topic: str, count: int, first: int = 0) -> None:
    with Producer(address) as producer:
        for i in range(first, first + count):
            producer.send(topic, key=b"k%d" % i, value=b"v%d" % i, headers=[("origin", b"%d" % i)])
        producer.flush()


def _end_offset(address: str, topic: str, request_timeout_ms: int = 30_000) -> int:
    with AdminClient(address, request_timeout_ms=request_timeout_ms) as admin:
        [partition] = admin.describe_topic(topic).partitions
    return partition.log_end_offset


def read_all(
    address: str, topic: str, isolation_level: str, *, timeout_s: float = 20
) -> list[ConsumerRecord]:
    """Everything ``topic``-0 holds up to its log end (every transaction there decided);
    also the cluster test's (``tests/broker/cluster/test_share_dead_letter_cluster.py``)."""
    end = _end_offset(address, topic, 20_000)
    out: list[ConsumerRecord] = []
    consumer = Consumer(address, isolation_level=isolation_level)
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning()

        def done() -> bool:
            out.extend(consumer.poll(timeout_ms=200))
            return consumer.position(tp) >= end

        eventually(done, timeout_s, interval_s=0)
    finally:
        consumer.close()
    return out


def _headers(record: ConsumerRecord) -> dict[str, bytes | None]:
    return dict(record.headers)


def test_reject_and_the_delivery_limit_dead_letter_exactly_once_with_headers(
    tmp_path: Path,
) -> None:
    with InProcessBroker(tmp_path / "data", settings=COMMON) as broker:
        _dead_letter_twice_and_restart(broker)


def _dead_letter_twice_and_restart(broker: InProcessBroker) -> None:
    topic, dlq = "jobs-a", "jobs-a-dlq"
    with AdminClient(broker.address) as admin:
        admin.create_topic(topic, 1)
    _set_group_configs(broker, "dlq-a", {DLQ_CONFIG: dlq})
    consumer = _consumer(broker.address, "dlq-a", topic)
    try:
        _produce(broker.address, topic, 3)  # 0 rejected, 1 released twice, 2 accepted
        first = _poll_until(consumer, {0, 1, 2})
        consumer.acknowledge(first[0], "reject")
        consumer.acknowledge(first[1], "release")
        consumer.acknowledge(first[2], "accept")
        assert set(consumer.commit_sync().values()) == {None}
        again = _poll_until(consumer, {1})
        assert consumer.delivery_count(again[1]) == 2
        consumer.acknowledge(again[1], "release")  # its 2nd delivery ends: the limit
        assert set(consumer.commit_sync().values()) == {None}

        def dead_lettered() -> bool:
            shares = broker.server.core.shares
            assert shares is not None
            [state] = shares.describe("dlq-a").partitions
            return state.dead_lettered == 2

        eventually(dead_lettered, 20)
        _produce(broker.address, topic, 1, first=3)  # anything still available comes first
        rest = _poll_until(consumer, {3})
        assert sorted(rest) == [3]  # 0 and 1 are never delivered again
        consumer.acknowledge(rest[3], "accept")
        consumer.commit_sync()
    finally:
        consumer.close()
    copies = read_all(broker.address, dlq, "read_committed")
    assert len(copies) == 2
    by_offset = {int(_headers(c)["tidelog.dlq.offset"] or b""): c for c in copies}
    assert sorted(by_offset) == [0, 1]
    for offset, reason, count in ((0, b"rejected", b"1"), (1, b"delivery-limit", b"2")):
        copy = by_offset[offset]
        assert (copy.key, copy.value) == (b"k%d" % offset, b"v%d" % offset)
        assert copy.headers[0] == ("origin", b"%d" % offset)  # the original's, first
        assert _headers(copy) == {
            "origin": b"%d" % offset,
            "tidelog.dlq.group": b"dlq-a",
            "tidelog.dlq.topic": topic.encode(),
            "tidelog.dlq.partition": b"0",
            "tidelog.dlq.offset": b"%d" % offset,
            "tidelog.dlq.reason": reason,
            "tidelog.dlq.delivery.count": count,
        }
    # Nothing else was written there, committed or not: one transaction, committed.
    assert len(read_all(broker.address, dlq, "read_uncommitted")) == 2
    # The archiving was durable with the copies: reloaded, 0..3 are done, nothing is left
    # to dead-letter (a second copy would need a record to be dead-lettered).
    broker.restart()
    shares = broker.server.core.shares
    assert shares is not None
    reloaded = shares.partitions.describe("dlq-a", topic, 0)
    assert (reloaded.start_offset, reloaded.records()) == (4, {})


def test_a_group_without_a_dead_letter_topic_archives_only(broker: InProcessBroker) -> None:
    topic = "jobs-b"
    with AdminClient(broker.address) as admin:
        admin.create_topic(topic, 1)
        before = set(admin.list_topics())
    consumer = _consumer(broker.address, "plain-b", topic)
    try:
        _produce(broker.address, topic, 2)
        first = _poll_until(consumer, {0, 1})
        consumer.acknowledge(first[0], "reject")
        consumer.acknowledge(first[1], "accept")
        assert set(consumer.commit_sync().values()) == {None}
        _produce(broker.address, topic, 1, first=2)
        rest = _poll_until(consumer, {2})
        assert sorted(rest) == [2]
        consumer.acknowledge(rest[2], "accept")
        consumer.commit_sync()
        shares = broker.server.core.shares
        assert shares is not None
        [state] = shares.describe("plain-b").partitions
        assert (state.start_offset, state.dead_lettered) == (3, 0)
    finally:
        consumer.close()
    with AdminClient(broker.address) as admin:
        assert set(admin.list_topics()) == before


def test_a_broker_killed_between_copy_and_commit_neither_loses_nor_duplicates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir = tmp_path / "data"
    topic, dlq, group = "jobs-c", "jobs-c-dlq", "dlq-c"
    with InProcessBroker(data_dir, settings=COMMON) as setup:
        with AdminClient(setup.address) as admin:
            admin.create_topic(topic, 1)
        _set_group_configs(setup, group, {DLQ_CONFIG: dlq})
    extra = [arg for k, v in COMMON.items() for arg in ("--set", f"{k}={v}")]
    monkeypatch.setenv(STOP_ENV, "after_copy")
    daemon = Daemon(data_dir, *extra)
    try:
        consumer = _consumer(daemon.address, group, topic)
        try:
            _produce(daemon.address, topic, 3)
            got = _poll_until(consumer, {0, 1, 2})
            for offset in (0, 1, 2):
                consumer.acknowledge(got[offset], "reject")
            consumer.commit_async()  # the broker may die before it answers
            daemon.process.wait(30)  # the hook killed it: copies written, not committed
        finally:
            consumer.close(timeout_ms=1_000)
        assert "DLQ test hook: killed at after_copy" in daemon.output()
    finally:
        daemon.kill()
    monkeypatch.delenv(STOP_ENV)
    daemon = Daemon(data_dir, *extra)
    try:
        consumer = _consumer(daemon.address, group, topic)  # loads the share partition
        try:

            def copied() -> bool:
                assert consumer.poll(timeout_ms=200) == []  # 0..2 are never redelivered
                # 3 aborted copies and their marker, 3 committed ones and theirs.
                return _end_offset(daemon.address, dlq) == 8

            eventually(copied, 60, interval_s=0)
        finally:
            consumer.close()
        copies = read_all(daemon.address, dlq, "read_committed")
        assert sorted(int(_headers(c)["tidelog.dlq.offset"] or b"") for c in copies) == [0, 1, 2]
        assert {_headers(c)["tidelog.dlq.reason"] for c in copies} == {b"rejected"}
        # The killed transaction's copies are in the log, aborted: read_uncommitted sees
        # both attempts, read_committed only the committed one.
        assert len(read_all(daemon.address, dlq, "read_uncommitted")) == 6
    finally:
        daemon.kill()


def test_a_dead_letter_write_that_keeps_failing_stalls_nothing_and_loses_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    topic, dlq = "jobs-d", "jobs-d-dlq"
    with InProcessBroker(tmp_path / "data", settings=COMMON) as broker:
        with AdminClient(broker.address) as admin:
            admin.create_topic(topic, 1)
            # Every copy of the record below is too large for it: each write fails.
            admin.create_topic(dlq, 1, config={"max.message.bytes": "1024"})
        _set_group_configs(broker, "dlq-d", {DLQ_CONFIG: dlq})
        consumer = _consumer(broker.address, "dlq-d", topic)
        try:
            with Producer(broker.address) as producer:
                producer.send(topic, value=b"x" * 4_000)  # offset 0
                producer.flush()
            [poison] = _poll_until(consumer, {0}).values()
            consumer.acknowledge(poison, "reject")
            assert set(consumer.commit_sync().values()) == {None}

            def loud() -> bool:
                return any(
                    r.levelname == "ERROR"
                    and "dead-lettering offsets 0..0 to jobs-d-dlq" in r.message
                    for r in caplog.records
                )

            eventually(loud, 60)  # the failures in a row reached the loud threshold
            # The partition is not stalled: later records are delivered and acknowledged.
            _produce(broker.address, topic, 2, first=1)
            later = _poll_until(consumer, {1, 2})
            assert sorted(later) == [1, 2]  # offset 0 is not redelivered
            for record in later.values():
                consumer.acknowledge(record, "accept")
            assert set(consumer.commit_sync().values()) == {None}
            # Nor lost: once the topic takes it, the record is dead-lettered.
            with AdminClient(broker.address) as admin:
                admin.incremental_alter_configs(
                    ConfigResource.topic(dlq),
                    [AlterConfigOp("max.message.bytes", "set", "1048576")],
                )
            eventually(lambda: len(read_all(broker.address, dlq, "read_committed")) == 1, 60)
            [copy] = read_all(broker.address, dlq, "read_committed")
            assert (copy.value, _headers(copy)["tidelog.dlq.offset"]) == (b"x" * 4_000, b"0")
        finally:
            consumer.close()
