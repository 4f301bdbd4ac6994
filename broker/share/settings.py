"""The broker's share-group settings, parsed from its Kafka-named keys (issue #32, step 3).

One object for ``BrokerConfig`` to hold (``BrokerConfig.share``), gathering what the
share-group coordinator, the share partitions and ``__share_group_state`` obey. Kafka's
broker names and defaults:

==============================================================  =======  ===========================
key                                                             default  meaning
==============================================================  =======  ===========================
``group.share.session.timeout.ms``                              45000    a member's session (within
                                                                         ``group.share.min/max...``)
``group.share.heartbeat.interval.ms``                           5000     how often members heartbeat
``group.share.max.size``                                        200      members per share group
``group.share.record.lock.duration.ms``                         30000    an acquired record's lock
``group.share.delivery.count.limit``                            5        deliveries before archiving
``group.share.partition.max.record.locks``                      2000     in-flight records per share
                                                                         partition
``share.coordinator.state.topic.num.partitions``                5        of ``__share_group_state``
                                                                         (Kafka 50), at creation
``share.coordinator.state.topic.min.isr``                       2        its ``min.insync.replicas``
``share.coordinator.state.topic.replication.factor``            3        its replicas (cluster; at
                                                                         most the brokers)
``share.coordinator.snapshot.update.records.per.snapshot``      500      updates between snapshots
``share.coordinator.state.topic.prune.interval.ms``             300000   how often its records no
                                                                         reload needs are deleted
==============================================================  =======  ===========================

plus the ``group.share.min/max.*`` bounds ``ShareGroupConfig`` documents. The brief's
``share.record.lock.duration.ms`` / ``share.delivery.count.limit`` are the *group* configs
of the same settings (``broker.share.groups_config``); the broker takes Kafka's broker
names, ``group.share.*``, so a Kafka ``server.properties`` carries over.

Frozen, validated at construction (``InvalidConfigError`` naming the key).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tidelog.broker.share.groups_config import (
    BROKER_KEYS as GROUP_KEYS,
)
from tidelog.broker.share.groups_config import (
    ShareGroupConfig,
    ShareGroupSettings,
)
from tidelog.broker.share.partition import SharePartitionConfig
from tidelog.broker.share.state_log import ShareStateLogConfig
from tidelog.storage.errors import InvalidConfigError

__all__ = ["SHARE_KEYS", "ShareSettings"]

_MAX_RECORD_LOCKS = "group.share.partition.max.record.locks"
_STATE_PARTITIONS = "share.coordinator.state.topic.num.partitions"
_STATE_MIN_ISR = "share.coordinator.state.topic.min.isr"
_PER_SNAPSHOT = "share.coordinator.snapshot.update.records.per.snapshot"
_PRUNE_INTERVAL = "share.coordinator.state.topic.prune.interval.ms"
_STATE_RF = "share.coordinator.state.topic.replication.factor"
_OWN_KEYS = (
    _MAX_RECORD_LOCKS,
    _STATE_PARTITIONS,
    _STATE_MIN_ISR,
    _PER_SNAPSHOT,
    _PRUNE_INTERVAL,
    _STATE_RF,
)

SHARE_KEYS = frozenset({*GROUP_KEYS, *_OWN_KEYS})


@dataclass(frozen=True, slots=True, kw_only=True)
class ShareSettings:
    """Every broker-level share-group setting."""

    groups: ShareGroupConfig = field(default_factory=ShareGroupConfig)
    max_record_locks: int = 2_000
    state_log: ShareStateLogConfig = field(default_factory=ShareStateLogConfig)
    prune_interval_ms: int = 300_000
    state_replication_factor: int = 3

    def __post_init__(self) -> None:
        if self.state_replication_factor < 1:
            raise InvalidConfigError(f"{_STATE_RF} must be at least 1")
        if not 100 <= self.max_record_locks <= 10_000:
            # Kafka's bounds for group.share.partition.max.record.locks.
            raise InvalidConfigError(f"{_MAX_RECORD_LOCKS} must be within 100 and 10000")
        if self.prune_interval_ms < 1:
            raise InvalidConfigError(f"{_PRUNE_INTERVAL} must be at least 1")

    def partition_config(self, group: ShareGroupSettings) -> SharePartitionConfig:
        """A share group's settings for its share partitions (its group configs over these
        defaults, ``ShareGroupManager.settings``). ``by_duration:`` offset resets are not
        served yet (docs/share-groups.md): such a group starts at ``latest``."""
        reset = group.auto_offset_reset
        return SharePartitionConfig(
            record_lock_duration_ms=group.record_lock_duration_ms,
            delivery_count_limit=group.delivery_count_limit,
            max_record_locks=self.max_record_locks,
            auto_offset_reset=reset if reset in ("latest", "earliest") else "latest",
            isolation_level=group.isolation_level,
            dead_letter_topic=group.dead_letter_topic,
        )

    @classmethod
    def from_mapping(cls, settings: Mapping[str, object]) -> ShareSettings:
        """Build from the share keys among ``settings`` (others are ignored: the caller
        checks unknown keys). Raises ``InvalidConfigError``."""
        groups = ShareGroupConfig.from_mapping(
            {k: v for k, v in settings.items() if k in GROUP_KEYS}
        )
        state: dict[str, int] = {}
        for key, name in (
            (_STATE_PARTITIONS, "num_partitions"),
            (_STATE_MIN_ISR, "min_isr"),
            (_PER_SNAPSHOT, "snapshot_update_records_per_snapshot"),
        ):
            if key in settings:
                state[name] = _int(key, settings[key])
        try:
            state_log = ShareStateLogConfig(**state)
        except ValueError as exc:
            raise InvalidConfigError(str(exc)) from None
        own: dict[str, int] = {}
        if _MAX_RECORD_LOCKS in settings:
            own["max_record_locks"] = _int(_MAX_RECORD_LOCKS, settings[_MAX_RECORD_LOCKS])
        if _PRUNE_INTERVAL in settings:
            own["prune_interval_ms"] = _int(_PRUNE_INTERVAL, settings[_PRUNE_INTERVAL])
        if _STATE_RF in settings:
            own["state_replication_factor"] = _int(_STATE_RF, settings[_STATE_RF])
        return cls(groups=groups, state_log=state_log, **own)

    def to_mapping(self) -> dict[str, str]:
        """The settings as Kafka-named strings."""
        g = self.groups
        return {
            "group.share.session.timeout.ms": str(g.session_timeout_ms),
            "group.share.min.session.timeout.ms": str(g.min_session_timeout_ms),
            "group.share.max.session.timeout.ms": str(g.max_session_timeout_ms),
            "group.share.heartbeat.interval.ms": str(g.heartbeat_interval_ms),
            "group.share.min.heartbeat.interval.ms": str(g.min_heartbeat_interval_ms),
            "group.share.max.heartbeat.interval.ms": str(g.max_heartbeat_interval_ms),
            "group.share.max.size": str(g.max_size),
            "group.share.record.lock.duration.ms": str(g.record_lock_duration_ms),
            "group.share.min.record.lock.duration.ms": str(g.min_record_lock_duration_ms),
            "group.share.max.record.lock.duration.ms": str(g.max_record_lock_duration_ms),
            "group.share.delivery.count.limit": str(g.delivery_count_limit),
            _MAX_RECORD_LOCKS: str(self.max_record_locks),
            _STATE_PARTITIONS: str(self.state_log.num_partitions),
            _STATE_MIN_ISR: str(self.state_log.min_isr),
            _PER_SNAPSHOT: str(self.state_log.snapshot_update_records_per_snapshot),
            _PRUNE_INTERVAL: str(self.prune_interval_ms),
            _STATE_RF: str(self.state_replication_factor),
        }


def _int(key: str, value: object) -> int:
    if isinstance(value, bool):
        raise InvalidConfigError(f"{key} must be an integer, got {value!r}")
    try:
        return int(str(value))
    except ValueError:
        raise InvalidConfigError(f"{key} must be an integer, got {value!r}") from None
