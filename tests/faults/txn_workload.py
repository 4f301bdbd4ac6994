"""The transactional workload of the fault harness (issues #28 and #29), through the Kafka
listener with confluent-kafka, recorded into a ``history.Recorder``.

* ``producers`` transactional producers, each with its own ``transactional.id``
  (``<prefix>-<i>``, kept by every generation of that producer, so a new one fences the
  old). Each transaction writes 1-3 unique values (``t<i>.<generation>-<n>``) to each of
  2-4 distinct partitions (at most the topic's), then commits, or aborts with probability
  ``abort_probability``; the choices come from ``random.Random`` seeded with ``seed``.
* ``consumers`` consumers (``isolation.level=read_committed`` by default), each assigned
  every partition from offset 0 (no group: nothing moves partitions between them), record
  what every poll returned. ``isolation_level="read_uncommitted"`` exists to break the
  workload on purpose: the checker must then find the aborted records it reads.
* ``final_read_committed`` reads a partition whole at the end, read_committed, once no
  transaction is open on it (its last stable offset equals its high watermark).

How outcomes are recorded (``tests/faults/history.py``). ``Send``s are transactional and
idempotent: ``ok`` with the offset the delivery report gave, ``failed`` when ``produce``
itself raised (nothing was queued), ``unknown`` for any delivery error (a timeout, a
purge by an abort, a broker error: the record may be in the log, and its transaction's
end decides whether it counts). Each transaction ends with one record:

* ``TxnCommit`` ``ok`` when ``commit_transaction`` returned; a retriable error (a timeout,
  the coordinator restarting) retries the commit, as librdkafka documents, until
  ``txn_deadline_s``; still undecided, it is ``unknown``, as after a fatal error.
* ``TxnAbort`` ``ok`` when ``abort_transaction`` returned: for a chosen abort (its
  records flushed to the log first, so that there are aborted records to hide), and for a
  commit that failed with an error that requires an abort (librdkafka reports those
  before it sends EndTxn(commit): a record that could not be delivered, a fenced epoch
  it bumps). Decision: a successful abort means the transaction did not commit. A
  coordinator that completed a commit refuses a later abort of it (INVALID_TXN_STATE,
  or a stale epoch under transactions v2), so if the broker ever answers such an abort
  with success, the checker will say so as an aborted read, which is the point.
  An abort that raised is ``unknown``.

A fatal error (fenced, an unsupported feature, a cluster refusing transactions) closes
the producer and starts the next generation after a pause. Every blocking call has a
timeout; a thread stopped at the worst moment (a commit retried to ``txn_deadline_s``, its
last attempt's ``call_timeout_s``, the abort after it, the closing flush) ends within
``txn_deadline_s`` + 4 ``call_timeout_s``, and ``stop()`` waits that and 10 s more (a
CI run at 35 s was seen cut short under load; the hung thread's stack is logged).
Thread-safe as ``workloads``: ``start``/``stop`` from the owning thread.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from tests.faults.history import FinalRead, Poll, Recorder, Seek, Send, TxnAbort, TxnCommit
from tests.faults.workloads import _Workers

__all__ = ["TxnSettings", "TxnStats", "TxnWorkload", "final_read_committed"]

log = logging.getLogger(__name__)

IsolationLevel = Literal["read_committed", "read_uncommitted"]
_REPLACE_BACKOFF_S = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class TxnSettings:
    """Client settings of the transactional workload. Immutable.

    librdkafka requires ``message_timeout_ms <= transaction_timeout_ms``; the broker aborts
    a transaction left open (its producer gone) after ``transaction_timeout_ms``.
    """

    transaction_timeout_ms: int = 10_000
    message_timeout_ms: int = 8_000
    socket_timeout_ms: int = 5_000
    txn_deadline_s: float = 20.0
    call_timeout_s: float = 5.0
    poll_timeout_s: float = 0.5
    records_per_partition: tuple[int, int] = (1, 3)
    partitions_per_txn: tuple[int, int] = (2, 4)
    txn_interval_s: float = 0.02


@dataclass(slots=True)
class TxnStats:
    """What the workload's producers did, for a test's sanity checks. Updated under the
    workload's lock."""

    committed: int = 0
    aborted: int = 0
    unknown: int = 0
    fatal_errors: int = 0


