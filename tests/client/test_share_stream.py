"""The share fetch stream (``ShareFetchStream``, ``broker.grpc.share_stream``;
``client.share_links``) against a real broker, single node. The cluster's case (a stream
to a broker that does not lead) is ``tests/broker/cluster/test_share_stream_cluster.py``.

Raw streams (protobuf requests on a gRPC channel) where the test must control what is
sent when: acknowledgements piggy-backed on a request are applied once (the same
acknowledgements again are refused, the describe shows each record acknowledged once);
a stream broken while a long poll is parked loses nothing and acknowledges nothing
twice: what the request carried was applied, what the member still held comes back to
another member after the lock (a second delivery), the broken member's acknowledgements
of it are refused afterwards. Through ``ShareConsumer(fetch_ahead=True)``: ``commit_sync``
fetches the next poll's records ahead (never more than ``max_poll_records``), the next
``poll`` hands them out, and a ``close`` releases what was fetched ahead at once; the unary calls
(``share_fetch_stream=False``) still serve the same consumer.
"""

from __future__ import annotations

import queue
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from tests.broker.cluster.waiting import eventually
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient, Producer, ShareConsumer
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc

SHORT_LOCK_MS = 1_500
LONG_LOCK_MS = 600_000
COMMON = {
    "group.share.min.heartbeat.interval.ms": 100,
    "group.share.heartbeat.interval.ms": 100,
    "group.share.min.session.timeout.ms": 1_000,
    "group.share.session.timeout.ms": 20_000,
    "group.share.min.record.lock.duration.ms": 100,
    "group.share.max.record.lock.duration.ms": LONG_LOCK_MS,
}
ACCEPT = 1

_count = iter(range(1_000_000))


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


def _topic(broker: InProcessBroker) -> str:
    name = f"stream-{next(_count)}"
    with AdminClient(broker.address) as admin:
        admin.create_topic(name, 1)
    return name


def _produce(broker: InProcessBroker, topic: str, count: int) -> None:
    with Producer(broker.address, acks="all") as producer:
        for i in range(count):
            producer.send(topic, f"r{i}".encode(), partition=0)
        producer.flush()


class _RawStream:
    """One ``ShareFetchStream`` of one member, a request and its answer at a time."""

    def __init__(self, broker: InProcessBroker, group: str, member: str, topic: str) -> None:
        self.group, self.member, self.topic = group, member, topic
        self._channel = grpc.insecure_channel(broker.address)
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        stub = broker_pb2_grpc.BrokerStub(self._channel)
        # A member of the group (the describe below needs the group); its heartbeats
        # stop here, and its session outlives the test.
        stub.ShareGroupHeartbeat(
            pb.ShareGroupHeartbeatRequest(
                group_id=group, member_id=member, member_epoch=0, subscribed_topic_names=[topic]
            ),
            timeout=10,
        )
        self._call = stub.ShareFetchStream(iter(self._requests.get, None))

    def ask(
        self,
        *,
        fetch: bool = True,
        acks: tuple[tuple[int, int], ...] = (),
        max_wait_ms: int = 0,
    ) -> pb.ShareFetchResponse:
        self.send(fetch=fetch, acks=acks, max_wait_ms=max_wait_ms)
        answer: pb.ShareFetchResponse = next(self._call)
        return answer

    def send(self, *, fetch: bool, acks: tuple[tuple[int, int], ...], max_wait_ms: int) -> None:
        self._requests.put(
            pb.ShareFetchRequest(
                group_id=self.group,
                member_id=self.member,
                partitions=[pb.TopicPartitions(topic=self.topic, partitions=[0])] if fetch else [],
                acknowledgements=[
                    pb.ShareAcknowledgement(
                        topic=self.topic,
                        partition=0,
                        first_offset=first,
                        last_offset=last,
                        kind=ACCEPT,
                    )
                    for first, last in acks
                ],
                max_records=100,
                max_wait_ms=max_wait_ms,
            )
        )

    def cancel(self) -> None:
        self._call.cancel()
        self._channel.close()

    def close(self) -> None:
        self._requests.put(None)
        self._channel.close()


