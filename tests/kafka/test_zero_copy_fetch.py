"""Zero-copy fetch (issue #31): on a plaintext Kafka listener a Fetch answer's records go
from the segment file to the socket with ``sendfile`` (``broker.kafka.listener``), and the
answer must be byte for byte the one the copying path gives.

Two levels, both against a real broker:

- the core: a fetch with ``FetchSpec.zero_copy`` answers each partition with a
  ``FileRegion``; its bytes (read back) equal the copying fetch's records, and every other
  field of the answer is equal too;
- the wire: the same raw Fetch request on a connection made while ``zero_copy_fetch`` is
  on and on one made while it is off (the listener reads the switch per connection) is
  answered with identical frames, for Fetch v11 (INT32-sized records) and v12 (compact).

Each over data that exercises the limits of a region: many segments (a fetch starting in
one and the regions of another), a compacted log (offsets missing, segments replaced
while a region may be open), aborted transactions read with ``read_committed``, and
``max_bytes`` / ``partition_max_bytes`` cutting an answer over many partitions.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import struct
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer as KafkaProducer

from tests.kafka.conftest import KafkaBroker, unique, wait_until_decided
from tests.kafka.raw import fetch_request, frame, kio_frame, read_frame
from tidelog.broker.core.fetch import FetchSpec, PartitionFetched, PartitionFetchSpec, release
from tidelog.broker.kafka.kip848 import topic_id
from tidelog.broker.kafka.listener import Connection
from tidelog.broker.testing import InProcessBroker
from tidelog.client import Producer, TopicPartition
from tidelog.storage.records import iter_batch_headers

pytestmark = pytest.mark.timeout(180)

TIMEOUT_S = 30.0
PARTITIONS = 6


def _produce(kafka_broker: KafkaBroker, topic: str, partition: int, count: int, size: int,
             keys: int = 0) -> None:  # fmt: skip
    """``count`` records of ``size`` bytes to ``partition``, one batch each (linger 0,
    each waited for); ``keys`` > 0: keyed ``k0``..``k<keys-1>`` in turn."""
    with Producer(kafka_broker.address, acks="all", linger_ms=0) as producer:
        for i in range(count):
            key = f"k{i % keys}".encode() if keys else None
            value = (b"%d-" % i).ljust(size, b"v")
            producer.send(topic, value, key=key, partition=partition).result(TIMEOUT_S)


@pytest.fixture(scope="module")
def segmented(kafka_broker: KafkaBroker) -> str:
    """A topic of ``PARTITIONS`` partitions, each of many small segments."""
    topic = unique("zc-segments")
    kafka_broker.broker.server.core.create_topic(topic, PARTITIONS, {"segment.bytes": "4096"})
    for partition in range(PARTITIONS):
        _produce(kafka_broker, topic, partition, 40 + 10 * partition, 300)
    log = kafka_broker.broker.server.core.logs.get_log(topic, 0)
    assert len(log._local.view.segments) > 3  # the reads below cross segments
    return topic


@pytest.fixture(scope="module")
def compacted(kafka_broker: KafkaBroker) -> str:
    """One partition of keyed records, compacted: most offsets gone, segments replaced."""
    topic = unique("zc-compacted")
    core = kafka_broker.broker.server.core
    core.create_topic(topic, 1, {"cleanup.policy": "compact", "segment.bytes": "4096"})
    _produce(kafka_broker, topic, 0, 120, 200, keys=7)
    log = core.logs.get_log(topic, 0)
    log.roll()  # the active segment is never cleaned
    cleaner = core.logs.cleaner
    assert cleaner is not None
    assert cleaner.clean_log(log, force=True).cleaned
    return topic


@pytest.fixture(scope="module")
def transactional(kafka_broker: KafkaBroker) -> str:
    """One partition of committed and aborted transactions, interleaved, all decided."""
    topic = unique("zc-txn")
    kafka_broker.broker.server.core.create_topic(topic, 1, {"segment.bytes": "4096"})
    producer = KafkaProducer(
        {
            "bootstrap.servers": kafka_broker.bootstrap,
            "transactional.id": unique("zc-app"),
            "linger.ms": 0,
        }
    )
    producer.init_transactions(TIMEOUT_S)
    for round_ in range(6):
        producer.begin_transaction()
        for i in range(5):
            producer.produce(topic, (b"%d-%d-" % (round_, i)).ljust(150, b"t"), partition=0)
            assert producer.flush(TIMEOUT_S) == 0
        if round_ % 2:
            producer.abort_transaction(TIMEOUT_S)
        else:
            producer.commit_transaction(TIMEOUT_S)
    wait_until_decided(kafka_broker.address, TopicPartition(topic, 0))
    return topic


# ------------------------------------------------------------------------------ the core


def _core_fetch(kafka_broker: KafkaBroker, spec: FetchSpec) -> list[PartitionFetched]:
    core = kafka_broker.broker.server.core
    pending = core.start_fetch(spec, wake=lambda: None)
    answers = core.step_fetch(pending)
    assert answers is not None  # max_wait_ms 0: answered at once
    return answers


def _copy_and_zero_copy(kafka_broker: KafkaBroker, spec: FetchSpec) -> Iterator[Any]:
    """Each partition's (copying answer, zero-copy answer, the region's bytes)."""
    copied = _core_fetch(kafka_broker, spec)
    zero = _core_fetch(kafka_broker, dataclasses.replace(spec, zero_copy=True))
    try:
        assert all(not a.records for a in zero)  # no records read: regions only
        for c, z in zip(copied, zero, strict=True):
            assert c.region is None
            yield c, z, z.region.read() if z.region is not None else b""
    finally:
        release(zero)


def _specs(topic: str, offsets: list[int], **limits: Any) -> FetchSpec:
    partition_max = limits.pop("partition_max_bytes", 0)
    return FetchSpec(
        [PartitionFetchSpec(topic, p, o, partition_max) for p, o in enumerate(offsets)],
        **limits,
    )


@pytest.mark.parametrize(
    ("offsets", "limits"),
    [
        ([0] * PARTITIONS, {}),  # whole partitions, many segments each
        ([7, 13, 29, 0, 41, 52], {}),  # mid-segment starts (inside the first batch read)
        ([0] * PARTITIONS, {"max_bytes": 2500}),  # the answer's limit cuts partitions out
        ([3] * PARTITIONS, {"partition_max_bytes": 900}),  # each partition's limit
        ([0] * PARTITIONS, {"partition_max_bytes": 1}),  # only first batches, whole
    ],
)
def test_regions_hold_the_copying_reads_bytes_across_segments(
    kafka_broker: KafkaBroker, segmented: str, offsets: list[int], limits: dict[str, int]
) -> None:
    answered = 0
    for copied, zero, region_bytes in _copy_and_zero_copy(
        kafka_broker, _specs(segmented, offsets, **limits)
    ):
        assert region_bytes == copied.records
        # Every other field as the copying read's (a region carries no batch times).
        assert dataclasses.replace(zero, region=None) == dataclasses.replace(
            copied, records=b"", batch_times=b""
        )
        if copied.records:
            answered += 1
            assert zero.region is not None
            headers = [h for _, h in iter_batch_headers(copied.records, validate=True)]
            assert zero.region.next_offset == headers[-1].next_offset
            assert zero.region.records_count == sum(h.records_count for h in headers)
    assert answered >= 1
    if limits.get("max_bytes"):
        assert answered < PARTITIONS  # the limit did cut some partitions out


def test_regions_of_a_compacted_log_hold_what_survived(
    kafka_broker: KafkaBroker, compacted: str
) -> None:
    for offset in (0, 50, 115):
        spec = _specs(compacted, [offset])
        [(copied, zero, region_bytes)] = list(_copy_and_zero_copy(kafka_broker, spec))
        assert copied.records  # something survived at or after every offset asked for
        assert region_bytes == copied.records
        assert zero.high_watermark == copied.high_watermark


def test_read_committed_regions_name_the_same_aborted_transactions(
    kafka_broker: KafkaBroker, transactional: str
) -> None:
    for offset in (0, 9, 20):
        spec = _specs(transactional, [offset], isolation_level=1)
        [(copied, zero, region_bytes)] = list(_copy_and_zero_copy(kafka_broker, spec))
        assert region_bytes == copied.records
        assert zero.aborted_transactions == copied.aborted_transactions
        assert zero.last_stable_offset == copied.last_stable_offset
    spec = _specs(transactional, [0], isolation_level=1)
    [(copied, _, _)] = list(_copy_and_zero_copy(kafka_broker, spec))
    # A read stays in one segment (as Kafka's): it overlaps some of rounds 1, 3 and 5.
    assert copied.aborted_transactions


def test_a_region_outlives_its_segment_being_compacted_away(
    kafka_broker: KafkaBroker,
) -> None:
    topic = unique("zc-swap")
    core = kafka_broker.broker.server.core
    core.create_topic(topic, 1, {"cleanup.policy": "compact", "segment.bytes": "4096"})
    _produce(kafka_broker, topic, 0, 60, 200, keys=3)
    spec = _specs(topic, [0])
    [before] = _core_fetch(kafka_broker, spec)
    [zero] = _core_fetch(kafka_broker, dataclasses.replace(spec, zero_copy=True))
    try:
        log = core.logs.get_log(topic, 0)
        log.roll()
        cleaner = core.logs.cleaner
        assert cleaner is not None
        assert cleaner.clean_log(log, force=True).cleaned
        log.delete_expired_files(force=True)  # the replaced segments unlinked and closed
        [after] = _core_fetch(kafka_broker, spec)
        assert after.records != before.records  # the log did change under the region
        assert zero.region is not None
        assert zero.region.read() == before.records  # the region still reads what it named
    finally:
        release([zero])


# ------------------------------------------------------------------------------ the wire


@pytest.fixture
def switch(kafka_broker: KafkaBroker) -> Iterator[Any]:
    """Set the listener's ``zero_copy_fetch`` for connections made from now on."""
    listener = kafka_broker.broker.server.kafka
    assert listener is not None
    original = listener.settings
    assert original.zero_copy_fetch  # kafka.zero.copy.fetch defaults to on
    assert original.ssl_context is None  # a plaintext listener: zero copy applies

    def set_to(on: bool) -> None:
        listener.settings = dataclasses.replace(original, zero_copy_fetch=on)

    try:
        yield set_to
    finally:
        listener.settings = original


