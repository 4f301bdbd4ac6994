"""The producer's background I/O: the sender thread and the answer reader of its stream.

The sender thread loops: fetch what it lacks (a producer id for idempotence, the
partition counts of topics that records wait for), fail what ran out of time, take the
ready batches out of the accumulator (at most ``max_in_flight_requests_per_connection``
requests in flight), encode them (outside the lock: ``send`` never waits for encoding)
and write one ``ProduceRequest`` per round to the produce stream. A reader thread per
stream takes the answers, matches them to requests by correlation id, and completes,
retries or fails each batch (``client.idempotence`` decides); futures are settled outside
the lock, so user callbacks never run under it.

The produce links (one stream per leader broker, the requests in flight, the answers and
what they decide, throttling) are ``ProduceLinks`` (``client.produce_links``), mixed into
``Sender``: this module keeps the thread's loop, the lookups (producer id, metadata),
parked records, and collecting and expiring batches.

Thread-safe: all shared state is guarded by the producer's lock.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tidelog.client.accumulator import NO_ROOM, ProducerBatch, RecordAccumulator
from tidelog.client.cluster import ClusterMetadata
from tidelog.client.config import ProducerConfig
from tidelog.client.connection import ProduceStream
from tidelog.client.errors import ClosedError
from tidelog.client.futures import BatchOutcome, RecordFuture, settle_failure, settle_success
from tidelog.client.idempotence import ResetMode, SequenceTable
from tidelog.client.partitioner import StickyPartitioner, partition_for_key
from tidelog.client.produce_links import ProduceLink, ProduceLinks, Settlements, now_ms
from tidelog.client.routing import ROUTING_ERRORS, ClusterConnections
from tidelog.client.topic_errors import topic_errors
from tidelog.client.transactions import TransactionManager
from tidelog.client.types import Header, TopicPartition
from tidelog.storage.errors import (
    BrokerUnavailableError,
    KafkaTimeoutError,
    TidelogError,
    UnknownTopicOrPartitionError,
)
from tidelog.storage.records import NO_SEQUENCE

__all__ = ["ParkedRecord", "Sender", "now_ms"]

log = logging.getLogger(__name__)

_READER_JOIN_S = 2.0  # join() waits this long for the stream readers to end


@dataclass(slots=True)
class ParkedRecord:
    """A record sent to a topic whose partition count is not known yet."""

    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    partition: int | None
    size_bytes: int
    future: RecordFuture
    deadline_ms: int  # fail it if the topic is still unknown then (max_block_ms)


class Sender(ProduceLinks):
    """Owns the producer's I/O threads and the state they share with ``send``.

    Thread-safe; ``lock`` guards the accumulator, the sequence table, the partition
    counts' writers, parked records and the requests in flight.
    """

    def __init__(
        self,
        config: ProducerConfig,
        connections: ClusterConnections,
        accumulator: RecordAccumulator[RecordFuture],
        sequences: SequenceTable | None,
        partitioner: StickyPartitioner,
        lock: threading.Lock,
        futures_condition: threading.Condition,
        *,
        wall_clock: Callable[[], int] = now_ms,
        transactions: TransactionManager | None = None,
    ) -> None:
        # Stamps each request's send time (the device's clock, which may be wrong: the
        # broker's received time minus it is how consumers correct record timestamps).
        self._wall_clock = wall_clock
        self._config = config
        self._connections = connections
        self._accumulator = accumulator
        self._sequences = sequences
        # A transactional producer's state (client.transactions): which partitions may
        # send, the transactional id on each request, and failures that make it abortable.
        self._txn = transactions
        self._partitioner = partitioner
        self._lock = lock
        self._futures_condition = futures_condition
        self.wakeup = threading.Condition(lock)  # the sender thread waits here
        self.memory = threading.Condition(lock)  # send() waits here for buffer memory
        self.memory_waiters = 0
        # Set by a send() that found the lock taken (see _yield_gil_if_wanted). A plain
        # attribute: a lost or late write costs one missed or one needless yield.
        self.lock_wanted = False
        # topic -> its TopicPartition objects, one per partition (the count is the length).
        # Read without the lock by send() (a dict read is atomic); replaced, never mutated.
        self.topic_partitions: dict[str, list[TopicPartition]] = {}
        self._metadata_ms: dict[str, int] = {}
        self._next_metadata_refresh_ms = 2**62  # no topic known yet
        self._metadata_errors: dict[str, TidelogError] = {}
        self._parked: dict[str, list[ParkedRecord]] = {}
        # One produce stream per broker that leads a partition we send to.
        self._links: dict[int, ProduceLink] = {}
        self._stream_ids = itertools.count(1)
        # The routing snapshot (leaders), replaced by each metadata refresh.
        self._metadata: ClusterMetadata | None = None
        # A partition waits for a leader, or one moved: refresh (read without the lock).
        self._metadata_wanted = False
        self._correlation_ids = itertools.count(1)  # next() is atomic under the GIL
        self._reset_errors: dict[TopicPartition, TidelogError] = {}
        self._closing = False
        self._forced = False
        # The producer's fatal error once it has one (the sender thread failed, or an
        # idempotent producer's id was refused for good). A plain attribute: ``send``
        # reads it for every record.
        self.fatal_error: BaseException | None = None
        self._readers: list[threading.Thread] = []  # the stream readers started
        self._producer_id_backoff_until = 0
        self._metadata_backoff_until = 0
        # A broker quota's throttle (throttle_time_ms): no new request before this.
        self._throttled_until = 0
        self._thread = threading.Thread(
            target=self._run, name=f"tidelog-producer-{config.client_id}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    # --- called by the facade ------------------------------------------------------------

    def park_locked(self, topic: str, record: ParkedRecord) -> bool:
        """Hold a record until ``topic``'s partition count is known. False if no memory."""
        if not self._accumulator.reserve(record.size_bytes):
            return False
        self._parked.setdefault(topic, []).append(record)
        self.wakeup.notify()
        return True

    def parked_futures_locked(self) -> list[RecordFuture]:
        return [r.future for records in self._parked.values() for r in records]

    def tp_for(self, topic: str, partition: int) -> TopicPartition:
        """The shared ``TopicPartition`` object of a known partition (no allocation)."""
        partitions = self.topic_partitions.get(topic)
        if partitions is not None and partition < len(partitions):
            return partitions[partition]
        return TopicPartition(topic, partition)

    def begin_close(self) -> None:
        """Stop lingering; the thread ends once everything is delivered or failed."""
        with self._lock:
            self._closing = True
            self._accumulator.close()
            self.wakeup.notify()

    def force_close(self, error: TidelogError | None = None) -> None:
        """Fail everything not yet delivered with ``error`` (default ``ClosedError``) and
        end the threads."""
        settlements = Settlements()
        with self._lock:
            self._closing = True
            self._forced = True
            if error is None:
                error = ClosedError("the producer was closed before the record was delivered")
            for batch in self._accumulator.abort_all():
                self._accumulator.deallocate(batch)
                settlements.fail(batch.handles, error)
            for records in self._parked.values():
                for record in records:
                    self._accumulator.release(record.size_bytes)
                    settlements.fail([record.future], error)
            self._parked.clear()
            streams = [
                self._detach_locked(broker_id, error, settlements)
                for broker_id in list(self._links)
            ]
            self.wakeup.notify()
            self.memory.notify_all()
        for stream in streams:
            if stream is not None:
                stream.cancel()
        self._settle(settlements)

    def join(self, timeout_s: float | None) -> bool:
        """Wait for the sender thread to end, then (bounded) for the stream readers it
        closed; True if the sender thread ended. A daemon reader frozen at interpreter
        exit while holding a grpc call's lock would deadlock that call's ``__del__``."""
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            return False
        deadline = time.monotonic() + _READER_JOIN_S
        for reader in list(self._readers):
            if reader is not threading.current_thread():
                reader.join(max(0.0, deadline - time.monotonic()))
        return True

    # --- the sender thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                if self._lookups_due():
                    self._fetch_what_is_missing()
                batches, done = self._collect()
                if done:
                    break
                for broker_id, broker_batches in batches:
                    self._send(broker_id, broker_batches)
        except BaseException as exc:  # the thread must not die silently
            log.exception("producer sender thread failed")
            self.fatal_error = exc
            self.force_close()
        finally:
            with self._lock:
                links, self._links = list(self._links.values()), {}
            for link in links:
                link.stream.close()

    def _lookups_due(self) -> bool:
        """Whether there may be a producer id or partition counts to fetch.

        Read without the lock (a stale answer costs one loop): the sender thread takes
        the producer's lock as seldom as it can, because ``send`` takes it for every
        record, and each time ``send`` finds it taken it loses up to the interpreter's
        switch interval (5 ms) waiting for the GIL afterwards.
        """
        sequences = self._sequences
        txn = self._txn
        return (
            (txn is not None and txn.has_pending_adds(now_ms()))
            or bool(self._parked)
            or self._metadata_wanted
            or (sequences is not None and sequences.needs_producer_id)
            or now_ms() >= self._next_metadata_refresh_ms
        )

    def _idle_locked(self) -> bool:
        return (
            not any(link.requests for link in self._links.values())
            and not self._parked
            and not self._accumulator.has_incomplete()
        )

    def _fetch_what_is_missing(self) -> None:
        """Producer id and partition counts: blocking calls, outside the lock."""
        now = now_ms()
        sequences = self._sequences
        with self._lock:
            need_id = (
                sequences is not None
                and sequences.needs_producer_id
                and not self._forced
                and now >= self._producer_id_backoff_until
                and (self._accumulator.has_incomplete() or self._parked or not self._closing)
            )
            topics = [
                topic
                for topic in self._parked
                if now >= self._metadata_backoff_until or topic not in self._metadata_errors
            ]
            max_age = self._config.metadata_max_age_ms
            topics += [
                topic
                for topic, fetched in self._metadata_ms.items()
                if now - fetched >= max_age and topic not in topics
            ]
            wanted = self._metadata_wanted or self._metadata is None
        if need_id:
            assert sequences is not None
            self._init_producer_id(sequences)
        if self._txn is not None and self._txn.has_pending_adds(now):
            self._txn.add_pending(now)
        if topics or wanted:
            self._refresh_metadata(topics)

    def _init_producer_id(self, sequences: SequenceTable) -> None:
        try:
            connection = self._connections.bootstrap_or_any()
            producer_id, epoch = connection.init_producer_id(
                timeout_ms=self._config.request_timeout_ms
            )
        except TidelogError as exc:
            # A cancelled call (ClosedError) that this producer did not cancel is the
            # broker or a proxy dropping it (overload, a restart): transient, as any
            # transport failure. The full-size soak on 2 cores hit it.
            if not exc.retriable and not isinstance(exc, ClosedError):
                # Refused for good (not authorized to write idempotently, an unknown
                # user...): as Kafka's producer, fatal. Everything pending and every
                # later send fails with it at once instead of waiting out its timeout.
                log.error("the broker refused a producer id; the producer fails: %s", exc)
                self.fatal_error = exc
                self.force_close(exc)
                return
            log.warning("no producer id yet: %s", exc)
            if isinstance(exc, ROUTING_ERRORS):
                self._connections.mark_stale()
            with self._lock:
                self._producer_id_backoff_until = now_ms() + self._config.retry_backoff_ms
            return
        with self._lock:
            sequences.set_producer_id(producer_id, epoch)
        log.debug("producer id %d epoch %d", producer_id, epoch)

    def _refresh_metadata(self, topics: list[str]) -> None:
        """Fetch the cluster's metadata (leaders, partition counts), outside the lock.

        ``topics``: those whose partition count is wanted (parked records, max age).
        The metadata backs off by itself (``ClusterConnections``): asked again and again
        for a partition without a leader, it answers from its cache in between.

        A topic missing from the listing is asked for by name (``client.topic_errors``):
        one the principal may not describe (``TopicAuthorizationFailedError``) or with an
        illegal name (``InvalidTopicError``) fails its parked records at once, as Kafka's
        producer does; an unknown one is waited for until ``max_block_ms``.
        """
        self._metadata_wanted = False
        timeout_ms = min(self._config.request_timeout_ms, self._config.max_block_ms or 1)
        try:
            metadata: ClusterMetadata | None = self._connections.metadata(
                timeout_ms=timeout_ms, force=True
            )
            error: TidelogError | None = None
        except TidelogError as exc:
            metadata, error = None, exc
        named: dict[str, TidelogError] = {}
        if metadata is not None:
            missing = [topic for topic in topics if metadata.partition_count(topic) is None]
            try:
                named = topic_errors(self._connections, missing, timeout_ms=timeout_ms)
            except TidelogError as exc:  # they stay unknown: retried as before
                log.info("could not ask for %s by name: %s", ", ".join(missing), exc)
        settlements = Settlements()
        now = now_ms()
        with self._lock:
            if metadata is not None:
                self._metadata = metadata
            for topic in topics:
                self._metadata_ms[topic] = now
                count = None if metadata is None else metadata.partition_count(topic)
                if count is not None:
                    self._metadata_errors.pop(topic, None)
                    known = self.topic_partitions.get(topic)
                    if known is None or len(known) != count:
                        self.topic_partitions[topic] = [
                            TopicPartition(topic, p) for p in range(count)
                        ]
                    self._place_parked_locked(topic, count, settlements)
                else:
                    topic_error = (
                        error
                        or named.get(topic)
                        or UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
                    )
                    self._metadata_errors[topic] = topic_error
                    self._metadata_backoff_until = now + self._config.retry_backoff_ms
                    # Refused or illegal: no wait can help, fail what waits now.
                    self._expire_parked_locked(
                        topic, now, topic_error, settlements, every=not topic_error.retriable
                    )
            if self._metadata_ms:
                self._next_metadata_refresh_ms = (
                    min(self._metadata_ms.values()) + self._config.metadata_max_age_ms
                )
            self.wakeup.notify()
        self._settle(settlements)

    def _leader_locked(self, tp: TopicPartition) -> int | None:
        """The id of ``tp``'s leader as last seen; None while unknown or offline."""
        metadata = self._metadata
        if metadata is None:
            return None
        node = metadata.leader_for(tp)
        return None if node is None else node.id

    def _place_parked_locked(self, topic: str, count: int, settlements: Settlements) -> None:
        records = self._parked.pop(topic, [])
        now = now_ms()
        added = False
        for record in records:
            self._accumulator.release(record.size_bytes)
            partition = record.partition
            if partition is None:
                if record.key is not None:
                    partition = partition_for_key(record.key, count)
                else:
                    partition = self._partitioner.partition(topic, count, record.size_bytes)
            elif not 0 <= partition < count:
                settlements.fail(
                    [record.future],
                    UnknownTopicOrPartitionError(
                        f"topic {topic!r} has {count} partitions; partition {partition} "
                        "does not exist"
                    ),
                )
                continue
            status = self._accumulator.append(
                self.tp_for(topic, partition),
                record.timestamp_ms,
                record.key,
                record.value,
                record.headers,
                record.size_bytes,
                record.future,
                now,
            )
            assert status != NO_ROOM  # its bytes were reserved
            added = True
        if added:
            self.wakeup.notify()

    def _expire_parked_locked(
        self,
        topic: str,
        now: int,
        error: TidelogError,
        settlements: Settlements,
        *,
        every: bool = False,
    ) -> None:
        """Fail with ``error`` the parked records of ``topic`` whose ``max_block_ms``
        deadline passed (``every``: all of them, for an error no wait can cure)."""
        records = self._parked.get(topic)
        if not records:
            return
        kept = []
        for record in records:
            if every or now >= record.deadline_ms:
                self._accumulator.release(record.size_bytes)
                settlements.fail([record.future], _metadata_timeout(topic, error))
            else:
                kept.append(record)
        if kept:
            self._parked[topic] = kept
        else:
            del self._parked[topic]
        self.memory.notify_all()

    def _collect(
        self,
    ) -> tuple[list[tuple[int, list[ProducerBatch[RecordFuture]]]], bool]:
        """Under the lock: time out what must, then drain one request's batches per leader.

        Returns the batches grouped by the broker leading their partitions, and whether
        the thread is done. With nothing to do it waits (in the same critical section)
        until ``send``, an answer or a timer wakes it.
        """
        settlements = Settlements()
        streams_to_cancel: list[ProduceStream] = []
        with self._lock:
            if self._forced or (self._closing and self._idle_locked()):
                return [], True
            now = now_ms()
            config = self._config
            accumulator = self._accumulator
            sequences = self._sequences
            for batch in accumulator.expire(now, config.delivery_timeout_ms):
                self._expire_locked(batch, now, settlements)
            aborted = None if self._txn is None else self._txn.undrained_error()
            if aborted is not None:  # the transaction ends unsent batches (transactions.py)
                for batch in accumulator.abort_all():
                    accumulator.deallocate(batch)
                    settlements.fail(batch.handles, aborted)
            if sequences is not None:
                self._finish_resets_locked(sequences, settlements)
            wait_ms: int | None = None
            for link in list(self._links.values()):
                if not link.requests:
                    continue
                oldest = next(iter(link.requests.values()))
                deadline = oldest.sent_ms + config.request_timeout_ms
                if now >= deadline:
                    error = KafkaTimeoutError(
                        f"no produce answer from {link.address} within "
                        f"{config.request_timeout_ms} ms"
                    )
                    stream = self._detach_locked(link.broker_id, error, settlements)
                    if stream is not None:
                        streams_to_cancel.append(stream)
                else:
                    wait_ms = _min(wait_ms, deadline - now)
            grouped: dict[int, list[ProducerBatch[RecordFuture]]] = {}
            if now < self._throttled_until:
                wait_ms = _min(wait_ms, self._throttled_until - now)
            else:
                leaderless: list[TopicPartition] = []
                check = accumulator.ready(now, self._can_send_check(leaderless))
                if check.partitions:
                    assign = None if sequences is None else sequences.assign
                    for batch in accumulator.drain(
                        check.partitions, config.max_request_size, assign
                    ):
                        leader = self._leader_locked(batch.tp)
                        assert leader is not None  # can_send checked it
                        grouped.setdefault(leader, []).append(batch)
                if check.next_check_ms is not None:
                    wait_ms = _min(wait_ms, check.next_check_ms - now)
                if leaderless:
                    # Wait for a leader: ask for metadata when its backoff allows.
                    self._metadata_wanted = True
            if self._metadata_wanted:
                self._connections.mark_stale()
                wait_ms = _min(wait_ms, max(self._connections.refresh_in_ms(), 1))
            expiry = accumulator.next_expiry_ms(config.delivery_timeout_ms)
            if expiry is not None:
                wait_ms = _min(wait_ms, expiry - now)
            for records in self._parked.values():
                for record in records:
                    wait_ms = _min(wait_ms, record.deadline_ms - now)
            if sequences is not None and sequences.needs_producer_id:
                wait_ms = _min(wait_ms, max(self._producer_id_backoff_until - now, 1))
            if self._txn is not None and self._txn.has_pending_adds():
                wait_ms = _min(wait_ms, max(self._txn.add_retry_at_ms - now, 1))
            if self._parked:
                wait_ms = _min(wait_ms, max(self._metadata_backoff_until - now, 1))
            if settlements:
                self.memory.notify_all()
            elif not grouped and not streams_to_cancel:
                if wait_ms is None or wait_ms > 0:
                    self.wakeup.wait(None if wait_ms is None else wait_ms / 1000)
                return [], False
        self._yield_gil_if_wanted()
        for stream in streams_to_cancel:
            stream.cancel()
        self._settle(settlements)
        return list(grouped.items()), False

    def _can_send_check(
        self, leaderless: list[TopicPartition]
    ) -> Callable[[TopicPartition, int], bool]:
        """``ready``'s filter: idempotence allows it, the partition has a leader, and the
        leader's stream has room (``max_in_flight_requests_per_connection``). Partitions
        without a known leader are added to ``leaderless`` (the lock is held)."""
        sequences = self._sequences
        sequence_check = None if sequences is None else sequences.can_send
        txn_check = None if self._txn is None else self._txn.can_send
        links = self._links
        limit = self._config.max_in_flight_requests_per_connection

        def can_send(tp: TopicPartition, flying: int) -> bool:
            if txn_check is not None and not txn_check(tp):
                return False
            if sequence_check is not None and not sequence_check(tp, flying):
                return False
            leader = self._leader_locked(tp)
            if leader is None:
                leaderless.append(tp)
                return False
            link = links.get(leader)
            return link is None or len(link.requests) < limit

        return can_send

    def _expire_locked(
        self, batch: ProducerBatch[RecordFuture], now: int, settlements: Settlements
    ) -> None:
        tp = batch.tp
        offline = ""
        if self._metadata is not None and self._leader_locked(tp) is None:
            offline = f"partition {tp} is offline (no leader); "
        error = KafkaTimeoutError(
            f"{batch.record_count} record(s) for {tp} expired: {offline}"
            f"{now - batch.created_ms} ms since the batch was created "
            f"(delivery_timeout_ms={self._config.delivery_timeout_ms})"
        )
        if self._sequences is not None and batch.base_sequence != NO_SEQUENCE:
            self._sequences.expired(tp, batch.producer_id, batch.base_sequence)
            self._reset_errors.setdefault(tp, error)
        self._accumulator.deallocate(batch)
        settlements.fail(batch.handles, error)
        if self._txn is not None:
            self._txn.batch_failed(error)

    def _finish_resets_locked(self, sequences: SequenceTable, settlements: Settlements) -> None:
        for tp in sequences.resetting():
            if self._accumulator.in_flight(tp):
                continue
            mode = sequences.reset_mode(tp)
            sequenced = [b for b in self._accumulator.queued(tp) if b.base_sequence != NO_SEQUENCE]
            cause = self._reset_errors.pop(tp, None)
            if mode is ResetMode.FAIL:
                self._accumulator.remove(tp, sequenced)
                for batch in sequenced:
                    self._accumulator.deallocate(batch)
                    settlements.fail(
                        batch.handles,
                        KafkaTimeoutError(
                            f"not retried: an earlier batch of {tp} failed with an unknown "
                            f"outcome ({cause}), and resending could store records twice"
                        ),
                    )
            else:
                for batch in sequenced:
                    batch.clear_sequence()
            log.warning("%s starts over with a new producer id (%s)", tp, mode)
            sequences.finish_reset(tp)

    # --- settling futures (outside the lock) ---------------------------------------------

    def _yield_gil_if_wanted(self) -> None:
        """Let a ``send`` that waited for the producer's lock run now.

        When ``send`` found the lock held by this thread, it is now runnable but needs the
        GIL, which this thread would keep until it blocks or the interpreter's switch
        interval (5 ms) runs out: measured, those waits cost ~15% of the producer's
        throughput. ``sleep(0)`` hands the GIL over at once. Only then: a yield nobody
        needs lets grpcio's threads run first, and that cost ~0.2 ms of the ~1 ms a
        single acknowledged record takes (three yields on its path, measured by stage).
        """
        if self.lock_wanted:
            self.lock_wanted = False
            time.sleep(0)

    def _settle(self, settlements: Settlements) -> None:
        if not settlements:
            return
        condition = self._futures_condition
        for batch, base_offset, append_time in settlements.successes:
            tp = batch.tp
            outcome = BatchOutcome(
                tp.topic, tp.partition, base_offset, append_time, batch.timestamps
            )
            settle_success(condition, batch.handles, outcome)
        for futures, error in settlements.failures:
            settle_failure(condition, futures, error)


def _metadata_timeout(topic: str, error: TidelogError) -> TidelogError:
    if isinstance(error, UnknownTopicOrPartitionError):
        return UnknownTopicOrPartitionError(f"topic {topic!r} does not exist ({error})")
    if isinstance(error, (BrokerUnavailableError, KafkaTimeoutError)):
        return type(error)(f"no partition count for topic {topic!r}: {error}")
    return error


def _min(current: int | None, candidate: int) -> int:
    return candidate if current is None or candidate < current else current