def _acquired(answer: pb.ShareFetchResponse) -> list[int]:
    return [
        offset
        for part in answer.partitions
        for r in part.acquired
        for offset in range(r.first_offset, r.last_offset + 1)
    ]


def _ack_errors(answer: pb.ShareFetchResponse) -> list[str]:
    return [r.error_code for r in answer.acknowledgements]


def _stats(broker: InProcessBroker, group: str) -> Any:
    with AdminClient(broker.address) as admin:
        return admin.describe_share_group(group).partitions[0]


def test_piggybacked_acknowledgements_are_applied_exactly_once(long_lock: InProcessBroker) -> None:
    topic, group = _topic(long_lock), f"g-{uuid.uuid4()}"
    stream = _RawStream(long_lock, group, str(uuid.uuid4()), topic)
    try:
        assert _acquired(stream.ask()) == []  # the share partition starts at the log end
        _produce(long_lock, topic, 5)
        assert _acquired(stream.ask(max_wait_ms=2_000)) == [0, 1, 2, 3, 4]
        # Acknowledgements with the next fetch: applied, and nothing more to acquire.
        answer = stream.ask(acks=((0, 2),))
        assert _ack_errors(answer) == [""]
        assert _acquired(answer) == []
        # An acknowledgement-only request (no partitions): the commit's.
        assert _ack_errors(stream.ask(fetch=False, acks=((3, 4),))) == [""]
        # The same acknowledgements again: the member holds those records no more.
        again = stream.ask(fetch=False, acks=((0, 4),))
        assert _ack_errors(again) == ["INVALID_RECORD_STATE"]
        stats = _stats(long_lock, group)
        assert (stats.start_offset, stats.acquired, stats.available) == (5, 0, 0)
        # Nothing comes to another member: each record was acknowledged once.
        other = _RawStream(long_lock, group, str(uuid.uuid4()), topic)
        try:
            _produce(long_lock, topic, 1)
            assert _acquired(other.ask(max_wait_ms=2_000)) == [5]
        finally:
            other.close()
    finally:
        stream.close()


def test_a_stream_broken_mid_poll_loses_nothing_and_acknowledges_nothing_twice(
    short_lock: InProcessBroker,
) -> None:
    topic, group = _topic(short_lock), f"g-{uuid.uuid4()}"
    broken_member = str(uuid.uuid4())
    stream = _RawStream(short_lock, group, broken_member, topic)
    stream.ask()
    _produce(short_lock, topic, 5)
    assert _acquired(stream.ask(max_wait_ms=2_000)) == [0, 1, 2, 3, 4]
    # The next poll carries the acknowledgement of 0-1 and parks (nothing available);
    # the stream breaks while it waits.
    stream.send(fetch=True, acks=((0, 1),), max_wait_ms=30_000)
    eventually(lambda: _stats(short_lock, group).start_offset == 2, 10)
    stream.cancel()
    # 2-4 were still held by the broken member: another gets them after their lock, at
    # their second delivery; 0-1 never come back.
    deliveries: dict[int, int] = {}
    with ShareConsumer(
        short_lock.address, group, acknowledgement_mode="explicit", request_timeout_ms=10_000
    ) as consumer:
        consumer.subscribe([topic])

        def redelivered() -> bool:
            for record in consumer.poll(timeout_ms=200):
                deliveries[record.offset] = consumer.delivery_count(record)
                consumer.acknowledge(record)
            consumer.commit_sync()
            return len(deliveries) >= 3

        eventually(redelivered, 30, interval_s=0)
    assert deliveries == {2: 2, 3: 2, 4: 2}
    # The broken member, on a new stream, holds none of them any more.
    again = _RawStream(short_lock, group, broken_member, topic)
    try:
        assert _ack_errors(again.ask(fetch=False, acks=((2, 4),))) == ["INVALID_RECORD_STATE"]
    finally:
        again.close()
    stats = _stats(short_lock, group)
    assert (stats.start_offset, stats.acquired, stats.available, stats.archived) == (5, 0, 0, 0)