def _fetch_v11(topic: str, offsets: list[int], max_bytes: int, partition_max: int,
               isolation: int) -> bytes:  # fmt: skip
    request = fetch_request(
        topic,
        max_bytes=max_bytes,
        offsets=offsets,
        partition_max_bytes=partition_max,
        isolation_level=isolation,
    )
    return frame(request, "zero-copy-test")


def _fetch_v13(topic: str, offsets: list[int], max_bytes: int, partition_max: int,
               isolation: int) -> bytes:  # fmt: skip
    body = {
        "replica_id": -1,
        "max_wait": 0,
        "min_bytes": 1,
        "max_bytes": max_bytes,
        "isolation_level": isolation,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [
            {
                "topic_id": topic_id(topic),
                "partitions": [
                    {
                        "partition": p,
                        "current_leader_epoch": -1,
                        "fetch_offset": o,
                        "last_fetched_epoch": -1,
                        "log_start_offset": -1,
                        "partition_max_bytes": partition_max,
                    }
                    for p, o in enumerate(offsets)
                ],
            }
        ],
        "forgotten_topics_data": [],
        "rack_id": "",
    }
    return kio_frame(1, 13, body, "zero-copy-test")


def _answer(kafka_broker: KafkaBroker, request: bytes) -> bytes:
    host, port = kafka_broker.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        sock.sendall(request)
        answer = read_frame(sock)
        assert answer is not None
        return answer


