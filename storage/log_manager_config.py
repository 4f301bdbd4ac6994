"""The log manager's settings and a topic's metadata (``storage.log_manager``'s types,
apart so that module stays under the size STYLE.md asks; it re-exports both)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tidelog.storage.config import LogConfig
from tidelog.storage.errors import InvalidConfigError

__all__ = ["LogManagerConfig", "TopicMetadata"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LogManagerConfig:
    """Broker-level storage settings (Kafka's broker names in the comments)."""

    defaults: LogConfig = field(default_factory=LogConfig)  # log.retention.ms, ...
    num_partitions: int = 1  # num.partitions
    retention_check_interval_ms: int = 300_000  # log.retention.check.interval.ms
    cleaner_enabled: bool = True  # log.cleaner.enable
    cleaner_backoff_ms: int = 15_000  # log.cleaner.backoff.ms
    flush_scheduler_interval_ms: int = 1_000  # log.flush.scheduler.interval.ms
    flush_offset_checkpoint_interval_ms: int = 60_000  # log.flush.offset.checkpoint.interval.ms
    file_delete_check_interval_ms: int = 1_000
    producer_id_expiration_ms: int = 86_400_000  # producer.id.expiration.ms
    # producer.id.expiration.check.interval.ms
    producer_id_expiration_check_interval_ms: int = 600_000

    def __post_init__(self) -> None:
        if self.num_partitions < 1:
            raise InvalidConfigError(
                f"num.partitions must be at least 1, got {self.num_partitions}"
            )
        for name in (
            "retention_check_interval_ms",
            "cleaner_backoff_ms",
            "flush_scheduler_interval_ms",
            "flush_offset_checkpoint_interval_ms",
            "file_delete_check_interval_ms",
            "producer_id_expiration_ms",
            "producer_id_expiration_check_interval_ms",
        ):
            if getattr(self, name) < 1:
                raise InvalidConfigError(f"{name} must be at least 1 ms")


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    """A topic: its partition count, the config keys set on it, and the effective config."""

    name: str
    partitions: int
    overrides: Mapping[str, str]
    config: LogConfig
    internal: bool
