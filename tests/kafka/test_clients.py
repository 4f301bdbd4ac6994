"""Kafka clients against the Kafka listener of a real broker: produce with each client's
defaults, read back by assign and seek with every other family (and Tidelog's own client
over gRPC) bit for bit, keyed records in the partitions Kafka's partitioners compute, and
topic admin. A missing client library fails the import: nothing here is skipped."""

from __future__ import annotations

import time

import confluent_kafka
import confluent_kafka.admin
import kafka
import kafka.admin
import pytest

from tests.kafka.clients import FAMILIES, TIMEOUT_S, Out, consume, produce
from tests.kafka.conftest import KafkaBroker, unique
from tidelog.broker.config import BrokerConfig
from tidelog.client.partitioner import partition_for_key
from tidelog.storage.errors import InvalidConfigError

pytestmark = pytest.mark.timeout(120)


def _create(broker: KafkaBroker, topic: str, partitions: int) -> None:
    admin = kafka.KafkaAdminClient(
        bootstrap_servers=broker.bootstrap, request_timeout_ms=int(TIMEOUT_S * 1000)
    )
    try:
        admin.create_topics([kafka.admin.NewTopic(topic, partitions, 1)])
    finally:
        admin.close()


def _records(family: str) -> list[Out]:
    now = int(time.time() * 1000)
    return [
        Out(
            f"key-{i}".encode() if i % 3 else None,
            bytes(range(i, i + 40)) if i != 4 else b"",
            (("h", f"{family}-{i}".encode()), ("bin", b"\0\xff")) if i % 2 else (),
            now - 1000 * i,
            i % 2,
        )
        for i in range(6)
    ]


@pytest.mark.parametrize("producer", FAMILIES)
def test_records_read_back_identical_by_every_family(
    kafka_broker: KafkaBroker, producer: str
) -> None:
    topic = unique(f"x-{producer}")
    _create(kafka_broker, topic, 2)
    sent = _records(producer)
    partitions = produce(producer, kafka_broker.bootstrap, kafka_broker.address, topic, sent)
    assert partitions == [r.partition for r in sent]
    expected = sorted(
        ((r.partition, r.key, r.value, r.headers, r.timestamp_ms) for r in sent),
        key=lambda t: t[-1],
    )
    offsets_seen = None
    for reader in FAMILIES:
        got = consume(
            reader, kafka_broker.bootstrap, kafka_broker.address, topic, [0, 1], len(sent)
        )
        # The empty value and the null key survive as such in every family.
        normalized = sorted(
            (
                (
                    r.partition,
                    r.key,
                    r.value if r.value is not None else b"",
                    r.headers,
                    r.timestamp_ms,
                )
                for r in got
            ),
            key=lambda t: t[-1],
        )
        assert normalized == expected, reader
        offsets = [(r.partition, r.offset) for r in got]
        assert offsets == sorted(offsets)
        offsets_seen = offsets_seen or offsets
        assert offsets == offsets_seen, reader


def test_kafka_python_defaults_are_idempotent_and_acks_all(kafka_broker: KafkaBroker) -> None:
    topic = unique("kp-defaults")
    _create(kafka_broker, topic, 1)
    producer = kafka.KafkaProducer(bootstrap_servers=kafka_broker.bootstrap)
    try:
        assert producer.config["enable_idempotence"] is True
        assert producer.config["acks"] == -1
        metas = [producer.send(topic, value=b"v%d" % i).get(TIMEOUT_S) for i in range(5)]
    finally:
        producer.close(TIMEOUT_S)
    assert [m.offset for m in metas] == [0, 1, 2, 3, 4]
    # The broker allocated a producer id, and the batches carry it (DescribeProducers).
    answers = kafka_broker.broker.server.core.describe_producers([(topic, 0)], None)
    (answer,) = answers
    assert answer.error_code == ""
    assert len(answer.producers) == 1
    assert answer.producers[0].producer_id >= 0


@pytest.mark.parametrize("acks", [0, 1, "all"])
def test_confluent_acks(kafka_broker: KafkaBroker, acks: object) -> None:
    topic = unique("acks")
    _create(kafka_broker, topic, 1)
    sent = [Out(None, b"a%d" % i, partition=0) for i in range(20)]
    produce("confluent-kafka", kafka_broker.bootstrap, kafka_broker.address, topic, sent, acks=acks)
    got = consume("kafka-python", kafka_broker.bootstrap, kafka_broker.address, topic, [0], 20)
    assert [r.value for r in got] == [r.value for r in sent]


