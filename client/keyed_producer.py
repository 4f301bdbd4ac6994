"""A producer with a stable identity that resumes where an earlier instance stopped.

``KeyedProducer`` is the building block of effectively-once writers (the Spark sink,
``docs/spark.md``): a writer that may be re-run after a failure (same input, same
records, in the same order) and must not store anything twice.

How (the broker's idempotence, ``docs/broker.md``):

1. ``InitProducerId`` with a ``producer_key`` gives the key's producer id: the same id
   every time, for as long as the key is used within ``producer.id.expiration.ms``.
2. The writer picks an *epoch* per attempt-independent unit of work (the Spark sink
   uses the micro-batch id): a partition accepts a higher epoch starting at sequence 0
   and from then on fences the lower one.
3. ``DescribeProducers`` tells, per partition, the last sequence the partition stored for
   ``(producer id, epoch)``; the writer skips that many records and sends the rest with
   the next sequences. So a re-run never depends on the broker's five-batch duplicate
   window: however many batches the failed attempt wrote, the partition knows how far it
   got, durably (the producer state is rebuilt from the log after a broker restart).
4. Batches are cut at deterministic places (``plan_batches``: from the first sequence, by
   record count and bytes), so two attempts racing each other send identical batches;
   the partition stores one and answers the other as a duplicate, or refuses it as out of
   order, after which the writer asks again where it stands and skips further.

``plan_batches`` is pure; ``KeyedProducer`` does the calls, synchronously (Spark executors
call it from a plain iterator). Not thread-safe: one owner.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tidelog.client.connection import (
    Connection,
    ConnectionFactory,
    PartitionProduceResult,
    ProduceCall,
)
from tidelog.client.grpc_connection import grpc_connections
from tidelog.client.routing import ROUTING_ERRORS, ClusterConnections
from tidelog.client.security import ClientSecurity
from tidelog.client.types import Header, TopicPartition
from tidelog.storage.errors import (
    InvalidRequestError,
    OutOfOrderSequenceError,
    TidelogError,
)
from tidelog.storage.records import BatchBuilder, Compression

__all__ = [
    "MAX_EPOCH",
    "KeyedProducer",
    "ProducerRecord",
    "WriteSummary",
    "plan_batches",
]

log = logging.getLogger(__name__)

MAX_EPOCH = 32766  # the batch header's epoch is an int16; 32767 is left for a bump
_BATCH_OVERHEAD_BYTES = 61
_RECORD_OVERHEAD_BYTES = 21  # varints and attributes of one record, generously
_MAX_ROUNDS = 50  # re-plans after OUT_OF_ORDER before giving up


@dataclass(frozen=True, slots=True)
class ProducerRecord:
    """One record to write: key, value, headers, and its CreateTime in ms."""

    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    timestamp_ms: int = -1  # -1: the time of the write


@dataclass(frozen=True, slots=True)
class WriteSummary:
    """What ``KeyedProducer.write_once`` did: records it stored, records found stored.

    ``skipped`` counts what the partitions held when the call began; records another
    attempt stored while this one ran are in neither count.
    """

    written: int
    skipped: int


def _record_bytes(record: ProducerRecord) -> int:
    size = _RECORD_OVERHEAD_BYTES + len(record.key or b"") + len(record.value or b"")
    for key, value in record.headers:
        size += 10 + len(key.encode()) + len(value or b"")
    return size


def plan_batches(
    records: Sequence[ProducerRecord],
    first_sequence: int,
    *,
    max_batch_records: int,
    max_batch_bytes: int,
) -> list[tuple[int, int]]:
    """Cut ``records[first_sequence:]`` into batches: a list of ``(start, stop)`` indexes.

    The cuts are a pure function of the records and ``first_sequence``: a batch ends when
    it holds ``max_batch_records`` records or the next record would take it past
    ``max_batch_bytes`` (a single larger record gets a batch of its own). Record ``i`` is
    sequence ``i``, so two attempts that start from the same sequence cut alike.
    Raises ``ValueError`` for limits below 1 or a negative ``first_sequence``.
    """
    if max_batch_records < 1 or max_batch_bytes < 1:
        raise ValueError("max_batch_records and max_batch_bytes must be >= 1")
    if first_sequence < 0:
        raise ValueError(f"first_sequence must be >= 0, got {first_sequence}")
    cuts: list[tuple[int, int]] = []
    start = first_sequence
    size = _BATCH_OVERHEAD_BYTES
    for index in range(first_sequence, len(records)):
        record_size = _record_bytes(records[index])
        count = index - start
        if count and (count >= max_batch_records or size + record_size > max_batch_bytes):
            cuts.append((start, index))
            start, size = index, _BATCH_OVERHEAD_BYTES
        size += record_size
    if start < len(records):
        cuts.append((start, len(records)))
    return cuts


class KeyedProducer:
    """Writes records under the stable producer id of ``producer_key``. Not thread-safe.

    Args:
        bootstrap_servers: ``HOST:PORT[,HOST:PORT...]``: any live broker of the cluster.
        producer_key: the identity; the same key is the same producer id.
        acks: ``"all"`` (fsynced before the answer, the default) or ``1``.
        compression: ``"none"`` or ``"lz4"``.
        request_timeout_ms: bound on every call.
        max_batch_records / max_batch_bytes: where ``plan_batches`` cuts.
        max_request_bytes: batches are sent in requests of about this size.

    The channel opens in the constructor; ``close`` it (or use ``with``).
    """

    def __init__(
        self,
        bootstrap_servers: str,
        producer_key: str,
        *,
        acks: str | int = "all",
        compression: str = "none",
        request_timeout_ms: int = 30_000,
        max_batch_records: int = 10_000,
        max_batch_bytes: int = 512 * 1024,
        max_request_bytes: int = 4 * 1024 * 1024,
        client_id: str = "tidelog-keyed-producer",
        connection_factory: ConnectionFactory | None = None,
        security: ClientSecurity | None = None,
    ) -> None:
        if str(acks) not in ("all", "-1", "1"):
            raise ValueError(f"acks must be 'all' or 1 for a keyed producer, got {acks!r}")
        if compression not in ("none", "lz4"):
            raise ValueError(f"compression must be 'none' or 'lz4', got {compression!r}")
        if not producer_key:
            raise ValueError("producer_key must not be empty")
        self._acks = 1 if str(acks) == "1" else -1
        self._compression = Compression.LZ4 if compression == "lz4" else Compression.NONE
        self._key = producer_key
        self._max_batch_records = max_batch_records
        self._max_batch_bytes = max_batch_bytes
        self._max_request_bytes = max_request_bytes
        self._request_timeout_ms = request_timeout_ms
        # Each partition's calls go to its leader (client.routing).
        self._connections = ClusterConnections(
            bootstrap_servers,
            connection_factory
            or grpc_connections(
                client_id=client_id,
                request_timeout_ms=request_timeout_ms,
                reconnect_backoff_max_ms=1_000,
                max_send_bytes=max(max_request_bytes, max_batch_bytes) + 1024 * 1024,
                security=security,
            ),
            request_timeout_ms=request_timeout_ms,
        )
        self._producer_id = -1

    @property
    def producer_id(self) -> int:
        """The key's producer id (asks the broker on first use)."""
        if self._producer_id < 0:
            self._producer_id, _ = self._connections.run(
                self._connections.route_any(),
                lambda c, t: c.init_producer_id(producer_key=self._key, timeout_ms=t),
                what="InitProducerId",
            )
            log.debug("producer key %s is producer id %d", self._key, self._producer_id)
        return self._producer_id

    def stored_sequences(
        self, partitions: Iterable[TopicPartition], epoch: int
    ) -> dict[TopicPartition, int]:
        """How many records of ``epoch`` each partition stored from this producer.

        That is the next sequence to send: 0 when the partition has nothing of this id, or
        only an older epoch. Raises ``OutOfOrderSequenceError`` if a partition already
        holds a *newer* epoch of this id (this writer is fenced: a later unit of work
        already wrote), and the partition's error if it cannot answer.
        """
        tps = sorted(set(partitions))
        if not tps:
            return {}
        producer_id = self.producer_id
        answers = self._connections.run_per_leader(
            dict.fromkeys(tps, None),
            lambda c, batch, t: c.describe_producers(batch, producer_id, timeout_ms=t),
            what="DescribeProducers",
        )
        out: dict[TopicPartition, int] = {}
        for tp, states in answers.items():
            next_sequence = 0
            for state in states:
                if state.producer_id != producer_id:
                    continue
                if state.producer_epoch > epoch:
                    raise OutOfOrderSequenceError(
                        f"{tp}: producer {self._key} already wrote epoch {state.producer_epoch}"
                        f" (this writer has epoch {epoch}): fenced"
                    )
                if state.producer_epoch == epoch:
                    next_sequence = state.last_sequence + 1
            out[tp] = next_sequence
        missing = [tp for tp in tps if tp not in out]
        if missing:
            raise InvalidRequestError(f"DescribeProducers did not answer for {missing}")
        return out

    def write_once(
        self, records: Mapping[TopicPartition, Sequence[ProducerRecord]], epoch: int
    ) -> WriteSummary:
        """Store ``records`` (record ``i`` of a partition is sequence ``i`` of ``epoch``).

        Whatever a partition already stored of ``epoch`` from this producer is skipped,
        so calling this again with the same records after a failure (in this process or
        another) stores each record exactly once. Raises the broker's error when a
        partition refuses a batch for another reason than sequence order.
        """
        if not 0 <= epoch <= MAX_EPOCH:
            raise ValueError(f"epoch must be within 0..{MAX_EPOCH}, got {epoch}")
        wanted = {tp: rs for tp, rs in records.items() if rs}
        if not wanted:
            return WriteSummary(0, 0)
        next_sequence = self.stored_sequences(wanted, epoch)
        for tp, rs in wanted.items():
            if next_sequence[tp] > len(rs):
                # An earlier attempt stored more than this one has: the input differs
                # (a non-deterministic query); nothing can be done but say so.
                log.warning(
                    "%s: producer %s epoch %d already stored %d records, this attempt has "
                    "only %d: its input differs from the earlier attempt's",
                    tp,
                    self._key,
                    epoch,
                    next_sequence[tp],
                    len(rs),
                )
        skipped = sum(min(next_sequence[tp], len(rs)) for tp, rs in wanted.items())
        written = 0
        for _ in range(_MAX_ROUNDS):
            plans = {
                tp: plan_batches(
                    rs,
                    next_sequence[tp],
                    max_batch_records=self._max_batch_records,
                    max_batch_bytes=self._max_batch_bytes,
                )
                for tp, rs in wanted.items()
            }
            plans = {tp: cuts for tp, cuts in plans.items() if cuts}
            if not plans:
                return WriteSummary(written, skipped)
            stored, raced = self._send_plans(wanted, plans, epoch)
            written += stored
            if not raced:
                return WriteSummary(written, skipped)
            # Another attempt wrote past us (or an earlier batch is missing): ask again.
            next_sequence = self.stored_sequences(wanted, epoch)
        raise OutOfOrderSequenceError(
            f"producer {self._key}: sequences kept conflicting after {_MAX_ROUNDS} rounds"
        )

    def _send_plans(
        self,
        records: Mapping[TopicPartition, Sequence[ProducerRecord]],
        plans: Mapping[TopicPartition, list[tuple[int, int]]],
        epoch: int,
    ) -> tuple[int, bool]:
        """Send every planned batch, a request at a time, partitions side by side.

        Returns the records stored (not counting duplicates) and whether some partition
        answered ``OUT_OF_ORDER_SEQUENCE_NUMBER`` (its remaining batches are not sent).
        """
        producer_id = self.producer_id
        now_ms = int(time.time() * 1000)
        cursor = dict.fromkeys(plans, 0)
        raced: set[TopicPartition] = set()
        stored = 0
        while True:
            request: dict[TopicPartition, list[bytes]] = {}
            counts: dict[TopicPartition, int] = {}
            size = 0
            for tp, cuts in plans.items():
                if tp in raced:
                    continue
                while cursor[tp] < len(cuts) and (size < self._max_request_bytes or not request):
                    start, stop = cuts[cursor[tp]]
                    data = self._encode(records[tp][start:stop], producer_id, epoch, start, now_ms)
                    request.setdefault(tp, []).append(data)
                    counts[tp] = counts.get(tp, 0) + stop - start
                    size += len(data)
                    cursor[tp] += 1
            if not request:
                return stored, bool(raced)
            answers = self._connections.run_per_leader(
                {tp: b"".join(batches) for tp, batches in request.items()},
                self._produce_to,
                what="Produce",
            )
            for tp, result in answers.items():
                if result.error is None:
                    if not result.duplicate:
                        stored += counts.get(tp, 0)
                    continue
                if isinstance(result.error, OutOfOrderSequenceError):
                    log.info(
                        "%s: producer %s raced another attempt: %s", tp, self._key, result.error
                    )
                    raced.add(tp)
                    continue
                raise result.error

    def _produce_to(
        self, connection: Connection, batches: dict[TopicPartition, bytes], timeout_ms: int
    ) -> dict[TopicPartition, PartitionProduceResult | TidelogError]:
        """One unary produce to a leader. Errors that mean "ask the new leader" come back
        as errors (``run_per_leader`` resends those partitions, with the same sequences:
        the partition stores a batch once); the others stay in the result, for the caller."""
        call = ProduceCall(
            0,
            self._acks,
            self._request_timeout_ms,
            list(batches.items()),
            # The send time of the three timestamps (this host's wall clock).
            sent_timestamp_ms=time.time_ns() // 1_000_000,
        )
        answer = connection.produce(call, timeout_ms=timeout_ms)
        out: dict[TopicPartition, PartitionProduceResult | TidelogError] = {}
        for tp, result in answer.results.items():
            routing = isinstance(result.error, ROUTING_ERRORS)
            out[tp] = result.error if routing and result.error is not None else result
        return out

    def _encode(
        self,
        records: Sequence[ProducerRecord],
        producer_id: int,
        epoch: int,
        base_sequence: int,
        now_ms: int,
    ) -> bytes:
        builder = BatchBuilder(
            compression=self._compression,
            producer_id=producer_id,
            producer_epoch=epoch,
            base_sequence=base_sequence,
        )
        for record in records:
            timestamp = record.timestamp_ms if record.timestamp_ms >= 0 else now_ms
            builder.append(timestamp, record.key, record.value, record.headers)
        return builder.build()

    def close(self) -> None:
        """Close the connections. Idempotent."""
        self._connections.close()

    def __enter__(self) -> KeyedProducer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
