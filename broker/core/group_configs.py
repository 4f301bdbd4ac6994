"""A group's configs over the wire (Kafka 4.x's ConfigResource type GROUP = 32,
``kafka-configs.sh --entity-type groups``): what DescribeConfigs answers for a group and
what IncrementalAlterConfigs / AlterConfigs make of its configs. Pure; ``ShareOps``
(``describe_group_configs``, ``alter_group_configs``) runs them at the group's
coordinator, where the configs are kept (``broker.share.groups_config``: with the
group's records in ``__consumer_offsets``).

Decided:

* **The keys** are Tidelog's group configs (``GROUP_CONFIG_NAMES``): Kafka 4.1's
  ``share.*`` ones and KIP-1191's ``errors.deadletterqueue.topic.name``. Kafka's
  consumer-group configs (``consumer.session.timeout.ms``, ``consumer.heartbeat.interval
  .ms``) are not served (Tidelog's consumer groups take the broker's): naming one is
  ``INVALID_CONFIG``, as any unknown key.
* **Describe** answers every key (or those asked), as Kafka's broker does for a group:
  a key set on the group with source ``GROUP_CONFIG`` (8), the others with their
  effective default and source ``DEFAULT_CONFIG``; synonyms: the group's value, then the
  broker setting it falls back to (``group.share.*``, source ``DEFAULT_CONFIG``) where
  there is one. A group nobody configured is described by its defaults, not refused:
  configs may be set before the group exists (as in Kafka).
* **Alter**: IncrementalAlterConfigs' SET and DELETE; APPEND and SUBTRACT are
  ``INVALID_CONFIG`` (no group key is a list); legacy AlterConfigs replaces the group's
  configs with those given. The result is validated whole (``validate_group_configs``:
  an unknown key, a bad value, a value outside the broker's bounds, an internal topic as
  the dead-letter topic: ``INVALID_CONFIG``), then stored; ``validate_only`` stores
  nothing. A key named twice is ``INVALID_REQUEST`` (``apply_changes``).
* **Sent to another broker** (Kafka's admin clients send a GROUP resource to any broker:
  Kafka keeps group configs in its metadata log), a call is forwarded to the group's
  coordinator in this broker's view (``GrpcSharePeers``, the inter-broker channel, the
  request marked ``forwarded``), whose answer is the caller's; a forwarded call that
  does not find the coordinator there is ``NOT_COORDINATOR`` (retriable), never
  forwarded again. The caller was authorized where it called; the coordinator authorizes
  the inter-broker user (DESCRIBE_CONFIGS / ALTER_CONFIGS on the group) as any caller.
  A forwarded AlterConfigs goes as the incremental changes with the same result
  (``as_incremental``).
* **When a change applies**: the coordinator's heartbeat settings from the next
  heartbeat; a share partition takes the group's settings when its leader loads it
  (a new leader, a restart), as ``SharePartitionManager`` documents.

Frozen inputs; thread-safe.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tidelog.broker.core.config_keys import ConfigEntry, ConfigSynonym, ConfigType, Source
from tidelog.broker.core.configs import AlterOp, ConfigChange, apply_changes
from tidelog.broker.share.groups_config import (
    AUTO_OFFSET_RESET,
    DEAD_LETTER_TOPIC,
    DELIVERY_COUNT_LIMIT,
    GROUP_CONFIG_NAMES,
    HEARTBEAT_INTERVAL,
    ISOLATION_LEVEL,
    RECORD_LOCK_DURATION,
    SESSION_TIMEOUT,
    ShareGroupConfig,
    resolve_settings,
    validate_group_configs,
)

__all__ = ["altered_group_configs", "as_incremental", "describe_group_configs"]

# Group key -> (type, documentation, the broker setting it falls back to or "").
_KEYS: Mapping[str, tuple[ConfigType, str, str]] = {
    AUTO_OFFSET_RESET: (
        ConfigType.STRING,
        "Where a new share partition starts: latest, earliest or by_duration:<ISO 8601>.",
        "",
    ),
    ISOLATION_LEVEL: (
        ConfigType.STRING,
        "read_committed hands out only committed transactional records.",
        "",
    ),
    SESSION_TIMEOUT: (
        ConfigType.INT,
        "A share-group member's session timeout.",
        "group.share.session.timeout.ms",
    ),
    HEARTBEAT_INTERVAL: (
        ConfigType.INT,
        "How often share-group members heartbeat.",
        "group.share.heartbeat.interval.ms",
    ),
    RECORD_LOCK_DURATION: (
        ConfigType.INT,
        "How long an acquired record stays locked to its member.",
        "group.share.record.lock.duration.ms",
    ),
    DELIVERY_COUNT_LIMIT: (
        ConfigType.INT,
        "Deliveries before a record is archived (or dead-lettered).",
        "group.share.delivery.count.limit",
    ),
    DEAD_LETTER_TOPIC: (
        ConfigType.STRING,
        "The topic rejected and undeliverable records are copied to (KIP-1191); empty: none.",
        "",
    ),
}
assert set(_KEYS) == GROUP_CONFIG_NAMES


def describe_group_configs(
    configs: Mapping[str, str], broker: ShareGroupConfig, keys: Sequence[str] | None = None
) -> list[ConfigEntry]:
    """DescribeConfigs' entries for a group with ``configs`` set (module docstring), in
    name order; ``keys``: only those (unknown ones are left out, as for a topic)."""
    defaults = _defaults(broker)
    wanted = None if keys is None else set(keys)
    entries = []
    for name in sorted(_KEYS):
        if wanted is not None and name not in wanted:
            continue
        config_type, documentation, broker_key = _KEYS[name]
        synonyms: list[ConfigSynonym] = []
        if name in configs:
            value: str = configs[name]
            source = Source.GROUP_CONFIG
            synonyms.append(ConfigSynonym(name, value, Source.GROUP_CONFIG))
        else:
            value = defaults[name]
            source = Source.DEFAULT_CONFIG
        if broker_key:
            synonyms.append(ConfigSynonym(broker_key, defaults[name], Source.DEFAULT_CONFIG))
        entries.append(
            ConfigEntry(
                name,
                value,
                source,
                read_only=False,
                sensitive=False,
                config_type=config_type,
                documentation=documentation,
                synonyms=tuple(synonyms),
            )
        )
    return entries


def altered_group_configs(
    current: Mapping[str, str],
    changes: Sequence[ConfigChange],
    broker: ShareGroupConfig,
    *,
    incremental: bool,
) -> dict[str, str]:
    """A group's configs after ``changes``, validated whole (module docstring).

    Raises ``InvalidConfigError`` (an unknown key, a bad value, APPEND/SUBTRACT) or
    ``InvalidRequestError`` (a key named twice).
    """
    configs = apply_changes(current, changes, incremental=incremental, current_value=_no_list)
    validate_group_configs(configs, broker)
    return configs


def as_incremental(changes: Sequence[ConfigChange]) -> list[ConfigChange]:
    """Legacy AlterConfigs' ``changes`` (the group's configs to be exactly those with a
    value) as incremental changes with the same result: SET each, DELETE every other
    group key (a forwarded AlterConfigs: the inter-broker call is incremental). Keys that
    are not group keys are kept as given, to be refused where they are applied."""
    given = [c for c in changes if c.value is not None]
    kept = {c.name for c in given}
    return [
        *(ConfigChange(c.name, AlterOp.SET, c.value) for c in given),
        *(ConfigChange(name, AlterOp.DELETE) for name in sorted(GROUP_CONFIG_NAMES - kept)),
    ]


def _no_list(key: str) -> str | None:
    return None  # never reached: apply_changes refuses APPEND/SUBTRACT on non-list keys


def _defaults(broker: ShareGroupConfig) -> dict[str, str]:
    settings = resolve_settings({}, broker)
    return {
        AUTO_OFFSET_RESET: settings.auto_offset_reset,
        ISOLATION_LEVEL: settings.isolation_level,
        SESSION_TIMEOUT: str(settings.session_timeout_ms),
        HEARTBEAT_INTERVAL: str(settings.heartbeat_interval_ms),
        RECORD_LOCK_DURATION: str(settings.record_lock_duration_ms),
        DELIVERY_COUNT_LIMIT: str(settings.delivery_count_limit),
        DEAD_LETTER_TOPIC: settings.dead_letter_topic,
    }