def test_confluent_idempotent_producer(kafka_broker: KafkaBroker) -> None:
    topic = unique("rdk-idem")
    _create(kafka_broker, topic, 1)
    sent = [Out(b"k", b"i%d" % i, partition=0) for i in range(50)]
    produce(
        "confluent-kafka",
        kafka_broker.bootstrap,
        kafka_broker.address,
        topic,
        sent,
        **{"enable.idempotence": True, "linger.ms": 5},
    )
    got = consume("confluent-kafka", kafka_broker.bootstrap, kafka_broker.address, topic, [0], 50)
    assert [r.value for r in got] == [r.value for r in sent]
    (answer,) = kafka_broker.broker.server.core.describe_producers([(topic, 0)], None)
    assert len(answer.producers) == 1


@pytest.mark.parametrize(
    ("family", "config"),
    [
        ("kafka-python", {}),
        ("aiokafka", {}),
        ("confluent-kafka", {"partitioner": "murmur2_random"}),
        ("tidelog", {}),
    ],
)
def test_keys_land_in_kafkas_murmur2_partition(
    kafka_broker: KafkaBroker, family: str, config: dict[str, str]
) -> None:
    topic = unique("keys")
    _create(kafka_broker, topic, 5)
    sent = [Out(f"user-{i}".encode(), b"x") for i in range(40)]
    reported = produce(family, kafka_broker.bootstrap, kafka_broker.address, topic, sent, **config)
    expected = [partition_for_key(r.key or b"", 5) for r in sent]
    assert reported == expected
    got = consume("kafka-python", kafka_broker.bootstrap, kafka_broker.address, topic, range(5), 40)
    stored = {(r.key, r.partition) for r in got}
    assert stored == {(r.key, p) for r, p in zip(sent, expected, strict=True)}


def test_confluent_default_partitioner_is_honoured(kafka_broker: KafkaBroker) -> None:
    # librdkafka's default (consistent_random: CRC32 of the key) differs from Java's; the
    # broker stores each record where the client put it.
    topic = unique("crc")
    _create(kafka_broker, topic, 4)
    sent = [Out(f"k{i}".encode(), b"v") for i in range(30)]
    reported = produce("confluent-kafka", kafka_broker.bootstrap, kafka_broker.address, topic, sent)
    got = consume("aiokafka", kafka_broker.bootstrap, kafka_broker.address, topic, range(4), 30)
    assert {(r.key, r.partition) for r in got} == {
        (r.key, p) for r, p in zip(sent, reported, strict=True)
    }


def test_admin_create_list_delete_with_kafka_python(kafka_broker: KafkaBroker) -> None:
    admin = kafka.KafkaAdminClient(
        bootstrap_servers=kafka_broker.bootstrap, request_timeout_ms=int(TIMEOUT_S * 1000)
    )
    topic = unique("admin-kp")
    try:
        admin.create_topics([kafka.admin.NewTopic(topic, 4, 1)])
        assert topic in admin.list_topics()
        with pytest.raises(kafka.errors.TopicAlreadyExistsError):
            admin.create_topics([kafka.admin.NewTopic(topic, 4, 1)], raise_errors=True)
        admin.create_partitions({topic: kafka.admin.NewPartitions(6)})
        described = admin.describe_topics([topic])
        assert len(described[0]["partitions"]) == 6
        admin.delete_topics([topic])
        assert topic not in admin.list_topics()
        # Tidelog's own view agrees.
        names = [t.name for t in kafka_broker.broker.server.core.list_topics(False)]
        assert topic not in names
    finally:
        admin.close()


def test_admin_create_list_delete_with_confluent(kafka_broker: KafkaBroker) -> None:
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    topic = unique("admin-rdk")
    futures = admin.create_topics([confluent_kafka.admin.NewTopic(topic, 3, 1)])
    futures[topic].result(TIMEOUT_S)
    listed = admin.list_topics(timeout=TIMEOUT_S)
    assert len(listed.topics[topic].partitions) == 3
    assert listed.brokers[0].port == int(kafka_broker.bootstrap.rsplit(":", 1)[1])
    admin.delete_topics([topic])[topic].result(TIMEOUT_S)
    assert topic not in admin.list_topics(timeout=TIMEOUT_S).topics


def test_list_offsets_by_spec_with_confluent(kafka_broker: KafkaBroker) -> None:
    """AdminClient.list_offsets: earliest, latest, a timestamp, and max_timestamp
    (ListOffsets v7's -3, KIP-734: the first record with the largest timestamp)."""
    topic = unique("offsets-rdk")
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    admin.create_topics([confluent_kafka.admin.NewTopic(topic, 1, 1)])[topic].result(TIMEOUT_S)
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": kafka_broker.bootstrap, "linger.ms": 0}
    )
    for ts in (5_000, 9_000, 7_000, 9_000, 1_000):
        producer.produce(topic, b"x", partition=0, timestamp=ts)
        producer.flush(TIMEOUT_S)  # one batch each: the timestamps are the records' own
    tp = confluent_kafka.TopicPartition(topic, 0)
    spec = confluent_kafka.admin.OffsetSpec

    def ask(offset_spec: object) -> tuple[int, int]:
        found = admin.list_offsets({tp: offset_spec})[tp].result(TIMEOUT_S)
        return found.offset, found.timestamp

    assert ask(spec.earliest())[0] == 0
    assert ask(spec.latest())[0] == 5
    assert ask(spec.for_timestamp(6_000)) == (1, 9_000)
    assert ask(spec.max_timestamp()) == (1, 9_000)