@pytest.mark.parametrize("encode", [_fetch_v11, _fetch_v13], ids=["v11", "v13"])
@pytest.mark.parametrize(
    ("data", "offsets", "max_bytes", "partition_max", "isolation"),
    [
        ("segmented", [0] * PARTITIONS, 1 << 20, 1 << 20, 0),
        ("segmented", [5, 0, 17, 33, 2, 60], 6000, 2000, 0),  # max_bytes truncation
        ("segmented", [0] * PARTITIONS, 1, 1, 0),  # the first batch only, whole
        ("compacted", [0], 1 << 20, 1 << 20, 0),
        ("transactional", [0], 1 << 20, 1 << 20, 1),  # read_committed: aborted txns
        ("transactional", [0], 1 << 20, 1 << 20, 0),
    ],
)
def test_the_wire_answer_is_the_copying_answer_byte_for_byte(
    request: pytest.FixtureRequest,
    kafka_broker: KafkaBroker,
    switch: Any,
    encode: Any,
    data: str,
    offsets: list[int],
    max_bytes: int,
    partition_max: int,
    isolation: int,
) -> None:
    topic = request.getfixturevalue(data)
    fetch = encode(topic, offsets, max_bytes, partition_max, isolation)
    listener = kafka_broker.broker.server.kafka
    assert listener is not None
    switch(True)
    before = listener.sendfile_bytes
    zero = _answer(kafka_broker, fetch)
    sent = listener.sendfile_bytes - before
    switch(False)
    copied = _answer(kafka_broker, fetch)
    assert listener.sendfile_bytes - before == sent  # the copying answer used no sendfile
    assert zero == copied
    assert sent > 0  # the zero-copy answer's records did come from the files
    assert len(zero) > 200 * min(len(offsets), 2)  # records were answered, not only headers