class _Client:
    """A ``Producer`` whose calls raise a fatal error as the ``KafkaException`` it is.

    confluent-kafka raises a fatal error from inside ``poll``/``flush`` (never through
    ``error_cb``) and then goes on serving delivery reports with that exception set: the
    report's first call into C fails with ``SystemError``, the fatal error its cause (seen
    under kills: a retried batch answered OUT_OF_ORDER_SEQUENCE_NUMBER). Unwrapped here,
    it takes the workload's fatal-error path (a new generation) as any other.
    """

    def __init__(self, producer: Producer) -> None:
        self._producer = producer

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._producer, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return method(*args, **kwargs)
            except SystemError as error:
                if isinstance(error.__cause__, KafkaException):
                    raise error.__cause__ from None
                raise

        return call


def _error_of(exception: KafkaException) -> KafkaError | None:
    error = exception.args[0] if exception.args else None
    return error if isinstance(error, KafkaError) else None


class _Transaction:
    """One open transaction's sends, each recorded exactly once.

    No lock: ``begin``, ``end`` and ``abandon`` run on the producer's thread (librdkafka
    serves delivery reports inside its ``poll``/``flush``), and the once-only rule rests on
    the send leaving ``_pending`` (a ``dict.pop``, atomic under the GIL) once recorded. A
    lock here was the one place two full CI runs saw a producer thread stay blocked
    (``flush`` -> delivery report -> ``end`` waiting on this lock, held by no other code
    path): a report served re-entrantly (a finalizer run by the garbage collector inside
    ``begin``) would wait on its own thread forever; without the lock there is nothing to
    wait on.
    """

    def __init__(self, recorder: Recorder, producer_id: str, topic: str) -> None:
        self.recorder = recorder
        self.producer_id = producer_id
        self.topic = topic
        self.values: list[str] = []
        self._pending: dict[str, tuple[int, int]] = {}  # value -> (partition, start_ns)

    def begin(self, value: str, partition: int) -> None:
        self.values.append(value)
        self._pending[value] = (partition, self.recorder.now_ns())

    def end(self, value: str, offset: int | None, *, raised: bool = False) -> None:
        # Taken off only once recorded: a report served while confluent-kafka holds a
        # fatal error fails in its first call (``_Client``) and leaves the send pending,
        # for ``abandon`` to record as unknown.
        found = self._pending.get(value)
        if found is None:
            return
        partition, start = found
        outcome = "ok" if offset is not None else ("failed" if raised else "unknown")
        self.recorder.record(
            Send(
                producer_id=self.producer_id,
                topic=self.topic,
                partition=partition,
                value=value,
                outcome=outcome,  # type: ignore[arg-type]
                offset=offset,
                start_ns=start,
                end_ns=self.recorder.now_ns(),
                idempotent=True,
                transactional=True,
            )
        )
        self._pending.pop(value, None)

    def abandon(self) -> None:
        """Record every send never reported as ``unknown``."""
        for value in list(self._pending):
            self.end(value, None)


