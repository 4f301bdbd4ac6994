"""Share-partition state: the internal topic ``__share_group_state`` and its cache (the
share coordinator's store, Kafka's ``ShareCoordinatorShard`` with its persister).

The log is the store, as for committed offsets and transactions
(``broker.core.internal_topic``, whose machinery this reuses): every change is appended to
the share partition's state partition, fsynced, and in cluster mode replicated to the
in-sync replicas *before* the caller acts on it (hands records out, answers an
acknowledgement). A crash or failover loses only a change nobody was told of.

**Group commit** (``begin_write``): the checks, the append and the cache change run under
the state partition's write lock; the fsync and the replication wait after it, so
writers that arrive meanwhile share them (``PartitionLog.flush`` joins a writer to the
running or next fsync). The cache may so hold an append not durable yet; every answer
read from it (``read_state``, ``initialize``, ``write``) first waits until the state
partition is durable through its last append. Transactional writes, deletes and
``prune`` stay whole under the lock.

**Snapshots and updates, as Kafka's.** A share partition's first write, an admin reset
and every ``snapshot_update_records_per_snapshot``-th write after a snapshot (Kafka's
``share.coordinator.snapshot.update.records.per.snapshot``, 500) are written as a
snapshot of the whole merged state; the writes between are updates holding only the
batches that changed. A reload replays the partition: a snapshot replaces the key's
state, an update merges into it (``records.apply_update``).

**Not compacted.** Updates of one share partition share one key, so compaction would keep
only the latest and lose the others; the topic is therefore ``cleanup.policy=delete``
with no time or size retention, as Kafka creates it, and ``prune`` deletes the records
before the oldest snapshot any share partition of that state partition still needs
(Kafka's "last redundant offset", by DeleteRecords on the leader).

Cluster mode: only the leader of a state partition serves its keys (the share
coordinator of those keys; other brokers call it, ``broker.core.share_state_routing``);
``reload_partition`` and ``check_loaded`` as the transaction log's
(``COORDINATOR_LOAD_IN_PROGRESS`` until the load at the current leader epoch is
replicated).

**Leader-epoch fencing, as Kafka's share coordinator.** Every state carries the leader
epoch of the topic partition whose leader last wrote or read it. A write or initialize
naming an older epoch raises ``FencedLeaderEpochError`` (a deposed leader that has not
noticed yet must not overwrite what the new one acts on), and a read naming a newer
epoch (``read_state``: a new leader loading) first writes that epoch, so the old
leader is fenced from then on (Kafka's ``readStateAndMaybeUpdateLeaderEpoch``). The check
runs under the state partition's write lock, so it and the append are one step.

**State-epoch fencing, as Kafka's share coordinator** (issue #32, the admin in a
cluster). Every state carries a state epoch, which only ``initialize`` moves: 0 for a
share partition's first state, and an admin's reset (AlterShareGroupOffsets, naming the
epoch it read plus one) writes a newer one; one naming an epoch not newer than the
stored one raises ``FencedStateEpochError`` (another reset won). A leader's
``write`` names the state epoch it loaded at, and anything but the stored one (or no
state at all: an admin deleted it) raises ``FencedStateEpochError``: its memory predates
the reset or the delete, so it drops it and reloads. A leader's first-use ``initialize``
names epoch 0, so it cannot overwrite a state an admin wrote meanwhile. A reset or a
delete of a share partition with a pending dead-letter write (below) raises
``ConcurrentTransactionsError`` (retriable): the transaction decides first. The checks
run under the state partition's write lock with the append.

**Transactional writes (the dead-letter topic, ``broker.share.dead_letter``).** A write
may belong to a Tidelog transaction (``write(..., transaction=(producer id, epoch))``):
its update is appended as a transactional record of that producer and held *pending*,
per state partition and producer, out of the cache, as ``broker.groups.txn_offsets``
holds offsets. The transaction's COMMIT marker on that partition (``end_transaction``,
the markers' ``on_marker`` hook) applies it to the cache; an ABORT drops it. A reload
replays the same way (``internal_topic.replay``): a transaction still undecided at the
log end comes back pending. While a share partition has a pending write, ``read_state``
answers ``COORDINATOR_LOAD_IN_PROGRESS`` (retriable): a leader loading it then would
see the records to be dead-lettered as not yet archived, and copy them again once the
transaction commits (read_committed, as KIP-447's ``require_stable``). A pending update
landing after a later plain write cannot undo it: ``records.apply_update`` never moves
the start back, and what it archives is final. ``prune`` keeps every record from the
first pending one on.

Thread-safe: one write lock per state partition (its records are appended in the order
the cache takes them), one cache lock for reads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from tidelog.broker.core.internal_topic import (
    Entry,
    append_durably,
    append_unsynced,
    check_loaded,
    make_durable,
    replay,
)
from tidelog.broker.core.partitions import PartitionRegistry
from tidelog.broker.share.records import (
    SNAPSHOT,
    UPDATE,
    ShareSnapshot,
    ShareStateKey,
    ShareUpdate,
    StateBatch,
    apply_update,
    decode_key,
    decode_snapshot,
    decode_update,
    encode_key,
    encode_snapshot,
    encode_update,
    merge,
    partition_for,
)
from tidelog.storage.errors import (
    ConcurrentTransactionsError,
    CoordinatorLoadInProgressError,
    CorruptRecordError,
    FencedLeaderEpochError,
    FencedStateEpochError,
    TopicAlreadyExistsError,
)
from tidelog.storage.log_manager import LogManager

__all__ = [
    "SHARE_STATE_TOPIC",
    "PendingWrite",
    "ShareStateLog",
    "ShareStateLogConfig",
    "state_topic_config",
]

log = logging.getLogger(__name__)

SHARE_STATE_TOPIC = "__share_group_state"


@dataclass(frozen=True, slots=True, kw_only=True)
class ShareStateLogConfig:
    """How ``__share_group_state`` is created and written (Kafka's
    ``share.coordinator.*``). Kafka's default is 50 partitions; Tidelog's is 5, as for the
    other internal topics (a single node's default should stay small)."""

    num_partitions: int = 5
    segment_bytes: int = 100 * 1024 * 1024
    min_isr: int = 2
    snapshot_update_records_per_snapshot: int = 500

    def __post_init__(self) -> None:
        if self.num_partitions < 1:
            raise ValueError("share.coordinator.state.topic.num.partitions must be at least 1")
        if self.min_isr < 1:
            raise ValueError("share.coordinator.state.topic.min.isr must be at least 1")
        if not 0 <= self.snapshot_update_records_per_snapshot <= 500:
            raise ValueError(
                "share.coordinator.snapshot.update.records.per.snapshot must be in [0, 500]"
            )


@dataclass(frozen=True, slots=True)
class PendingWrite:
    """A write appended to its state partition and in the cache, not yet known durable
    (``ShareStateLog.begin_write``): ``wait`` returns once it is fsynced (and replicated),
    or raises as ``append_durably``'s fsync and replication wait do."""

    state: ShareSnapshot
    wait: Callable[[], None]


@dataclass(frozen=True, slots=True)
class _Entry:
    """One share partition's durable state, and where its latest snapshot is."""

    state: ShareSnapshot
    updates_since_snapshot: int
    snapshot_offset: int


class ShareStateLog:
    """Every share partition's durable state, in ``__share_group_state``. Build with
    ``open``. Thread-safe."""

    def __init__(
        self,
        logs: LogManager,
        config: ShareStateLogConfig,
        partitions: int,
        cache: dict[ShareStateKey, _Entry],
        registry: PartitionRegistry,
        on_append: Callable[[str, int], None] | None,
        pending: dict[int, dict[int, list[Entry]]] | None = None,
    ) -> None:
        self._logs = logs
        self._config = config
        self._partitions = partitions
        self._cache = cache
        self._registry = registry
        self._on_append = on_append
        self._cache_lock = threading.Lock()
        # Reentrant: a write reads the state it merges into under the lock its append
        # takes, so no concurrent write lands between (a reload's read_state beside an
        # operation still in flight lost acknowledgements from the served state).
        self._write_locks = [threading.RLock() for _ in range(partitions)]
        self._loaded: dict[int, tuple[int, int]] = {}
        # Per state partition, the end of the last append the cache reflects (guarded by
        # its write lock): every answer is made durable up to it first (group commit).
        self._appended = [0] * partitions
        # Transactional writes not decided yet: state partition -> producer id -> its
        # records (module docstring); guarded by _cache_lock.
        self._pending: dict[int, dict[int, list[Entry]]] = pending or {}

    @classmethod
    def open(
        cls,
        logs: LogManager,
        config: ShareStateLogConfig | None = None,
        *,
        registry: PartitionRegistry | None = None,
        on_append: Callable[[str, int], None] | None = None,
    ) -> ShareStateLog:
        """Create ``__share_group_state`` if needed and load every share partition's
        state. ``registry`` and ``on_append`` as ``TxnLog.open``'s. Raises
        ``StorageError``."""
        config = config or ShareStateLogConfig()
        registry = registry or PartitionRegistry(logs, 0, logs.clock, replicated=False)
        try:
            meta = logs.create_topic(
                SHARE_STATE_TOPIC,
                config.num_partitions,
                state_topic_config(config, replicated=registry.replicated),
                internal=True,
            )
            log.info("created %s with %d partition(s)", SHARE_STATE_TOPIC, meta.partitions)
        except TopicAlreadyExistsError:
            meta = logs.topic(SHARE_STATE_TOPIC)
        cache: dict[ShareStateKey, _Entry] = {}
        pending: dict[int, dict[int, list[Entry]]] = {}
        records = 0
        for p in range(meta.partitions):
            undecided: dict[int, list[Entry]] = {}
            records += replay(logs.get_log(SHARE_STATE_TOPIC, p), _applier(cache), undecided)
            if undecided:
                pending[p] = undecided
        log.info(
            "loaded %d share partition(s) from %d record(s) of %s",
            len(cache),
            records,
            SHARE_STATE_TOPIC,
        )
        return cls(logs, config, meta.partitions, cache, registry, on_append, pending)

    @property
    def partitions(self) -> int:
        return self._partitions

    def partition_for(self, key: ShareStateKey) -> int:
        """The ``__share_group_state`` partition holding ``key``."""
        return partition_for(key, self._partitions)

    # --- reads ----------------------------------------------------------------------

    def read(self, key: ShareStateKey) -> ShareSnapshot | None:
        """``key``'s durable state (snapshot and updates merged), None if never written."""
        with self._cache_lock:
            entry = self._cache.get(key)
        return None if entry is None else entry.state

    def read_state(self, key: ShareStateKey, leader_epoch: int) -> ShareSnapshot | None:
        """``key``'s state for the topic partition's leader at ``leader_epoch`` (it loads
        the share partition): None if never written; a newer epoch than the stored one is
        written first (module docstring), an older one raises ``FencedLeaderEpochError``.
        Raises as ``append_durably`` too."""
        partition = self.partition_for(key)
        with self._write_locks[partition]:
            if self.has_pending(key):
                raise CoordinatorLoadInProgressError(
                    f"share partition {key.group_id}:{key.topic_id}:{key.partition}: a "
                    "dead-letter transaction of it is not decided yet"
                )
            state = self.read(key)
            if state is not None and leader_epoch < state.leader_epoch:
                raise _fenced(key, leader_epoch, state.leader_epoch)
            if state is not None and leader_epoch != state.leader_epoch:
                state = self._write(key, leader_epoch, -1, (), None, None)
            end = self._appended[partition]
        self._sync(partition, end)  # the state read may be an append not durable yet
        return state

    def has_pending(self, key: ShareStateKey) -> bool:
        """Whether a transactional write of ``key`` awaits its transaction's marker."""
        partition = self.partition_for(key)
        with self._cache_lock:
            held = self._pending.get(partition, {})
            return any(_key_of(entry) == key for entries in held.values() for entry in entries)

    def keys(self) -> list[ShareStateKey]:
        with self._cache_lock:
            return sorted(self._cache)

    def group_states(
        self, group_id: str, partition: int
    ) -> list[tuple[ShareStateKey, ShareSnapshot]]:
        """Every share partition of ``group_id`` whose state state partition ``partition``
        holds, with its state (ReadShareGroupStateSummary's answer)."""
        with self._cache_lock:
            return sorted(
                (k, e.state)
                for k, e in self._cache.items()
                if k.group_id == group_id and self.partition_for(k) == partition
            )

    # --- writes ---------------------------------------------------------------------

    def initialize(
        self,
        key: ShareStateKey,
        start_offset: int,
        leader_epoch: int,
        state_epoch: int | None = None,
    ) -> ShareSnapshot:
        """Write a fresh snapshot of ``key``: start at ``start_offset``, nothing in flight.
        ``state_epoch``: the new state epoch, which must be newer than the stored one
        (module docstring; a leader's first use names 0, an admin's reset the epoch it
        read plus one), else ``FencedStateEpochError``; with a pending dead-letter write,
        ``ConcurrentTransactionsError``. None: the next state epoch, unchecked (0 for a
        new share partition). Raises as ``append_durably`` too."""
        partition = self.partition_for(key)
        with self._write_locks[partition]:
            state = self._initialize(key, start_offset, leader_epoch, state_epoch)
            end = self._appended[partition]
        self._sync(partition, end)
        return state

    def _initialize(
        self, key: ShareStateKey, start_offset: int, leader_epoch: int, state_epoch: int | None
    ) -> ShareSnapshot:
        previous = self.read(key)
        now_ms = self._logs.clock.wall_ms()
        if state_epoch is None:
            state_epoch = 0 if previous is None else previous.state_epoch + 1
            check = None
        else:
            check = self._newer_state_check(key, state_epoch)
        snapshot = ShareSnapshot(
            snapshot_epoch=0 if previous is None else previous.snapshot_epoch + 1,
            state_epoch=state_epoch,
            leader_epoch=leader_epoch,
            start_offset=start_offset,
            create_timestamp_ms=now_ms,
            write_timestamp_ms=now_ms,
            batches=(),
        )
        self._append(key, SNAPSHOT, encode_snapshot(snapshot), snapshot, 0, leader_epoch, check)
        return snapshot

    def _newer_state_check(self, key: ShareStateKey, state_epoch: int) -> Callable[[], None]:
        def check() -> None:  # under the write lock
            if self.has_pending(key):
                raise ConcurrentTransactionsError(
                    f"share partition {key.group_id}:{key.topic_id}:{key.partition}: a "
                    "dead-letter transaction of it is not decided yet; retry"
                )
            current = self._entry(key)
            if current is not None and current.state.state_epoch >= state_epoch:
                raise FencedStateEpochError(
                    f"share partition {key.group_id}:{key.topic_id}:{key.partition}: state "
                    f"epoch {state_epoch} is not newer than the state's "
                    f"{current.state.state_epoch} (it was initialized or reset meanwhile)"
                )

        return check

    def _same_state_check(self, key: ShareStateKey, state_epoch: int | None) -> Callable[[], None]:
        def check() -> None:  # under the write lock
            if state_epoch is None:
                return
            current = self._entry(key)
            if current is None or current.state.state_epoch != state_epoch:
                stored = "none (deleted)" if current is None else current.state.state_epoch
                raise FencedStateEpochError(
                    f"share partition {key.group_id}:{key.topic_id}:{key.partition}: "
                    f"loaded at state epoch {state_epoch}, the state's is {stored} (an "
                    "admin reset or deleted it): reload"
                )

        return check

    def write(
        self,
        key: ShareStateKey,
        leader_epoch: int,
        start_offset: int,
        batches: tuple[StateBatch, ...],
        transaction: tuple[int, int] | None = None,
        state_epoch: int | None = None,
    ) -> ShareSnapshot | None:
        """Persist a change of ``key``: the ``batches`` that changed, and ``start_offset``
        (-1: unchanged). With ``transaction`` (producer id, epoch; the partition already
        in that transaction): an update, pending until the transaction's marker (module
        docstring); returns None. Otherwise written as an
        update, or as a snapshot of the merged state when none exists yet or
        ``snapshot_update_records_per_snapshot`` updates followed the last one; returns
        the merged state. Raises ``FencedLeaderEpochError`` for a ``leader_epoch`` older
        than the state's, ``FencedStateEpochError`` for a ``state_epoch`` (the one the
        leader loaded at; None: unchecked) not the state's, and as ``append_durably``;
        the cache is unchanged then."""
        if transaction is not None:  # durable when _append_transactional returns
            with self._write_locks[self.partition_for(key)]:
                return self._write(
                    key, leader_epoch, start_offset, batches, transaction, state_epoch
                )
        pending = self.begin_write(key, leader_epoch, start_offset, batches, state_epoch)
        pending.wait()
        return pending.state

    def begin_write(
        self,
        key: ShareStateKey,
        leader_epoch: int,
        start_offset: int,
        batches: tuple[StateBatch, ...],
        state_epoch: int | None = None,
    ) -> PendingWrite:
        """``write`` (not transactional) in two halves, for group commit: the checks,
        the append and the cache change now, under the state partition's write lock;
        the fsync and the replication wait in ``wait``, after the lock is released, so
        writers of other share partitions (and this one's next, see
        ``SharePartitionManager``) append meanwhile and share them. Raises as ``write``
        (fencing: the cache is unchanged then); ``wait`` raises as ``append_durably``.
        The cache may so hold an append not durable yet: every answer that reads it
        (``read_state``, ``initialize``, ``write``) waits for the state partition's
        last append first."""
        partition = self.partition_for(key)
        with self._write_locks[partition]:
            state = self._write(key, leader_epoch, start_offset, batches, None, state_epoch)
            end = self._appended[partition]
        assert state is not None  # not transactional
        return PendingWrite(state, lambda: self._sync(partition, end))

    def _write(
        self,
        key: ShareStateKey,
        leader_epoch: int,
        start_offset: int,
        batches: tuple[StateBatch, ...],
        transaction: tuple[int, int] | None,
        state_epoch: int | None,
    ) -> ShareSnapshot | None:
        check = self._same_state_check(key, state_epoch)
        if transaction is not None:
            self._append_transactional(key, leader_epoch, start_offset, batches, transaction, check)
            return None
        previous_entry = self._entry(key)
        update = ShareUpdate(
            snapshot_epoch=0 if previous_entry is None else previous_entry.state.snapshot_epoch,
            leader_epoch=leader_epoch,
            start_offset=start_offset,
            batches=batches,
        )
        if previous_entry is None:
            start = max(start_offset, 0)
            now_ms = self._logs.clock.wall_ms()
            merged = ShareSnapshot(
                0, 0, leader_epoch, start, now_ms, now_ms, merge((), batches, start)
            )
            self._append(key, SNAPSHOT, encode_snapshot(merged), merged, 0, leader_epoch, check)
            return merged
        merged = apply_update(previous_entry.state, update)
        if (
            previous_entry.updates_since_snapshot
            >= self._config.snapshot_update_records_per_snapshot
        ):
            snapshot = ShareSnapshot(
                merged.snapshot_epoch + 1,
                merged.state_epoch,
                merged.leader_epoch,
                merged.start_offset,
                merged.create_timestamp_ms,
                self._logs.clock.wall_ms(),
                merged.batches,
            )
            self._append(key, SNAPSHOT, encode_snapshot(snapshot), snapshot, 0, leader_epoch, check)
            return snapshot
        count = previous_entry.updates_since_snapshot + 1
        self._append(key, UPDATE, encode_update(update), merged, count, leader_epoch, check)
        return merged

    def _append_transactional(
        self,
        key: ShareStateKey,
        leader_epoch: int,
        start_offset: int,
        batches: tuple[StateBatch, ...],
        transaction: tuple[int, int],
        check: Callable[[], None],
    ) -> None:
        previous = self._entry(key)
        update = ShareUpdate(
            snapshot_epoch=0 if previous is None else previous.state.snapshot_epoch,
            leader_epoch=leader_epoch,
            start_offset=start_offset,
            batches=batches,
        )
        record = (encode_key(UPDATE, key), encode_update(update))
        partition = self.partition_for(key)
        target = self._registry.get(SHARE_STATE_TOPIC, partition)
        with self._write_locks[partition]:
            current = self._entry(key)
            if current is not None and leader_epoch < current.state.leader_epoch:
                raise _fenced(key, leader_epoch, current.state.leader_epoch)
            check()
            result = append_durably(
                target,
                [record],
                self._logs.clock.wall_ms(),
                self._on_append,
                transaction=transaction,
            )
            with self._cache_lock:
                held = self._pending.setdefault(partition, {}).setdefault(transaction[0], [])
                held.append((result.base_offset, *record))

    def end_transaction(self, partition: int, producer_id: int, commit: bool) -> None:
        """A marker of ``producer_id``'s transaction was written (durably) to state
        partition ``partition``: its pending writes there go to the cache (``commit``)
        or are dropped."""
        with self._write_locks[partition], self._cache_lock:
            held = self._pending.get(partition, {})
            entries = held.pop(producer_id, [])
            if not held:
                self._pending.pop(partition, None)
            if commit:
                apply = _applier(self._cache)
                for entry in entries:
                    apply(*entry)

    def write_transactional(
        self,
        key: ShareStateKey,
        leader_epoch: int,
        start_offset: int,
        batches: tuple[StateBatch, ...],
        transaction: tuple[int, int],
        state_epoch: int | None = None,
    ) -> None:
        """``write`` with ``transaction`` (the ``ShareStateStore`` call)."""
        self.write(key, leader_epoch, start_offset, batches, transaction, state_epoch)

    def state_partition(self, key: ShareStateKey) -> int:
        """``partition_for`` (the ``ShareStateStore`` call)."""
        return self.partition_for(key)

    def delete(self, key: ShareStateKey) -> None:
        """Forget ``key`` (its group or topic was deleted): tombstones for its snapshot
        and update keys. Raises ``ConcurrentTransactionsError`` while a dead-letter write
        of it is pending (module docstring), and as ``append_durably``."""
        partition = self.partition_for(key)
        records: list[tuple[bytes, bytes | None]] = [
            (encode_key(SNAPSHOT, key), None),
            (encode_key(UPDATE, key), None),
        ]
        target = self._registry.get(SHARE_STATE_TOPIC, partition)
        with self._write_locks[partition]:
            if self.has_pending(key):
                raise ConcurrentTransactionsError(
                    f"share partition {key.group_id}:{key.topic_id}:{key.partition}: a "
                    "dead-letter transaction of it is not decided yet; retry"
                )
            append_durably(target, records, self._logs.clock.wall_ms(), self._on_append)
            with self._cache_lock:
                self._cache.pop(key, None)

    def prune(self, partition: int) -> int:
        """Delete the records of state partition ``partition`` that no reload needs: those
        before the oldest latest-snapshot of its share partitions (all of them when it
        holds none). Returns the new log start offset. Raises as
        ``Partition.delete_records``."""
        target = self._registry.get(SHARE_STATE_TOPIC, partition)
        with self._write_locks[partition]:
            with self._cache_lock:
                needed = [
                    e.snapshot_offset
                    for k, e in self._cache.items()
                    if self.partition_for(k) == partition
                ]
                needed += [
                    entries[0][0]
                    for entries in self._pending.get(partition, {}).values()
                    if entries
                ]
            end = target.log.high_watermark
            offset = min([*needed, end])
            if offset <= target.log.log_start_offset:
                return target.log.log_start_offset
            target.delete_records(offset)
        log.info("%s-%d: pruned records before %d", SHARE_STATE_TOPIC, partition, offset)
        return offset

    def _sync(self, partition: int, end: int) -> None:
        """Make state partition ``partition`` durable below ``end`` (fsync, and replicated
        the in-sync replicas' copies): one fsync serves every writer waiting for it."""
        if end <= 0:
            return
        target = self._registry.get(SHARE_STATE_TOPIC, partition)
        make_durable(target, end, self._on_append)

    def _entry(self, key: ShareStateKey) -> _Entry | None:
        with self._cache_lock:
            return self._cache.get(key)

    def _append(
        self,
        key: ShareStateKey,
        record_type: int,
        value: bytes,
        state: ShareSnapshot,
        count: int,
        leader_epoch: int,
        check: Callable[[], None] | None = None,
    ) -> None:
        partition = self.partition_for(key)
        target = self._registry.get(SHARE_STATE_TOPIC, partition)
        with self._write_locks[partition]:
            current = self._entry(key)
            if current is not None and leader_epoch < current.state.leader_epoch:
                raise _fenced(key, leader_epoch, current.state.leader_epoch)
            if check is not None:
                check()
            result = append_unsynced(
                target, [(encode_key(record_type, key), value)], self._logs.clock.wall_ms()
            )
            self._appended[partition] = result.last_offset + 1  # made durable by _sync
            with self._cache_lock:
                previous = self._cache.get(key)
                snapshot_offset = (
                    result.last_offset
                    if record_type == SNAPSHOT or previous is None
                    else previous.snapshot_offset
                )
                self._cache[key] = _Entry(state, count, snapshot_offset)

    # --- leadership -----------------------------------------------------------------

    def reload_partition(self, partition: int) -> list[ShareStateKey]:
        """Replace the cache of ``partition``'s share partitions with what its log holds
        (this broker became its leader); returns their keys. Raises ``StorageError``."""
        fresh: dict[ShareStateKey, _Entry] = {}
        with self._write_locks[partition]:
            epoch = self._registry.get(SHARE_STATE_TOPIC, partition).leader_epoch
            partition_log = self._logs.get_log(SHARE_STATE_TOPIC, partition)
            undecided: dict[int, list[Entry]] = {}
            records = replay(partition_log, _applier(fresh), undecided)
            with self._cache_lock:
                for key in [k for k in self._cache if self.partition_for(k) == partition]:
                    del self._cache[key]
                self._cache.update(fresh)
                self._pending.pop(partition, None)
                if undecided:
                    self._pending[partition] = undecided
                if epoch is not None:
                    self._loaded[partition] = (epoch, partition_log.log_end_offset)
            self._appended[partition] = partition_log.log_end_offset
        log.info(
            "%s-%d: reloaded %d share partition(s) from %d record(s)",
            SHARE_STATE_TOPIC,
            partition,
            len(fresh),
            records,
        )
        return sorted(fresh)

    def unload_partition(self, partition: int) -> None:
        """This broker stopped leading ``partition``: forget its share partitions."""
        with self._cache_lock:
            for key in [k for k in self._cache if self.partition_for(k) == partition]:
                del self._cache[key]
            self._loaded.pop(partition, None)
            self._pending.pop(partition, None)

    def check_loaded(self, partition: int) -> None:
        """Cluster mode: ``CoordinatorLoadInProgressError`` until ``partition`` was loaded
        at this broker's current leader epoch and replicated. A no-op on a single node."""
        with self._cache_lock:
            loaded = self._loaded.get(partition)
        target = self._registry.get(SHARE_STATE_TOPIC, partition)
        check_loaded(target, loaded, "share-group state")


def _fenced(key: ShareStateKey, asked: int, stored: int) -> FencedLeaderEpochError:
    return FencedLeaderEpochError(
        f"share partition {key.group_id}:{key.topic_id}:{key.partition}: leader epoch "
        f"{asked} is older than the state's {stored} (another broker leads it now)"
    )


def state_topic_config(config: ShareStateLogConfig, *, replicated: bool) -> dict[str, str]:
    """The topic configs of ``__share_group_state`` (module docstring: not compacted, no
    retention; the cluster's controller creates it with these too)."""
    return {
        "cleanup.policy": "delete",
        "retention.ms": "-1",
        "retention.bytes": "-1",
        "compression.type": "uncompressed",
        "unclean.leader.election.enable": "false",
        "segment.bytes": str(config.segment_bytes),
        "min.insync.replicas": str(config.min_isr if replicated else 1),
    }


def _key_of(entry: Entry) -> ShareStateKey | None:
    """The share partition a held record is about (None: not decodable)."""
    try:
        return decode_key(entry[1])[1] if entry[1] is not None else None
    except (ValueError, CorruptRecordError):
        return None


def _applier(
    cache: dict[ShareStateKey, _Entry],
) -> Callable[[int, bytes | None, bytes | None], None]:
    def apply(offset: int, key: bytes | None, value: bytes | None) -> None:
        try:
            if key is None:
                raise ValueError("a record without a key")
            record_type, state_key = decode_key(key)
            if value is None:
                cache.pop(state_key, None)
            elif record_type == SNAPSHOT:
                cache[state_key] = _Entry(decode_snapshot(value), 0, offset)
            else:
                update = decode_update(value)
                previous = cache.get(state_key)
                if previous is None:
                    # Its snapshot was pruned or never written: start from the update
                    # (Kafka's coordinator does the same).
                    start = max(update.start_offset, 0)
                    empty = ShareSnapshot(0, 0, update.leader_epoch, start, 0, 0, ())
                    cache[state_key] = _Entry(apply_update(empty, update), 0, offset)
                else:
                    cache[state_key] = _Entry(
                        apply_update(previous.state, update),
                        previous.updates_since_snapshot + 1,
                        previous.snapshot_offset,
                    )
        except (ValueError, CorruptRecordError) as exc:
            # Only a bug writes such a record (its batch passed its CRC); the broker keeps
            # serving the other share partitions rather than refusing to start.
            log.error("%s: skipping record %d: %s", SHARE_STATE_TOPIC, offset, exc)

    return apply