def test_metadata_does_not_create_topics_unless_enabled(kafka_broker: KafkaBroker) -> None:
    topic = unique("nocreate")
    consumer = kafka.KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap)
    try:
        # kafka-python's consumer asks for auto-creation by default; the broker says no.
        assert not consumer.partitions_for_topic(topic)
    finally:
        consumer.close()
    names = [t.name for t in kafka_broker.broker.server.core.list_topics(False)]
    assert topic not in names


@pytest.mark.parametrize("family", ["kafka-python", "confluent-kafka", "aiokafka"])
def test_lz4_batches_are_stored_and_read_back(kafka_broker: KafkaBroker, family: str) -> None:
    topic = unique(f"lz4-{family}")
    _create(kafka_broker, topic, 1)
    option = {"confluent-kafka": {"compression.type": "lz4"}}.get(
        family, {"compression_type": "lz4"}
    )
    sent = [Out(b"k%d" % i, b"compressible " * 20 + b"%d" % i, partition=0) for i in range(30)]
    produce(family, kafka_broker.bootstrap, kafka_broker.address, topic, sent, **option)
    for reader in ("tidelog", "confluent-kafka"):
        got = consume(reader, kafka_broker.bootstrap, kafka_broker.address, topic, [0], 30)
        assert [(r.key, r.value) for r in got] == [(r.key, r.value) for r in sent]
    # The batches were stored compressed, as sent (attributes bits 0-2: 3 is lz4).
    read = kafka_broker.broker.server.core.logs.get_log(topic, 0).read(0, 1 << 20)
    assert read.records[21 + 1] & 0x07 == 3


def test_kafka_listen_is_accepted_with_a_cluster() -> None:
    # Cluster mode registers the Kafka endpoint (tests/kafka/test_cluster.py).
    config = BrokerConfig.from_mapping(
        {"kafka.listen": "127.0.0.1:0", "zookeeper.connect": "127.0.0.1:2181"}
    )
    assert config.kafka_listen == "127.0.0.1:0"
    with pytest.raises(InvalidConfigError, match=r"kafka\.listen"):
        BrokerConfig.from_mapping({"kafka.listen": "no-port"})


def test_describe_configs_and_cluster_with_kafka_python(kafka_broker: KafkaBroker) -> None:
    topic = unique("cfg")
    admin = kafka.KafkaAdminClient(
        bootstrap_servers=kafka_broker.bootstrap, request_timeout_ms=int(TIMEOUT_S * 1000)
    )
    try:
        admin.create_topics(
            [kafka.admin.NewTopic(topic, 1, 1, topic_configs={"retention.ms": "12345"})]
        )
        described = admin.describe_configs(
            [kafka.admin.ConfigResource("TOPIC", topic)], config_filter="all"
        )
        configs = described["topic"][topic]
        assert configs["retention.ms"]["value"] == "12345"
        assert configs["retention.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
        assert configs["cleanup.policy"]["value"] == "delete"
        assert len(configs) > 10  # every effective key, not only the override
        broker = admin.describe_configs(
            [kafka.admin.ConfigResource("BROKER", "0")], config_filter="all"
        )
        assert broker["broker"]["0"]["num.partitions"]["value"] == "3"
        cluster = admin.describe_cluster()
        host, port = kafka_broker.bootstrap.rsplit(":", 1)
        assert [(b["host"], b["port"]) for b in cluster["brokers"]] == [(host, int(port))]
        assert cluster["controller_id"] == 0
    finally:
        admin.close()


def test_describe_configs_with_confluent(kafka_broker: KafkaBroker) -> None:
    topic = unique("cfg-rdk")
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    admin.create_topics(
        [confluent_kafka.admin.NewTopic(topic, 1, 1, config={"cleanup.policy": "compact"})]
    )[topic].result(TIMEOUT_S)
    resource = confluent_kafka.admin.ConfigResource("topic", topic)
    configs = admin.describe_configs([resource])[resource].result(TIMEOUT_S)
    assert configs["cleanup.policy"].value == "compact"
    assert (
        configs["cleanup.policy"].source
        == confluent_kafka.admin.ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    )
    assert configs["retention.ms"].is_default
