"""``ShareConsumer`` keeps acknowledgements a retriable failure stopped and sends them
again, and reports every outcome (``commit_sync``'s result, the acknowledgement commit
callback), against a real broker.

Proven:

* The broker unreachable (every client connection goes through a TCP proxy, which is
  cut): ``commit_sync`` answers a retriable error and the callback hears nothing (the
  acknowledgements are kept); the proxy healed, the next ``commit_sync`` applies them:
  the share partition's start offset moves past them and the callback hears success.
  Before this change they were dropped, and the records waited for their lock.
* The broker restarted in between (which released the records it had handed out: the
  member holds them no more): the kept acknowledgements go again with the next poll's
  fetch, the broker refuses them (``InvalidRecordStateError``), the callback is told,
  and the records are delivered again. The request the stopped broker did not answer
  might have been applied as far as the client can tell (gRPC's ``UNAVAILABLE`` is the
  same for a connection refused and an answer lost), so the refusal is reported as
  ``AcknowledgementOutcomeUnknownError`` caused by that error, not as "not applied"
  (``client.share_outcomes``; the pure rules in ``test_share_outcomes.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.cluster.waiting import eventually
from tidelog.broker.cluster.testing import TcpProxy, free_port
from tidelog.broker.testing import InProcessBroker
from tidelog.client import (
    AcknowledgementOutcomeUnknownError,
    AdminClient,
    ConsumerRecord,
    Producer,
    ShareConsumer,
    TopicPartition,
)
from tidelog.storage.errors import TidelogError

LONG_LOCK_MS = 600_000
SETTINGS = {
    "group.share.min.heartbeat.interval.ms": 100,
    "group.share.heartbeat.interval.ms": 100,
    "group.share.min.session.timeout.ms": 1_000,
    "group.share.session.timeout.ms": 30_000,
    "group.share.max.record.lock.duration.ms": LONG_LOCK_MS,
    "group.share.record.lock.duration.ms": LONG_LOCK_MS,
}
Outcome = tuple[dict[TopicPartition, set[int]], TidelogError | None]


@pytest.fixture
def proxied() -> Iterator[tuple[InProcessBroker, TcpProxy]]:
    port = free_port()
    proxy = TcpProxy(("127.0.0.1", port))
    advertised = {"advertised.listeners": f"127.0.0.1:{proxy.port}"}
    try:
        with InProcessBroker(port=port, settings={**SETTINGS, **advertised}) as broker:
            yield broker, proxy
    finally:
        proxy.close()


def _consumer(bootstrap: str, topic: str, outcomes: list[Outcome]) -> ShareConsumer:
    consumer = ShareConsumer(
        bootstrap,
        "retry-workers",
        acknowledgement_mode="explicit",
        request_timeout_ms=5_000,
        acknowledgement_commit_callback=lambda offsets, error: outcomes.append((offsets, error)),
    )
    consumer.subscribe([topic])
    eventually(lambda: bool(consumer.assignment()), 20)
    assert consumer.poll(timeout_ms=0) == []  # the share partition starts at the log end
    return consumer


def _produce_and_poll(
    broker: InProcessBroker, consumer: ShareConsumer, topic: str
) -> list[ConsumerRecord]:
    with Producer(broker.address) as producer:
        for i in range(5):
            producer.send(topic, value=b"%d" % i)
        producer.flush()
    got: list[ConsumerRecord] = []
    eventually(lambda: len(got.__iadd__(consumer.poll(timeout_ms=200))) >= 5, 30, interval_s=0)
    assert [r.offset for r in got] == [0, 1, 2, 3, 4]
    return got


def test_acknowledgements_kept_through_an_outage_are_applied_after_it(
    proxied: tuple[InProcessBroker, TcpProxy],
) -> None:
    broker, proxy = proxied
    tp = TopicPartition("retry", 0)
    with AdminClient(broker.address) as admin:
        admin.create_topic(tp.topic, 1)
        outcomes: list[Outcome] = []
        consumer = _consumer(f"127.0.0.1:{proxy.port}", tp.topic, outcomes)
        try:
            for record in _produce_and_poll(broker, consumer, tp.topic):
                consumer.acknowledge(record)
            proxy.cut()
            failed = consumer.commit_sync(timeout_ms=1_000)
            assert list(failed) == [tp]
            error = failed[tp]
            assert error is not None, failed
            assert error.retriable, failed
            assert outcomes == []  # kept, not given up
            proxy.heal()
            assert consumer.commit_sync() == {tp: None}
            assert outcomes == [({tp: {0, 1, 2, 3, 4}}, None)]
            (stats,) = admin.describe_share_group("retry-workers").partitions
            assert (stats.start_offset, stats.acquired) == (5, 0)
        finally:
            consumer.close()


def test_acknowledgements_kept_across_a_restart_are_refused_and_reported(tmp_path: Path) -> None:
    # Its own data directory: stop() keeps it for the start() after.
    with InProcessBroker(tmp_path / "data", settings=SETTINGS) as broker:
        tp = TopicPartition("restarted", 0)
        with AdminClient(broker.address) as admin:
            admin.create_topic(tp.topic, 1)
        outcomes: list[Outcome] = []
        consumer = _consumer(broker.address, tp.topic, outcomes)
        try:
            for record in _produce_and_poll(broker, consumer, tp.topic):
                consumer.acknowledge(record)
            broker.stop()
            failed = consumer.commit_sync(timeout_ms=1_000)
            error = failed[tp]
            assert error is not None, failed
            assert error.retriable, failed
            assert outcomes == []
            broker.start()  # the records it had handed out are available again

            again: list[ConsumerRecord] = []

            def redelivered() -> bool:
                again.extend(consumer.poll(timeout_ms=200))  # the kept ones go first
                return len(again) >= 5

            eventually(redelivered, 60, interval_s=0)
            assert len(outcomes) == 1
            offsets, error = outcomes[0]
            assert offsets == {tp: {0, 1, 2, 3, 4}}
            assert isinstance(error, AcknowledgementOutcomeUnknownError), error
            assert isinstance(error.__cause__, TidelogError)
            assert error.__cause__.retriable  # the request the stopped broker did not answer
            assert "is not acquired by member" in str(error)  # the refusal, quoted
            assert sorted(r.offset for r in again) == [0, 1, 2, 3, 4]
            assert {consumer.delivery_count(r) for r in again} == {2}
        finally:
            consumer.close()
