"""The transactional producer's state and its calls to the transaction coordinator
(issue #28; Kafka's ``TransactionManager``, kafka-python's names): what
``Producer(transactional_id=...)``'s ``init_transactions``, ``begin_transaction``,
``send_offsets_to_transaction``, ``commit_transaction`` and ``abort_transaction`` do, and
what the sender thread asks before it sends a batch.

States, as Kafka's client::

    UNINITIALIZED --init--> READY --begin--> IN_TRANSACTION --commit--> COMMITTING --> READY
                                                   |   \\--abort--> ABORTING --> READY
                              (a batch or call fails) v
                                           ABORTABLE_ERROR --abort--> ABORTING --> READY
    any state --fenced, unauthorized, bad timeout--> FATAL_ERROR (close the producer)

Rules kept:

- **AddPartitionsToTxn before the first batch to a partition.** The sender asks
  ``can_send(tp)``: a partition not in the transaction yet is queued for adding and its
  batches wait; the sender thread adds the queued partitions in one call
  (``add_pending``), then sends. The broker verifies every transactional batch against
  the transaction too (KIP-890 part 1), so a batch that slipped past would be refused.
- **Sends are flushed before EndTxn.** ``commit_transaction`` waits until every record
  of the transaction is stored or failed; any failure makes the transaction abortable and
  the commit raises instead of committing a transaction with a hole in it.
- **Errors, by Kafka's classes** (``reference/transactions.md`` 13): retriable answers
  (``CONCURRENT_TRANSACTIONS``, ``COORDINATOR_LOAD_IN_PROGRESS``, ``NOT_COORDINATOR``,
  ``COORDINATOR_NOT_AVAILABLE``, an unreachable broker) are retried until the call's
  timeout (AddPartitionsToTxn after ``retry_backoff_ms``, but after 20 ms at most when a
  transaction's first add meets ``CONCURRENT_TRANSACTIONS``: the previous transaction's
  markers are still being written, as Kafka's client); ``PRODUCER_FENCED``,
  ``INVALID_PRODUCER_EPOCH`` and ``INVALID_PRODUCER_ID_MAPPING`` from the coordinator,
  ``TRANSACTIONAL_ID_AUTHORIZATION_FAILED``, ``INVALID_TRANSACTION_TIMEOUT`` and
  ``INVALID_TXN_STATE`` are fatal; anything else (a record that failed, a topic or group
  not authorized, a zombie consumer's group metadata) is abortable: the only way on is
  ``abort_transaction``, after which a new transaction may begin.
- **After every abort the epoch is bumped** (KIP-360's InitProducerId with the current
  identity) and every partition's sequence starts again at 0. Kafka bumps only after an
  abortable error; bumping always costs one round trip per abort and makes "were any
  sequence numbers lost?" a question nobody has to answer (an aborted retry, a batch
  refused mid-transaction).
- **Timeouts on every blocking call**: each takes ``timeout_ms`` (default
  ``max_block_ms``, as Kafka's) and raises ``KafkaTimeoutError`` past it. A commit or
  abort that timed out may be called again: it resends EndTxn (the coordinator answers a
  retried EndTxn of a finished transaction with success).

Calls not in the ``Connection`` protocol go over the connection's gRPC transport (as
``client.admin_security``); the coordinator is found with FindCoordinator key type 1.

Thread-safe: one lock guards the state; no lock is held across a network call. The
producer's lock may be held when ``can_send`` or ``batch_failed`` is called (never the
other way round).
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from tidelog.client.cluster import BrokerNode
from tidelog.client.connection import Connection
from tidelog.client.errors import ClosedError, TransactionAbortedError
from tidelog.client.grpc_connection import GrpcConnection
from tidelog.client.routing import ROUTING_ERRORS, ClusterConnections
from tidelog.client.types import ConsumerGroupMetadata, TopicPartition
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.storage.errors import (
    ConcurrentTransactionsError,
    InvalidProducerEpochError,
    InvalidProducerIdMappingError,
    InvalidRequestError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    KafkaTimeoutError,
    ProducerFencedError,
    TidelogError,
    TransactionAbortableError,
    TransactionalIdAuthorizationFailedError,
    error_for_code,
)

__all__ = ["TransactionManager", "TxnState"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_MAX_BACKOFF_MS = 1_000
# The retry of a transaction's first AddPartitionsToTxn answered CONCURRENT_TRANSACTIONS
# (Kafka's ADD_PARTITIONS_RETRY_BACKOFF_MS): a group commit that begins its next
# transaction as soon as the last one's EndTxn returns meets it on every transaction.
_FIRST_ADD_RETRY_BACKOFF_MS = 20
# Answers from the coordinator that end the producer (module docstring).
_FATAL: tuple[type[TidelogError], ...] = (
    ProducerFencedError,
    InvalidProducerEpochError,
    InvalidProducerIdMappingError,
    TransactionalIdAuthorizationFailedError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
)


class TxnState(enum.Enum):
    UNINITIALIZED = "uninitialized"
    READY = "ready"
    IN_TRANSACTION = "in_transaction"
    COMMITTING = "committing"
    ABORTING = "aborting"
    ABORTABLE_ERROR = "abortable_error"
    FATAL_ERROR = "fatal_error"


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class TransactionManager:
    """One transactional producer's state and coordinator calls. Thread-safe.

    Args:
        transactional_id: the producer's id (fencing is per id).
        transaction_timeout_ms: how long the coordinator lets a transaction stay open.
        connections: the producer's connections (the coordinator is found through them).
        request_timeout_ms: the longest one call waits for an answer.
        retry_backoff_ms: the first pause before a retry (doubling up to 1 s).
    """

    def __init__(
        self,
        transactional_id: str,
        transaction_timeout_ms: int,
        connections: ClusterConnections,
        *,
        request_timeout_ms: int,
        retry_backoff_ms: int,
    ) -> None:
        self.transactional_id = transactional_id
        self._timeout_ms = transaction_timeout_ms
        self._connections = connections
        self._request_timeout_ms = request_timeout_ms
        self._retry_backoff_ms = max(retry_backoff_ms, 1)
        self._lock = threading.Lock()
        self._state = TxnState.UNINITIALIZED
        self._error: TidelogError | None = None
        self.producer_id = -1
        self.producer_epoch = -1
        self._added: set[TopicPartition] = set()
        self._pending: set[TopicPartition] = set()
        self._add_retry_at_ms = 0
        # The coordinator knows the current transaction (a partition or offsets joined).
        self._started = False
        self._coordinator: BrokerNode | None = None

    # --- state ---------------------------------------------------------------------------

    @property
    def state(self) -> TxnState:
        return self._state

    @property
    def error(self) -> TidelogError | None:
        """The error that made the transaction abortable or the producer fail, if any."""
        return self._error

    def _require(self, action: str, *allowed: TxnState) -> TxnState:
        """The current state if ``action`` is allowed in it; raises otherwise (the fatal
        error once there is one, ``InvalidTxnStateError`` for a call out of order)."""
        state = self._state
        if state is TxnState.FATAL_ERROR:
            raise _copy(self._error, f"the producer failed for good and must be closed ({action})")
        if state not in allowed:
            if state is TxnState.ABORTABLE_ERROR:
                raise TransactionAbortableError(
                    f"cannot {action}: the transaction failed ({self._error}); abort it"
                ) from self._error
            raise InvalidTxnStateError(f"cannot {action} in state {state.value}")
        return state

    def _fail_locked(self, error: TidelogError) -> None:
        """Enter the error state ``error`` asks for (fatal wins over abortable)."""
        if self._state is TxnState.FATAL_ERROR:
            return
        if isinstance(error, _FATAL):
            self._state = TxnState.FATAL_ERROR
            self._error = error
            log.error("transactional producer %r failed: %s", self.transactional_id, error)
        elif self._state in (TxnState.IN_TRANSACTION, TxnState.COMMITTING):
            self._state = TxnState.ABORTABLE_ERROR
            self._error = error
            log.warning("transaction of %r must be aborted: %s", self.transactional_id, error)

    # --- the application's calls (Producer) -----------------------------------------------

    def init(self, timeout_ms: int) -> tuple[int, int]:
        """InitProducerId with the transactional id: fences older instances (and aborts
        their open transaction). Returns ``(producer_id, epoch)``. May be called again
        after a timeout."""
        with self._lock:
            self._require("init_transactions", TxnState.UNINITIALIZED)
        request = pb.InitTransactionsRequest(
            transactional_id=self.transactional_id,
            transaction_timeout_ms=self._timeout_ms,
        )
        answer = self._on_coordinator("InitTransactions", request, timeout_ms)
        with self._lock:
            self.producer_id, self.producer_epoch = answer.producer_id, answer.producer_epoch
            self._state = TxnState.READY
        log.info(
            "transactional id %r: producer %d epoch %d",
            self.transactional_id,
            answer.producer_id,
            answer.producer_epoch,
        )
        return answer.producer_id, answer.producer_epoch

    def begin(self) -> None:
        """Start a transaction (local only: the coordinator learns of it with the first
        partition added)."""
        with self._lock:
            self._require("begin_transaction", TxnState.READY)
            self._added.clear()
            self._pending.clear()
            self._started = False
            self._error = None
            self._state = TxnState.IN_TRANSACTION

    def check_send(self) -> None:
        """Raise unless records may be sent now (inside a transaction)."""
        if self._state is not TxnState.IN_TRANSACTION:
            with self._lock:
                self._require(
                    "send outside a transaction (begin_transaction first)", TxnState.IN_TRANSACTION
                )

    def send_offsets(
        self,
        offsets: Mapping[TopicPartition, int],
        group: ConsumerGroupMetadata,
        timeout_ms: int,
    ) -> None:
        """AddOffsetsToTxn, then TxnOffsetCommit at the group's coordinator: the offsets
        are committed if and only if the transaction commits."""
        with self._lock:
            self._require("send_offsets_to_transaction", TxnState.IN_TRANSACTION)
            pid, epoch = self.producer_id, self.producer_epoch
        deadline = _monotonic_ms() + timeout_ms
        try:
            self._on_coordinator(
                "AddOffsetsToTxn",
                pb.AddOffsetsToTxnRequest(
                    transactional_id=self.transactional_id,
                    producer_id=pid,
                    producer_epoch=epoch,
                    group_id=group.group_id,
                ),
                timeout_ms,
            )
            with self._lock:
                self._started = True
            request = pb.TxnOffsetCommitRequest(
                transactional_id=self.transactional_id,
                producer_id=pid,
                producer_epoch=epoch,
                group_id=group.group_id,
                member_id=group.member_id,
                generation_id=group.generation_id,
                group_instance_id=group.group_instance_id,
                offsets=[
                    pb.CommittedOffset(topic=tp.topic, partition=tp.partition, offset=offset)
                    for tp, offset in offsets.items()
                ],
            )
            answer = self._retrying(
                lambda left: self._call(
                    self._connections.coordinator(group.group_id, left),
                    "TxnOffsetCommit",
                    request,
                    left,
                ),
                "TxnOffsetCommit",
                max(deadline - _monotonic_ms(), 1),
                forget=lambda: self._connections.forget_coordinator(group.group_id),
            )
            for result in answer.results:
                if result.error_code:
                    raise error_for_code(
                        result.error_code,
                        f"{result.topic}-{result.partition}: {result.error_message}",
                    )
        except KafkaTimeoutError:
            raise  # the outcome is unknown; the application may retry or abort
        except TidelogError as exc:
            with self._lock:
                self._fail_locked(exc)
            raise

    def begin_commit(self) -> bool:
        """Enter COMMITTING; False if already there (a commit retried after a timeout,
        whose records the producer flushes again before EndTxn)."""
        with self._lock:
            state = self._require(
                "commit_transaction", TxnState.IN_TRANSACTION, TxnState.COMMITTING
            )
            self._state = TxnState.COMMITTING
            return state is TxnState.IN_TRANSACTION

    def begin_abort(self) -> None:
        """Enter ABORTING: the sender fails every batch not sent yet
        (``TransactionAbortedError``); the ones in flight are waited for."""
        with self._lock:
            self._require(
                "abort_transaction",
                TxnState.IN_TRANSACTION,
                TxnState.COMMITTING,
                TxnState.ABORTABLE_ERROR,
                TxnState.ABORTING,
            )
            self._state = TxnState.ABORTING

    def end(self, commit: bool, timeout_ms: int) -> None:
        """EndTxn. On success the producer is READY again. A commit raises the abortable
        error instead if a record of the transaction failed meanwhile."""
        with self._lock:
            if commit:
                self._require("commit_transaction", TxnState.COMMITTING)
            else:
                self._require("abort_transaction", TxnState.ABORTING)
            pid, epoch, started = self.producer_id, self.producer_epoch, self._started
        if started:
            # A transaction no partition (nor offsets) joined is unknown to the
            # coordinator: there is nothing to end (Kafka's client sends no EndTxn either).
            request = pb.EndTxnRequest(
                transactional_id=self.transactional_id,
                producer_id=pid,
                producer_epoch=epoch,
                commit=commit,
            )
            self._on_coordinator("EndTxn", request, timeout_ms)
        with self._lock:
            self._added.clear()
            self._pending.clear()
            self._started = False
            self._error = None
            self._state = TxnState.READY

    def bump_epoch(self, timeout_ms: int) -> tuple[int, int]:
        """After an abort: InitProducerId with the current identity (KIP-360), the new
        epoch (or id) the next transaction uses, sequences from 0."""
        with self._lock:
            self._require("abort_transaction", TxnState.READY)
            request = pb.InitTransactionsRequest(
                transactional_id=self.transactional_id,
                transaction_timeout_ms=self._timeout_ms,
                producer_id=self.producer_id,
                producer_epoch=self.producer_epoch,
            )
        answer = self._on_coordinator("InitTransactions", request, timeout_ms)
        with self._lock:
            self.producer_id, self.producer_epoch = answer.producer_id, answer.producer_epoch
        return answer.producer_id, answer.producer_epoch

    # --- the sender thread's questions ---------------------------------------------------

    def can_send(self, tp: TopicPartition) -> bool:
        """Whether a batch of ``tp`` may go out now: the transaction is on and ``tp`` is in
        it. A partition not added yet is queued for ``add_pending``."""
        state = self._state
        if state is not TxnState.IN_TRANSACTION and state is not TxnState.COMMITTING:
            return False
        if tp in self._added:
            return True
        with self._lock:
            self._pending.add(tp)
        return False

    def has_pending_adds(self, now_ms: int | None = None) -> bool:
        """Partitions wait to be added (and their retry backoff, if any, has passed)."""
        if not self._pending or self._state not in (TxnState.IN_TRANSACTION, TxnState.COMMITTING):
            return False
        return now_ms is None or now_ms >= self._add_retry_at_ms

    @property
    def add_retry_at_ms(self) -> int:
        return self._add_retry_at_ms

    def add_pending(self, now_ms: int) -> None:
        """AddPartitionsToTxn for the queued partitions (the sender thread, no lock held):
        one attempt; a retriable failure is retried after a backoff, any other makes the
        transaction abortable (or the producer fail)."""
        with self._lock:
            wanted = sorted(self._pending - self._added)
            pid, epoch = self.producer_id, self.producer_epoch
        if not wanted:
            return
        by_topic: dict[str, list[int]] = {}
        for tp in wanted:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        request = pb.AddPartitionsToTxnRequest(
            transactional_id=self.transactional_id,
            producer_id=pid,
            producer_epoch=epoch,
            partitions=[pb.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()],
        )
        try:
            connection = self._coordinator_connection(self._request_timeout_ms)
            self._call(connection, "AddPartitionsToTxn", request, self._request_timeout_ms)
        except TidelogError as exc:
            with self._lock:
                if exc.retriable:
                    log.info("adding %s to the transaction: %s; retrying", wanted, exc)
                    if isinstance(exc, ROUTING_ERRORS):
                        self._coordinator = None
                    backoff = self._retry_backoff_ms
                    if isinstance(exc, ConcurrentTransactionsError) and not self._added:
                        # The previous transaction's markers are still being written
                        # (EndTxn answers before them): it completes within moments, so
                        # the first add of a transaction retries sooner, as Kafka's
                        # client does (KAFKA-5482's stopgap).
                        backoff = min(backoff, _FIRST_ADD_RETRY_BACKOFF_MS)
                    self._add_retry_at_ms = now_ms + backoff
                else:
                    self._fail_locked(exc)
            return
        with self._lock:
            self._added.update(wanted)
            self._pending.difference_update(wanted)
            self._started = True

    def undrained_error(self) -> TidelogError | None:
        """The error to fail batches not sent yet with, or None to keep them: the
        transaction's error once it is abortable (or the producer failed), and
        ``TransactionAbortedError`` while it is being aborted (Kafka's sender does the
        same with ``abortUndrainedBatches``)."""
        state = self._state
        if state is TxnState.ABORTING:
            return TransactionAbortedError(
                f"the transaction of {self.transactional_id!r} was aborted before the "
                "record was sent"
            )
        if state is TxnState.ABORTABLE_ERROR or state is TxnState.FATAL_ERROR:
            return TransactionAbortedError(
                f"the transaction failed before the record was sent: {self._error}"
            )
        return None

    def batch_failed(self, error: TidelogError) -> None:
        """A record of the transaction failed for good (the producer's lock may be held):
        the transaction can no longer commit. A produce answered
        ``INVALID_PRODUCER_EPOCH`` is abortable, as Kafka's client since 2.7 (the EndTxn
        of the abort tells whether the producer was really fenced)."""
        if isinstance(error, TransactionAbortedError):
            return
        with self._lock:
            if self._state in (TxnState.IN_TRANSACTION, TxnState.COMMITTING):
                self._state = TxnState.ABORTABLE_ERROR
                self._error = error

    # --- calls -------------------------------------------------------------------------

    def _on_coordinator(self, method: str, request: Any, timeout_ms: int) -> Any:
        """``method`` at the transaction coordinator, retried until ``timeout_ms``; a
        non-retriable answer moves the state (fatal or abortable) and is raised."""
        try:
            return self._retrying(
                lambda left: self._call(self._coordinator_connection(left), method, request, left),
                method,
                timeout_ms,
                forget=self._forget_coordinator,
            )
        except KafkaTimeoutError:
            raise
        except TidelogError as exc:
            with self._lock:
                self._fail_locked(exc)
            raise

    def _forget_coordinator(self) -> None:
        with self._lock:
            self._coordinator = None

    def _retrying(
        self,
        attempt: Callable[[int], T],
        what: str,
        timeout_ms: int,
        *,
        forget: Callable[[], None],
    ) -> T:
        deadline = _monotonic_ms() + timeout_ms
        backoff = self._retry_backoff_ms
        while True:
            left = max(deadline - _monotonic_ms(), 1)
            try:
                return attempt(min(left, self._request_timeout_ms))
            except TidelogError as exc:
                if not exc.retriable or isinstance(exc, ClosedError):
                    raise
                if isinstance(exc, ROUTING_ERRORS):
                    forget()
                    self._connections.mark_stale()
                remaining = deadline - _monotonic_ms()
                if remaining <= 0:
                    raise KafkaTimeoutError(
                        f"{what} for transactional id {self.transactional_id!r}: not done "
                        f"within {timeout_ms} ms (last: {exc})"
                    ) from exc
                log.info("%s: %s; retrying in %d ms", what, exc, min(backoff, remaining))
                time.sleep(min(backoff, remaining) / 1000)
                backoff = min(backoff * 2, _MAX_BACKOFF_MS)

    def _coordinator_connection(self, timeout_ms: int) -> Connection:
        """The transaction coordinator (FindCoordinator key type 1, then remembered)."""
        with self._lock:
            node = self._coordinator
        if node is None:
            connection = self._connections.any_broker(timeout_ms)
            answer = self._call(
                connection,
                "FindCoordinator",
                pb.FindCoordinatorRequest(group_id=self.transactional_id, key_type=1),
                timeout_ms,
            )
            found = answer.coordinator
            node = BrokerNode(found.id, found.host, found.port)
            with self._lock:
                self._coordinator = node
        return self._connections.connection_to(self._connections.address_of(node))

    def _call(self, connection: Connection, method: str, request: Any, timeout_ms: int) -> Any:
        """``method`` on ``connection``. A failure is reported to the routing
        (``report_failure``: an unreachable broker is asked last from then on, and a
        routing error marks the metadata stale), or FindCoordinator would ask the same
        dead broker again and again: a connector's commits once stalled for a minute
        after its coordinator was SIGKILLed (the CDC cluster test)."""
        if not isinstance(connection, GrpcConnection):
            raise InvalidRequestError(f"{method} needs a gRPC connection")
        transport = connection.transport
        try:
            return transport.call(
                getattr(transport.stub, method), request, what=method, timeout_ms=timeout_ms
            )
        except TidelogError as exc:
            self._connections.report_failure(connection.address, exc)
            if isinstance(exc, ROUTING_ERRORS):
                self._connections.mark_stale()
            raise


def group_metadata_of(group: ConsumerGroupMetadata | str) -> ConsumerGroupMetadata:
    """``send_offsets_to_transaction``'s group: a consumer's ``group_metadata()``, or a
    bare group id (kafka-python's older form: no member check)."""
    if isinstance(group, ConsumerGroupMetadata):
        return group
    if isinstance(group, str) and group:
        return ConsumerGroupMetadata(group)
    raise TypeError(f"group_metadata must be a ConsumerGroupMetadata or a group id, got {group!r}")


def offsets_of(offsets: Mapping[TopicPartition, Any]) -> dict[TopicPartition, int]:
    """Offsets as plain ints (an ``OffsetAndMetadata``-like object's ``offset`` too)."""
    out = {}
    for tp, value in offsets.items():
        offset = getattr(value, "offset", value)
        if not isinstance(tp, TopicPartition):
            raise TypeError(f"offsets keys must be TopicPartition, got {tp!r}")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise ValueError(f"the offset for {tp} must be a non-negative int, got {value!r}")
        out[tp] = offset
    return out


def _copy(error: TidelogError | None, message: str) -> TidelogError:
    if error is None:
        return ClosedError(message)
    return type(error)(f"{message}: {error}")
