"""Share groups end to end (issue #32, step 3): ``ShareConsumer`` against a real broker.

Brokers run in this process with short share-group timings: heartbeats every 100 ms and,
where a lock must expire, acquisition locks of ``SHORT_LOCK_MS``. Where a record must come
back *without* a lock expiring (RELEASE, a clean close, a restart), the broker's locks last
``LONG_LOCK_MS``, far beyond the test's own waits, so a redelivery there cannot be an
expiry. A share group starts at the log end (``share.auto.offset.reset`` latest), so every
test lets its consumers fetch once before producing.

What is proven: four share consumers on a two-partition topic each receive records and
every record is delivered (more consumers than partitions); a consumer closed without
acknowledging gives its records back to the others, and a consumer process SIGKILLed
with records in flight has them redelivered to the other after its locks expire (not
before the lock duration, a second delivery);
RELEASE redelivers at once; REJECT and the delivery limit archive (never delivered
again, a later record proves the partition moved past them); a consumer group on the
same topic reads everything independently; a broker restart loses no acknowledgement and
redelivers what was in flight.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.cluster.waiting import eventually
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient, Consumer, ConsumerRecord, Producer, ShareConsumer

ROOT = Path(__file__).resolve().parents[2]
SHORT_LOCK_MS = 1_500
LONG_LOCK_MS = 600_000
COMMON = {
    "group.share.min.heartbeat.interval.ms": 100,
    "group.share.heartbeat.interval.ms": 100,
    "group.share.min.session.timeout.ms": 1_000,
    "group.share.session.timeout.ms": 20_000,
    "group.share.min.record.lock.duration.ms": 100,
    "group.share.max.record.lock.duration.ms": LONG_LOCK_MS,
    "group.share.delivery.count.limit": 2,
}


def _broker(lock_ms: int) -> InProcessBroker:
    return InProcessBroker(settings={**COMMON, "group.share.record.lock.duration.ms": lock_ms})


@pytest.fixture(scope="module")
def short_lock() -> Iterator[InProcessBroker]:
    with _broker(SHORT_LOCK_MS) as broker:
        yield broker


@pytest.fixture(scope="module")
def long_lock() -> Iterator[InProcessBroker]:
    with _broker(LONG_LOCK_MS) as broker:
        yield broker


_count = iter(range(1_000_000))


def _topic(broker: InProcessBroker, partitions: int) -> str:
    name = f"share-{next(_count)}"
    with AdminClient(broker.address) as admin:
        admin.create_topic(name, partitions)
    return name


def _consumer(broker: InProcessBroker, group: str, topic: str, **options: object) -> ShareConsumer:
    consumer = ShareConsumer(broker.address, group, request_timeout_ms=10_000, **options)  # type: ignore[arg-type]
    consumer.subscribe([topic])
    return consumer


def _ready(*consumers: ShareConsumer, each: int = 1) -> None:
    """Wait until every consumer holds ``each`` partitions, then fetch once with each (the
    share partitions start at the log end before anything is produced)."""
    eventually(lambda: all(len(c.assignment()) == each for c in consumers), 20)
    for c in consumers:
        assert c.poll(timeout_ms=0) == []


def _produce(broker: InProcessBroker, topic: str, count: int, partitions: int = 1) -> None:
    with Producer(broker.address) as producer:
        for i in range(count):
            producer.send(topic, value=b"%d" % i, partition=i % partitions)
        producer.flush()


def _key(record: ConsumerRecord) -> tuple[int, int]:
    return record.partition, record.offset


def _poll_until(consumer: ShareConsumer, wanted: set[tuple[int, int]]) -> list[ConsumerRecord]:
    """Poll until every record of ``wanted`` was received; return everything received."""
    got: list[ConsumerRecord] = []

    def check() -> bool:
        got.extend(consumer.poll(timeout_ms=200))
        return wanted <= {_key(r) for r in got}

    eventually(check, 30, interval_s=0)
    return got


def test_four_share_consumers_on_two_partitions_each_receive_records(
    short_lock: InProcessBroker,
) -> None:
    topic = _topic(short_lock, 2)
    consumers = [_consumer(short_lock, "four", topic, max_poll_records=5) for _ in range(4)]
    try:
        _ready(*consumers)
        total = 200
        _produce(short_lock, topic, total, partitions=2)
        received: list[list[tuple[int, int]]] = [[] for _ in consumers]
        seen: set[tuple[int, int]] = set()
        lock = threading.Lock()
        done = threading.Event()

        def run(index: int) -> None:
            while not done.is_set():
                records = consumers[index].poll(timeout_ms=100)
                with lock:
                    received[index].extend(_key(r) for r in records)
                    seen.update(_key(r) for r in records)
                    if len(seen) == total:
                        done.set()
                done.wait(0.01)  # a little work per poll, so nobody takes everything

        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        done.wait(60)
        done.set()
        for t in threads:
            t.join(10)
        assert len(seen) == total  # every record delivered
        assert all(received), [len(r) for r in received]  # to each of the four
    finally:
        for c in consumers:
            c.close()


def test_a_consumer_closed_without_acknowledging_gives_its_records_to_the_others(
    long_lock: InProcessBroker,
) -> None:
    topic = _topic(long_lock, 1)
    holder = _consumer(long_lock, "closed", topic, acknowledgement_mode="explicit")
    _ready(holder)
    other = _consumer(long_lock, "closed", topic)
    try:
        _ready(other)
        _produce(long_lock, topic, 10)
        held = {_key(r) for r in _poll_until(holder, {(0, o) for o in range(10)})}
        holder.close()  # no acknowledgement: the broker releases them (not a lock expiry)
        again = _poll_until(other, held)
        assert {_key(r) for r in again} == held
        assert {other.delivery_count(r) for r in again} == {2}
    finally:
        holder.close()
        other.close()


def test_a_killed_consumer_process_records_come_back_after_the_lock_duration(
    short_lock: InProcessBroker,
) -> None:
    topic = _topic(short_lock, 1)
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.client.share_worker", short_lock.address, "killed", topic],
        stdout=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    other = _consumer(short_lock, "killed", topic)
    try:
        assert worker.stdout is not None
        assert json.loads(worker.stdout.readline()) == {"e": "assigned"}
        _ready(other)
        produced = time.monotonic()  # the worker acquired everything after this
        _produce(short_lock, topic, 20)
        held: set[tuple[int, int]] = set()
        while len(held) < 20:
            event = json.loads(worker.stdout.readline())
            if event["e"] == "recs":
                held.update((p, o) for p, o in event["r"])
        worker.kill()  # SIGKILL: no acknowledgement, no leave, no session close
        worker.wait(10)
        first: list[float] = []
        counts: dict[tuple[int, int], int] = {}  # read at once: the next poll accepts

        def all_back() -> bool:
            got = other.poll(timeout_ms=50)
            if got and not first:
                first.append(time.monotonic())
            counts.update((_key(r), other.delivery_count(r)) for r in got)
            return held <= counts.keys()

        eventually(all_back, 30, interval_s=0)
        # Not before the locks could expire: acquired after ``produced``, held SHORT_LOCK_MS.
        assert first[0] - produced >= SHORT_LOCK_MS / 1000
        assert counts.keys() == held
        # A second delivery: the first was the killed worker's, ended by its lock expiring.
        assert set(counts.values()) == {2}
    finally:
        worker.kill()
        worker.wait(10)
        if worker.stdout is not None:
            worker.stdout.close()
        other.close()


def test_release_redelivers_at_once_and_reject_and_the_delivery_limit_archive(
    long_lock: InProcessBroker,
) -> None:
    topic = _topic(long_lock, 1)
    consumer = _consumer(long_lock, "kinds", topic, acknowledgement_mode="explicit")
    try:
        _ready(consumer)
        _produce(long_lock, topic, 3)  # offsets 0 (accept), 1 (reject), 2 (release twice)
        first = {r.offset: r for r in _poll_until(consumer, {(0, 0), (0, 1), (0, 2)})}
        consumer.acknowledge(first[0], "accept")
        consumer.acknowledge(first[1], "reject")
        consumer.acknowledge(first[2], "release")
        assert set(consumer.commit_sync().values()) == {None}
        # RELEASE: back at once (the lock would hold it for ten minutes).
        [second] = _poll_until(consumer, {(0, 2)})
        assert consumer.delivery_count(second) == 2
        consumer.acknowledge(second, "release")  # the 2nd delivery ends: the limit is 2
        assert set(consumer.commit_sync().values()) == {None}
        _produce(long_lock, topic, 1)  # offset 3: anything available would come first
        rest = _poll_until(consumer, {(0, 3)})
        assert [_key(r) for r in rest] == [(0, 3)]  # 1 rejected, 2 archived at the limit
        consumer.acknowledge(rest[0])
        consumer.commit_sync()
    finally:
        consumer.close()


def test_a_consumer_group_reads_the_same_topic_independently(long_lock: InProcessBroker) -> None:
    topic = _topic(long_lock, 2)
    share = _consumer(long_lock, "both-share", topic)
    regular = Consumer(long_lock.address, group_id="both-regular", auto_offset_reset="earliest")
    try:
        _ready(share, each=2)
        regular.subscribe([topic])
        _produce(long_lock, topic, 40, partitions=2)
        everything = {(p, o) for p in range(2) for o in range(20)}
        assert {_key(r) for r in _poll_until(share, everything)} == everything
        share.commit_sync()  # all accepted
        read: set[tuple[int, int]] = set()

        def all_read() -> bool:
            read.update(_key(r) for r in regular.poll(timeout_ms=200))
            return read == everything

        eventually(all_read, 30, interval_s=0)
    finally:
        share.close()
        regular.close()


def test_a_restart_loses_no_acknowledgement_and_redelivers_what_was_in_flight() -> None:
    with _broker(LONG_LOCK_MS) as broker:
        topic = _topic(broker, 1)
        first = _consumer(broker, "restart", topic, acknowledgement_mode="explicit")
        _ready(first)
        _produce(broker, topic, 10)
        records = sorted(_poll_until(first, {(0, o) for o in range(10)}), key=_key)
        for record in records[:5]:
            first.acknowledge(record)
        assert set(first.commit_sync().values()) == {None}
        broker.restart()  # offsets 5..9 were in flight
        second = _consumer(broker, "restart", topic)
        try:
            eventually(lambda: bool(second.assignment()), 20)
            again = _poll_until(second, {(0, o) for o in range(5, 10)})
            assert sorted(_key(r) for r in again) == [(0, o) for o in range(5, 10)]
            assert {second.delivery_count(r) for r in again} == {2}
            second.commit_sync()
            _produce(broker, topic, 1)  # offset 10 comes after anything still available
            rest = _poll_until(second, {(0, 10)})
            assert [_key(r) for r in rest] == [(0, 10)]  # 0..4 stayed acknowledged
        finally:
            second.close()
            first.close()