def test_a_connection_keeps_serving_after_zero_copy_answers(
    kafka_broker: KafkaBroker, segmented: str, switch: Any
) -> None:
    """Pipelined: three fetches written at once, answered in order, each complete (the
    sendfile pieces and the bytes between them interleave correctly)."""
    switch(True)
    fetches = [_fetch_v11(segmented, [o] * PARTITIONS, 1 << 20, 4096, 0) for o in (0, 10, 20)]
    host, port = kafka_broker.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        sock.sendall(b"".join(fetches))
        answers = [read_frame(sock) for _ in fetches]
    for fetch, answer in zip(fetches, answers, strict=True):
        assert answer is not None
        assert answer == _answer(kafka_broker, fetch)
        (correlation,) = struct.unpack_from(">i", answer, 0)
        assert correlation == 1


def test_kafka_zero_copy_fetch_false_serves_fetches_by_copying() -> None:
    """The switch, end to end: a broker started with ``kafka.zero.copy.fetch=false``
    answers fetches with the records read and copied (nothing through sendfile)."""
    settings = {"kafka.listen": "127.0.0.1:0", "kafka.zero.copy.fetch": "false"}
    with InProcessBroker(settings=settings) as broker:
        listener = broker.server.kafka
        assert listener is not None
        assert not listener.settings.zero_copy_fetch
        topic = unique("zc-off")
        broker.server.core.create_topic(topic, 1, {})
        with Producer(broker.address, acks="all", linger_ms=0) as producer:
            for i in range(5):
                producer.send(topic, b"value-%d" % i, partition=0).result(TIMEOUT_S)
        host, port = "127.0.0.1", broker.server.kafka_port
        assert port is not None
        with socket.create_connection((host, port), timeout=TIMEOUT_S) as sock:
            sock.sendall(_fetch_v11(topic, [0], 1 << 20, 1 << 20, 0))
            answer = read_frame(sock)
        assert answer is not None
        assert b"value-4" in answer  # the records were answered
        assert listener.sendfile_bytes == 0


def test_a_region_truncated_before_it_is_sent_closes_the_connection(
    kafka_broker: KafkaBroker,
) -> None:
    """The one change a region cannot survive: its file cut below its end (a follower
    truncating a diverged log) after the read. ``sendfile`` sends short, and the
    listener closes the connection rather than answer a frame shorter than its size."""
    topic = unique("zc-cut")
    core = kafka_broker.broker.server.core
    core.create_topic(topic, 1, {})
    _produce(kafka_broker, topic, 0, 20, 100)
    [zero] = _core_fetch(kafka_broker, FetchSpec([PartitionFetchSpec(topic, 0, 0)], zero_copy=True))
    region = zero.region
    assert region is not None
    core.logs.get_log(topic, 0).truncate_to(5)  # the file now ends inside the region
    listener = kafka_broker.broker.server.kafka
    assert listener is not None
    left, right = socket.socketpair()

    async def send() -> None:
        _, writer = await asyncio.open_connection(sock=left)
        try:
            await listener.send_parts(Connection(listener, "test"), writer, [b"head", region])
        finally:
            writer.close()

    with right:
        future = asyncio.run_coroutine_threadsafe(send(), listener._loop)
        with pytest.raises(ConnectionError, match=r"sent \d+ of \d+ bytes"):
            future.result(TIMEOUT_S)
    with pytest.raises(ValueError, match="closed"):
        region.fileno()  # closed by the listener, sent or not
