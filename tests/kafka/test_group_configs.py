"""Group configs on the Kafka listener (Kafka 4.x's ConfigResource type GROUP = 32, as
``kafka-configs.sh --entity-type groups`` sends them): IncrementalAlterConfigs v1,
legacy AlterConfigs v2 and DescribeConfigs v4, raw requests (the Python Kafka clients
have no GROUP config resource; confluent-kafka's "group" is the ACL type 3).

Proven: SET and DELETE of ``share.*`` configs and ``errors.deadletterqueue.topic.name``
land (described back with source GROUP_CONFIG, 8, the unset ones DEFAULT_CONFIG with the
broker's value), a bad value or an unknown key is INVALID_CONFIG and changes nothing,
``validate_only`` changes nothing, AlterConfigs replaces the group's configs, and the
change reaches the share group (its ``settings``).
"""

from __future__ import annotations

import socket
from typing import Any

from kafka.protocol.admin import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)

from tests.kafka import raw
from tests.kafka.conftest import KafkaBroker, unique
from tidelog.broker.kafka.errors import error_code_for

TIMEOUT_S = 15.0
GROUP = 32
SET, DELETE, APPEND = 0, 1, 2


def _call(kafka_broker: KafkaBroker, request: Any) -> bytes:
    host, port = kafka_broker.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        answer = raw.call(sock, request, "test-group-configs")
    assert answer is not None
    return answer


def _alter(
    kafka_broker: KafkaBroker,
    group: str,
    changes: list[tuple[str, int, str | None]],
    *,
    validate_only: bool = False,
) -> tuple[int, str | None]:
    alter = IncrementalAlterConfigsRequest[1]
    request = alter(
        resources=[
            alter.AlterConfigsResource(
                resource_type=GROUP,
                resource_name=group,
                configs=[
                    alter.AlterConfigsResource.AlterableConfig(
                        name=name, config_operation=op, value=value
                    )
                    for name, op, value in changes
                ],
            )
        ],
        validate_only=validate_only,
    )
    answer = IncrementalAlterConfigsResponse[1].decode(_call(kafka_broker, request), header=True)
    (result,) = answer.responses
    assert (result.resource_type, result.resource_name) == (GROUP, group)
    return result.error_code, result.error_message


def _describe(kafka_broker: KafkaBroker, group: str) -> dict[str, Any]:
    describe = DescribeConfigsRequest[4]
    request = describe(
        resources=[
            describe.DescribeConfigsResource(
                resource_type=GROUP, resource_name=group, configuration_keys=None
            )
        ],
        include_synonyms=True,
        include_documentation=False,
    )
    (result,) = DescribeConfigsResponse[4].decode(_call(kafka_broker, request), header=True).results
    assert result.error_code == 0, result.error_message
    return {c.name: c for c in result.configs}


def test_group_configs_set_described_and_deleted(kafka_broker: KafkaBroker) -> None:
    group = unique("cfg-group")
    shares = kafka_broker.broker.server.core.shares
    assert shares is not None
    before = _describe(kafka_broker, group)
    assert before["share.delivery.count.limit"].value == "5"
    assert before["share.delivery.count.limit"].config_source == 5  # DEFAULT_CONFIG
    assert [(s.name, s.value) for s in before["share.delivery.count.limit"].synonyms] == [
        ("group.share.delivery.count.limit", "5")
    ]
    assert before["errors.deadletterqueue.topic.name"].value == ""

    assert _alter(
        kafka_broker,
        group,
        [
            ("share.delivery.count.limit", SET, "3"),
            ("errors.deadletterqueue.topic.name", SET, "jobs-dlq"),
            ("share.auto.offset.reset", SET, "earliest"),
        ],
    ) == (0, None)
    configs = _describe(kafka_broker, group)
    limit = configs["share.delivery.count.limit"]
    assert (limit.value, limit.config_source, limit.read_only) == ("3", 8, False)  # GROUP_CONFIG
    assert [(s.name, s.value, s.source) for s in limit.synonyms] == [
        ("share.delivery.count.limit", "3", 8),
        ("group.share.delivery.count.limit", "5", 5),
    ]
    assert configs["errors.deadletterqueue.topic.name"].value == "jobs-dlq"
    assert configs["share.auto.offset.reset"].value == "earliest"
    settings = shares.share_groups.settings(group)
    assert (settings.delivery_count_limit, settings.dead_letter_topic) == (3, "jobs-dlq")

    # validate_only: checked, not stored.
    assert _alter(
        kafka_broker, group, [("share.delivery.count.limit", SET, "7")], validate_only=True
    ) == (0, None)
    assert _describe(kafka_broker, group)["share.delivery.count.limit"].value == "3"

    assert _alter(kafka_broker, group, [("errors.deadletterqueue.topic.name", DELETE, None)]) == (
        0,
        None,
    )
    configs = _describe(kafka_broker, group)
    assert configs["errors.deadletterqueue.topic.name"].config_source == 5
    assert shares.share_groups.settings(group).dead_letter_topic == ""


def test_invalid_group_configs_are_refused_whole(kafka_broker: KafkaBroker) -> None:
    group = unique("cfg-bad")
    invalid = error_code_for("INVALID_CONFIG")
    assert _alter(kafka_broker, group, [("share.delivery.count.limit", SET, "3")]) == (0, None)
    for changes in (
        [("share.delivery.count.limit", SET, "11")],  # above Kafka's 10
        [("share.delivery.count.limit", SET, "many")],
        [("errors.deadletterqueue.topic.name", SET, "__consumer_offsets")],
        [("errors.deadletterqueue.topic.name", SET, "bad name!")],
        [("retention.ms", SET, "1000")],  # a topic's key: not a group config
        [("share.isolation.level", APPEND, "read_committed")],
        # One good change and one bad: neither applies.
        [("share.delivery.count.limit", SET, "4"), ("share.isolation.level", SET, "dirty")],
    ):
        code, message = _alter(kafka_broker, group, changes)
        assert code == invalid, (changes, code, message)
        assert message
    assert _describe(kafka_broker, group)["share.delivery.count.limit"].value == "3"
    repeated = [
        ("share.delivery.count.limit", SET, "4"),
        ("share.delivery.count.limit", DELETE, None),
    ]
    assert _alter(kafka_broker, group, repeated)[0] == error_code_for("INVALID_REQUEST")


def test_legacy_alter_configs_replaces_a_groups_configs(kafka_broker: KafkaBroker) -> None:
    group = unique("cfg-legacy")
    assert _alter(
        kafka_broker,
        group,
        [
            ("share.delivery.count.limit", SET, "3"),
            ("share.isolation.level", SET, "read_committed"),
        ],
    ) == (0, None)
    alter = AlterConfigsRequest[2]
    request = alter(
        resources=[(GROUP, group, [("share.record.lock.duration.ms", "20000")])],
        validate_only=False,
    )
    answer = AlterConfigsResponse[2].decode(_call(kafka_broker, request), header=True)
    (result,) = answer.responses
    assert (result.error_code, result.resource_type, result.resource_name) == (0, GROUP, group)
    configs = _describe(kafka_broker, group)
    assert configs["share.record.lock.duration.ms"].value == "20000"
    assert configs["share.delivery.count.limit"].config_source == 5  # reset by the replace
    assert configs["share.isolation.level"].value == "read_uncommitted"
