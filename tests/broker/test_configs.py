"""Topic and broker configs (#27): the pure rules (changes, precedence), and a real broker
driven by Tidelog's AdminClient over gRPC: sources and synonyms, incremental changes,
dynamic broker defaults applied live and kept across a restart, the cleaner following a
live cleanup.policy change, and the refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidelog.broker.core.config_keys import (
    DYNAMIC_BROKER_KEYS,
    TOPIC_KEYS,
    Source,
    resolve_topic_key,
)
from tidelog.broker.core.configs import AlterOp, ConfigChange, apply_changes
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient, Producer
from tidelog.client.types import AlterConfigOp, ConfigResource
from tidelog.storage.config import LogConfig
from tidelog.storage.errors import (
    InvalidConfigError,
    InvalidRecordError,
    InvalidRequestError,
    PolicyViolationError,
    RecordTooLargeError,
)

TIMEOUT_MS = 15_000


def _none(_key: str) -> str | None:
    return None


# --- pure rules ------------------------------------------------------------------------


def test_incremental_changes_set_delete_append_subtract() -> None:
    current = {"retention.ms": "1000", "cleanup.policy": "delete"}
    changes = [
        ConfigChange("retention.ms", AlterOp.DELETE),
        ConfigChange("cleanup.policy", AlterOp.APPEND, "compact"),
        ConfigChange("segment.bytes", AlterOp.SET, "1048576"),
    ]
    after = apply_changes(current, changes, incremental=True, current_value=_none)
    assert after == {"cleanup.policy": "delete,compact", "segment.bytes": "1048576"}
    back = apply_changes(
        after,
        [ConfigChange("cleanup.policy", AlterOp.SUBTRACT, "delete")],
        incremental=True,
        current_value=_none,
    )
    assert back["cleanup.policy"] == "compact"
    # APPEND on a key without a dynamic value starts from its effective value.
    started = apply_changes(
        {},
        [ConfigChange("cleanup.policy", AlterOp.APPEND, "compact")],
        incremental=True,
        current_value=lambda key: "delete",
    )
    assert started == {"cleanup.policy": "delete,compact"}


def test_legacy_alter_replaces_and_bad_changes_are_refused() -> None:
    after = apply_changes(
        {"retention.ms": "1", "segment.ms": "2"},
        [ConfigChange("segment.ms", AlterOp.SET, "3")],
        incremental=False,
        current_value=_none,
    )
    assert after == {"segment.ms": "3"}
    with pytest.raises(InvalidConfigError, match="list-valued"):
        apply_changes(
            {}, [ConfigChange("retention.ms", AlterOp.APPEND, "5")], incremental=True,
            current_value=_none,
        )  # fmt: skip
    with pytest.raises(InvalidRequestError, match="more than once"):
        apply_changes(
            {},
            [ConfigChange("retention.ms", AlterOp.SET, "5")] * 2,
            incremental=True,
            current_value=_none,
        )


def test_precedence_topic_over_broker_over_default_over_static_over_built_in() -> None:
    static = LogConfig.from_mapping({"retention.ms": "5000"})
    entry = resolve_topic_key("retention.ms", {}, static, {}, {})
    assert (entry.value, entry.source) == ("5000", Source.STATIC_BROKER_CONFIG)
    entry = resolve_topic_key("retention.ms", {}, static, {"log.retention.ms": "6000"}, {})
    assert (entry.value, entry.source) == ("6000", Source.DYNAMIC_DEFAULT_BROKER_CONFIG)
    entry = resolve_topic_key(
        "retention.ms", {"retention.ms": "8000"}, static, {"log.retention.ms": "6000"},
        {"log.retention.ms": "7000"},
    )  # fmt: skip
    assert (entry.value, entry.source) == ("8000", Source.DYNAMIC_TOPIC_CONFIG)
    assert [(s.name, s.value, s.source) for s in entry.synonyms] == [
        ("retention.ms", "8000", Source.DYNAMIC_TOPIC_CONFIG),
        ("log.retention.ms", "7000", Source.DYNAMIC_BROKER_CONFIG),
        ("log.retention.ms", "6000", Source.DYNAMIC_DEFAULT_BROKER_CONFIG),
        ("log.retention.ms", "5000", Source.STATIC_BROKER_CONFIG),
        ("log.retention.ms", "604800000", Source.DEFAULT_CONFIG),
    ]
    # Every topic key has documentation, and every dynamic broker key is a topic default.
    assert all(info.documentation for info in TOPIC_KEYS.values())
    assert set(DYNAMIC_BROKER_KEYS.values()) <= set(TOPIC_KEYS)
    assert set(TOPIC_KEYS) == set(LogConfig.known_keys())


# --- a real broker ---------------------------------------------------------------------


def _admin(broker: InProcessBroker) -> AdminClient:
    return AdminClient(broker.address, request_timeout_ms=TIMEOUT_MS)


def test_describe_and_alter_a_topic_with_sources_and_synonyms(broker: InProcessBroker) -> None:
    with _admin(broker) as admin:
        admin.create_topic("cfg", 1, {"retention.ms": "60000"})
        resource = ConfigResource.topic("cfg")
        entries = admin.describe_configs(resource)
        assert entries["retention.ms"].value == "60000"
        assert entries["retention.ms"].source == "DYNAMIC_TOPIC_CONFIG"
        assert [s.name for s in entries["retention.ms"].synonyms] == [
            "retention.ms",
            "log.retention.ms",
        ]
        assert entries["segment.bytes"].source == "DEFAULT_CONFIG"
        assert entries["cleanup.policy"].type == "LIST"
        assert entries["retention.ms"].documentation
        admin.incremental_alter_configs(
            resource,
            [
                AlterConfigOp("retention.ms", "delete"),
                AlterConfigOp("segment.ms", "set", "3600000"),
                AlterConfigOp("cleanup.policy", "append", "compact"),
            ],
        )
        entries = admin.describe_configs(resource, ["retention.ms", "segment.ms", "cleanup.policy"])
        assert set(entries) == {"retention.ms", "segment.ms", "cleanup.policy"}
        assert entries["retention.ms"].source == "DEFAULT_CONFIG"
        assert entries["segment.ms"].value == "3600000"
        assert entries["cleanup.policy"].value == "compact,delete"
        log_config = broker.server.core.logs.get_log("cfg", 0).config
        assert log_config.segment_ms == 3_600_000
        assert log_config.compact
        # validate_only checks and changes nothing.
        admin.incremental_alter_configs(
            resource, [AlterConfigOp("segment.ms", "set", "1")], validate_only=True
        )
        assert admin.describe_configs(resource, ["segment.ms"])["segment.ms"].value == "3600000"


def test_refusals_name_the_reason(broker: InProcessBroker) -> None:
    with _admin(broker) as admin:
        admin.create_topic("refused", 1)
        resource = ConfigResource.topic("refused")
        cases: list[tuple[AlterConfigOp, type[Exception], str]] = [
            (AlterConfigOp("local.retention.ms", "set", "1"), InvalidConfigError, "tiered"),
            (AlterConfigOp("local.retention.bytes", "set", "1"), InvalidConfigError, "tiered"),
            (AlterConfigOp("no.such.key", "set", "1"), InvalidConfigError, "unknown"),
            (AlterConfigOp("retention.ms", "set", "soon"), InvalidConfigError, "integer"),
            (AlterConfigOp("retention.ms", "append", "5"), InvalidConfigError, "list-valued"),
            (
                AlterConfigOp("min.insync.replicas", "set", "2"),
                PolicyViolationError,
                "replication factor 1",
            ),
        ]
        for change, error, text in cases:
            with pytest.raises(error, match=text):
                admin.incremental_alter_configs(resource, [change])
        with pytest.raises(PolicyViolationError, match="replication factor"):
            admin.create_topic("refused2", 1, {"min.insync.replicas": "2"})
        with pytest.raises(PolicyViolationError, match="internal topic"):
            admin.incremental_alter_configs(
                ConfigResource.topic("__consumer_offsets"),
                [AlterConfigOp("cleanup.policy", "set", "delete")],
            )
        broker_resource = ConfigResource.broker(0)
        with pytest.raises(InvalidConfigError, match="cannot be changed while the broker runs"):
            admin.incremental_alter_configs(
                broker_resource, [AlterConfigOp("num.partitions", "set", "4")]
            )
        assert "refused2" not in {t.name for t in admin.list_topics()}


def test_a_topic_made_compact_refuses_key_less_records(broker: InProcessBroker) -> None:
    with _admin(broker) as admin, Producer(broker.address) as producer:
        admin.create_topic("keys", 1)
        producer.send("keys", b"no key", partition=0).result(10)  # delete policy: fine
        admin.incremental_alter_configs(
            ConfigResource.topic("keys"), [AlterConfigOp("cleanup.policy", "set", "compact")]
        )
        with pytest.raises(InvalidRecordError, match="has no key"):
            producer.send("keys", b"no key", partition=0).result(10)
        producer.send("keys", b"v", key=b"k", partition=0).result(10)
        admin.incremental_alter_configs(
            ConfigResource.topic("keys"), [AlterConfigOp("cleanup.policy", "delete")]
        )
        producer.send("keys", b"no key again", partition=0).result(10)


def test_changing_cleanup_policy_starts_and_stops_the_cleaner(broker: InProcessBroker) -> None:
    logs = broker.server.core.logs
    with _admin(broker) as admin, Producer(broker.address) as producer:
        admin.create_topic("clean", 1, {"segment.bytes": "1024", "min.cleanable.dirty.ratio": "0"})
        for i in range(60):
            producer.send("clean", b"value-%d" % i, key=b"k%d" % (i % 3), partition=0).result(10)
        plog = logs.get_log("clean", 0)
        assert plog.segment_count > 2
        assert logs.run_cleaner() == 0  # delete policy: the cleaner leaves it alone
        admin.incremental_alter_configs(
            ConfigResource.topic("clean"), [AlterConfigOp("cleanup.policy", "set", "compact")]
        )
        assert logs.run_cleaner() == 1  # compact: cleaned at the next pass
        size = plog.size_bytes
        for i in range(60):
            producer.send("clean", b"value-%d" % i, key=b"k%d" % (i % 3), partition=0).result(10)
        admin.incremental_alter_configs(
            ConfigResource.topic("clean"), [AlterConfigOp("cleanup.policy", "set", "delete")]
        )
        assert logs.run_cleaner() == 0  # back to delete: no longer cleaned
        assert plog.size_bytes > size


def test_dynamic_broker_defaults_apply_live_and_survive_a_restart(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with InProcessBroker(data_dir, settings={"log.retention.ms": 5_000_000}) as broker:
        logs = broker.server.core.logs
        with _admin(broker) as admin, Producer(broker.address) as producer:
            admin.create_topic("live", 1)
            admin.create_topic("own", 1, {"max.message.bytes": "100000"})
            admin.incremental_alter_configs(
                ConfigResource.broker(),
                [AlterConfigOp("message.max.bytes", "set", "1000")],
            )
            admin.incremental_alter_configs(
                ConfigResource.broker(0), [AlterConfigOp("log.retention.ms", "set", "7000")]
            )
            assert logs.get_log("live", 0).config.max_message_bytes == 1000
            assert logs.get_log("live", 0).config.retention_ms == 7000
            assert logs.get_log("own", 0).config.max_message_bytes == 100000  # its own wins
            with pytest.raises(RecordTooLargeError):
                producer.send("live", b"x" * 2000, partition=0).result(10)
            producer.send("own", b"x" * 2000, partition=0).result(10)
            entry = admin.describe_configs(ConfigResource.topic("live"), ["retention.ms"])[
                "retention.ms"
            ]
            assert (entry.value, entry.source) == ("7000", "DYNAMIC_BROKER_CONFIG")
            assert [(s.value, s.source) for s in entry.synonyms] == [
                ("7000", "DYNAMIC_BROKER_CONFIG"),
                ("5000000", "STATIC_BROKER_CONFIG"),
                ("604800000", "DEFAULT_CONFIG"),
            ]
            defaults = admin.describe_configs(ConfigResource.broker())
            assert {k: (e.value, e.source) for k, e in defaults.items()} == {
                "message.max.bytes": ("1000", "DYNAMIC_DEFAULT_BROKER_CONFIG")
            }
            mine = admin.describe_configs(ConfigResource.broker(0))
            assert mine["log.retention.ms"].source == "DYNAMIC_BROKER_CONFIG"
            assert not mine["log.retention.ms"].read_only
            assert mine["num.partitions"].read_only
    # A restart: the dynamic configs come back from the data directory.
    with InProcessBroker(data_dir, settings={"log.retention.ms": 5_000_000}) as broker:
        logs = broker.server.core.logs
        assert logs.get_log("live", 0).config.max_message_bytes == 1000
        assert logs.get_log("live", 0).config.retention_ms == 7000
        with _admin(broker) as admin:
            admin.incremental_alter_configs(
                ConfigResource.broker(), [AlterConfigOp("message.max.bytes", "delete")]
            )
            assert admin.describe_configs(ConfigResource.broker()) == {}
        assert logs.get_log("live", 0).config.max_message_bytes == LogConfig().max_message_bytes