class TxnWorkload:
    """Transactional producers and read_committed consumers over ``topic`` (module
    docstring)."""

    def __init__(
        self,
        recorder: Recorder,
        bootstrap: str,
        topic: str,
        partitions: int,
        *,
        producers: int = 3,
        consumers: int = 2,
        abort_probability: float = 0.3,
        isolation_level: IsolationLevel = "read_committed",
        seed: int = 0,
        transactional_id_prefix: str = "txn-workload",
        settings: TxnSettings | None = None,
    ) -> None:
        if partitions < 2:
            raise ValueError("transactions across partitions need at least two partitions")
        self.recorder = recorder
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.producers = producers
        self.consumers = consumers
        self.abort_probability = abort_probability
        self.isolation_level = isolation_level
        self.seed = seed
        self.prefix = transactional_id_prefix
        self.settings = settings or TxnSettings()
        self.stats = TxnStats()
        self._stats_lock = threading.Lock()
        self._workers = _Workers()

    @property
    def errors(self) -> list[str]:
        return self._workers.errors

    def transactional_id(self, index: int) -> str:
        return f"{self.prefix}-{index}"

    def start(self) -> None:
        for i in range(self.producers):
            self._workers.spawn(f"txn-producer-{i}", lambda i=i: self._produce(i))
        for i in range(self.consumers):
            self._workers.spawn(f"txn-consumer-{i}", lambda i=i: self._consume(i))

    def stop(self) -> list[str]:
        """Stop and wait; the names of threads that did not end (none, normally)."""
        settings = self.settings
        return self._workers.stop(settings.txn_deadline_s + 4 * settings.call_timeout_s + 10)

    def _count(self, field: str) -> None:
        with self._stats_lock:
            setattr(self.stats, field, getattr(self.stats, field) + 1)

    # --- producers ------------------------------------------------------------------------

    def _producer(self, index: int, client_id: str) -> _Client:
        settings = self.settings
        return _Client(
            Producer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "client.id": client_id,
                    "transactional.id": self.transactional_id(index),
                    "transaction.timeout.ms": settings.transaction_timeout_ms,
                    "message.timeout.ms": settings.message_timeout_ms,
                    "socket.timeout.ms": settings.socket_timeout_ms,
                    "linger.ms": 5,
                }
            )
        )

    def _produce(self, index: int) -> None:
        rng = random.Random(f"{self.seed}-txn-{index}")
        stopping = self._workers.stopping
        generation = 0
        while not stopping.is_set():
            producer_id = f"t{index}.{generation}"
            producer = self._producer(index, producer_id)
            try:
                if self._initialise(producer, producer_id):
                    self._transactions(producer, producer_id, rng)
            except KafkaException as error:  # fatal: the next generation
                self._count("fatal_errors")
                log.warning("%s: %s; replacing the producer", producer_id, error)
            finally:
                # Anything still queued is purged unanswered; a transaction left open is
                # aborted by the next generation's init_transactions or by its timeout.
                try:
                    producer.purge()
                    producer.flush(self.settings.call_timeout_s)
                except KafkaException as error:  # a producer in a fatal state may refuse
                    log.info("%s: closing: %s", producer_id, error)
            generation += 1
            stopping.wait(_REPLACE_BACKOFF_S)

    def _initialise(self, producer: _Client, producer_id: str) -> bool:
        """``init_transactions``, retried while retriable; False when stopping first."""
        stopping = self._workers.stopping
        while not stopping.is_set():
            try:
                producer.init_transactions(self.settings.call_timeout_s)
                return True
            except KafkaException as exception:
                error = _error_of(exception)
                if error is None or not error.retriable():
                    raise
                log.info("%s: init_transactions: %s", producer_id, error)
        return False

    def _transactions(self, producer: _Client, producer_id: str, rng: random.Random) -> None:
        settings = self.settings
        stopping = self._workers.stopping
        sequence = 0
        while not stopping.is_set():
            txn = _Transaction(self.recorder, producer_id, self.topic)
            low, high = settings.partitions_per_txn
            count = rng.randint(min(low, self.partitions), min(high, self.partitions))
            chosen = sorted(rng.sample(range(self.partitions), count))
            abort = rng.random() < self.abort_probability
            start = self.recorder.now_ns()
            try:
                producer.begin_transaction()
                for partition in chosen:
                    for _ in range(rng.randint(*settings.records_per_partition)):
                        value = f"{producer_id}-{sequence}"
                        sequence += 1
                        self._send(producer, txn, value, partition)
                    producer.poll(0)
            except KafkaException as exception:
                error = _error_of(exception)
                if error is None or not error.txn_requires_abort():
                    self._end(producer, txn, "unknown-commit", start)
                    raise
                log.info("%s: %s; aborting", producer_id, error)
                abort = True
            self._end(producer, txn, "abort" if abort else "commit", start)
            stopping.wait(settings.txn_interval_s)

    def _send(self, producer: _Client, txn: _Transaction, value: str, partition: int) -> None:
        txn.begin(value, partition)

        def delivered(error: KafkaError | None, message: Any, value: str = value) -> None:
            txn.end(value, None if error is not None else message.offset())

        try:
            producer.produce(self.topic, value.encode(), partition=partition, on_delivery=delivered)
        except BufferError:
            txn.end(value, None, raised=True)
        except KafkaException:
            txn.end(value, None, raised=True)
            raise

    def _end(self, producer: _Client, txn: _Transaction, how: str, start_ns: int) -> None:
        """Commit or abort ``txn`` and record how it ended (module docstring).

        Raises ``KafkaException`` on a fatal error, after recording the end as unknown.
        """
        settings = self.settings
        deadline = time.monotonic() + settings.txn_deadline_s
        if how == "commit":
            while True:
                try:
                    producer.commit_transaction(settings.call_timeout_s)
                    self._record(TxnCommit, txn, "ok", start_ns, "committed")
                    return
                except KafkaException as exception:
                    error = _error_of(exception)
                    if error is not None and error.txn_requires_abort():
                        log.info("%s: commit needs an abort: %s", txn.producer_id, error)
                        break
                    if error is None or error.fatal() or not error.retriable():
                        self._record(TxnCommit, txn, "unknown", start_ns, "unknown")
                        raise
                    if time.monotonic() > deadline:
                        self._record(TxnCommit, txn, "unknown", start_ns, "unknown")
                        self._abort_quietly(producer, txn)
                        return
                    log.info("%s: commit retried: %s", txn.producer_id, error)
        elif how == "unknown-commit":
            self._record(TxnCommit, txn, "unknown", start_ns, "unknown")
            return
        else:
            # Written first, so the log holds the aborted records that read_committed
            # must hide (abort_transaction alone would purge most of them unsent).
            try:
                producer.flush(settings.call_timeout_s)
            except KafkaException:  # fatal: the abort will not happen here
                self._record(TxnAbort, txn, "unknown", start_ns, "unknown")
                raise
        while True:
            try:
                producer.abort_transaction(settings.call_timeout_s)
                self._record(TxnAbort, txn, "ok", start_ns, "aborted")
                return
            except KafkaException as exception:
                error = _error_of(exception)
                retriable = error is not None and error.retriable() and not error.fatal()
                if not retriable or time.monotonic() > deadline:
                    self._record(TxnAbort, txn, "unknown", start_ns, "unknown")
                    if retriable:
                        return
                    raise
                log.info("%s: abort retried: %s", txn.producer_id, error)

    def _abort_quietly(self, producer: _Client, txn: _Transaction) -> None:
        """After an undecided commit: leave the producer usable if it can be (the outcome
        is already recorded as unknown, whatever this does)."""
        try:
            producer.abort_transaction(self.settings.call_timeout_s)
        except KafkaException as error:
            log.info("%s: abort after an undecided commit: %s", txn.producer_id, error)
            raise

    def _record(
        self,
        kind: type[TxnCommit] | type[TxnAbort],
        txn: _Transaction,
        outcome: str,
        start_ns: int,
        counter: str,
    ) -> None:
        # Every delivery report was served by the commit or abort (or never will be).
        txn.abandon()
        self.recorder.record(
            kind(
                producer_id=txn.producer_id,
                values=tuple(txn.values),
                outcome=outcome,  # type: ignore[arg-type]
                start_ns=start_ns,
                end_ns=self.recorder.now_ns(),
            )
        )
        self._count(counter)

    # --- consumers ------------------------------------------------------------------------

    def _consume(self, index: int) -> None:
        stopping = self._workers.stopping
        name = f"tc{index}"
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"{self.prefix}-reader-{index}",  # never joined: assign only
                "client.id": name,
                "isolation.level": self.isolation_level,
                "enable.auto.commit": False,
                "auto.offset.reset": "error",
                "socket.timeout.ms": self.settings.socket_timeout_ms,
            }
        )
        try:
            start = self.recorder.now_ns()
            consumer.assign([TopicPartition(self.topic, p, 0) for p in range(self.partitions)])
            for partition in range(self.partitions):
                self.recorder.record(
                    Seek(
                        consumer=name,
                        topic=self.topic,
                        partition=partition,
                        offset=0,
                        start_ns=start,
                        end_ns=self.recorder.now_ns(),
                    )
                )
            while not stopping.is_set():
                start = self.recorder.now_ns()
                messages = consumer.consume(500, self.settings.poll_timeout_s)
                end = self.recorder.now_ns()
                by_partition: dict[int, list[tuple[int, str]]] = defaultdict(list)
                for message in messages:
                    if message.error() is not None:
                        log.info("%s: %s", name, message.error())
                        continue
                    value = (message.value() or b"").decode()
                    by_partition[message.partition()].append((message.offset(), value))
                for partition, records in by_partition.items():
                    self.recorder.record(
                        Poll(
                            consumer=name,
                            topic=self.topic,
                            partition=partition,
                            records=tuple(records),
                            start_ns=start,
                            end_ns=end,
                        )
                    )
        finally:
            consumer.close()


