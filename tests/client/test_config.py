"""Configuration dataclasses: defaults, validation, and parsing from text."""

from __future__ import annotations

import dataclasses

import pytest

from tidelog.client.config import (
    AdminConfig,
    ConsumerConfig,
    ProducerConfig,
    parse_acks,
    parse_bootstrap,
)


def test_producer_defaults() -> None:
    config = ProducerConfig()
    assert config.bootstrap_servers == "127.0.0.1:7410"
    assert config.acks_value == -1
    assert config.enable_idempotence
    assert config.max_in_flight_requests_per_connection == 5
    assert config.buffer_memory == 4 * 1024 * 1024  # not Kafka's 32 MiB: see config.py
    assert config.compression is None


def test_configs_are_frozen_and_keyword_only() -> None:
    config = ProducerConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.linger_ms = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        ProducerConfig("127.0.0.1:1")  # type: ignore[misc]


@pytest.mark.parametrize(
    ("value", "expected"), [("all", -1), ("ALL", -1), (-1, -1), ("1", 1), (0, 0), ("0", 0)]
)
def test_acks_values(value: int | str, expected: int) -> None:
    assert parse_acks(value) == expected


@pytest.mark.parametrize("value", ["2", 5, "most", True])
def test_bad_acks(value: int | str) -> None:
    with pytest.raises(ValueError, match="acks"):
        parse_acks(value)


@pytest.mark.parametrize("value", ["", "localhost", "host:", ":80", "host:99999", "host:x"])
def test_bad_bootstrap(value: str) -> None:
    with pytest.raises(ValueError, match="bootstrap_servers"):
        parse_bootstrap(value)


def test_bootstrap_list_is_normalised_and_ipv6_kept() -> None:
    assert parse_bootstrap("a:1, b:2") == "a:1,b:2"
    assert parse_bootstrap("[::1]:7410") == "[::1]:7410"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"linger_ms": -1}, "linger_ms"),
        ({"batch_size": 0}, "batch_size"),
        ({"compression": "brotli"}, "compression"),
        ({"max_in_flight_requests_per_connection": 6}, "<= 5"),
        ({"acks": 0}, "acks=0"),
        ({"delivery_timeout_ms": 100, "request_timeout_ms": 200}, "delivery_timeout_ms"),
        ({"retries": 1.5}, "retries"),
        ({"buffer_memory": 2**40}, "int32"),
    ],
)
def test_producer_validation(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ProducerConfig(**settings)  # type: ignore[arg-type]


def test_idempotence_off_allows_acks_zero_and_more_in_flight() -> None:
    config = ProducerConfig(
        acks=0, enable_idempotence=False, max_in_flight_requests_per_connection=10
    )
    assert config.acks_value == 0


def test_from_mapping_accepts_kafka_names_and_text() -> None:
    config = ProducerConfig.from_mapping(
        {
            "bootstrap.servers": "10.0.0.1:9",
            "linger.ms": "20",
            "compression.type": "lz4",
            "enable.idempotence": "false",
            "acks": "1",
        }
    )
    assert config.bootstrap_servers == "10.0.0.1:9"
    assert config.linger_ms == 20
    assert config.compression == "lz4"
    assert config.enable_idempotence is False
    assert config.acks_value == 1


def test_from_mapping_rejects_unknown_keys_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown ProducerConfig setting 'lingr_ms'.*linger_ms"):
        ProducerConfig.from_mapping({"lingr_ms": 5})
    with pytest.raises(ValueError, match="must be an integer"):
        ProducerConfig.from_mapping({"linger_ms": "soon"})
    with pytest.raises(ValueError, match="true or false"):
        ConsumerConfig.from_mapping({"enable_auto_commit": "maybe"})


def test_consumer_defaults_and_validation() -> None:
    config = ConsumerConfig()
    assert config.auto_offset_reset == "latest"
    assert config.group_id is None
    assert config.max_poll_records == 500
    with pytest.raises(ValueError, match="auto_offset_reset"):
        ConsumerConfig(auto_offset_reset="smallest")
    with pytest.raises(ValueError, match="fetch_max_wait_ms"):
        ConsumerConfig(request_timeout_ms=100, fetch_max_wait_ms=500)
    with pytest.raises(ValueError, match="group_id"):
        ConsumerConfig(group_id="")
    assert (
        ConsumerConfig.from_mapping({"group.id": "g", "consumer_timeout_ms": "none"}).group_id
        == "g"
    )


def test_admin_config() -> None:
    assert AdminConfig.from_mapping({"request.timeout.ms": "500"}).request_timeout_ms == 500
    with pytest.raises(ValueError, match="request_timeout_ms"):
        AdminConfig(request_timeout_ms=0)
