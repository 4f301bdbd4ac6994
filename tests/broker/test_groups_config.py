"""The group settings of ``BrokerConfig``: Kafka's names, defaults and consistency checks."""

from __future__ import annotations

import pytest

from tidelog.broker.config import BrokerConfig
from tidelog.storage.errors import InvalidConfigError


def test_defaults_are_kafkas() -> None:
    groups = BrokerConfig().group_config()
    assert groups.coordinator.heartbeat_interval_ms == 5_000
    assert groups.coordinator.session_timeout_ms == 45_000
    assert groups.coordinator.min_session_timeout_ms == 45_000
    assert groups.coordinator.max_session_timeout_ms == 60_000
    assert groups.offsets.num_partitions == 5  # Kafka: 50 (docs/groups.md says why)
    assert groups.offsets.segment_bytes == 100 * 1024 * 1024
    assert groups.offset_metadata_max_bytes == 4_096
    assert groups.initial_rebalance_delay_ms == 3_000  # group.initial.rebalance.delay.ms


def test_settings_by_kafka_name_round_trip() -> None:
    config = BrokerConfig.from_mapping(
        {
            "group.consumer.heartbeat.interval.ms": "50",
            "group.consumer.min.session.timeout.ms": 100,
            "group.consumer.session.timeout.ms": 200,
            "group.consumer.max.session.timeout.ms": 300,
            "offsets.topic.num.partitions": 1,
            "offset.metadata.max.bytes": 10,
            "group.initial.rebalance.delay.ms": 0,
        }
    )
    groups = config.group_config()
    assert groups.initial_rebalance_delay_ms == 0
    assert groups.coordinator.session_timeout_for(1_000) == 300
    assert groups.offsets.num_partitions == 1
    assert BrokerConfig.from_mapping(config.to_mapping()) == config


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"group.consumer.heartbeat.interval.ms": 45_000}, "group.consumer.heartbeat.interval.ms"),
        ({"group.consumer.session.timeout.ms": 70_000}, "group.consumer.session.timeout.ms"),
        (
            {"group.consumer.min.session.timeout.ms": 70_000},
            "group.consumer.min.session.timeout.ms",
        ),
        ({"offsets.topic.num.partitions": 0}, "offsets.topic.num.partitions"),
        ({"offset.metadata.max.bytes": 40_000}, "offset.metadata.max.bytes"),
        ({"group.initial.rebalance.delay.ms": -1}, "group.initial.rebalance.delay.ms"),
    ],
)
def test_inconsistent_settings_are_refused(settings: dict[str, object], key: str) -> None:
    with pytest.raises(InvalidConfigError, match=key):
        BrokerConfig.from_mapping(settings)