def _commit_first_three(
    broker: InProcessBroker, topic: str, group: str, records: int
) -> ShareConsumer:
    """A member (``max_poll_records`` 3, fetch-ahead on) that polled and accepted the
    first three of ``records`` produced; its ``commit_sync`` fetched the next three ahead.
    The caller closes it."""
    first = ShareConsumer(
        broker.address,
        group,
        max_poll_records=3,
        acknowledgement_mode="explicit",
        request_timeout_ms=10_000,
        fetch_ahead=True,
    )
    try:
        first.subscribe([topic])
        eventually(lambda: bool(first.assignment()), 30)
        first.poll(timeout_ms=0)  # the share partition starts at the log end
        _produce(broker, topic, records)
        got: list[Any] = []
        eventually(lambda: bool(got.extend(first.poll(200)) or got), 30)
        assert [r.offset for r in got] == [0, 1, 2]
        for record in got:
            first.acknowledge(record)
        # commit_sync: 0-2 accepted, and the next poll's three acquired with them.
        assert list(first.commit_sync().values()) == [None]
    except BaseException:
        first.close()
        raise
    return first


def test_commit_sync_fetches_one_poll_ahead_and_close_releases_it(
    long_lock: InProcessBroker,
) -> None:
    topic, group = _topic(long_lock), f"g-{uuid.uuid4()}"
    first = _commit_first_three(long_lock, topic, group, 10)
    try:
        stats = _stats(long_lock, group)
        assert (stats.start_offset, stats.acquired) == (3, 3)
        # The next poll hands them out without asking the broker for more.
        assert [r.offset for r in first.poll(timeout_ms=0)] == [3, 4, 5]
        assert _stats(long_lock, group).acquired == 3
    finally:
        first.close()  # implicit none (explicit mode): 3-5 released with the session
    with ShareConsumer(long_lock.address, group, request_timeout_ms=10_000) as second:
        second.subscribe([topic])
        offsets: list[int] = []
        eventually(
            lambda: bool(offsets.extend(r.offset for r in second.poll(200))) or len(offsets) >= 7,
            30,
            interval_s=0,
        )
        assert sorted(offsets) == [3, 4, 5, 6, 7, 8, 9]


def test_records_fetched_ahead_and_never_handed_out_go_back_uncounted(
    long_lock: InProcessBroker,
) -> None:
    """``close`` gives back what a commit fetched ahead as RETURN: the next member gets
    those records as their first delivery (a member closing burns no delivery of records
    it never handed out; released with the session they came back as the second, and a
    record at its last delivery was archived unseen: the fault harness's kill test)."""
    topic, group = _topic(long_lock), f"g-{uuid.uuid4()}"
    first = _commit_first_three(long_lock, topic, group, 6)
    try:
        assert _stats(long_lock, group).acquired == 3  # 3-5 fetched ahead
    finally:
        first.close()
    stats = _stats(long_lock, group)
    assert (stats.start_offset, stats.acquired, stats.available) == (3, 0, 3)
    with ShareConsumer(long_lock.address, group, request_timeout_ms=10_000) as second:
        second.subscribe([topic])
        counts: dict[int, int] = {}

        def take() -> bool:
            for record in second.poll(200):
                counts[record.offset] = second.delivery_count(record)
            return len(counts) >= 3

        eventually(take, 30, interval_s=0)
        assert counts == {3: 1, 4: 1, 5: 1}


def test_the_unary_calls_still_serve_a_consumer(long_lock: InProcessBroker) -> None:
    topic, group = _topic(long_lock), f"g-{uuid.uuid4()}"
    with ShareConsumer(
        long_lock.address, group, share_fetch_stream=False, request_timeout_ms=10_000
    ) as consumer:
        consumer.subscribe([topic])
        eventually(lambda: bool(consumer.assignment()), 30)
        consumer.poll(timeout_ms=0)
        _produce(long_lock, topic, 4)
        offsets: list[int] = []
        eventually(
            lambda: bool(offsets.extend(r.offset for r in consumer.poll(200))) or len(offsets) >= 4,
            30,
            interval_s=0,
        )
        assert sorted(offsets) == [0, 1, 2, 3]
        assert all(error is None for error in consumer.commit_sync().values())
    stats = _stats(long_lock, group)
    assert (stats.start_offset, stats.acquired) == (4, 0)
