"""Committed offsets: the internal compacted topic ``__consumer_offsets`` and its cache.

The log is its own offset store. Every commit is a batch of records (format in
``broker.groups.offset_records``) appended to the group's partition of
``__consumer_offsets``; deleting a group's offsets appends tombstones. The topic is created
on the broker's first start (``internal``, ``cleanup.policy=compact``), so compaction keeps
the latest record of each (group, topic, partition) and drops old tombstones.

Writes, per offsets partition under its own lock, in this order:

1. append the batch to the partition log;
2. fsync it (``acks=all``); in cluster mode also wait until the in-sync replicas have it
   (the partition's high watermark passed it: ``Partition.wait_replicated``), so a commit
   acknowledged survives the coordinator's death;
3. only then change the in-memory cache, and return (the caller acknowledges).

Cluster mode: only the leader of an offsets partition coordinates its groups; a broker
that becomes leader reloads the partition (``reload_partition``) from its replicated log.
Until that load is done *and* the partition's high watermark has reached the log end it
loaded, every group call for the partition is answered ``COORDINATOR_LOAD_IN_PROGRESS``
(``check_loaded``; clients retry). Both halves matter: before the reload the cache holds
what this broker knew when it last led (older than the log: a consumer resuming from it
would re-read and commit backwards), and a new leader's log may end with commits the old
leader appended but never acknowledged; the cache must not show those until the in-sync
replicas hold them, or a second failover before they are replicated would take them back
(the committed offset seen going backwards). Kafka's new group coordinator has the same
rule: it serves only state at or below the high watermark. A broker that stops leading a
partition forgets its groups (``unload_partition``, Kafka's ``removeGroupsAndOffsets``),
so nothing it answers later comes from that state; ``open`` reads every partition (the
group manager's startup hold needs the group ids), and ``forget_unloaded`` then drops
what no leadership loaded.

The append goes through the offsets partition's ``Partition`` (``append_as_leader``, from
the registry the broker was built with): in cluster mode it is refused unless this broker
leads the partition, and stamped with its leader epoch; on a single node the partition is
an unreplicated leader and nothing is checked.

A failed append or fsync leaves the cache as it was and raises (``StorageError``); a
commit whose fsync failed may still reappear after a restart, as with any write whose
acknowledgement was lost. Holding the partition lock through the fsync keeps the cache in
log order, so that what a restart reloads is exactly what the cache held.

Loading (``open``): every partition is read from its log start offset to its end through
``broker.core.internal_topic.replay``; later records replace earlier ones and
tombstones delete. Records that are neither offset commits nor group metadata, or cannot
be decoded, are logged and skipped.

Group metadata (issue #27): a classic group's membership is one record per group in the
same partition (``offset_records``: Kafka's key version 2), written by ``store_group`` the
same way as a commit (appended, fsynced, replicated, then cached) and loaded with the
offsets; ``group_metadata`` returns what was loaded, which ``broker.groups.classic``
rebuilds its groups from. Writes of one group are ordered by a sequence number its caller
draws when it builds the record (``ClassicGroups``): a write older than one already made
for the group, or older than the partition's last reload (``sequence_floor``: built from
the state before the reload), is skipped, so a record built from stale state never
overwrites a newer one, whichever thread reaches the write lock first. Deleting a group
(``delete`` with ``group=True``) tombstones its metadata with its offsets.

Records of the other group kinds (issue #32: share groups, their members, assignments and
group configs, ``broker.share.groups_records``): every key whose record type (its leading
int16) is neither an offset commit nor a classic group's metadata is kept as bytes, per
group id (the string that follows the type in every key of this topic), latest value per
key, a tombstone deleting it. ``write_records`` stores such records as a commit is stored
(appended, fsynced, replicated, then cached); ``records_of`` and ``groups_with_records``
return them for their owner to decode; reload, unload and ``forget_unloaded`` treat them as
the offsets of their group. The store never interprets them.

Thread-safe. Reads (``offsets``, ``group_ids``) take only the cache lock and never wait for
an fsync.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from tidelog.broker.core.internal_topic import Entry, append_durably, check_loaded, replay
from tidelog.broker.core.partitions import PartitionRegistry
from tidelog.broker.groups.assignor import TopicPartition
from tidelog.broker.groups.offset_records import (
    MAX_STRING_BYTES,
    SHARE_GROUP_METADATA_TYPE,
    GroupMetadataValue,
    OffsetValue,
    decode_group_key,
    decode_group_value,
    decode_key,
    decode_value,
    encode_group_key,
    encode_group_value,
    encode_key,
    encode_value,
    partition_for,
)
from tidelog.broker.groups.txn_offsets import PendingOffsets
from tidelog.storage.errors import (
    TopicAlreadyExistsError,
)
from tidelog.storage.log_manager import LogManager
from tidelog.storage.partition_log import PartitionLog

__all__ = ["OFFSETS_TOPIC", "OffsetStore", "OffsetStoreConfig", "record_key_group"]

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetStoreConfig:
    """How the offsets topic is created (Kafka's ``offsets.topic.*`` settings). Used only
    when the topic does not exist yet: an existing topic keeps its partition count, so a
    group's partition never changes."""

    num_partitions: int = 5
    segment_bytes: int = 100 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.num_partitions < 1:
            raise ValueError("offsets.topic.num.partitions must be at least 1")


class OffsetStore:
    """Committed offsets of every group, durable in ``__consumer_offsets``. Thread-safe.

    Build with ``open``.
    """

    def __init__(
        self,
        logs: LogManager,
        partitions: int,
        cache: dict[str, dict[TopicPartition, OffsetValue]],
        on_append: Callable[[str, int], None] | None,
        registry: PartitionRegistry,
        groups: dict[str, GroupMetadataValue] | None = None,
        pending: PendingOffsets | None = None,
        extra: dict[str, dict[bytes, bytes]] | None = None,
    ) -> None:
        self._logs = logs
        self._partitions = partitions
        self._cache = cache
        # Classic groups' metadata records (the latest of each group); _cache_lock.
        self._groups = groups if groups is not None else {}
        # Records of the other group kinds: group id -> key -> value (module docstring);
        # _cache_lock.
        self._extra = extra if extra is not None else {}
        # Ordering of group metadata writes (module docstring); under the write locks.
        self._group_sequences: dict[str, int] = {}
        self._sequence_floors = [0] * partitions
        self._cache_lock = threading.Lock()
        # Reentrant: store_group checks its ordering and writes under the same lock.
        self._write_locks = [threading.RLock() for _ in range(partitions)]
        self._on_append = on_append
        # The broker's partitions (replicated in cluster mode: roles from the replica
        # manager).
        self._registry = registry
        # Cluster mode: offsets partition -> (leader epoch the cache was loaded at, the log
        # end offset then); guarded by _cache_lock. See check_loaded.
        self._loaded: dict[int, tuple[int, int]] = {}
        # Offsets committed in transactions not decided yet (broker.groups.txn_offsets);
        # guarded by _cache_lock.
        self._pending = pending if pending is not None else PendingOffsets()

    @classmethod
    def open(
        cls,
        logs: LogManager,
        config: OffsetStoreConfig | None = None,
        *,
        on_append: Callable[[str, int], None] | None = None,
        registry: PartitionRegistry | None = None,
    ) -> OffsetStore:
        """Create ``__consumer_offsets`` if needed and load every committed offset.

        Args:
            logs: the broker's log manager.
            config: partitions and segment size for a topic created now.
            on_append: called with (topic, partition) after each append (wakes fetches
                of the offsets topic).
            registry: the broker's partitions over ``logs``; None: a single node's,
                made here (unreplicated: every partition leads).

        Raises:
            StorageError: the topic cannot be created or read.
        """
        config = config or OffsetStoreConfig()
        try:
            meta = logs.create_topic(
                OFFSETS_TOPIC,
                config.num_partitions,
                {"cleanup.policy": "compact", "segment.bytes": str(config.segment_bytes)},
                internal=True,
            )
            log.info("created %s with %d partition(s)", OFFSETS_TOPIC, meta.partitions)
        except TopicAlreadyExistsError:
            meta = logs.topic(OFFSETS_TOPIC)
        cache: dict[str, dict[TopicPartition, OffsetValue]] = {}
        groups: dict[str, GroupMetadataValue] = {}
        pending = PendingOffsets()
        extra: dict[str, dict[bytes, bytes]] = {}
        records = 0
        for partition in range(meta.partitions):
            records += _load_partition(
                logs.get_log(OFFSETS_TOPIC, partition), cache, groups, pending, extra
            )
        log.info(
            "loaded %d committed offset(s) of %d group(s) and %d group metadata record(s)"
            " from %d record(s) of %s",
            sum(len(offsets) for offsets in cache.values()),
            len(cache),
            len(groups),
            records,
            OFFSETS_TOPIC,
        )
        if registry is None:
            registry = PartitionRegistry(logs, 0, logs.clock, replicated=False)
        return cls(logs, meta.partitions, cache, on_append, registry, groups, pending, extra)

    @property
    def partitions(self) -> int:
        """Partitions of ``__consumer_offsets``."""
        return self._partitions

    def partition_for(self, group_id: str) -> int:
        """The offsets partition holding ``group_id``."""
        return partition_for(group_id, self._partitions)

    # --- reads ------------------------------------------------------------------------------

    def offsets(self, group_id: str) -> dict[TopicPartition, OffsetValue]:
        """The group's committed offsets (a copy; empty for an unknown group)."""
        with self._cache_lock:
            return dict(self._cache.get(group_id, {}))

    def group_ids(self) -> list[str]:
        """Groups with at least one committed offset, sorted."""
        with self._cache_lock:
            return sorted(self._cache)

    def group_metadata(self, partition: int | None = None) -> dict[str, GroupMetadataValue]:
        """Group id -> its latest group metadata record (of one offsets partition, or of
        all); groups whose record was tombstoned are absent."""
        with self._cache_lock:
            return {
                group: value
                for group, value in self._groups.items()
                if partition is None or self.partition_for(group) == partition
            }

    def records_of(self, group_id: str) -> dict[bytes, bytes]:
        """The group's records of the other group kinds (key -> value; a copy)."""
        with self._cache_lock:
            return dict(self._extra.get(group_id, {}))

    def is_share_group(self, group_id: str) -> bool:
        """Whether ``group_id`` is a share group's (issue #32): it has a share group
        metadata record (``SHARE_GROUP_METADATA_TYPE``). Neither consumer-group protocol
        may join such a group."""
        with self._cache_lock:
            keys = list(self._extra.get(group_id, ()))
        return any(record_key_group(key)[0] == SHARE_GROUP_METADATA_TYPE for key in keys)

    def groups_with_records(self, partition: int | None = None) -> dict[str, dict[bytes, bytes]]:
        """Group id -> its records of the other group kinds (of one offsets partition, or
        of all); groups without any are absent."""
        with self._cache_lock:
            return {
                group: dict(records)
                for group, records in self._extra.items()
                if partition is None or self.partition_for(group) == partition
            }

    def groups_with_topic(self, topic: str) -> dict[str, list[TopicPartition]]:
        """Group -> its committed partitions of ``topic``."""
        with self._cache_lock:
            found = {
                group: sorted(tp for tp in offsets if tp.topic == topic)
                for group, offsets in self._cache.items()
            }
        return {group: tps for group, tps in found.items() if tps}

    # --- writes -----------------------------------------------------------------------------

    def commit(self, group_id: str, offsets: Mapping[TopicPartition, OffsetValue]) -> None:
        """Store ``offsets`` durably, then make them visible. Nothing to do if empty.

        Raises:
            ValueError: a group id, topic or metadata too long for the record format.
            StorageError: the append or fsync failed; nothing became visible.
        """
        records: list[tuple[bytes, bytes | None]] = [
            (encode_key(group_id, tp), encode_value(v)) for tp, v in offsets.items()
        ]
        self._write(group_id, records, lambda: self._offsets_of(group_id).update(offsets))

    def commit_transactional(
        self,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        offsets: Mapping[TopicPartition, OffsetValue],
    ) -> None:
        """TxnOffsetCommit: store ``offsets`` durably as records of the producer's
        transaction; they stay pending (invisible) until its marker lands on this
        partition (``end_transaction``). Raises as ``commit``."""
        records: list[tuple[bytes, bytes | None]] = [
            (encode_key(group_id, tp), encode_value(v)) for tp, v in offsets.items()
        ]
        self._write(
            group_id,
            records,
            lambda: self._pending.add(producer_id, group_id, offsets),
            transaction=(producer_id, producer_epoch),
        )

    def end_transaction(self, partition: int, producer_id: int, commit: bool) -> None:
        """A transaction marker of ``producer_id`` was written (durably) to offsets
        partition ``partition``: its pending offsets there become committed, or go."""
        with self._cache_lock:
            ended = self._pending.end(
                producer_id, lambda g: self.partition_for(g) == partition, commit
            )
            for group_id, offsets in ended.items():
                self._offsets_of(group_id).update(offsets)

    def pending_partitions(self, group_id: str) -> set[TopicPartition]:
        """The group's partitions with an offset pending in an undecided transaction."""
        with self._cache_lock:
            return self._pending.partitions_of(group_id)

    def delete(
        self,
        group_id: str,
        partitions: Iterable[TopicPartition],
        *,
        group_sequence: int | None = None,
    ) -> None:
        """Append tombstones for the group's offsets of ``partitions`` (and, with a
        ``group_sequence``, for its group metadata if it has any, ordered as
        ``store_group`` orders writes), then forget them. The tombstones are one write: a
        restart or a coordinator move sees all or none.

        Raises:
            StorageError: the append or fsync failed; nothing was forgotten.
        """
        doomed = sorted(set(partitions))
        records: list[tuple[bytes, bytes | None]] = [
            (encode_key(group_id, tp), None) for tp in doomed
        ]

        def forget() -> None:
            cached = self._offsets_of(group_id)
            for tp in doomed:
                cached.pop(tp, None)
            if group_sequence is not None:
                self._groups.pop(group_id, None)

        with self._write_locks[self.partition_for(group_id)]:
            if group_sequence is not None:
                with self._cache_lock:
                    has_metadata = group_id in self._groups
                if has_metadata:
                    records.append((encode_group_key(group_id), None))
            self._write(group_id, records, forget)
            if group_sequence is not None:
                previous = self._group_sequences.get(group_id, -1)
                self._group_sequences[group_id] = max(previous, group_sequence)

    def write_records(self, group_id: str, records: Mapping[bytes, bytes | None]) -> None:
        """Store records of another group kind (key -> value, None a tombstone) durably,
        in one write, then cache them (module docstring). Every key must name
        ``group_id`` (``record_key_group``). Nothing to do if empty.

        Raises:
            ValueError: a key of an offset commit or of group metadata, or of another group.
            NotLeaderOrFollowerError: cluster mode, this broker does not lead the group's
                offsets partition.
            StorageError: the append, fsync or replication failed; the cache is unchanged.
        """
        for key in records:
            record_type, owner = record_key_group(key)
            if record_type <= GROUP_METADATA_TYPE or owner != group_id:
                raise ValueError(f"record key {key!r} is not another kind's key of {group_id}")
        changes = dict(records)

        def remember() -> None:
            cached = self._extra.setdefault(group_id, {})
            for key, value in changes.items():
                if value is None:
                    cached.pop(key, None)
                else:
                    cached[key] = value
            if not cached:
                del self._extra[group_id]

        self._write(group_id, list(changes.items()), remember)

    def store_group(self, group_id: str, value: GroupMetadataValue | None, sequence: int) -> bool:
        """Write a classic group's metadata record (None: a tombstone) durably, as a
        commit is written, unless a write of a later ``sequence`` was made for the group
        or the partition was reloaded after ``sequence`` was drawn (module docstring).
        Returns whether it was written.

        Raises:
            ValueError: a field too long or out of range for the record format.
            NotLeaderOrFollowerError: cluster mode, this broker does not lead the group's
                offsets partition (its coordinator moved).
            StorageError: the append, fsync or replication failed; the cache is unchanged.
        """
        key = encode_group_key(group_id)
        encoded = None if value is None else encode_group_value(value)
        partition = self.partition_for(group_id)

        def remember() -> None:
            if value is None:
                self._groups.pop(group_id, None)
            else:
                self._groups[group_id] = value

        with self._write_locks[partition]:
            if sequence < self._sequence_floors[partition] or sequence <= (
                self._group_sequences.get(group_id, -1)
            ):
                log.debug("group %s: metadata write %d superseded", group_id, sequence)
                return False
            self._write(group_id, [(key, encoded)], remember)
            self._group_sequences[group_id] = sequence
        return True

    def reload_partition(
        self,
        partition: int,
        *,
        sequence_floor: int = 0,
        on_groups: Callable[[dict[str, GroupMetadataValue]], object] | None = None,
    ) -> int:
        """Replace the cache of the groups stored in ``partition`` with what its log holds
        (cluster mode: this broker just became the partition's leader). Returns records
        read. Raises ``StorageError``.

        ``sequence_floor``: group metadata writes drawn before it are skipped from now on
        (built from the state before this load). ``on_groups``: called with the group
        metadata loaded, before the partition counts as loaded (``check_loaded``), so no
        request is served between the load and the classic groups' rebuild."""
        fresh: dict[str, dict[TopicPartition, OffsetValue]] = {}
        fresh_groups: dict[str, GroupMetadataValue] = {}
        fresh_pending = PendingOffsets()
        fresh_extra: dict[str, dict[bytes, bytes]] = {}
        with self._write_locks[partition]:
            self._sequence_floors[partition] = max(self._sequence_floors[partition], sequence_floor)
            epoch = self._leader_epoch(partition)
            partition_log = self._logs.get_log(OFFSETS_TOPIC, partition)
            records = _load_partition(
                partition_log, fresh, fresh_groups, fresh_pending, fresh_extra
            )
            if on_groups is not None:
                on_groups(dict(fresh_groups))
            with self._cache_lock:
                for group in [g for g in self._cache if self.partition_for(g) == partition]:
                    del self._cache[group]
                self._cache.update(fresh)
                for group in [g for g in self._groups if self.partition_for(g) == partition]:
                    del self._groups[group]
                self._groups.update(fresh_groups)
                for group in [g for g in self._extra if self.partition_for(g) == partition]:
                    del self._extra[group]
                self._extra.update(fresh_extra)
                self._pending.forget(lambda g: self.partition_for(g) == partition)
                self._pending.merge(fresh_pending)
                if epoch is not None:
                    self._loaded[partition] = (epoch, partition_log.log_end_offset)
        log.info(
            "%s-%d: reloaded %d group(s) from %d record(s)",
            OFFSETS_TOPIC,
            partition,
            len(fresh),
            records,
        )
        return records

    def check_loaded(self, partition: int) -> None:
        """Cluster mode: raise ``CoordinatorLoadInProgressError`` unless the cache of
        ``partition`` was loaded at this broker's current leader epoch and the high
        watermark has reached what that load read (see the module docstring). A no-op on a
        single node."""
        with self._cache_lock:
            loaded = self._loaded.get(partition)
        check_loaded(self._registry.get(OFFSETS_TOPIC, partition), loaded, "groups")

    def unload_partition(self, partition: int) -> int:
        """Forget what the cache holds of the groups stored in ``partition`` (cluster mode:
        this broker stopped leading it; Kafka's ``removeGroupsAndOffsets``), and that it
        was loaded, so ``check_loaded`` refuses it until a reload. Returns the groups
        forgotten. The log is untouched: a reload reads it all again."""
        with self._write_locks[partition], self._cache_lock:
            gone = {g for g in self._cache if self.partition_for(g) == partition}
            gone.update(g for g in self._groups if self.partition_for(g) == partition)
            gone.update(g for g in self._extra if self.partition_for(g) == partition)
            for group in gone:
                self._cache.pop(group, None)
                self._groups.pop(group, None)
                self._extra.pop(group, None)
            self._pending.forget(lambda g: self.partition_for(g) == partition)
            self._loaded.pop(partition, None)
        return len(gone)

    def loaded_partitions(self) -> list[int]:
        """Cluster mode: the offsets partitions whose groups were loaded (and not unloaded
        since), sorted; empty on a single node."""
        with self._cache_lock:
            return sorted(self._loaded)

    def forget_unloaded(self) -> None:
        """Cluster mode: drop what ``open`` read of the partitions not loaded since (every
        partition, right after ``open``): a broker shows only the groups of the
        partitions it leads, each loaded when it became their leader. A no-op on a
        single node, which coordinates every group."""
        if not self._registry.replicated:
            return
        with self._cache_lock:
            for cache in (self._cache, self._groups, self._extra):
                for group in [g for g in cache if self.partition_for(g) not in self._loaded]:
                    del cache[group]

    def leads(self, partition: int) -> bool:
        """Whether this broker leads offsets partition ``partition`` now (always on a
        single node)."""
        return self._registry.get(OFFSETS_TOPIC, partition).is_leader

    def serves(self, partition: int) -> bool:
        """Whether this broker coordinates the groups of ``partition``: a single node
        always; in cluster mode, it leads the partition and loaded it at its current
        leader epoch (``check_loaded``'s first half: the views of ``list_groups``)."""
        if not self._registry.replicated:
            return True
        epoch = self._leader_epoch(partition)
        with self._cache_lock:
            loaded = self._loaded.get(partition)
        return epoch is not None and loaded is not None and loaded[0] == epoch

    def check_led_loaded(self) -> None:
        """Cluster mode: ``check_loaded`` for every offsets partition this broker leads
        (ListGroups answers ``COORDINATOR_LOAD_IN_PROGRESS`` while one is loading, as
        Kafka's does). A no-op on a single node."""
        if not self._registry.replicated:
            return
        for partition in range(self._partitions):
            if self._leader_epoch(partition) is not None:
                self.check_loaded(partition)

    def led_without_a_break(self, partition: int) -> bool:
        """Whether this broker's cache of ``partition`` was loaded at the leader epoch just
        before the one it leads at now: it led the partition through both (epochs go up
        by one per election), so nobody else wrote to it in between and what it holds in
        memory is still the partition's state (an ISR change alone bumps the epoch)."""
        epoch = self._leader_epoch(partition)
        with self._cache_lock:
            loaded = self._loaded.get(partition)
        return epoch is not None and loaded is not None and loaded[0] == epoch - 1

    def _offsets_of(self, group_id: str) -> dict[TopicPartition, OffsetValue]:
        """The cached offsets of ``group_id``, created empty (caller holds _cache_lock)."""
        return self._cache.setdefault(group_id, {})

    def _leader_epoch(self, partition: int) -> int | None:
        """This broker's leader epoch of the offsets partition; None if it does not lead
        it (or on a single node)."""
        return self._registry.get(OFFSETS_TOPIC, partition).leader_epoch

    def _write(
        self,
        group_id: str,
        records: list[tuple[bytes, bytes | None]],
        apply: Callable[[], None],
        *,
        transaction: tuple[int, int] | None = None,
    ) -> None:
        """Append ``records`` to the group's partition durably (module docstring), then
        ``apply`` the change to the caches under the cache lock. ``transaction``: the
        (producer id, epoch) whose transaction they belong to."""
        if not records:
            return
        partition = self.partition_for(group_id)
        target = self._registry.get(OFFSETS_TOPIC, partition)
        now_ms = self._logs.clock.wall_ms()
        with self._write_locks[partition]:
            result = append_durably(target, records, now_ms, self._on_append, transaction)
            with self._cache_lock:
                apply()
                if not self._cache.get(group_id, True):
                    del self._cache[group_id]
        if self._on_append is not None:
            self._on_append(OFFSETS_TOPIC, partition)
        log.debug(
            "group %s: wrote %d record(s) to %s-%d at %d",
            group_id,
            len(records),
            OFFSETS_TOPIC,
            partition,
            result.base_offset,
        )


def _load_partition(
    partition_log: PartitionLog,
    cache: dict[str, dict[TopicPartition, OffsetValue]],
    groups: dict[str, GroupMetadataValue],
    pending: PendingOffsets,
    extra: dict[str, dict[bytes, bytes]],
) -> int:
    """Replay one offsets partition into ``cache`` (offsets), ``groups`` (group
    metadata) and ``pending`` (offsets of transactions undecided at the log end); returns
    the records read."""
    undecided: dict[int, list[Entry]] = {}
    count = replay(
        partition_log,
        lambda offset, key, value: _apply(partition_log, offset, key, value, cache, groups, extra),
        undecided,
    )
    for producer_id, entries in undecided.items():
        held: dict[str, dict[TopicPartition, OffsetValue]] = {}
        for offset, key, value in entries:
            _apply(partition_log, offset, key, value, held, {}, {})
        for group_id, offsets in held.items():
            pending.add(producer_id, group_id, offsets)
    return count


def _apply(
    partition_log: PartitionLog,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    cache: dict[str, dict[TopicPartition, OffsetValue]],
    groups: dict[str, GroupMetadataValue],
    extra: dict[str, dict[bytes, bytes]],
) -> None:
    try:
        parsed = decode_key(key) if key is not None else None
        if parsed is None:
            group_id = decode_group_key(key) if key is not None else None
            if group_id is None and key is not None:
                _apply_extra(key, value, extra)
            elif group_id is None:
                log.warning(
                    "%s: skipping record %d: neither an offset commit nor group metadata",
                    partition_log,
                    offset,
                )
            elif value is None:
                groups.pop(group_id, None)
            else:
                groups[group_id] = decode_group_value(value)
            return
        if value is None:
            group = cache.get(parsed.group_id)
            if group is not None:
                group.pop(parsed.tp, None)
                if not group:
                    del cache[parsed.group_id]
            return
        cache.setdefault(parsed.group_id, {})[parsed.tp] = decode_value(value)
    except ValueError as exc:
        log.warning("%s: skipping record %d: %s", partition_log, offset, exc)


GROUP_METADATA_TYPE = 2  # a classic group's metadata key version; below it, offset commits


def record_key_group(key: bytes) -> tuple[int, str]:
    """The record type (a key's leading int16) and the group id (the string after it) of
    a ``__consumer_offsets`` key: every kind of key there starts so (Kafka's coordinator
    record keys). Raises ``ValueError`` for a key too short for both."""
    if len(key) < 4:
        raise ValueError("offsets record key shorter than its type and group id")
    record_type = int.from_bytes(key[:2], "big", signed=True)
    length = int.from_bytes(key[2:4], "big", signed=True)
    if not 0 <= length <= MAX_STRING_BYTES or 4 + length > len(key):
        raise ValueError(f"offsets record key has a bad group id length {length}")
    try:
        return record_type, key[4 : 4 + length].decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("offsets record key's group id is not UTF-8") from None


def _apply_extra(key: bytes, value: bytes | None, extra: dict[str, dict[bytes, bytes]]) -> None:
    """Keep (or, a tombstone, drop) a record of another group kind; raises ``ValueError``
    for a key that names no group (logged and skipped by the caller)."""
    record_type, group_id = record_key_group(key)
    if record_type <= GROUP_METADATA_TYPE:
        raise ValueError(f"a record of type {record_type} that does not decode")
    if value is None:
        records = extra.get(group_id)
        if records is not None:
            records.pop(key, None)
            if not records:
                del extra[group_id]
    else:
        extra.setdefault(group_id, {})[key] = value
