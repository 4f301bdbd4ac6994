"""Compressed batches from Kafka clients: stored as sent, read back by every reader.

Each client family produces with each of Kafka's codecs (gzip, snappy, zstd, lz4) through
the Kafka listener; the log holds the batches compressed as they came (attribute bits
0-2), and Tidelog's own consumer and another client family read back the same records,
bit for bit. kcat (librdkafka 2.0.2) and Tidelog's own producer produce them too, and a
compacted topic of compressed batches is cleaned and stays readable, still compressed. A
missing codec library fails the test: nothing here is skipped.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.kafka.clients import TIMEOUT_S, Out, Rec, consume, produce
from tests.kafka.conftest import KafkaBroker, unique
from tidelog import client
from tidelog.storage.records import Compression, iter_batch_headers

pytestmark = pytest.mark.timeout(120)

CODECS = ["gzip", "snappy", "zstd", "lz4"]
# Who reads back what each family wrote, besides Tidelog's consumer.
OTHER_READER = {
    "kafka-python": "confluent-kafka",
    "confluent-kafka": "aiokafka",
    "aiokafka": "kafka-python",
}


def _records(count: int, *, keys: int | None = None) -> list[Out]:
    # Compressible values (a client sends a batch that does not shrink uncompressed), with
    # headers and explicit timestamps so that every field is compared.
    return [
        Out(
            b"key-%d" % (i % keys if keys else i),
            b"a compressible value, again and again " * 8 + b"%d" % i,
            (("h", b"%d" % i), ("bin", b"\0\xff")) if i % 2 else (),
            1_700_000_000_000 + i,
            0,
        )
        for i in range(count)
    ]


def _stored_codecs(broker: KafkaBroker, topic: str) -> set[Compression]:
    log = broker.broker.server.core.logs.get_log(topic, 0)
    data = log.read(log.log_start_offset, 64 << 20).records
    # An emptied batch the cleaner keeps (a producer's last) is uncompressed, as Kafka's.
    return {h.compression for _, h in iter_batch_headers(data) if h.records_count}


def _as_sent(records: list[Rec]) -> list[tuple[object, ...]]:
    return [(r.key, r.value, r.headers, r.timestamp_ms) for r in records]


def _option(family: str, codec: str) -> dict[str, str]:
    return (
        {"compression.type": codec} if family == "confluent-kafka" else {"compression_type": codec}
    )


@pytest.mark.parametrize(
    ("sent_as", "stored_as"), [("snappy", "zstd"), ("lz4", "uncompressed"), ("none", "gzip")]
)
def test_a_topics_compression_type_recompresses_what_producers_send(
    kafka_broker: KafkaBroker, sent_as: str, stored_as: str
) -> None:
    """Kafka's ``compression.type``: the log holds the topic's codec whatever the
    producer used, and every reader gets the records as sent."""
    topic = unique(f"recompress-{stored_as}")
    kafka_broker.broker.server.core.create_topic(topic, 1, {"compression.type": stored_as})
    sent = _records(30)
    produce(
        "confluent-kafka",
        kafka_broker.bootstrap,
        kafka_broker.address,
        topic,
        sent,
        **_option("confluent-kafka", sent_as),
    )
    codec = Compression.NONE if stored_as == "uncompressed" else Compression[stored_as.upper()]
    assert _stored_codecs(kafka_broker, topic) == {codec}
    for reader in ("tidelog", "kafka-python"):
        got = consume(reader, kafka_broker.bootstrap, kafka_broker.address, topic, [0], 30)
        assert _as_sent(got) == [(o.key, o.value, o.headers, o.timestamp_ms) for o in sent]


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("family", list(OTHER_READER))
def test_compressed_batches_are_stored_as_sent_and_read_back_by_all(
    kafka_broker: KafkaBroker, family: str, codec: str
) -> None:
    topic = unique(f"{codec}-{family}")
    kafka_broker.broker.server.core.create_topic(topic, 1, {})
    sent = _records(40)
    produce(
        family, kafka_broker.bootstrap, kafka_broker.address, topic, sent, **_option(family, codec)
    )
    assert _stored_codecs(kafka_broker, topic) == {Compression[codec.upper()]}
    ours = consume("tidelog", kafka_broker.bootstrap, kafka_broker.address, topic, [0], 40)
    theirs = consume(
        OTHER_READER[family], kafka_broker.bootstrap, kafka_broker.address, topic, [0], 40
    )
    assert ours == theirs  # partition, offset, key, value, headers and timestamp
    assert [r.offset for r in ours] == list(range(40))
    expected = [(r.key, r.value, r.headers, r.timestamp_ms) for r in sent]
    assert _as_sent(ours) == expected


@pytest.mark.parametrize("codec", CODECS)
def test_kcat_produces_compressed_batches(kafka_broker: KafkaBroker, codec: str) -> None:
    path = shutil.which("kcat")
    assert path is not None, "kcat is not installed: apt-get install kcat (make venv does)"
    topic = unique(f"kcat-{codec}")
    kafka_broker.broker.server.core.create_topic(topic, 1, {})
    lines = [f"key{i}:value {i} " + "compressible " * 10 for i in range(30)]
    done = subprocess.run(
        [path, "-b", kafka_broker.bootstrap, "-P", "-t", topic, "-p", "0", "-K", ":", "-z", codec],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert _stored_codecs(kafka_broker, topic) == {Compression[codec.upper()]}
    for family in ("tidelog", "aiokafka"):
        got = consume(family, kafka_broker.bootstrap, kafka_broker.address, topic, [0], 30)
        assert [(r.key, r.value) for r in got] == [
            tuple(line.encode().split(b":", 1)) for line in lines
        ]


@pytest.mark.parametrize("codec", ["gzip", "snappy", "zstd"])
def test_a_compacted_topic_of_compressed_batches_is_cleaned_in_its_codec(
    kafka_broker: KafkaBroker, codec: str
) -> None:
    topic = unique(f"compact-{codec}")
    core = kafka_broker.broker.server.core
    core.create_topic(topic, 1, {"cleanup.policy": "compact"})
    # Four batches (one per produce call) overwriting the same five keys.
    for round_ in range(4):
        batch = [r._replace(value=r.value + b"-round-%d" % round_) for r in _records(10, keys=5)]
        produce(
            "kafka-python",
            kafka_broker.bootstrap,
            kafka_broker.address,
            topic,
            batch,
            **_option("kafka-python", codec),
        )
    log = core.logs.get_log(topic, 0)
    log.roll()  # the active segment is never cleaned
    cleaner = core.logs.cleaner
    assert cleaner is not None
    assert cleaner.clean_log(log, force=True).cleaned
    assert _stored_codecs(kafka_broker, topic) == {Compression[codec.upper()]}
    # What survives: each key's last value (offsets 35-39 of the last round), as produced.
    latest = _records(10, keys=5)[5:]
    expected = [(r.key, r.value + b"-round-3", r.headers, r.timestamp_ms) for r in latest]
    for family in ("tidelog", "confluent-kafka"):
        got = consume(family, kafka_broker.bootstrap, kafka_broker.address, topic, [0], 5)
        assert [r.offset for r in got] == [35, 36, 37, 38, 39]
        assert _as_sent(got) == expected


@pytest.mark.parametrize("codec", CODECS)
def test_tidelogs_producer_compresses_with_kafkas_codecs(
    kafka_broker: KafkaBroker, codec: str
) -> None:
    topic = unique(f"tidelog-{codec}")
    kafka_broker.broker.server.core.create_topic(topic, 1, {})
    sent = _records(40)
    with client.Producer(kafka_broker.address, compression=codec, linger_ms=50) as producer:
        futures = [
            producer.send(
                topic,
                value=r.value,
                key=r.key,
                headers=list(r.headers),
                partition=0,
                timestamp_ms=r.timestamp_ms,
            )
            for r in sent
        ]
        producer.flush(int(TIMEOUT_S * 1000))
        assert [f.result(TIMEOUT_S).offset for f in futures] == list(range(40))
    assert _stored_codecs(kafka_broker, topic) == {Compression[codec.upper()]}
    expected = [(r.key, r.value, r.headers, r.timestamp_ms) for r in sent]
    for family in ("confluent-kafka", "kafka-python"):
        got = consume(family, kafka_broker.bootstrap, kafka_broker.address, topic, [0], 40)
        assert _as_sent(got) == expected
