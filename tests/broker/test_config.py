"""BrokerConfig: Kafka broker names, TOML, --set and flags, clear errors."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from tidelog.broker.cli import config_from_args
from tidelog.broker.config import BrokerConfig, broker_keys, load_toml, parse_listen
from tidelog.storage.errors import InvalidConfigError

HOUR_MS = 3_600_000


def test_embedded_defaults_are_the_documented_ones() -> None:
    config = BrokerConfig()
    assert config.listen_address == "127.0.0.1:7410"
    assert config.data_dir == Path("./tidelog-data")
    assert config.message_max_bytes == 1_048_588
    assert config.socket_request_max_bytes == 104_857_600
    assert config.log_defaults.retention_ms == 168 * HOUR_MS
    assert BrokerConfig.from_mapping({}) == config


def test_kafka_names_map_to_fields_and_topic_defaults() -> None:
    config = BrokerConfig.from_mapping(
        {
            "listeners": "PLAINTEXT://0.0.0.0:9092",
            "log.dirs": "/var/lib/tidelog",
            "num.partitions": "3",
            "message.max.bytes": 2048,
            "socket.request.max.bytes": "65536",
            "log.retention.bytes": "1000000",
            "log.segment.bytes": "1048576",
            "log.roll.hours": 2,
            "log.cleanup.policy": "delete,compact",
            "log.cleaner.enable": "false",
            "log.flush.interval.messages": "100",
            "num.io.threads": "4",
            "metrics.port": "-1",
        }
    )
    assert (config.listen_host, config.listen_port) == ("0.0.0.0", 9092)
    assert config.data_dir == Path("/var/lib/tidelog")
    assert config.num_partitions == 3
    assert config.message_max_bytes == 2048
    assert config.socket_request_max_bytes == 65536
    assert config.log_defaults.retention_bytes == 1_000_000
    assert config.log_defaults.segment_bytes == 1_048_576
    assert config.log_defaults.segment_ms == 2 * HOUR_MS
    assert config.log_defaults.cleanup_policy == "compact,delete"
    assert config.cleaner_enabled is False
    assert config.log_defaults.flush_messages == 100
    assert config.num_io_threads == 4
    assert config.metrics_port == -1
    manager = config.log_manager_config()
    assert manager.defaults is config.log_defaults
    assert manager.num_partitions == 3
    assert manager.cleaner_enabled is False


def test_finest_retention_unit_wins_as_in_kafka() -> None:
    both = BrokerConfig.from_mapping({"log.retention.hours": 1, "log.retention.ms": 5000})
    assert both.log_defaults.retention_ms == 5000
    minutes = BrokerConfig.from_mapping({"log.retention.hours": 1, "log.retention.minutes": 2})
    assert minutes.log_defaults.retention_ms == 120_000
    forever = BrokerConfig.from_mapping({"log.retention.hours": -1})
    assert forever.log_defaults.retention_ms == -1


def test_unknown_key_is_rejected_naming_it_and_the_known_ones() -> None:
    with pytest.raises(InvalidConfigError, match=r"unknown broker setting 'log\.retention\.msec'"):
        BrokerConfig.from_mapping({"log.retention.msec": 1})
    with pytest.raises(InvalidConfigError, match=r"known settings: .*message\.max\.bytes"):
        BrokerConfig.from_mapping({"retention.ms": 1})  # a topic key, not a broker key


@pytest.mark.parametrize("value", ["threads", "async"])
def test_the_removed_serving_model_setting_is_refused_saying_why(value: str) -> None:
    # Issue #26: the threaded model is gone; even the old default is refused, so that no
    # config file keeps a setting that does nothing.
    with pytest.raises(
        InvalidConfigError,
        match=r"'server\.io\.model' was removed: .*asyncio model \(grpc\.aio\) is the only one",
    ):
        BrokerConfig.from_mapping({"server.io.model": value})
    assert "server.io.model" not in broker_keys()


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"num.partitions": "0"}, "num.partitions"),
        ({"num.partitions": "many"}, "num.partitions"),
        ({"num.partitions": True}, "num.partitions"),
        ({"message.max.bytes": "-5"}, "message.max.bytes"),
        ({"log.cleanup.policy": "shred"}, "log.cleanup.policy"),
        ({"log.retention.ms": "-7"}, "log.retention.ms"),
        ({"log.cleaner.enable": "yes"}, "log.cleaner.enable"),
        ({"listeners": "localhost"}, "listeners"),
        ({"listeners": "SSL://localhost:1"}, "listeners"),
        ({"listeners": "a:1,b:2"}, "listeners"),
        ({"listeners": "host:99999"}, "listeners"),
        ({"log.dirs": "/a,/b"}, "log.dirs"),
        ({"metrics.port": "-2"}, "metrics.port"),
        ({"connections.keepalive.time.ms": "0"}, "connections.keepalive.time.ms"),
        ({"connections.keepalive.timeout.ms": "soon"}, "connections.keepalive.timeout.ms"),
        ({"connections.keepalive.timeout.ms": 2**31}, "connections.keepalive.timeout.ms"),
    ],
)
def test_bad_values_name_the_key(settings: dict[str, object], named: str) -> None:
    with pytest.raises(InvalidConfigError, match="^" + re.escape(named)):
        BrokerConfig.from_mapping(settings)


def test_direct_construction_validates() -> None:
    with pytest.raises(ValueError, match=r"num\.io\.threads"):
        BrokerConfig(num_io_threads=0)
    with pytest.raises(ValueError, match=r"connections\.keepalive\.time\.ms"):
        BrokerConfig(connections_keepalive_time_ms=0)


def test_keepalive_settings() -> None:
    assert BrokerConfig().connections_keepalive_time_ms == 30_000
    assert BrokerConfig().connections_keepalive_timeout_ms == 20_000
    config = BrokerConfig.from_mapping(
        {"connections.keepalive.time.ms": "60000", "connections.keepalive.timeout.ms": 5000}
    )
    assert config.connections_keepalive_time_ms == 60_000
    assert config.connections_keepalive_timeout_ms == 5_000
    assert config.to_mapping()["connections.keepalive.time.ms"] == "60000"


def test_producer_expiration_settings_reach_the_log_manager() -> None:
    config = BrokerConfig.from_mapping(
        {"producer.id.expiration.ms": "1000", "producer.id.expiration.check.interval.ms": 50}
    )
    storage = config.log_manager_config()
    assert storage.producer_id_expiration_ms == 1_000
    assert storage.producer_id_expiration_check_interval_ms == 50
    assert BrokerConfig().log_manager_config().producer_id_expiration_check_interval_ms == 600_000
    with pytest.raises(InvalidConfigError, match=r"producer\.id\.expiration\.check\.interval\.ms"):
        BrokerConfig.from_mapping({"producer.id.expiration.check.interval.ms": 0})


def test_parse_listen_forms() -> None:
    assert parse_listen("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_listen("PLAINTEXT://[::1]:7410") == ("::1", 7410)
    assert BrokerConfig(listen_host="::1", listen_port=1).listen_address == "[::1]:1"


def test_toml_dotted_and_quoted_keys_flatten(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(
        'listeners = "127.0.0.1:9000"\n'
        "num.partitions = 4\n"
        '"log.retention.ms" = 60000\n'
        "[log.cleaner]\n"
        "enable = false\n"
    )
    flat = load_toml(path)
    assert flat == {
        "listeners": "127.0.0.1:9000",
        "num.partitions": 4,
        "log.retention.ms": 60000,
        "log.cleaner.enable": False,
    }
    config = BrokerConfig.from_mapping(flat)
    assert config.num_partitions == 4
    assert config.log_defaults.retention_ms == 60000
    assert config.cleaner_enabled is False


def test_toml_errors_are_config_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("num.partitions = = 3\n")
    with pytest.raises(InvalidConfigError, match="not valid TOML"):
        load_toml(bad)
    with pytest.raises(InvalidConfigError, match="cannot read"):
        load_toml(tmp_path / "missing.toml")
    array = tmp_path / "array.toml"
    array.write_text("listeners = [1, 2]\n")
    with pytest.raises(InvalidConfigError, match="listeners"):
        load_toml(array)


def _args(**kwargs: object) -> argparse.Namespace:
    base: dict[str, object] = {"config": None, "set": [], "data_dir": None, "listen": None}
    base.update(kwargs)
    return argparse.Namespace(**base)


def test_set_overrides_the_file_and_flags_override_both(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text('num.partitions = 2\nlisteners = "127.0.0.1:1000"\nlog.dirs = "/from/file"\n')
    config = config_from_args(_args(config=str(path), set=["num.partitions=5"]))
    assert config.num_partitions == 5
    assert config.listen_port == 1000
    config = config_from_args(
        _args(
            config=str(path),
            set=["listeners=127.0.0.1:2000"],
            listen="127.0.0.1:3000",
            data_dir=str(tmp_path),
        )
    )
    assert config.listen_port == 3000
    assert config.data_dir == tmp_path
    with pytest.raises(InvalidConfigError, match="KEY=VALUE"):
        config_from_args(_args(set=["num.partitions"]))


def test_to_mapping_round_trips() -> None:
    config = BrokerConfig.from_mapping({"num.partitions": 7, "log.retention.hours": 1})
    mapping = config.to_mapping()
    assert set(mapping) <= broker_keys()
    assert "metrics.host" not in mapping  # unset: follows the listen host
    assert config.effective_metrics_host == "127.0.0.1"
    assert BrokerConfig.from_mapping(mapping) == config


def test_security_settings_the_listener_does_not_use_are_named() -> None:
    """The listener's scheme decides (Kafka's convention); what it leaves unused is said."""
    config = BrokerConfig.from_mapping(
        {
            "ssl.certfile": "server.pem",
            "ssl.keyfile": "server.key",
            "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",  # the default, given
            "authorizer.enabled": "true",
        }
    )
    assert config.security.protocol == "PLAINTEXT"
    messages = config.ignored_settings()
    for key in ("ssl.certfile", "ssl.keyfile", "sasl.enabled.mechanisms"):
        (message,) = [m for m in messages if m.startswith(f"{key} is ignored")]
        assert "PLAINTEXT" in message
        assert "security.protocol" in message
    (authorizer,) = [m for m in messages if m.startswith("authorizer.enabled")]
    assert "User:ANONYMOUS" in authorizer
    assert "SASL_SSL" in authorizer
    assert len(messages) == 4


def test_nothing_is_said_when_the_listener_uses_every_setting() -> None:
    assert BrokerConfig.from_mapping({}).ignored_settings() == ()
    sasl_ssl = BrokerConfig.from_mapping(
        {
            "listeners": "SASL_SSL://127.0.0.1:0",
            "ssl.certfile": "server.pem",
            "ssl.keyfile": "server.key",
            "sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "authorizer.enabled": "true",
        }
    )
    assert sasl_ssl.ignored_settings() == ()
    # SSL: the certificate is used, SASL's settings are not; the metrics endpoint's TLS
    # uses the certificate even on a PLAINTEXT listener.
    ssl = BrokerConfig.from_mapping(
        {
            "security.protocol": "SSL",
            "ssl.certfile": "server.pem",
            "ssl.keyfile": "server.key",
            "sasl.session.lifetime.ms": "1000",
        }
    )
    assert [m.split(" ", 1)[0] for m in ssl.ignored_settings()] == ["sasl.session.lifetime.ms"]
    metrics = BrokerConfig.from_mapping(
        {"ssl.certfile": "s.pem", "ssl.keyfile": "s.key", "metrics.ssl.enable": "true"}
    )
    assert metrics.ignored_settings() == ()
