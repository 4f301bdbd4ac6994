"""``TransactionalSink``: exactly once, by atomic commit (issue #30; docs/cdc.md).

Every PostgreSQL transaction's records and the connector's position (its LSN, in the
compacted offsets topic, key = the connector's name) are written in ONE Tidelog
transaction; ``durable_lsn`` moves only when ``commit_transaction`` has returned, and the
connector confirms an LSN to PostgreSQL only up to ``durable_lsn``. A read_committed
consumer therefore sees a PostgreSQL transaction whole or not at all, and a connector
killed anywhere restarts from a position that matches exactly what is visible.

Decisions:

- **transactional.id = ``tidelog-cdc-{name}``** (the connector's name, its slot). The
  sink calls ``init_transactions`` when it is built, before the connector reads its
  position: a restarted connector fences its zombie (whose next call fails with
  ``ProducerFencedError``), and the zombie's open transaction is aborted before the
  position is read, so the position read is the last one anybody can commit.
- **Batching (group commit).** Several small PostgreSQL transactions go into one Tidelog
  transaction, whole and in commit order: a PostgreSQL transaction is never split, so
  atomicity holds, and one producer writes them in order, so order holds. The open
  transaction is committed when the connector finds the replication stream drained
  (``flush``, called whenever no message is waiting), when it has been open
  ``commit_interval_ms`` (default 50), or when it holds ``max_records`` (default 5,000).
  While a commit runs, PostgreSQL's messages queue in the socket, so the next batch grows
  with the load: latency stays near one commit when the load is light, throughput grows
  with the batch when it is heavy (issue #30's target: commit-to-visible p99 <= 200 ms at
  5,000 changes/s).
- **The snapshot is one transaction.** Its chunks (units without a position) go into one
  Tidelog transaction that commits with the final unit (the leftover tombstones and the
  ``snapshot_done`` position). An exported snapshot cannot outlive its replication
  connection, so a killed snapshot can never be resumed, only taken again; as one
  transaction, a killed snapshot is aborted by the next start's fence and a read_committed
  consumer never sees a partial snapshot (nor its rows twice). The price: the snapshot
  must finish within ``snapshot_timeout_ms`` (default 900,000, the brokers' default
  ``transaction.max.timeout.ms``), and read_committed consumers of the connector's topics
  see nothing until it commits. The producer is re-created with that timeout for the
  snapshot and with ``transaction_timeout_ms`` (Kafka's 60,000) for streaming, so a dead
  connector that nobody restarts holds the last stable offset for a minute, not fifteen.
- **Failures.** Each for up to ``outage_timeout_ms`` (default 120,000), then the sink
  raises and the connector stops (a restart resumes from the last commit):

  - a commit that times out (brokers unreachable, a leader moving, the coordinator
    moving: ``NOT_COORDINATOR``, ``COORDINATOR_NOT_AVAILABLE`` and
    ``CONCURRENT_TRANSACTIONS`` are retried inside each call until its
    ``request_timeout_ms``) is called again; the producer flushes again before it sends
    EndTxn, so a commit whose flush timed out never decides the transaction with a
    record still in flight;
  - a transaction made abortable (a record refused, a restarted leader refusing an
    in-flight batch), found at the commit or at a send, is aborted and its units written
    again in a new transaction; a send that blocks past its timeout likewise;
  - ``init_transactions`` that times out (no coordinator yet) is called again;
  - an abort that times out is called again; one the producer refuses (a retried abort
    whose EndTxn went through but whose epoch bump did not) replaces the producer: the
    new one's InitProducerId fences the old and aborts whatever it left open.

  ``PRODUCER_FENCED`` or ``INVALID_PRODUCER_EPOCH`` from the coordinator raises
  ``CdcError`` ("fenced") at once: another connector with the same name took over (or
  an outage outlived the transaction timeout and the coordinator aborted the
  transaction, bumping the epoch: a restart resumes). A failed snapshot transaction is
  not retried (its chunks are not kept): the connector stops and the next start
  snapshots again.

Not thread-safe: one connector thread calls every method.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from tidelog.client.cdc.events import CdcError, ChangeUnit, Position, format_lsn
from tidelog.client.cdc.sink import encode_position
from tidelog.client.cdc.testhooks import stop_point
from tidelog.client.producer import Producer
from tidelog.storage.errors import (
    InvalidProducerEpochError,
    KafkaTimeoutError,
    ProducerFencedError,
    TidelogError,
    TransactionAbortableError,
)

__all__ = ["TransactionalSink", "transactional_id_for"]

log = logging.getLogger(__name__)

# The coordinator's answers that mean a newer instance of the transactional id exists.
_FENCED = (ProducerFencedError, InvalidProducerEpochError)


def transactional_id_for(name: str) -> str:
    """The transactional id of the connector ``name`` (one per connector: the fence)."""
    return f"tidelog-cdc-{name}"


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class TransactionalSink:
    """Exactly once: each batch of whole PostgreSQL transactions and the position in one
    Tidelog transaction (the module docstring). Building it fences older instances.

    Args:
        bootstrap: the brokers.
        name: the connector's name: the offsets topic's key and the transactional id's.
        offsets_topic: the compacted topic of positions (created by the connector).
        security: producer security settings (kafka-python's names).
        now_ms: the wall clock for ``written_ms`` (injected).
        commit_interval_ms, max_records: when an open transaction is committed at the
            latest (it is committed sooner when the stream is drained).
        transaction_timeout_ms, snapshot_timeout_ms: the coordinator's timeout for
            streaming transactions and for the snapshot's.
        request_timeout_ms: the longest one commit call blocks.
        outage_timeout_ms: how long a commit is retried before the sink gives up.
    """

    def __init__(
        self,
        bootstrap: str,
        name: str,
        offsets_topic: str,
        security: Mapping[str, Any],
        now_ms: Callable[[], int],
        *,
        commit_interval_ms: int = 50,
        max_records: int = 5_000,
        transaction_timeout_ms: int = 60_000,
        snapshot_timeout_ms: int = 900_000,
        request_timeout_ms: int = 30_000,
        outage_timeout_ms: int = 120_000,
    ) -> None:
        self._bootstrap = bootstrap
        self._name = name
        self._offsets_topic = offsets_topic
        self._security = dict(security)
        self._clock = now_ms
        self._commit_interval_ms = commit_interval_ms
        self._max_records = max_records
        self._streaming_timeout_ms = transaction_timeout_ms
        self._snapshot_timeout_ms = snapshot_timeout_ms
        self._request_timeout_ms = request_timeout_ms
        self._outage_timeout_ms = outage_timeout_ms
        self.transactional_id = transactional_id_for(name)
        self._producer: Producer | None = None
        self._producer_timeout_ms = 0
        # The open transaction: its kind, when it began, its units (streaming only: kept
        # to write them again if it must be aborted), its record count, its last position.
        self._open = False
        self._snapshot = False
        self._opened_ms = 0
        self._units: list[ChangeUnit] = []
        self._records = 0
        self._position: Position | None = None
        self._durable: int | None = None
        self._rewrites = 0  # the open transaction's rewrites since the last commit
        self.commits = 0  # Tidelog transactions committed (a metric)
        self.server_wal_end = 0  # the connector's latest view, written with positions
        self._ensure_producer(transaction_timeout_ms)  # fences the zombie

    # --- ChangeSink ------------------------------------------------------------------------

    def write(self, unit: ChangeUnit) -> None:
        """Add ``unit`` to the open transaction (beginning one if none is open); commit
        when the batch is due, or, for the snapshot, at its last unit."""
        if not self._open:
            self._begin(snapshot=unit.snapshot)
        elif unit.snapshot != self._snapshot:
            raise CdcError("a snapshot unit and a streaming unit in one transaction")
        if self._snapshot:
            # A failure here stops the connector: the snapshot is taken again (its
            # chunks are not kept to be written twice).
            self._send_records(unit)
            if unit.position is None:
                stop_point("snapshot", prepare=self._flush_sends)
                return
            self._position = unit.position
            self._commit()  # the snapshot's last unit: the whole snapshot becomes visible
            return
        if unit.position is None:
            raise CdcError("a streaming unit without a position")
        self._units.append(unit)
        self._position = unit.position
        try:
            self._send_records(unit)
        except (TransactionAbortableError, KafkaTimeoutError) as exc:
            # A batch of the open transaction failed (or a send blocked past its
            # timeout while a leader moved): abort and write its units again.
            self._write_again(exc, _monotonic_ms() + self._outage_timeout_ms, position=False)
        if (
            self._records >= self._max_records
            or _monotonic_ms() - self._opened_ms >= self._commit_interval_ms
        ):
            self._commit()

    def durable_lsn(self) -> int | None:
        return self._durable

    def flush(self, timeout_ms: int) -> int | None:
        """Commit the open transaction now (the stream is drained, or the connector
        stops). A snapshot transaction is left open: only its last unit commits it."""
        if self._open and not self._snapshot and self._position is not None:
            self._commit()
        return self._durable

    def close(self) -> None:
        """Close the producer; a transaction still open is aborted (the producer's rule)."""
        if self._producer is not None:
            producer, self._producer = self._producer, None
            producer.close(timeout_ms=self._request_timeout_ms)

    # --- transactions ----------------------------------------------------------------------

    def _live_producer(self) -> Producer:
        if self._producer is None:
            raise CdcError("the sink is closed")
        return self._producer

    def _ensure_producer(self, timeout_ms: int) -> None:
        """A producer of this connector's transactional id whose transactions time out
        after ``timeout_ms``; InitProducerId (with the fence) when it is made."""
        if self._producer is not None and self._producer_timeout_ms == timeout_ms:
            return
        if self._producer is not None:
            self._producer.close(timeout_ms=self._request_timeout_ms)
            self._producer = None
        producer = Producer(
            self._bootstrap,
            transactional_id=self.transactional_id,
            transaction_timeout_ms=timeout_ms,
            acks="all",
            linger_ms=2,
            request_timeout_ms=self._request_timeout_ms,
            max_block_ms=self._request_timeout_ms,
            **self._security,
        )
        deadline = _monotonic_ms() + self._outage_timeout_ms
        try:
            while True:
                try:
                    producer.init_transactions(self._request_timeout_ms)
                    break
                except KafkaTimeoutError:
                    # No coordinator yet (brokers down, its partition moving): the call
                    # may be made again.
                    if _monotonic_ms() > deadline:
                        raise
                    log.warning("CDC %s: init_transactions timed out; retrying", self._name)
        except _FENCED as exc:
            producer.close(timeout_ms=0)
            raise self._fenced(exc) from exc
        except BaseException:
            producer.close(timeout_ms=0)
            raise
        self._producer = producer
        self._producer_timeout_ms = timeout_ms

    def _replace_producer(self) -> None:
        """A new producer in place of one that cannot go on: its InitProducerId fences the
        old one (whose late batches are refused) and aborts the transaction it left open."""
        timeout_ms = self._producer_timeout_ms
        if self._producer is not None:
            producer, self._producer = self._producer, None
            producer.close(timeout_ms=0)
        self._ensure_producer(timeout_ms)

    def _fenced(self, exc: BaseException) -> CdcError:
        return CdcError(
            f"fenced: another connector named {self._name!r} "
            f"(transactional id {self.transactional_id!r}) took over ({exc})"
        )

    def _begin(self, *, snapshot: bool) -> None:
        self._ensure_producer(self._snapshot_timeout_ms if snapshot else self._streaming_timeout_ms)
        self._live_producer().begin_transaction()
        self._open = True
        self._snapshot = snapshot
        self._opened_ms = _monotonic_ms()
        self._units = []
        self._records = 0
        self._position = None

    def _send_records(self, unit: ChangeUnit) -> None:
        producer = self._live_producer()
        for record in unit.records:
            producer.send(record.topic, value=record.value, key=record.key)
        self._records += len(unit.records)

    def _flush_sends(self) -> None:
        self._live_producer().flush(self._request_timeout_ms)

    def _send_position(self, position: Position) -> None:
        value = encode_position(self._name, position, self.server_wal_end, self._clock())
        self._live_producer().send(self._offsets_topic, value=value, key=self._name.encode())

    def _commit(self) -> None:
        """Write the position into the open transaction and commit it; on an abortable
        failure abort and write the units again (streaming only), for up to
        ``outage_timeout_ms``."""
        position = self._position
        assert self._open
        assert position is not None
        deadline = _monotonic_ms() + self._outage_timeout_ms
        try:
            self._send_position(position)
        except _FENCED as exc:
            raise self._fenced(exc) from exc
        except TransactionAbortableError as exc:
            # A record of the transaction already failed (a newer instance's epoch
            # refusing it, say): abort and write again; an abort refused as fenced
            # raises ``CdcError`` ("fenced") there (CI).
            if self._snapshot:
                raise
            self._write_again(exc, deadline, position=True)
        if not self._snapshot:
            stop_point("mid_transaction", prepare=self._flush_sends)
        while True:
            producer = self._live_producer()
            try:
                # Called again after a timeout it flushes first (the producer's rule), so
                # EndTxn never goes out with a record of the transaction in flight.
                producer.commit_transaction(self._request_timeout_ms)
                break
            except _FENCED as exc:
                raise self._fenced(exc) from exc
            except KafkaTimeoutError:
                if _monotonic_ms() > deadline:
                    raise
                log.warning("CDC %s: commit timed out; retrying", self._name)
            except TransactionAbortableError as exc:
                if self._snapshot:
                    raise
                self._write_again(exc, deadline, position=True)
        self._open = False
        self._units = []
        self._rewrites = 0
        self._durable = position.lsn
        self.commits += 1
        log.debug("CDC position %s committed", format_lsn(position.lsn))
        stop_point("after_commit")

    def _write_again(self, cause: BaseException, deadline: int, *, position: bool) -> None:
        """The open (streaming) transaction failed: abort it and write its units (and,
        with ``position``, the position) in a new one, until that succeeds or
        ``deadline`` passes (then ``cause``'s kind is raised)."""
        while True:
            if _monotonic_ms() > deadline:
                raise cause
            log.warning("CDC %s: transaction aborted (%s); writing it again", self._name, cause)
            # Consecutive failures back off (a record refused until an operator acts
            # would otherwise cost an abort and an epoch bump in a tight loop).
            if self._rewrites:
                time.sleep(min(0.05 * 2 ** min(self._rewrites, 5), 1.0))
            self._rewrites += 1
            self._abort(deadline)
            try:
                self._rewrite(position)
                return
            except (TransactionAbortableError, KafkaTimeoutError) as exc:
                cause = exc

    def _abort(self, deadline: int) -> None:
        """Abort the open transaction. A timeout is retried; a producer that cannot abort
        (say a retried abort whose EndTxn went through but whose epoch bump did not, so
        there is nothing left to abort in its eyes) is replaced by a new one, whose
        InitProducerId aborts whatever the old one left open."""
        while True:
            try:
                self._live_producer().abort_transaction(self._request_timeout_ms)
                return
            except _FENCED as exc:
                raise self._fenced(exc) from exc
            except KafkaTimeoutError as exc:
                if _monotonic_ms() > deadline:
                    raise
                log.warning("CDC %s: abort timed out (%s); retrying", self._name, exc)
            except TidelogError as exc:
                if _monotonic_ms() > deadline:
                    raise
                log.warning("CDC %s: abort failed (%s); a new producer", self._name, exc)
                self._replace_producer()
                return

    def _rewrite(self, position: bool) -> None:
        """The aborted transaction's units again, in a new transaction (and the
        position, for a commit)."""
        units = self._units
        stored = self._position
        self._begin(snapshot=False)
        self._units = units
        self._position = stored
        for unit in units:
            self._send_records(unit)
        if position and stored is not None:
            self._send_position(stored)
