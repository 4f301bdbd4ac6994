"""Configs through Kafka's admin clients (#27): confluent-kafka's AdminClient
(incremental_alter_configs, alter_configs, describe_configs with synonyms) and
kafka-python's KafkaAdminClient (alter_configs, describe_configs), against the real
broker's Kafka listener."""

from __future__ import annotations

import socket
from typing import Any

import confluent_kafka
import kafka
import kafka.admin
import pytest
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
)

from tests.kafka import raw
from tests.kafka.conftest import KafkaBroker, unique
from tidelog.broker.kafka.errors import error_code_for

TIMEOUT_S = 15.0


def _admin(kafka_broker: KafkaBroker) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka_broker.bootstrap})


def _incremental(name: str, op: AlterConfigOpType, value: str | None = None) -> ConfigEntry:
    return ConfigEntry(name, value, incremental_operation=op)


def test_confluent_incremental_alter_and_describe_with_synonyms(
    kafka_broker: KafkaBroker,
) -> None:
    admin = _admin(kafka_broker)
    topic = unique("cfg-inc")
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(TIMEOUT_S)
    resource = ConfigResource(
        "topic",
        topic,
        incremental_configs=[
            _incremental("retention.ms", AlterConfigOpType.SET, "120000"),
            _incremental("cleanup.policy", AlterConfigOpType.APPEND, "compact"),
        ],
    )
    admin.incremental_alter_configs([resource])[resource].result(TIMEOUT_S)
    plain = ConfigResource("topic", topic)
    configs = admin.describe_configs([plain])[plain].result(TIMEOUT_S)
    retention = configs["retention.ms"]
    assert retention.value == "120000"
    assert retention.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert set(retention.synonyms) == {"retention.ms", "log.retention.ms"}
    assert retention.synonyms["log.retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    assert configs["cleanup.policy"].value == "compact,delete"
    # SUBTRACT and DELETE; validate_only leaves everything as it was.
    resource = ConfigResource(
        "topic",
        topic,
        incremental_configs=[
            _incremental("cleanup.policy", AlterConfigOpType.SUBTRACT, "delete"),
            _incremental("retention.ms", AlterConfigOpType.DELETE),
        ],
    )
    admin.incremental_alter_configs([resource], validate_only=True)[resource].result(TIMEOUT_S)
    configs = admin.describe_configs([plain])[plain].result(TIMEOUT_S)
    assert configs["retention.ms"].value == "120000"
    admin.incremental_alter_configs([resource])[resource].result(TIMEOUT_S)
    configs = admin.describe_configs([plain])[plain].result(TIMEOUT_S)
    assert configs["cleanup.policy"].value == "compact"
    assert configs["retention.ms"].is_default
    # A compacted topic now: a key-less record is refused (INVALID_RECORD).
    producer = confluent_kafka.Producer({"bootstrap.servers": kafka_broker.bootstrap})
    errors: list[confluent_kafka.KafkaError | None] = []
    # One flush each: a batch holding both would be refused as a whole, as Kafka does.
    producer.produce(topic, value=b"no key", on_delivery=lambda e, _m: errors.append(e))
    assert producer.flush(TIMEOUT_S) == 0
    producer.produce(topic, key=b"k", value=b"keyed", on_delivery=lambda e, _m: errors.append(e))
    assert producer.flush(TIMEOUT_S) == 0
    assert errors[0] is not None
    assert errors[0].code() == confluent_kafka.KafkaError.INVALID_RECORD
    assert errors[1] is None


def test_confluent_refusals_carry_kafkas_codes(kafka_broker: KafkaBroker) -> None:
    admin = _admin(kafka_broker)
    topic = unique("cfg-bad")
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(TIMEOUT_S)
    cases = [
        ("topic", topic, "local.retention.ms", "1", confluent_kafka.KafkaError.INVALID_CONFIG),
        ("topic", topic, "retention.ms", "never", confluent_kafka.KafkaError.INVALID_CONFIG),
        (
            "topic",
            topic,
            "min.insync.replicas",
            "3",
            confluent_kafka.KafkaError.POLICY_VIOLATION,
        ),
        (
            "topic",
            unique("missing"),
            "retention.ms",
            "1",
            confluent_kafka.KafkaError.UNKNOWN_TOPIC_OR_PART,
        ),
        ("broker", "0", "num.io.threads", "4", confluent_kafka.KafkaError.INVALID_CONFIG),
    ]
    for kind, name, key, value, code in cases:
        resource = ConfigResource(
            kind, name, incremental_configs=[_incremental(key, AlterConfigOpType.SET, value)]
        )
        with pytest.raises(confluent_kafka.KafkaException) as raised:
            admin.incremental_alter_configs([resource])[resource].result(TIMEOUT_S)
        assert raised.value.args[0].code() == code, (key, raised.value)


def test_confluent_legacy_alter_configs_replaces_the_overrides(
    kafka_broker: KafkaBroker,
) -> None:
    admin = _admin(kafka_broker)
    topic = unique("cfg-legacy")
    admin.create_topics([NewTopic(topic, 1, 1, config={"retention.ms": "1000"})])[topic].result(
        TIMEOUT_S
    )
    resource = ConfigResource("topic", topic, set_config={"segment.ms": "600000"})
    with pytest.warns(DeprecationWarning, match="alter_configs"):
        admin.alter_configs([resource])[resource].result(TIMEOUT_S)
    overrides = kafka_broker.broker.server.core.logs.topic(topic).overrides
    assert dict(overrides) == {"segment.ms": "600000"}  # retention.ms reset, as Kafka


def test_kafka_python_alter_and_describe_topic_and_broker(kafka_broker: KafkaBroker) -> None:
    admin = kafka.KafkaAdminClient(
        bootstrap_servers=kafka_broker.bootstrap, request_timeout_ms=int(TIMEOUT_S * 1000)
    )
    topic = unique("cfg-kp")
    logs = kafka_broker.broker.server.core.logs
    try:
        admin.create_topics([kafka.admin.NewTopic(topic, 1, 1)])
        # incremental=False: the legacy AlterConfigs (key 33) rather than key 44.
        admin.alter_configs(
            [kafka.admin.ConfigResource("TOPIC", topic, configs={"retention.bytes": "1048576"})],
            incremental=False,
        )
        assert logs.get_log(topic, 0).config.retention_bytes == 1_048_576
        # This broker's dynamic value, applied to every topic without its own, live.
        admin.alter_configs(
            [kafka.admin.ConfigResource("BROKER", "0", configs={"log.segment.bytes": "2097152"})]
        )
        assert logs.get_log(topic, 0).config.segment_bytes == 2_097_152
        described = admin.describe_configs(
            [kafka.admin.ConfigResource("TOPIC", topic)],
            config_filter="all",
            include_synonyms=True,
        )
        segment = described["topic"][topic]["segment.bytes"]
        assert segment["value"] == "2097152"
        assert segment["config_source"] == "DYNAMIC_BROKER_CONFIG"
        broker = admin.describe_configs(
            [kafka.admin.ConfigResource("BROKER", "0")], config_filter="all"
        )
        assert broker["broker"]["0"]["log.segment.bytes"]["value"] == "2097152"
        assert broker["broker"]["0"]["log.segment.bytes"]["config_source"] == (
            "DYNAMIC_BROKER_CONFIG"
        )
    finally:
        # Leave the module's broker as it was for the other tests.
        admin.reset_configs(
            [kafka.admin.ConfigResource("BROKER", "0", configs=["log.segment.bytes"])]
        )
        admin.close()
    assert logs.get_log(topic, 0).config.segment_bytes == 1 << 30


def test_the_cluster_wide_default_and_another_broker_raw(kafka_broker: KafkaBroker) -> None:
    """Resource name "" is the cluster-wide dynamic default (the admin clients refuse to
    send it, Kafka's kafka-configs.sh --entity-default does): raw requests. Another
    broker's id is INVALID_REQUEST with Kafka's message, to describe and to alter, as
    Kafka's ZooKeeper-mode brokers answer; a resource type without configs too."""
    from kafka.protocol.admin import (
        DescribeConfigsRequest,
        DescribeConfigsResponse,
        IncrementalAlterConfigsRequest,
        IncrementalAlterConfigsResponse,
    )

    alter = IncrementalAlterConfigsRequest[1]
    describe = DescribeConfigsRequest[4]

    def change(kind: int, name: str, op: int, value: str | None) -> list[tuple[int, str]]:
        request = alter(
            resources=[
                alter.AlterConfigsResource(
                    resource_type=kind,
                    resource_name=name,
                    configs=[
                        alter.AlterConfigsResource.AlterableConfig(
                            name="log.retention.ms", config_operation=op, value=value
                        )
                    ],
                )
            ],
            validate_only=False,
        )
        with socket.create_connection(_address(kafka_broker), timeout=TIMEOUT_S) as sock:
            answer = raw.call(sock, request, "test-configs")
        assert answer is not None
        decoded = IncrementalAlterConfigsResponse[1].decode(answer, header=True)
        return [(r.error_code, r.resource_name) for r in decoded.responses]

    def described(name: str) -> Any:
        request = describe(
            resources=[
                describe.DescribeConfigsResource(
                    resource_type=4, resource_name=name, configuration_keys=None
                )
            ],
            include_synonyms=True,
            include_documentation=True,
        )
        with socket.create_connection(_address(kafka_broker), timeout=TIMEOUT_S) as sock:
            answer = raw.call(sock, request, "test-configs")
        assert answer is not None
        (result,) = DescribeConfigsResponse[4].decode(answer, header=True).results
        return result

    topic = unique("cfg-default")
    kafka_broker.broker.server.core.create_topic(topic, 1, {})
    logs = kafka_broker.broker.server.core.logs
    try:
        assert change(4, "", 0, "3600000") == [(0, "")]
        assert logs.get_log(topic, 0).config.retention_ms == 3_600_000
        result = described("")
        assert result.error_code == 0
        assert [(c.name, c.value, c.config_source) for c in result.configs] == [
            ("log.retention.ms", "3600000", 3)  # DYNAMIC_DEFAULT_BROKER_CONFIG
        ]
        mine = {c.name: c for c in described("0").configs}
        entry = mine["log.retention.ms"]
        assert (entry.value, entry.config_source, entry.read_only) == ("3600000", 3, False)
        assert entry.documentation
        assert entry.config_type == 5  # LONG
        assert [(s.value, s.source) for s in entry.synonyms] == [
            ("3600000", 3),
            ("604800000", 5),
        ]
        assert mine["num.partitions"].read_only
        assert change(4, "7", 0, "1") == [(error_code_for("INVALID_REQUEST"), "7")]
        refused = described("7")
        assert refused.error_code == error_code_for("INVALID_REQUEST")
        # Kafka's words (ConfigHelper.describeConfigs, ZkAdminManager.getBrokerId).
        assert refused.error_message.startswith(
            "Unexpected broker id, expected 0 or empty string, but received 7"
        )
        assert described("seven").error_message == "Broker id must be an integer, but it is: seven"
        assert change(3, "g", 0, "1") == [(error_code_for("INVALID_REQUEST"), "g")]
    finally:
        change(4, "", 1, None)
    assert logs.get_log(topic, 0).config.retention_ms == 7 * 24 * 3600 * 1000


def _address(kafka_broker: KafkaBroker) -> tuple[str, int]:
    host, port = kafka_broker.bootstrap.rsplit(":", 1)
    return host, int(port)


def test_timestamps_out_of_the_topics_bounds_fail_with_invalid_timestamp(
    kafka_broker: KafkaBroker,
) -> None:
    """KIP-937's topic keys through a Kafka producer: a record far in the past fails its
    delivery with INVALID_TIMESTAMP (not retried), a current one is stored."""
    topic = unique("ts-bounds")
    kafka_broker.broker.server.core.create_topic(
        topic, 1, {"message.timestamp.before.max.ms": "60000"}
    )
    producer = confluent_kafka.Producer({"bootstrap.servers": kafka_broker.bootstrap})
    outcomes: list[Any] = []
    producer.produce(topic, b"ancient", timestamp=1, on_delivery=lambda e, m: outcomes.append(e))
    assert producer.flush(20) == 0  # a batch of its own: a refusal fails the whole batch
    producer.produce(topic, b"now", on_delivery=lambda e, m: outcomes.append(e))
    assert producer.flush(20) == 0
    assert [e.code() if e else None for e in outcomes] == [
        confluent_kafka.KafkaError.INVALID_TIMESTAMP,
        None,
    ]
