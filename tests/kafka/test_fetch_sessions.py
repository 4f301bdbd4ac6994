"""Incremental fetch sessions (KIP-227) on the Kafka listener: the cache's rules on their
own, then raw Fetch v11 requests against a real broker (a session made, answers with only
what changed, partitions forgotten, Kafka's errors for an unknown session or a wrong
epoch, a session closed), and kafka-python's consumer, which uses sessions, reading many
partitions."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import kafka
import pytest
from kafka.protocol.consumer import FetchRequest, FetchResponse

from tests.kafka import raw
from tests.kafka.clients import TIMEOUT_S
from tests.kafka.conftest import KafkaBroker, unique
from tidelog.broker.core.fetch_sessions import FetchSessionCache, SessionError, Update
from tidelog.broker.kafka.kip848 import topic_id
from tidelog.client import AdminClient, Producer

pytestmark = pytest.mark.timeout(60)

# ---------------------------------------------------------------------- the cache alone


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def _update(partition: int, offset: int = 0) -> Update:
    return Update(("t", partition), offset, 1024, -1)


def test_a_session_moves_its_epoch_and_refuses_a_stale_or_unknown_one() -> None:
    cache = FetchSessionCache(10, 1_000, Clock())
    session = cache.create([_update(0), _update(1)])
    assert session is not None
    assert session.next_epoch == 1
    cache.continue_session(session.session_id, 1, [_update(1, 5)], [("t", 0)])
    assert [(k, c.fetch_offset) for k, c in session.partitions.items()] == [(("t", 1), 5)]
    assert session.next_epoch == 2
    with pytest.raises(SessionError) as stale:
        cache.continue_session(session.session_id, 1, [], [])  # a retried request
    assert stale.value.code == "INVALID_FETCH_SESSION_EPOCH"
    with pytest.raises(SessionError) as unknown:
        cache.continue_session(session.session_id + 1, 1, [], [])
    assert unknown.value.code == "FETCH_SESSION_ID_NOT_FOUND"
    cache.close(session.session_id)
    assert len(cache) == 0


def test_a_full_cache_evicts_only_an_idle_session() -> None:
    clock = Clock()
    cache = FetchSessionCache(2, 1_000, clock)
    first, second = cache.create([_update(0)]), cache.create([_update(0)])
    assert first is not None
    assert second is not None
    clock.now = 500
    cache.continue_session(first.session_id, 1, [], [])  # first is the recently used one
    assert cache.create([_update(0)]) is None  # second idle 500 ms only: no slot
    clock.now = 1_200
    third = cache.create([_update(0)])
    assert third is not None
    assert cache.get(second.session_id) is None  # the least recently used went
    assert cache.get(first.session_id) is not None
    assert FetchSessionCache(0, 0, clock).create([_update(0)]) is None


def test_epochs_wrap_past_the_largest_int32() -> None:
    cache = FetchSessionCache(1, 0, Clock())
    session = cache.create([_update(0)])
    assert session is not None
    session.next_epoch = 0x7FFFFFFF
    cache.continue_session(session.session_id, 0x7FFFFFFF, [], [])
    assert session.next_epoch == 1


# ---------------------------------------------------------------------- on the wire


@pytest.fixture
def sock(kafka_broker: KafkaBroker) -> Iterator[socket.socket]:
    host, port = kafka_broker.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as connection:
        connection.settimeout(TIMEOUT_S)
        yield connection


def _fetch(
    sock: socket.socket,
    session_id: int,
    epoch: int,
    offsets: dict[tuple[str, int], int],
    forgotten: dict[str, list[int]] | None = None,
    version: int = 11,
) -> Any:
    """Fetch ``version`` (11, or 13+: topics named by their ids)."""

    def named(topic: str) -> dict[str, Any]:
        return {"topic_id": topic_id(topic)} if version >= 13 else {"topic": topic}

    by_topic: dict[str, list[Any]] = {}
    for (name, partition), offset in offsets.items():
        by_topic.setdefault(name, []).append(
            FetchRequest.FetchTopic.FetchPartition(
                partition=partition,
                current_leader_epoch=-1,
                fetch_offset=offset,
                last_fetched_epoch=-1,
                log_start_offset=-1,
                partition_max_bytes=1 << 20,
            )
        )
    request = FetchRequest[version](
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=0,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=session_id,
        session_epoch=epoch,
        topics=[FetchRequest.FetchTopic(**named(t), partitions=ps) for t, ps in by_topic.items()],
        forgotten_topics_data=[
            FetchRequest.ForgottenTopic(**named(t), partitions=ps)
            for t, ps in (forgotten or {}).items()
        ],
        rack_id="",
    )
    answer = raw.call(sock, request, "test-sessions")
    assert answer is not None, "the broker hung up"
    return FetchResponse[version].decode(answer, header=True)


def _answered(response: Any) -> dict[int, tuple[int, bool]]:
    """partition -> (high watermark, whether records came)."""
    return {
        p.partition_index: (p.high_watermark, bool(p.records))
        for t in response.responses
        for p in t.partitions
    }


@pytest.mark.parametrize("version", [11, 16])
def test_an_incremental_fetch_answers_only_what_changed(
    kafka_broker: KafkaBroker, sock: socket.socket, version: int
) -> None:
    """v16 names the topics by id (Metadata's), in the fetch, the answer and the
    forgotten topics alike."""
    topic = unique("sessions")
    with AdminClient(kafka_broker.address) as admin:
        admin.create_topic(topic, 3)
    with Producer(kafka_broker.address, linger_ms=0) as producer:
        producer.send(topic, b"zero", partition=0).result(TIMEOUT_S)

    first = _fetch(sock, 0, 0, {(topic, p): 0 for p in range(3)}, version=version)
    assert first.error_code == 0
    assert first.session_id != 0
    assert _answered(first) == {0: (1, True), 1: (0, False), 2: (0, False)}
    session = first.session_id

    # Nothing new: partition 0 asked on from offset 1, the others unchanged.
    quiet = _fetch(sock, session, 1, {(topic, 0): 1}, version=version)
    assert (quiet.error_code, quiet.session_id, _answered(quiet)) == (0, session, {})

    with Producer(kafka_broker.address, linger_ms=0) as producer:
        producer.send(topic, b"two", partition=2).result(TIMEOUT_S)
    moved = _fetch(sock, session, 2, {}, version=version)
    assert _answered(moved) == {2: (1, True)}  # read from the offset the session keeps

    # Partition 2 forgotten: new records there are not answered any more.
    with Producer(kafka_broker.address, linger_ms=0) as producer:
        producer.send(topic, b"two again", partition=2).result(TIMEOUT_S)
    dropped = _fetch(sock, session, 3, {}, forgotten={topic: [2]}, version=version)
    assert _answered(dropped) == {}

    stale = _fetch(sock, session, 3, {}, version=version)
    assert (stale.error_code, stale.session_id, stale.responses) == (71, 0, [])
    closed = _fetch(sock, session, -1, {(topic, 0): 0}, version=version)
    assert (closed.session_id, _answered(closed)) == (0, {0: (1, True)})
    gone = _fetch(sock, session, 4, {}, version=version)
    assert gone.error_code == 70  # FETCH_SESSION_ID_NOT_FOUND
    if version >= 13:
        assert {t.topic_id for t in first.responses} == {topic_id(topic)}


def test_a_topic_id_of_no_topic_or_of_a_deleted_one_is_unknown(
    kafka_broker: KafkaBroker, sock: socket.socket
) -> None:
    """Fetch v13+: ``UNKNOWN_TOPIC_ID`` (100) per partition, as Kafka answers."""
    topic = unique("deleted")
    with AdminClient(kafka_broker.address) as admin:
        admin.create_topic(topic, 1)
        assert _answered(_fetch(sock, 0, -1, {(topic, 0): 0}, version=16)) == {0: (0, False)}
        admin.delete_topic(topic)
    for name in (topic, unique("never")):
        answer = _fetch(sock, 0, -1, {(name, 0): 0}, version=16)
        ((found,),) = [t.partitions for t in answer.responses]
        assert found.error_code == 100


def test_kafka_python_reads_many_partitions_through_a_session(kafka_broker: KafkaBroker) -> None:
    topic = unique("sessions-kp")
    with AdminClient(kafka_broker.address) as admin:
        admin.create_topic(topic, 8)
    sent = {f"v{i}".encode() for i in range(80)}
    with Producer(kafka_broker.address) as producer:
        for i, value in enumerate(sorted(sent)):
            producer.send(topic, value, partition=i % 8)
    consumer = kafka.KafkaConsumer(
        topic,
        bootstrap_servers=kafka_broker.bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=int(TIMEOUT_S * 1000),
    )
    got: set[bytes] = set()
    try:
        for record in consumer:
            got.add(record.value)
            if len(got) == len(sent):
                break
    finally:
        consumer.close()
    assert got == sent
    assert len(kafka_broker.broker.server.kafka.fetch_sessions) >= 1  # it made a session
