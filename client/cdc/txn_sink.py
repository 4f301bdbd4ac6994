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
- **Batching (group commit), pipelined.** Several small PostgreSQL transactions go into
  one Tidelog transaction, whole and in commit order: a PostgreSQL transaction is never
  split, so atomicity holds, and one producer writes them in order, so order holds.
  ``write`` only queues a unit; a committer thread owns the streaming transactions: it
  takes every unit queued (up to ``max_records`` records, at least one whole unit),
  begins a transaction, sends their records and the position, commits, and only then
  moves ``durable_lsn``. A batch is taken when the connector finds the replication stream
  drained (``drained``), when its oldest unit has waited ``commit_interval_ms`` (default
  50), or when ``max_records`` (default 5,000) are queued. One transaction is in flight
  at a time and the next batch builds meanwhile: the connector goes on reading and
  decoding while a commit waits for its acknowledgements and EndTxn (before, the commit
  blocked the connector and PostgreSQL's messages queued in the socket). So batches grow
  with the load, and a commit's wait costs no capture time. ``write`` blocks while twice
  ``max_records`` records are queued (backpressure: an outage holds the connector, not
  its memory). The position (the batch's last unit's) is sent after the records, at
  the commit, as before the pipeline. (The kill tests once found this sink's "stopped"
  transaction readable read_committed: the stop-point hook, reached on the committer
  thread, let that thread run on and commit; ``client.cdc.testhooks`` now stops the
  thread that reaches the point. docs/cdc.md, "Performance".)
  Whatever the committer raises (fenced, an outage outlasting ``outage_timeout_ms``) is
  raised by the connector's next call.
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

Not thread-safe for callers: one connector thread calls every method (the committer
thread is the sink's own). The snapshot is written on the caller's thread, before the
committer starts.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
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
        commit_interval_ms, max_records: when queued units are taken into a transaction
            at the latest (sooner when the stream is drained); ``max_records`` also
            caps a transaction (a single larger unit still goes whole).
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
        # The streaming pipeline (module docstring): units queued by ``write``, taken in
        # batches by the committer thread. ``_cond`` guards every field below.
        self._cond = threading.Condition()
        self._queue: deque[ChangeUnit] = deque()
        self._queued_records = 0
        self._queued_since_ms = 0  # when the oldest queued unit arrived
        self._commit_now = False  # drained or flush: take what is queued at once
        self._written_lsn: int | None = None  # the last streaming position written
        self._failure: BaseException | None = None
        self._closing = False
        self._committer: threading.Thread | None = None
        # Written after every commit (and failure), so a connector sleeping in select()
        # on the replication socket confirms the new position at once (``wakeup_fd``).
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        try:
            self._ensure_producer(transaction_timeout_ms)  # fences the zombie
        except BaseException:
            os.close(self._wake_read)
            os.close(self._wake_write)
            raise

    # --- ChangeSink ------------------------------------------------------------------------

    def write(self, unit: ChangeUnit) -> None:
        """Queue a streaming unit for the committer; write a snapshot unit at once (in
        the snapshot's transaction, committed with its last unit)."""
        if unit.snapshot:
            self._write_snapshot(unit)
            return
        if unit.position is None:
            raise CdcError("a streaming unit without a position")
        if self._open and self._snapshot:
            raise CdcError("a snapshot unit and a streaming unit in one transaction")
        count = len(unit.records)
        with self._cond:
            self._raise_failure()
            limit = 2 * self._max_records
            while self._queue and self._queued_records + count > limit:
                self._cond.wait(1.0)
                self._raise_failure()
            if not self._queue:
                self._queued_since_ms = _monotonic_ms()
                wake = True
            else:
                wake = self._queued_records < self._max_records <= self._queued_records + count
            self._queue.append(unit)
            self._queued_records += count
            self._written_lsn = unit.position.lsn
            if self._committer is None:
                self._committer = threading.Thread(
                    target=self._commit_loop, name=f"cdc-commit-{self._name}", daemon=True
                )
                self._committer.start()
            elif wake:
                self._cond.notify_all()

    def durable_lsn(self) -> int | None:
        if self._failure is not None:
            with self._cond:
                self._raise_failure()
        return self._durable

    def drained(self) -> None:
        """The replication stream has nothing waiting: commit what is queued now, without
        waiting for it (``durable_lsn`` moves when it is committed)."""
        with self._cond:
            self._raise_failure()
            if self._queue and not self._commit_now:
                self._commit_now = True
                self._cond.notify_all()

    def flush(self, timeout_ms: int) -> int | None:
        """Commit everything written and wait for it (the connector stops, or lost
        PostgreSQL). A snapshot transaction is left open: only its last unit commits it.
        Waits for the committer's retries (``outage_timeout_ms``) at least."""
        if self._open and self._snapshot:
            return self._durable
        deadline = _monotonic_ms() + max(timeout_ms, self._outage_timeout_ms + 1_000)
        with self._cond:
            target = self._written_lsn
            self._commit_now = True
            self._cond.notify_all()
            while True:
                self._raise_failure()
                if target is None or (self._durable is not None and self._durable >= target):
                    return self._durable
                left = deadline - _monotonic_ms()
                if left <= 0:
                    raise KafkaTimeoutError(
                        f"CDC {self._name}: position {format_lsn(target)} not committed "
                        f"within {timeout_ms} ms"
                    )
                self._cond.wait(min(left, 1_000) / 1000)

    def wakeup_fd(self) -> int:
        """A file descriptor readable after every commit (read it empty with
        ``os.read``): the connector waits on it beside the replication socket."""
        return self._wake_read

    def close(self) -> None:
        """Stop the committer (a batch in flight is finished or given up on), close the
        producer; a transaction still open is aborted (the producer's rule)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        committer = self._committer
        if committer is not None and committer is not threading.current_thread():
            committer.join(self._request_timeout_ms / 1000)
        if self._producer is not None:
            producer, self._producer = self._producer, None
            producer.close(timeout_ms=self._request_timeout_ms)
        for fd in (self._wake_read, self._wake_write):
            try:
                os.close(fd)
            except OSError:
                pass
        self._wake_read = self._wake_write = -1

    # --- the committer thread --------------------------------------------------------------

    def _raise_failure(self) -> None:
        """(``_cond`` held.) Raise what stopped the committer, if anything did."""
        failure = self._failure
        if failure is not None:
            if isinstance(failure, CdcError):
                raise CdcError(str(failure)) from failure
            raise failure

    def _take_batch(self) -> list[ChangeUnit] | None:
        """(``_cond`` held.) Wait until a batch is due; take it (None: closing)."""
        while True:
            if self._closing:
                return None
            if self._queue:
                waited = _monotonic_ms() - self._queued_since_ms
                if (
                    self._commit_now
                    or self._queued_records >= self._max_records
                    or waited >= self._commit_interval_ms
                ):
                    break
                self._cond.wait((self._commit_interval_ms - waited) / 1000)
            else:
                self._cond.wait()
        units = [self._queue.popleft()]
        taken = len(units[0].records)
        while self._queue and taken + len(self._queue[0].records) <= self._max_records:
            unit = self._queue.popleft()
            units.append(unit)
            taken += len(unit.records)
        self._queued_records -= taken
        if self._queue:
            self._queued_since_ms = _monotonic_ms()
        else:
            self._commit_now = False
        self._cond.notify_all()  # writers waiting for room
        return units

    def _commit_loop(self) -> None:
        """The committer: batches of queued units, each in one transaction, in order."""
        try:
            while True:
                with self._cond:
                    units = self._take_batch()
                if units is None:
                    return
                self._begin(snapshot=False)
                self._units = units
                position = self._position = units[-1].position
                assert position is not None
                try:
                    self._send_records(*units)
                except _FENCED as exc:
                    raise self._fenced(exc) from exc
                except (TransactionAbortableError, KafkaTimeoutError) as exc:
                    # A batch of the open transaction failed (or a send blocked past its
                    # timeout while a leader moved): abort and write it again.
                    self._write_again(
                        exc, _monotonic_ms() + self._outage_timeout_ms, position=False
                    )
                self._commit()
                with self._cond:
                    self._cond.notify_all()  # flush waits for durable_lsn
                self._wake()
        except BaseException as exc:  # handed to the connector's next call
            if not self._closing:
                log.error("CDC %s: the committer stopped: %s", self._name, exc)
            with self._cond:
                self._failure = exc
                self._cond.notify_all()
            self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_write, b"x")
        except OSError:
            pass  # full (the connector has a wake-up waiting already) or closed

    # --- the snapshot (the caller's thread) ------------------------------------------------

    def _write_snapshot(self, unit: ChangeUnit) -> None:
        """Add a snapshot unit to the snapshot's transaction (begun by the first one);
        the unit with a position is the last: it commits the whole snapshot."""
        if self._committer is not None:
            raise CdcError("a snapshot unit after streaming began")
        if not self._open:
            self._begin(snapshot=True)
        # A failure here stops the connector: the snapshot is taken again (its chunks
        # are not kept to be written twice).
        self._send_records(unit)
        if unit.position is None:
            stop_point("snapshot", prepare=self._flush_sends)
            return
        self._position = unit.position
        self._commit()  # the snapshot's last unit: the whole snapshot becomes visible

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

    def _send_records(self, *units: ChangeUnit) -> None:
        """The units' records into the open transaction, in order. (A batch send under
        one lock acquisition was measured: no gain in the sink's CPU a record, ~4.5 us
        with the producer's sender thread, so ``send`` it is.)"""
        send = self._live_producer().send
        for unit in units:
            for record in unit.records:
                send(record.topic, value=record.value, key=record.key)
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
        # Before ``durable_lsn`` shows it: the connector's thread, which confirms it to
        # PostgreSQL, runs beside the committer, and the point promises "not confirmed".
        stop_point("after_commit")
        self._durable = position.lsn
        self.commits += 1
        log.debug("CDC position %s committed", format_lsn(position.lsn))

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
        self._send_records(*units)
        if position and stored is not None:
            self._send_position(stored)
