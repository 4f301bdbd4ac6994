"""Transaction state: the internal compacted topic ``__transaction_state`` and its cache.

The log is the store, as for committed offsets (``broker.groups.offset_store``, whose rules
this follows): every transition of a transactional id's state is one record (format in
``broker.transactions.log_records``) appended to the id's partition, fsynced, and in
cluster mode replicated to the in-sync replicas (the high watermark passed it) *before*
the cache changes and the caller acts on it or answers. A crash or a failover can
therefore lose only a transition nobody was told about.

The topic is created on the first start with Kafka's settings for it (``reference/
transactions.md`` 2.1, ``topic_config``): compacted, uncompressed, unclean election off, and
``min.insync.replicas`` = ``transaction.state.log.min.isr`` (applied in cluster mode). In
a cluster the controller creates it in ZooKeeper too, as the offsets topic, with
``transaction.state.log.replication.factor`` replicas (at most the live brokers), and
every broker's local log follows that. The partition count never changes after that: an
id's partition must not move.

Cluster mode: only the leader of a partition coordinates its ids. ``open`` reads
nothing (what a log held from an earlier leadership is no one's state now); a broker that
becomes leader replays the partition (``reload_partition``) and forgets it when it stops
leading (``unload_partition``); until that is done at its current
leader epoch and the high watermark has reached what it read, calls for the partition
answer ``COORDINATOR_LOAD_IN_PROGRESS`` (``check_loaded``), for the reason the offsets
store gives: a new leader's log may end with transitions that were never replicated.
The coordinator epoch that markers carry is the partition's leader epoch (0 on a single
node).

Thread-safe: one write lock per partition (transitions of one partition are appended in
the order the cache takes them), one cache lock for reads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from tidelog.broker.core.internal_topic import append_durably, check_loaded, replay
from tidelog.broker.core.partitions import PartitionRegistry
from tidelog.broker.transactions.log_records import (
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    partition_for,
)
from tidelog.broker.transactions.state import TxnMetadata, from_log_value, to_log_value
from tidelog.storage.errors import (
    CorruptRecordError,
    TopicAlreadyExistsError,
)
from tidelog.storage.log_manager import LogManager

__all__ = ["TRANSACTION_STATE_TOPIC", "TxnLog", "TxnLogConfig", "topic_config"]

log = logging.getLogger(__name__)

TRANSACTION_STATE_TOPIC = "__transaction_state"


@dataclass(frozen=True, slots=True, kw_only=True)
class TxnLogConfig:
    """How ``__transaction_state`` is created (Kafka's ``transaction.state.log.*``); used
    only when the topic does not exist yet. Kafka's default is 50 partitions; Tidelog's
    is 5, as for ``__consumer_offsets`` (a single node's default should stay small)."""

    num_partitions: int = 5
    segment_bytes: int = 100 * 1024 * 1024
    min_isr: int = 2

    def __post_init__(self) -> None:
        if self.num_partitions < 1:
            raise ValueError("transaction.state.log.num.partitions must be at least 1")
        if self.min_isr < 1:
            raise ValueError("transaction.state.log.min.isr must be at least 1")


def topic_config(config: TxnLogConfig, *, replicated: bool) -> dict[str, str]:
    """``__transaction_state``'s topic config, as Kafka enforces it at creation (the local
    log's, and in cluster mode the controller's in ZooKeeper): compacted, uncompressed,
    unclean election off, ``min.insync.replicas`` = ``transaction.state.log.min.isr``
    (1 on a single node, whose partitions are unreplicated)."""
    return {
        "cleanup.policy": "compact",
        "compression.type": "uncompressed",
        "unclean.leader.election.enable": "false",
        "segment.bytes": str(config.segment_bytes),
        "min.insync.replicas": str(config.min_isr if replicated else 1),
    }


class TxnLog:
    """Every transactional id's state, durable in ``__transaction_state``. Build with
    ``open``. Thread-safe."""

    def __init__(
        self,
        logs: LogManager,
        partitions: int,
        cache: dict[str, TxnMetadata],
        registry: PartitionRegistry,
        on_append: Callable[[str, int], None] | None,
    ) -> None:
        self._logs = logs
        self._partitions = partitions
        self._cache = cache
        self._registry = registry
        self._on_append = on_append
        self._cache_lock = threading.Lock()
        self._write_locks = [threading.Lock() for _ in range(partitions)]
        # Cluster mode: partition -> (leader epoch loaded at, log end then); see check_loaded.
        self._loaded: dict[int, tuple[int, int]] = {}

    @classmethod
    def open(
        cls,
        logs: LogManager,
        config: TxnLogConfig | None = None,
        *,
        registry: PartitionRegistry | None = None,
        on_append: Callable[[str, int], None] | None = None,
    ) -> TxnLog:
        """Create ``__transaction_state`` if needed and load every id's state.

        ``registry``: the broker's partitions (None: a single node's, made here, every
        partition leads). ``on_append``: called with (topic, partition) after each append
        (wakes fetches). Raises ``StorageError``.
        """
        config = config or TxnLogConfig()
        registry = registry or PartitionRegistry(logs, 0, logs.clock, replicated=False)
        try:
            meta = logs.create_topic(
                TRANSACTION_STATE_TOPIC,
                config.num_partitions,
                topic_config(config, replicated=registry.replicated),
                internal=True,
            )
            log.info("created %s with %d partition(s)", TRANSACTION_STATE_TOPIC, meta.partitions)
        except TopicAlreadyExistsError:
            meta = logs.topic(TRANSACTION_STATE_TOPIC)
        cache: dict[str, TxnMetadata] = {}
        if registry.replicated:
            # A cluster broker coordinates only the partitions it leads, each loaded when
            # it becomes their leader (``reload_partition``): what its log held from an
            # earlier leadership is no one's state now.
            return cls(logs, meta.partitions, cache, registry, on_append)
        records = sum(
            replay(logs.get_log(TRANSACTION_STATE_TOPIC, p), _applier(cache))
            for p in range(meta.partitions)
        )
        log.info(
            "loaded %d transactional id(s) from %d record(s) of %s",
            len(cache),
            records,
            TRANSACTION_STATE_TOPIC,
        )
        return cls(logs, meta.partitions, cache, registry, on_append)

    @property
    def partitions(self) -> int:
        return self._partitions

    def partition_for(self, transactional_id: str) -> int:
        """The ``__transaction_state`` partition coordinating ``transactional_id``."""
        return partition_for(transactional_id, self._partitions)

    def coordinator_epoch(self, partition: int) -> int:
        """The epoch markers of ``partition``'s transactions carry: its leader epoch (0 on
        a single node, or when this broker does not lead it)."""
        epoch = self._registry.get(TRANSACTION_STATE_TOPIC, partition).leader_epoch
        return 0 if epoch is None else max(epoch, 0)

    # --- reads ----------------------------------------------------------------------

    def get(self, transactional_id: str) -> TxnMetadata | None:
        with self._cache_lock:
            return self._cache.get(transactional_id)

    def all(self) -> list[TxnMetadata]:
        """Every id's state (values), sorted by id."""
        with self._cache_lock:
            return [self._cache[t] for t in sorted(self._cache)]

    def in_partition(self, partition: int) -> list[TxnMetadata]:
        with self._cache_lock:
            return [m for t, m in sorted(self._cache.items()) if self.partition_for(t) == partition]

    # --- writes ---------------------------------------------------------------------

    def write(self, metadata: TxnMetadata) -> None:
        """Append ``metadata`` (Dead: a tombstone) durably and replicated, then make it the
        cache's. Raises what the append, the fsync or the replication wait raise
        (``NotLeaderOrFollowerError``, ``NotEnoughReplicasError``, ``KafkaTimeoutError``,
        ``StorageError``); the cache is unchanged then."""
        tid = metadata.transactional_id
        partition = self.partition_for(tid)
        value = to_log_value(metadata)
        records = [(encode_key(tid), None if value is None else encode_value(value))]
        target = self._registry.get(TRANSACTION_STATE_TOPIC, partition)
        with self._write_locks[partition]:
            append_durably(target, records, self._logs.clock.wall_ms(), self._on_append)
            with self._cache_lock:
                if value is None:
                    self._cache.pop(tid, None)
                else:
                    self._cache[tid] = metadata
        if self._on_append is not None:
            self._on_append(TRANSACTION_STATE_TOPIC, partition)

    def reload_partition(self, partition: int) -> list[TxnMetadata]:
        """Replace the cache of ``partition``'s ids with what its log holds (this broker
        became its leader); returns the ids' states, for the coordinator to finish every
        prepared transaction. Raises ``StorageError``."""
        fresh: dict[str, TxnMetadata] = {}
        with self._write_locks[partition]:
            epoch = self._registry.get(TRANSACTION_STATE_TOPIC, partition).leader_epoch
            partition_log = self._logs.get_log(TRANSACTION_STATE_TOPIC, partition)
            records = replay(partition_log, _applier(fresh))
            with self._cache_lock:
                for tid in [t for t in self._cache if self.partition_for(t) == partition]:
                    del self._cache[tid]
                self._cache.update(fresh)
                if epoch is not None:
                    self._loaded[partition] = (epoch, partition_log.log_end_offset)
        log.info(
            "%s-%d: reloaded %d transactional id(s) from %d record(s)",
            TRANSACTION_STATE_TOPIC,
            partition,
            len(fresh),
            records,
        )
        return [fresh[t] for t in sorted(fresh)]

    def unload_partition(self, partition: int) -> None:
        """This broker stopped leading ``partition``: forget its ids."""
        with self._cache_lock:
            for tid in [t for t in self._cache if self.partition_for(t) == partition]:
                del self._cache[tid]
            self._loaded.pop(partition, None)

    def loaded_partitions(self) -> list[int]:
        """Cluster mode: the partitions loaded (``reload_partition``) and not unloaded
        since, sorted; empty on a single node."""
        with self._cache_lock:
            return sorted(self._loaded)

    def leads(self, partition: int) -> bool:
        """Whether this broker leads ``partition`` now (always on a single node)."""
        return self._registry.get(TRANSACTION_STATE_TOPIC, partition).is_leader

    def check_loaded(self, partition: int) -> None:
        """Cluster mode: ``CoordinatorLoadInProgressError`` until ``partition`` was loaded
        at this broker's current leader epoch and its high watermark reached what that
        load read. A no-op on a single node."""
        with self._cache_lock:
            loaded = self._loaded.get(partition)
        target = self._registry.get(TRANSACTION_STATE_TOPIC, partition)
        check_loaded(target, loaded, "transactional ids")


def _applier(cache: dict[str, TxnMetadata]) -> Callable[[int, bytes | None, bytes | None], None]:
    def apply(offset: int, key: bytes | None, value: bytes | None) -> None:
        try:
            if key is None:
                raise ValueError("a record without a key")
            tid = decode_key(key)
            if value is None:
                cache.pop(tid, None)
            else:
                cache[tid] = from_log_value(tid, decode_value(value))
        except (ValueError, CorruptRecordError) as exc:
            # Only a bug writes such a record (its batch passed its CRC); the broker keeps
            # serving the other ids rather than refusing to start.
            log.error("%s: skipping record %d: %s", TRANSACTION_STATE_TOPIC, offset, exc)

    return apply
