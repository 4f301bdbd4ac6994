"""Producer ids for a cluster, drawn from ZooKeeper (Kafka's ``ZkProducerIdManager``).

In cluster mode every broker answers ``InitProducerId`` through this class instead of
the data directory's counter (``broker/core/producer_ids.py``), so that an id is never handed
out twice across the cluster, whichever broker a producer asks and whichever broker dies
when.

**New ids come in blocks.** ``/latest_producer_id_block`` holds the last block claimed
(``{"version":1,"broker":N,"block_start":S,"block_end":E}``, both ends inclusive). A broker
that has used up its block (or has none: it just started) reads the znode and writes the
next 1,000 ids after ``block_end`` at the version it read; a broker that claimed in
between makes the write fail, and the claim starts over from a new read. The block is in
ZooKeeper before its first id is handed out, so a broker that dies mid-block loses the
rest of the block (its next life, or any other broker, claims a fresh one) and never hands
out an id twice. Nothing of this is kept on disk.

**Epoch bumps** (``init(id, epoch)``): ids up to the end of the latest claimed block are
known to the cluster (any block, any broker: the last block's end is re-read when an id
lies past what this broker has seen); others are ``UnknownProducerIdError``. Each broker
remembers the epochs it handed out for ``producer.id.expiration.ms``; for an id it has no
record of (initialised on another broker, or before a restart), it trusts the caller's
epoch, as the single node does for an expired entry: the partition logs still fence any
lower epoch (``storage/producer_state.py``). Two instances of one producer bumping at
the same moment through two brokers can therefore both get epoch + 1; the partitions
accept whichever writes first at that epoch and its sequences (Kafka leaves epoch bumps of
non-transactional producers to the client for the same reason).

**Keyed ids** (``init_keyed``, the Spark sink's): one znode per key,
``/tidelog/producer_keys/<producer_key_name(key)>`` holding
``{"version":1,"producer_id":P,"producer_epoch":E,"last_used_ms":T}``. A new key's znode
is created with create-if-absent: of two brokers racing, the loser reads the winner's id
(its own fresh id is simply never used). A use refreshes ``last_used_ms`` by
compare-and-set; a key unused for longer than ``producer.id.expiration.ms`` gets a fresh
id (compare-and-set too, so two brokers agree on it). The stored epoch is the one the id
was created with: keyed writers choose their epochs themselves
(``client/keyed_producer.py``), and a bump through ``init`` is tracked like any other.

**Sweep.** So that ``/tidelog/producer_keys`` does not grow for good, each broker looks
at up to ``sweep_max_reads`` keys (in turn, a cursor over the sorted names) every
``producer.id.expiration.check.interval.ms`` and deletes the expired ones at the version
read (a key refreshed meanwhile stays). The sweep runs in the call that finds it due: one
call in ten minutes pays up to a few hundred ZooKeeper reads, which keeps this class free
of threads; a failed sweep is logged and never fails the call.

Errors: a ZooKeeper outage is ``BrokerUnavailableError`` (retriable); a znode that does
not parse is ``StorageError``. Thread-safe: one lock guards the block and the epochs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from tidelog.broker.cluster.errors import StaleStateError, StoreError
from tidelog.broker.cluster.store import ClusterStore
from tidelog.broker.cluster.znodes import (
    KeyedProducerId,
    ProducerIdBlock,
    ZnodeError,
    producer_key_name,
)
from tidelog.broker.core.producer_ids import (
    MAX_PRODUCER_EPOCH,
    check_init_request,
    check_producer_key,
)
from tidelog.storage.clock import Clock
from tidelog.storage.errors import (
    BrokerUnavailableError,
    InvalidProducerEpochError,
    StorageError,
    UnknownProducerIdError,
)

__all__ = ["PRODUCER_ID_BLOCK_SIZE", "ZooKeeperProducerIds"]

log = logging.getLogger(__name__)

PRODUCER_ID_BLOCK_SIZE = 1000  # Kafka's ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE
_MAX_PRODUCER_ID = 2**63 - 1  # the batch header's producerId is an int64
_MAX_ATTEMPTS = 20  # compare-and-set rounds lost in a row before giving up (retriable)
_SWEEP_MAX_READS = 200


class ZooKeeperProducerIds:
    """``ProducerIdSource`` for cluster mode (module docstring). Thread-safe."""

    def __init__(
        self,
        store: ClusterStore,
        broker_id: int,
        clock: Clock,
        expiration_ms: int,
        *,
        sweep_interval_ms: int,
        block_size: int = PRODUCER_ID_BLOCK_SIZE,
        sweep_max_reads: int = _SWEEP_MAX_READS,
    ) -> None:
        if block_size < 1 or sweep_max_reads < 1:
            raise ValueError("block_size and sweep_max_reads must be positive")
        self._store = store
        self._broker_id = broker_id
        self._clock = clock
        self._expiration_ms = expiration_ms
        self._sweep_interval_ms = sweep_interval_ms
        self._block_size = block_size
        self._sweep_max_reads = sweep_max_reads
        self._lock = threading.Lock()
        # All below guarded by _lock.
        self._block: ProducerIdBlock | None = None  # this broker's current block
        self._next_producer_id = 0  # the next id of _block to hand out
        self._known_end = -1  # the highest block_end seen: every id up to it was claimed
        self._epochs: dict[int, tuple[int, int]] = {}  # id -> (epoch, last init wall ms)
        self._next_sweep_ms = clock.monotonic_ms() + sweep_interval_ms
        self._sweep_cursor = 0
        self._sweeping = False

    @property
    def block(self) -> ProducerIdBlock | None:
        """The block this broker hands ids from (None before its first new id)."""
        with self._lock:
            return self._block

    def init(self, producer_id: int, producer_epoch: int) -> tuple[int, int]:
        """Answer ``InitProducerId``: a new id (``-1, -1``) or a bumped epoch.

        Raises:
            InvalidRequestError: only one of the two is -1, or either is below -1.
            UnknownProducerIdError: ``producer_id`` is beyond every claimed block.
            InvalidProducerEpochError: this broker handed out another epoch for the id.
            BrokerUnavailableError: ZooKeeper failed; nothing was handed out.
        """
        new = check_init_request(producer_id, producer_epoch)
        with _zookeeper_errors("InitProducerId"), self._lock:
            now_ms = self._clock.wall_ms()
            if new:
                answer = (self._allocate_locked(), 0)
                self._epochs[answer[0]] = (0, now_ms)
            else:
                answer = self._bump_locked(producer_id, producer_epoch, now_ms)
        self._maybe_sweep()
        return answer

    def init_keyed(self, key: str) -> tuple[int, int]:
        """Answer a keyed ``InitProducerId``: the key's id and its epoch, never bumped.

        The same answer from every broker while the key is used within
        ``producer.id.expiration.ms``; a new or expired key gets a fresh id, epoch 0.

        Raises:
            InvalidRequestError: the key is empty or longer than 1,024 characters.
            BrokerUnavailableError: ZooKeeper failed, or lost 20 races in a row.
        """
        check_producer_key(key)
        name = producer_key_name(key)
        with _zookeeper_errors(f"producer key {key!r}"):
            for _ in range(_MAX_ATTEMPTS):
                now_ms = self._clock.wall_ms()
                found = self._store.read_producer_key(name)
                version = -1 if found is None else found[1]
                if found is not None and not self._expired(found[0].last_used_ms, now_ms):
                    entry = replace(found[0], last_used_ms=max(now_ms, found[0].last_used_ms))
                else:
                    entry = KeyedProducerId(self._allocate(), 0, now_ms)
                try:
                    self._store.write_producer_key(name, entry, version)
                except StaleStateError:
                    continue  # another broker created, refreshed, replaced or swept it
                if found is None or entry.producer_id != found[0].producer_id:
                    log.info("producer key %r: producer id %d", key, entry.producer_id)
                break
            else:
                raise BrokerUnavailableError(
                    f"producer key {key!r}: lost {_MAX_ATTEMPTS} races in ZooKeeper; retry"
                )
        self._maybe_sweep()
        return entry.producer_id, entry.producer_epoch

    def sweep_expired_keys(self) -> int:
        """Delete expired keys among the next ``sweep_max_reads``; return how many went.

        Raises ``StoreError`` if ZooKeeper failed (keys deleted until then stay deleted).
        """
        names = self._store.producer_key_names()
        if not names:
            return 0
        with self._lock:
            start = self._sweep_cursor % len(names)
            chosen = (names[start:] + names[:start])[: self._sweep_max_reads]
            self._sweep_cursor = start + len(chosen)
        now_ms = self._clock.wall_ms()
        deleted = 0
        for name in chosen:
            try:
                found = self._store.read_producer_key(name)
            except ZnodeError as exc:
                log.warning("producer key znode %s does not parse; left alone: %s", name, exc)
                continue
            if found is None or not self._expired(found[0].last_used_ms, now_ms):
                continue
            if self._store.delete_producer_key(name, found[1]):
                deleted += 1
        if deleted:
            log.info("swept %d expired producer keys (of %d read)", deleted, len(chosen))
        return deleted

    # --- allocation ------------------------------------------------------------------

    def _allocate(self) -> int:
        with self._lock:
            return self._allocate_locked()

    def _allocate_locked(self) -> int:
        if self._block is None or self._next_producer_id > self._block.block_end:
            self._block = self._claim_block_locked()
            self._next_producer_id = self._block.block_start
        producer_id = self._next_producer_id
        self._next_producer_id += 1
        return producer_id

    def _claim_block_locked(self) -> ProducerIdBlock:
        """Claim the block after the latest one (compare-and-set, again on a lost race)."""
        for _ in range(_MAX_ATTEMPTS):
            found = self._store.read_producer_id_block()
            start, version = (0, -1) if found is None else (found[0].block_end + 1, found[1])
            end = start + self._block_size - 1
            if end > _MAX_PRODUCER_ID:
                raise StorageError("the cluster has used up every producer id (int64)")
            block = ProducerIdBlock(self._broker_id, start, end)
            try:
                self._store.claim_producer_id_block(block, version)
            except StaleStateError:
                continue  # another broker claimed the block first: read the new latest
            self._known_end = max(self._known_end, end)
            log.info("broker %d claimed producer ids %d..%d", self._broker_id, start, end)
            return block
        raise BrokerUnavailableError(
            f"lost {_MAX_ATTEMPTS} races for a producer id block in ZooKeeper; retry"
        )

    def _bump_locked(self, producer_id: int, epoch: int, now_ms: int) -> tuple[int, int]:
        if producer_id > self._known_end:
            found = self._store.read_producer_id_block()
            if found is not None:
                self._known_end = max(self._known_end, found[0].block_end)
            if producer_id > self._known_end:
                raise UnknownProducerIdError(f"producer id {producer_id} was never allocated")
        entry = self._epochs.get(producer_id)
        if entry is not None and self._expired(entry[1], now_ms):
            entry = None
        current = entry[0] if entry is not None else epoch  # no record: trust the producer
        if epoch != current:
            raise InvalidProducerEpochError(
                f"producer id {producer_id}: epoch {epoch} is not the current epoch {current}; "
                "another instance re-initialised this producer"
            )
        if current >= MAX_PRODUCER_EPOCH:
            log.info("producer id %d exhausted its epochs; allocating a new id", producer_id)
            fresh = self._allocate_locked()
            self._epochs[fresh] = (0, now_ms)
            return fresh, 0
        self._epochs[producer_id] = (current + 1, now_ms)
        log.info("producer id %d re-initialised: epoch %d", producer_id, current + 1)
        return producer_id, current + 1

    # --- expiry ----------------------------------------------------------------------

    def _expired(self, last_used_ms: int, now_ms: int) -> bool:
        return now_ms - last_used_ms > self._expiration_ms

    def _maybe_sweep(self) -> None:
        """Sweep keys and forget expired epochs if the interval has passed (one at a time)."""
        with self._lock:
            now_ms = self._clock.monotonic_ms()
            if self._sweeping or now_ms < self._next_sweep_ms:
                return
            self._sweeping = True
            self._next_sweep_ms = now_ms + self._sweep_interval_ms
            wall_ms = self._clock.wall_ms()
            self._epochs = {
                pid: e for pid, e in self._epochs.items() if not self._expired(e[1], wall_ms)
            }
        try:
            self.sweep_expired_keys()
        except (StoreError, ZnodeError) as exc:
            log.warning("sweeping expired producer keys failed: %s", exc)
        finally:
            with self._lock:
                self._sweeping = False


@contextmanager
def _zookeeper_errors(what: str) -> Iterator[None]:
    """ZooKeeper's failures as the core's errors: retriable outage, or damaged state."""
    try:
        yield
    except StoreError as exc:
        raise BrokerUnavailableError(f"{what}: ZooKeeper is unavailable ({exc})") from exc
    except ZnodeError as exc:
        raise StorageError(f"{what}: damaged state in ZooKeeper ({exc})") from exc
