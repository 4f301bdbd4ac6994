"""``Producer``: sends records to a Tidelog broker, batched, in the background.

::

    with Producer("127.0.0.1:7410", acks="all", linger_ms=5, compression="lz4") as producer:
        future = producer.send("events", value=b"...", key=b"user-1")
        metadata = future.result(timeout=10)   # RecordMetadata(topic, partition, offset, ...)

``send`` picks the partition (``client.partitioner``), appends the record to that
partition's open batch (``client.accumulator``) and returns a
``concurrent.futures.Future`` of its ``RecordMetadata``; it never waits for the network.
It blocks only when the buffer is full (``buffer_memory``), for up to ``max_block_ms``,
then raises ``BufferExhaustedError``. A record for a topic whose partition count is not
known yet waits in the producer (not in ``send``) until the sender thread has it.

The sender thread (``client.sender``) sends the batches over one produce stream,
retries what fails retriably, and completes the futures. With ``enable_idempotence``
(the default) every batch carries a producer id and sequence numbers, so a retry is
stored once, and records of a partition are stored in the order they were sent.

Transactions (``transactional_id=...``, kafka-python's names; ``client.transactions``)::

    producer = Producer("127.0.0.1:7410", transactional_id="copier-1")
    producer.init_transactions()            # fences older instances of "copier-1"
    producer.begin_transaction()
    producer.send("out", b"...")
    producer.send_offsets_to_transaction({tp: next_offset}, consumer.group_metadata())
    producer.commit_transaction()           # or abort_transaction()

Every record sent between ``begin_transaction`` and ``commit_transaction`` (to any
partitions), and the offsets sent with it, is visible to ``read_committed`` consumers if
and only if the transaction commits.

Thread-safe: any number of threads may ``send`` at once. Callbacks (``callback=`` or
``future.add_done_callback``) run on the producer's I/O thread: keep them short and do
not call ``flush``/``close`` from them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from types import TracebackType
from typing import Any, Protocol

from tidelog.client.accumulator import NEW_BATCH, NO_ROOM, RECORD_OVERHEAD_BYTES, RecordAccumulator
from tidelog.client.config import DEFAULT_BOOTSTRAP, ProducerConfig, resolve_config
from tidelog.client.connection import ConnectionFactory
from tidelog.client.errors import BufferExhaustedError, ClosedError
from tidelog.client.futures import RecordFuture
from tidelog.client.grpc_connection import grpc_connections
from tidelog.client.idempotence import SequenceTable
from tidelog.client.offsets import partitions_of
from tidelog.client.partitioner import NATIVE_MURMUR2, StickyPartitioner, murmur2
from tidelog.client.routing import ClusterConnections
from tidelog.client.security import ClientSecurity
from tidelog.client.sender import ParkedRecord, Sender, now_ms
from tidelog.client.transactions import (
    TransactionManager,
    TxnState,
    group_metadata_of,
    offsets_of,
)
from tidelog.client.types import ConsumerGroupMetadata, Header, RecordMetadata, TopicPartition
from tidelog.storage.errors import (
    InvalidTxnStateError,
    KafkaTimeoutError,
    RecordTooLargeError,
    TidelogError,
)
from tidelog.storage.records import HEADER_SIZE, Compression

__all__ = ["DeliveryCallback", "Producer"]

log = logging.getLogger(__name__)

_time_ns = time.time_ns
_KEY_HASH_CACHE_SIZE = 16_384
_TOPIC_KNOWN = -1  # _park: the count arrived, the record was not parked


class DeliveryCallback(Protocol):
    """``callback(metadata, error)``: exactly one of them is None."""

    def __call__(self, metadata: RecordMetadata | None, error: BaseException | None) -> Any: ...


class Producer:
    """Sends records to each partition's leader. Thread-safe; use as a context manager or ``close``.

    Args:
        bootstrap_servers: ``HOST:PORT[,HOST:PORT...]``: any live broker of the cluster.
        config: a whole ``ProducerConfig`` instead of keyword settings.
        connection_factory: how to reach a broker (default gRPC); tests pass
            ``client.testing.InMemoryCluster.connect``.
        **settings: ``ProducerConfig`` fields (``acks``, ``linger_ms``, ``batch_size``,
            ``compression``, ...), or their Kafka dotted names.

    Raises ``ValueError`` for unknown or invalid settings. Connecting happens in the
    background: a broker that is down is noticed by the first records' futures.
    """

    def __init__(
        self,
        bootstrap_servers: str = DEFAULT_BOOTSTRAP,
        *,
        config: ProducerConfig | None = None,
        connection_factory: ConnectionFactory | None = None,
        wall_clock: Callable[[], int] | None = None,
        **settings: object,
    ) -> None:
        """``wall_clock``: the producer's wall clock in ms for default record timestamps
        and each request's send time (tests inject a skewed device clock); the system's
        by default. Timers (linger, timeouts) always use the system clock."""
        self._wall_clock = wall_clock
        config = resolve_config(ProducerConfig.from_mapping, bootstrap_servers, config, settings)
        self.config = config
        # Each partition's batches go to its leader, one produce stream per broker.
        self._connections = ClusterConnections(
            config.bootstrap_servers,
            connection_factory
            or grpc_connections(
                client_id=config.client_id,
                request_timeout_ms=config.request_timeout_ms,
                reconnect_backoff_max_ms=config.reconnect_backoff_max_ms,
                max_send_bytes=config.max_request_size,
                security=ClientSecurity.of(config),
            ),
            request_timeout_ms=config.request_timeout_ms,
            metadata_max_age_ms=config.metadata_max_age_ms,
        )
        self._lock = threading.Lock()
        self._futures_condition = threading.Condition()  # an RLock: futures.wait needs one
        self._new_future = RecordFuture.factory(self._futures_condition)
        # Kafka's names (compression.type) are the codecs' names in upper case.
        compression = Compression[(config.compression or "none").upper()]
        batch_size = min(config.batch_size, config.max_request_size - HEADER_SIZE)
        self._accumulator: RecordAccumulator[RecordFuture] = RecordAccumulator(
            batch_size=batch_size,
            buffer_memory=config.buffer_memory,
            linger_ms=config.linger_ms,
            compression=compression,
            max_in_flight=config.max_in_flight_requests_per_connection,
            ordered_single_flight=not config.enable_idempotence,
            transactional=config.transactional_id is not None,
        )
        self._txn = (
            None
            if config.transactional_id is None
            else TransactionManager(
                config.transactional_id,
                config.transaction_timeout_ms,
                self._connections,
                request_timeout_ms=config.request_timeout_ms,
                retry_backoff_ms=config.retry_backoff_ms,
            )
        )
        # A transactional producer's identity is the transaction manager's to set.
        self._sequences = (
            SequenceTable(external_identity=self._txn is not None)
            if config.enable_idempotence
            else None
        )
        self._partitioner = StickyPartitioner(batch_size)
        self._sender = Sender(
            config,
            self._connections,
            self._accumulator,
            self._sequences,
            self._partitioner,
            self._lock,
            self._futures_condition,
            wall_clock=wall_clock or now_ms,
            transactions=self._txn,
        )
        # The largest record that can travel alone: a batch header plus the record must
        # fit in one request, and in the buffer.
        self._max_record_bytes = min(config.max_request_size - HEADER_SIZE, config.buffer_memory)
        # The sender's metadata, read here without its lock (dict reads are atomic).
        self._topic_partitions = self._sender.topic_partitions
        # murmur2 of recent keys, for the pure-Python hash: keys repeat in most workloads
        # (user and entity ids), and a dict hit costs ~0.05 us against ~1.5 us for the
        # hash in pure Python. The C hash (~0.08 us) is called directly.
        self._key_hashes: dict[bytes, int] = {}
        self._closed = False
        self._close_lock = threading.Lock()
        self._sender.start()

    # --- sending --------------------------------------------------------------------------

    def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        headers: Iterable[Header] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        callback: DeliveryCallback | None = None,
    ) -> Future[RecordMetadata]:
        """Queue one record; return the future of its ``RecordMetadata``.

        ``key``/``value`` are bytes (or bytes-like) or None; ``headers`` ``(str, bytes |
        None)`` pairs. Without ``partition`` a keyed record goes to Kafka's murmur2
        partition of its key, a keyless one to the topic's sticky partition.
        ``timestamp_ms`` defaults to now. ``callback(metadata, error)`` runs once the
        record is stored or failed.

        Raises ``TypeError``/``ValueError`` for bad arguments (a partition out of range
        of a topic whose size is known), ``RecordTooLargeError`` for a record larger
        than ``max_request_size`` or ``buffer_memory``, ``BufferExhaustedError`` if the
        buffer stayed full for ``max_block_ms``, ``ClosedError`` after ``close``, and the
        producer's fatal error once it has one (an idempotent producer refused a producer
        id for good, e.g. ``ClusterAuthorizationFailedError``: close it).
        The future fails with the error that stopped delivery (``KafkaTimeoutError``
        after ``delivery_timeout_ms``, ``UnknownTopicOrPartitionError`` for a topic that
        did not appear within ``max_block_ms``; at once ``TopicAuthorizationFailedError``
        for a topic the principal may not describe and ``InvalidTopicError`` for an
        illegal name, as Kafka's producer; or the broker's error).
        """
        if self._closed:
            raise ClosedError("the producer is closed")
        fatal = self._sender.fatal_error
        if fatal is not None:
            raise _fatal_copy(fatal)
        if self._txn is not None:
            self._txn.check_send()
        if topic.__class__ is not str or not topic:
            raise TypeError(f"topic must be a non-empty str, got {topic!r}")
        size = RECORD_OVERHEAD_BYTES
        if key is not None:
            if key.__class__ is not bytes:
                key = _as_bytes(key, "key")
            size += len(key)
        if value is not None:
            if value.__class__ is not bytes:
                value = _as_bytes(value, "value")
            size += len(value)
        record_headers: tuple[Header, ...] = ()
        if headers:
            record_headers, header_bytes = _check_headers(headers)
            size += header_bytes
        if size > self._max_record_bytes:
            raise RecordTooLargeError(
                f"a record of about {size} bytes exceeds the limit of {self._max_record_bytes} "
                "(max_request_size and buffer_memory)"
            )
        now = _time_ns() // 1_000_000
        if timestamp_ms is None:
            timestamp_ms = now if self._wall_clock is None else self._wall_clock()
        elif timestamp_ms.__class__ is not int or timestamp_ms < 0:
            raise ValueError(f"timestamp_ms must be a non-negative int, got {timestamp_ms!r}")
        future = self._new_future()
        if callback is not None:
            future.add_done_callback(_delivery_adapter(callback))
        tps = self._topic_partitions.get(topic)
        if tps is None:
            if partition is not None and (partition.__class__ is not int or partition < 0):
                raise ValueError(f"partition must be a non-negative int, got {partition!r}")
            tps = self._park(
                topic, timestamp_ms, key, value, record_headers, partition, size, future
            )
            if tps is None:
                return future
            # The partition count arrived while send() waited for the lock: append as
            # usual, never parked behind records that were sent after this one.
        count = len(tps)
        if partition is None:
            if key is not None:
                if count == 1:
                    partition = 0  # what murmur2 would say, without the cost
                elif NATIVE_MURMUR2:
                    partition = (murmur2(key) & 0x7FFFFFFF) % count  # C: cheaper than a cache
                else:
                    hashed = self._key_hashes.get(key)
                    if hashed is None:
                        hashed = self._hash_key(key)
                    partition = hashed % count
        elif partition.__class__ is not int or not 0 <= partition < count:
            raise ValueError(
                f"partition {partition!r} is out of range: topic {topic!r} has {count} partitions"
            )
        lock = self._lock
        if not lock.acquire(False):
            # The sender thread holds it: ask it to hand over the GIL when it lets go.
            self._sender.lock_wanted = True
            lock.acquire()
        try:
            if self._closed:
                raise ClosedError("the producer is closed")
            if partition is None:
                partition = self._partitioner.partition(topic, count, size)
            tp = tps[partition]
            status = self._accumulator.append(
                tp, timestamp_ms, key, value, record_headers, size, future, now
            )
            if status == NEW_BATCH:
                self._sender.wakeup.notify()
            elif status == NO_ROOM:
                self._wait_for_memory_locked(
                    lambda: self._accumulator.append(
                        tp, timestamp_ms, key, value, record_headers, size, future, now_ms()
                    )
                )
        finally:
            lock.release()
        return future

    def _hash_key(self, key: bytes) -> int:
        hashed = murmur2(key) & 0x7FFFFFFF
        cache = self._key_hashes
        if len(cache) >= _KEY_HASH_CACHE_SIZE:
            cache.clear()  # cheaper than tracking recency; refills with the keys in use
        cache[key] = hashed
        return hashed

    def _park(
        self,
        topic: str,
        timestamp_ms: int,
        key: bytes | None,
        value: bytes | None,
        headers: tuple[Header, ...],
        partition: int | None,
        size: int,
        future: RecordFuture,
    ) -> list[TopicPartition] | None:
        """Hold a record until ``topic``'s partition count is known.

        Returns None once the record is parked, or the topic's partitions if the count
        became known before the record could be parked: the caller then appends it as any
        other record. Checked under the lock, on every attempt: the sender places parked
        records under the same lock that publishes the count, so a record parked after
        that would be placed only at the next metadata refresh, behind records sent after
        it (issue 11: one producer's records stored out of order).
        """
        record = ParkedRecord(
            timestamp_ms,
            key,
            value,
            headers,
            partition,
            size,
            future,
            now_ms() + self.config.max_block_ms,
        )
        sender = self._sender
        known: list[list[TopicPartition]] = []

        def attempt() -> int:
            tps = self._topic_partitions.get(topic)
            if tps is not None:
                known.append(tps)
                return _TOPIC_KNOWN
            return NEW_BATCH if sender.park_locked(topic, record) else NO_ROOM

        with self._lock:
            if self._closed:
                raise ClosedError("the producer is closed")
            if attempt() == NO_ROOM:
                self._wait_for_memory_locked(attempt)
        return known[0] if known else None

    def _wait_for_memory_locked(self, attempt: Any) -> None:
        """Retry ``attempt()`` as memory frees up, for up to ``max_block_ms``."""
        sender = self._sender
        accumulator = self._accumulator
        deadline = now_ms() + self.config.max_block_ms
        sender.memory_waiters += 1
        accumulator.waiting_for_memory = True
        sender.wakeup.notify()
        try:
            while True:
                status = attempt()
                if status == NEW_BATCH:
                    sender.wakeup.notify()
                if status != NO_ROOM:
                    return
                if self._closed:
                    raise ClosedError("the producer is closed")
                remaining = deadline - now_ms()
                if remaining <= 0:
                    raise BufferExhaustedError(
                        f"the producer's buffer ({accumulator.buffer_memory} bytes) stayed "
                        f"full for max_block_ms={self.config.max_block_ms}"
                    )
                sender.memory.wait(remaining / 1000)
        finally:
            sender.memory_waiters -= 1
            if not sender.memory_waiters:
                accumulator.waiting_for_memory = False

    # --- transactions (client.transactions) ----------------------------------------------

    def _transactions(self, timeout_ms: int | None) -> tuple[TransactionManager, int]:
        if self._txn is None:
            raise InvalidTxnStateError("not a transactional producer (no transactional_id)")
        if self._closed:
            raise ClosedError("the producer is closed")
        return self._txn, self.config.max_block_ms if timeout_ms is None else timeout_ms

    def init_transactions(self, timeout_ms: int | None = None) -> None:
        """Register the transactional id with its coordinator, once, before the first
        transaction: an older producer with the same id is fenced (its next call fails
        with ``ProducerFencedError``) and a transaction it left open is aborted.

        Raises ``KafkaTimeoutError`` after ``timeout_ms`` (default ``max_block_ms``; may
        be called again), ``TransactionalIdAuthorizationFailedError`` (fatal)."""
        txn, timeout = self._transactions(timeout_ms)
        producer_id, epoch = txn.init(timeout)
        with self._lock:
            assert self._sequences is not None
            self._sequences.restart(producer_id, epoch)

    def begin_transaction(self) -> None:
        """Start a transaction: records sent from now on belong to it. Raises
        ``InvalidTxnStateError`` before ``init_transactions`` or inside a transaction."""
        txn, _ = self._transactions(None)
        txn.begin()

    def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition, int],
        group_metadata: ConsumerGroupMetadata | str,
        timeout_ms: int | None = None,
    ) -> None:
        """Commit a consumer group's ``offsets`` (each the next offset to read) as part
        of the transaction: they become the group's committed offsets if and only if it
        commits. ``group_metadata``: the consumer's ``group_metadata()`` (a zombie
        member's offsets are refused, KIP-447), or a bare group id (no member check).
        A refusal makes the transaction abortable (``ProducerFencedError``: fatal)."""
        txn, timeout = self._transactions(timeout_ms)
        txn.send_offsets(offsets_of(offsets), group_metadata_of(group_metadata), timeout)

    def commit_transaction(self, timeout_ms: int | None = None) -> None:
        """Flush every record of the transaction, then commit it. Raises
        ``TransactionAbortableError`` (its ``__cause__`` the error that made the
        transaction fail: a record refused, offsets refused; ``abort_transaction`` is the
        only way on), ``ProducerFencedError`` (fatal), or ``KafkaTimeoutError`` after
        ``timeout_ms`` (default ``max_block_ms``; call it again to finish the commit)."""
        txn, timeout = self._transactions(timeout_ms)
        deadline = now_ms() + timeout
        txn.begin_commit()
        # Flushed on every call, a retried one too: a commit that timed out in its flush
        # still has records in flight, and an EndTxn sent before they are stored would
        # commit the transaction without them (they land after its marker, refused or in
        # no transaction). Kafka's sender likewise holds EndTxn while batches are
        # incomplete. Once the records are done, flushing again costs nothing.
        self._flush_transaction(txn, deadline)
        txn.end(True, max(deadline - now_ms(), 1))

    def abort_transaction(self, timeout_ms: int | None = None) -> None:
        """Abort the transaction: records not sent yet fail with
        ``TransactionAbortedError``, the ones in flight are waited for, and nothing of the
        transaction becomes visible to ``read_committed`` consumers. Then the epoch is
        bumped (every partition's sequence starts again). Raises ``ProducerFencedError``
        (fatal) or ``KafkaTimeoutError`` after ``timeout_ms`` (call it again)."""
        txn, timeout = self._transactions(timeout_ms)
        deadline = now_ms() + timeout
        txn.begin_abort()
        self._flush_transaction(txn, deadline)
        txn.end(False, max(deadline - now_ms(), 1))
        producer_id, epoch = txn.bump_epoch(max(deadline - now_ms(), 1))
        with self._lock:
            assert self._sequences is not None
            self._sequences.restart(producer_id, epoch)

    def _flush_transaction(self, txn: TransactionManager, deadline: int) -> None:
        """Wait until every record sent is stored or failed (the sender fails the unsent
        ones of a transaction that is aborting or abortable at once)."""
        with self._lock:
            self._sender.wakeup.notify()
        try:
            self.flush(max(deadline - now_ms(), 0))
        except KafkaTimeoutError as exc:
            raise KafkaTimeoutError(
                f"the records of transactional id {txn.transactional_id!r} were not all "
                f"sent in time: {exc}"
            ) from exc

    # --- metadata -------------------------------------------------------------------------

    def partitions_for(self, topic: str, timeout_ms: int | None = None) -> set[int]:
        """The partition numbers of ``topic``, asking the broker if not known yet.

        Raises ``UnknownTopicOrPartitionError`` for no such topic,
        ``BrokerUnavailableError``/``KafkaTimeoutError`` after ``timeout_ms`` (default
        ``max_block_ms``).
        """
        known = self._sender.topic_partitions.get(topic)
        count = None if known is None else len(known)
        if count is None:
            wait_ms = self.config.max_block_ms if timeout_ms is None else timeout_ms
            return set(partitions_of(self._connections, topic, wait_ms))
        return set(range(count))

    # --- flush and close --------------------------------------------------------------------

    def flush(self, timeout_ms: int | None = None) -> None:
        """Send everything queued now, without lingering, and wait until it is done.

        Done means stored or failed: check the futures for failures. Records sent by
        other threads meanwhile are not waited for. Raises ``KafkaTimeoutError`` if it
        takes longer than ``timeout_ms`` (None: until done, which ``delivery_timeout_ms``
        bounds).
        """
        with self._lock:
            self._accumulator.begin_flush()
            targets: list[RecordFuture] = [
                batch.handles[0] for batch in self._accumulator.incomplete() if batch.handles
            ]
            targets += self._sender.parked_futures_locked()
            self._sender.wakeup.notify()
        try:
            if targets:
                _, pending = wait_futures(
                    targets, timeout=None if timeout_ms is None else timeout_ms / 1000
                )
                if pending:
                    raise KafkaTimeoutError(
                        f"flush: {len(pending)} batch(es) not done within {timeout_ms} ms"
                    )
        finally:
            with self._lock:
                self._accumulator.end_flush()

    def close(self, timeout_ms: int | None = None) -> None:
        """Deliver what is queued, then stop. Idempotent.

        Waits up to ``timeout_ms`` (None: until everything is delivered or failed, which
        ``delivery_timeout_ms`` bounds); what is still undelivered then fails with
        ``ClosedError``. ``send`` raises ``ClosedError`` from the start of ``close``.
        """
        with self._close_lock:
            if self._closed:
                return
            txn = self._txn
            if txn is not None and txn.state in (TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR):
                # As Kafka's producer: a transaction left open at close is aborted rather
                # than left to hold the partitions' last stable offset until its timeout.
                try:
                    self.abort_transaction(
                        self.config.max_block_ms if timeout_ms is None else timeout_ms
                    )
                except TidelogError as exc:
                    log.warning("closing: the open transaction was not aborted: %s", exc)
            self._closed = True
            sender = self._sender
            sender.begin_close()
            with self._lock:
                sender.memory.notify_all()
            if not sender.join(None if timeout_ms is None else timeout_ms / 1000):
                log.warning("producer closed with records undelivered after %s ms", timeout_ms)
                sender.force_close()
                sender.join(5.0)
            self._connections.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def metrics(self) -> Mapping[str, int]:
        """A few gauges: buffer bytes in use, batches not done, requests in flight."""
        with self._lock:
            return {
                "buffer_used_bytes": self._accumulator.used_bytes,
                "incomplete_batches": len(self._accumulator.incomplete()),
                "in_flight_batches": self._accumulator.total_in_flight(),
            }


def _as_bytes(data: object, what: str) -> bytes:
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    if isinstance(data, bytes):
        return bytes(data)  # a bytes subclass becomes plain bytes
    raise TypeError(f"{what} must be bytes or None, got {type(data).__name__}")


def _check_headers(headers: Iterable[Header]) -> tuple[tuple[Header, ...], int]:
    checked = []
    size = 0
    for item in headers:
        try:
            header_key, header_value = item
        except (TypeError, ValueError):
            raise TypeError(f"a header must be a (str, bytes | None) pair, got {item!r}") from None
        if not isinstance(header_key, str):
            raise TypeError(f"a header key must be a str, got {header_key!r}")
        if header_value is not None and header_value.__class__ is not bytes:
            header_value = _as_bytes(header_value, f"header {header_key!r}")
        size += 10 + len(header_key.encode("utf-8"))
        if header_value is not None:
            size += len(header_value)
        checked.append((header_key, header_value))
    return tuple(checked), size


def _delivery_adapter(callback: DeliveryCallback) -> Any:
    def on_done(future: Future[RecordMetadata]) -> None:
        error = future.exception()
        if error is None:
            callback(future.result(), None)
        else:
            callback(None, error)

    return on_done


def _fatal_copy(error: BaseException) -> BaseException:
    """A fresh exception of the fatal error's kind for each refused ``send``."""
    if isinstance(error, TidelogError):
        return type(error)(f"the producer failed for good and must be closed: {error}")
    return ClosedError(f"the producer's sender failed and it must be closed: {error!r}")