def final_read_committed(
    bootstrap: str, topic: str, partition: int, recorder: Recorder, *, timeout_s: float = 60.0
) -> FinalRead:
    """Read ``topic``-``partition`` whole, read_committed, and record it.

    Waits first until no transaction is open on it (its read_committed end offset, the
    last stable offset, equals the read_uncommitted one, the high watermark): a
    transaction its producer left open is aborted by the coordinator at its timeout.
    Raises ``TimeoutError`` if that or the read does not finish within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    tp = TopicPartition(topic, partition, OFFSET_BEGINNING)

    def reader(isolation: IsolationLevel, name: str) -> Consumer:
        return Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"final-{topic}",  # never joined: assign only
                "client.id": name,
                "isolation.level": isolation,
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            }
        )

    committed = reader("read_committed", f"final-{topic}-{partition}")
    uncommitted = reader("read_uncommitted", f"final-{topic}-{partition}-hw")
    try:
        last: object = None
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}-{partition}: a transaction stays open: {last}")
            try:
                low, stable = committed.get_watermark_offsets(tp, timeout=5.0, cached=False)
                _, high = uncommitted.get_watermark_offsets(tp, timeout=5.0, cached=False)
            except KafkaException as error:
                last = error
                time.sleep(0.5)
                continue
            if stable == high:
                break
            last = f"last stable offset {stable}, high watermark {high}"
            time.sleep(0.5)
        start = recorder.now_ns()
        committed.assign([tp])
        records: list[tuple[int, str]] = []
        while time.monotonic() < deadline:
            message = committed.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is None:
                records.append((message.offset(), (message.value() or b"").decode()))
            elif error.code() == KafkaError._PARTITION_EOF and message.offset() >= high:
                read = FinalRead(
                    topic=topic,
                    partition=partition,
                    log_start_offset=low,
                    log_end_offset=high,
                    records=tuple(records),
                    start_ns=start,
                    end_ns=recorder.now_ns(),
                )
                recorder.record(read)
                return read
            elif error.code() != KafkaError._PARTITION_EOF:
                log.warning("final read of %s-%s: %s", topic, partition, error)
        raise TimeoutError(f"final read of {topic}-{partition}: read {len(records)} records")
    finally:
        committed.close()
        uncommitted.close()
