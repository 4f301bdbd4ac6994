"""The fault harness's workloads (issue #29), recording everything into a ``history.Recorder``.

* ``QueueWorkload``: ``producers`` idempotent ``acks=all`` producers send unique values
  (``q<i>.<generation>-<n>``) to random partitions of a topic, pipelined (several
  records in flight), while ``consumers`` members of one group poll and commit, each
  poll's records then committed at once (explicit offsets, no auto-commit).
* ``AppendWorkload``: per-partition list-append: one producer per partition appends
  unique values (``a<p>.<generation>-<n>``) one at a time, each waited for before the next
  (so each append really precedes the next in time); the whole partition is read back at
  the end (``final_read``).

What is recorded, and how each outcome is decided (``tests/faults/history.py``):

* ``Send``: ``ok`` with the offset the broker gave; ``failed`` only when ``send`` itself
  raised (nothing was queued, so nothing can be written); ``unknown`` for any error the
  delivery reported (a timeout or a broker error after retries: the batch may have been
  written) and for records still undelivered when the producer was closed.
* ``Seek``: every time a consumer is granted a partition, its ``on_assign`` looks up the
  committed offset and seeks there explicitly (0 when none), and records it; when the
  look-up fails it seeks to 0 and the commits that follow for that partition, until it
  is granted again, are recorded as ``reset`` (they may legitimately go backwards). With
  ``auto_offset_reset="none"``, a truncated or out-of-range position raises; the
  consumer seeks (to the divergent offset, else the committed one) and records it.
* ``Poll``: one per partition of each non-empty poll. ``Commit``: one per partition of
  each commit call: ``ok`` when the call returned, ``unknown`` when it raised (a commit
  of several partitions may be partly applied).

A producer whose ``send`` raises a fatal error is closed and replaced under a new
generation (a new ``producer_id``), as is a consumer that raises something unexpected.
Every blocking call has a timeout; every thread ends by itself within about
``delivery_timeout_ms`` + 15 s of ``stop()``. Thread-safe: ``start``/``stop`` from the
owning thread; the workers record from their own threads.
"""

from __future__ import annotations

import logging
import random
import sys
import threading
import time
import traceback
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass

from tests.faults.history import Commit, FinalRead, Poll, Recorder, Seek, Send
from tidelog.client import (
    BufferExhaustedError,
    ClosedError,
    Consumer,
    LogTruncationError,
    OffsetOutOfRangeError,
    Producer,
    RecordMetadata,
    TidelogError,
    TopicPartition,
)

__all__ = ["AppendWorkload", "ClientTimeouts", "QueueWorkload", "final_read"]

log = logging.getLogger(__name__)

# Before a replaced producer or consumer starts again: a broker refusing producer ids
# (while it joins the cluster) would otherwise make a new producer every few ms.
_REPLACE_BACKOFF_S = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientTimeouts:
    """Client settings shared by the workloads. Immutable."""

    request_timeout_ms: int = 10_000
    delivery_timeout_ms: int = 30_000
    max_block_ms: int = 5_000
    commit_timeout_ms: int = 5_000
    session_timeout_ms: int = 10_000
    poll_timeout_ms: int = 500


class _Workers:
    """Threads that run until ``stop``; each ends by itself."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.errors: list[str] = []

    def spawn(self, name: str, target: object) -> None:
        def run() -> None:
            try:
                target()  # type: ignore[operator]
            except BaseException as error:  # kept for the report, not lost on the thread
                log.exception("%s died", name)
                self.errors.append(f"{name}: {error!r}")

        thread = threading.Thread(target=run, name=name, daemon=True)
        self.threads.append(thread)
        thread.start()

    def stop(self, timeout_s: float) -> list[str]:
        """Ask every thread to end, wait up to ``timeout_s``; the names still alive."""
        self.stopping.set()
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [t for t in self.threads if t.is_alive()]
        frames = sys._current_frames()
        for thread in stuck:  # where it hangs, for the report (a CI failure is read once)
            frame = frames.get(thread.ident or -1)
            where = "".join(traceback.format_stack(frame)) if frame is not None else "?"
            log.error("%s did not end within %.0f s; its stack:\n%s", thread.name, timeout_s, where)
        if stuck:  # and every other thread's: the one holding what a stuck thread waits on
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in frames.items():
                if ident not in {t.ident for t in stuck}:
                    where = "".join(traceback.format_stack(frame))
                    log.error("thread %s:\n%s", names.get(ident, ident), where)
        return [t.name for t in stuck]


class _Sender:
    """One producer thread's records in flight: each recorded exactly once. Thread-safe."""

    def __init__(self, recorder: Recorder, producer_id: str, topic: str) -> None:
        self.recorder = recorder
        self.producer_id = producer_id
        self.topic = topic
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[int, int]] = {}  # value -> (partition, start_ns)

    def begin(self, value: str, partition: int) -> int:
        start = self.recorder.now_ns()
        with self._lock:
            self._pending[value] = (partition, start)
        return start

    def end(
        self,
        value: str,
        metadata: RecordMetadata | None,
        error: BaseException | None,
        *,
        raised: bool = False,
    ) -> None:
        with self._lock:
            found = self._pending.pop(value, None)
        if found is None:
            return
        partition, start = found
        if error is None and metadata is not None:
            outcome, offset = "ok", metadata.offset
        else:
            outcome, offset = ("failed" if raised else "unknown"), None
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
            )
        )

    def abandon(self) -> None:
        """Record everything never answered as ``unknown`` (the producer is closed)."""
        with self._lock:
            left = list(self._pending)
        for value in left:
            self.end(value, None, ClosedError("never answered"))


def _producer(bootstrap: str, timeouts: ClientTimeouts, client_id: str) -> Producer:
    return Producer(
        bootstrap,
        client_id=client_id,
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        request_timeout_ms=timeouts.request_timeout_ms,
        delivery_timeout_ms=timeouts.delivery_timeout_ms,
        max_block_ms=timeouts.max_block_ms,
    )


def _close_producer(producer: Producer, sender: _Sender, timeouts: ClientTimeouts) -> None:
    try:
        producer.flush(timeout_ms=timeouts.delivery_timeout_ms + 5_000)
    except TidelogError as error:
        log.warning("%s: flush: %s", sender.producer_id, error)
    producer.close(timeout_ms=5_000)
    sender.abandon()


class QueueWorkload:
    """Pipelined producers and a consumer group over ``topic`` (module docstring)."""

    def __init__(
        self,
        recorder: Recorder,
        bootstrap: str,
        topic: str,
        partitions: int,
        *,
        producers: int = 2,
        consumers: int = 2,
        group: str = "queue",
        send_interval_s: float = 0.02,
        seed: int = 0,
        timeouts: ClientTimeouts | None = None,
    ) -> None:
        self.recorder = recorder
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.producers = producers
        self.consumers = consumers
        self.group = group
        self.send_interval_s = send_interval_s
        self.seed = seed
        self.timeouts = timeouts or ClientTimeouts()
        self._workers = _Workers()

    @property
    def errors(self) -> list[str]:
        return self._workers.errors

    def start(self) -> None:
        for i in range(self.producers):
            self._workers.spawn(f"queue-producer-{i}", lambda i=i: self._produce(i))
        for i in range(self.consumers):
            self._workers.spawn(f"queue-consumer-{i}", lambda i=i: self._consume(i))

    def stop(self) -> list[str]:
        """Stop and wait; the names of threads that did not end (none, normally)."""
        return self._workers.stop(self.timeouts.delivery_timeout_ms / 1000 + 20)

    # --- producers ------------------------------------------------------------------------

    def _produce(self, index: int) -> None:
        rng = random.Random(f"{self.seed}-queue-{index}")
        stopping = self._workers.stopping
        generation = 0
        while not stopping.is_set():
            producer_id = f"q{index}.{generation}"
            sender = _Sender(self.recorder, producer_id, self.topic)
            producer = _producer(self.bootstrap, self.timeouts, producer_id)
            try:
                sequence = 0
                while not stopping.is_set():
                    value = f"{producer_id}-{sequence}"
                    sequence += 1
                    partition = rng.randrange(self.partitions)
                    sender.begin(value, partition)

                    def done(
                        metadata: RecordMetadata | None,
                        error: BaseException | None,
                        value: str = value,
                        sender: _Sender = sender,
                    ) -> None:
                        sender.end(value, metadata, error)

                    try:
                        producer.send(
                            self.topic, value.encode(), partition=partition, callback=done
                        )
                    except BufferExhaustedError as error:
                        sender.end(value, None, error, raised=True)
                    except TidelogError as error:  # fatal: a new producer session
                        sender.end(value, None, error, raised=True)
                        log.warning("%s: %s; replacing the producer", producer_id, error)
                        break
                    stopping.wait(self.send_interval_s)
            finally:
                _close_producer(producer, sender, self.timeouts)
            generation += 1
            stopping.wait(_REPLACE_BACKOFF_S)

    # --- consumers ------------------------------------------------------------------------

    def _consume(self, index: int) -> None:
        stopping = self._workers.stopping
        generation = 0
        while not stopping.is_set():
            _GroupMember(self, f"c{index}.{generation}").run(stopping)
            generation += 1
            stopping.wait(_REPLACE_BACKOFF_S)


class _GroupMember:
    """One consumer session of the queue workload's group (one thread)."""

    def __init__(self, workload: QueueWorkload, name: str) -> None:
        self.workload = workload
        self.name = name
        self.recorder = workload.recorder
        self.rewound: set[TopicPartition] = set()
        timeouts = workload.timeouts
        self.consumer = Consumer(
            workload.bootstrap,
            client_id=name,
            group_id=workload.group,
            auto_offset_reset="none",
            enable_auto_commit=False,
            session_timeout_ms=timeouts.session_timeout_ms,
            heartbeat_interval_ms=1_000,
            request_timeout_ms=timeouts.request_timeout_ms,
            max_poll_records=200,
        )

    def _seek(self, tp: TopicPartition, offset: int | None) -> None:
        """Seek ``tp`` to ``offset``, or to the committed offset when None (0 when the
        group has none; 0 and later commits marked ``reset`` when the look-up fails)."""
        start = self.recorder.now_ns()
        if offset is None:
            try:
                offset = (
                    self.consumer.committed(tp, timeout_ms=self.workload.timeouts.commit_timeout_ms)
                    or 0
                )
            except TidelogError as error:
                log.warning("%s: committed(%s): %s; reading from 0", self.name, tp, error)
                offset = 0
                self.rewound.add(tp)
        self.consumer.seek(tp, offset)
        self.recorder.record(
            Seek(
                consumer=self.name,
                topic=tp.topic,
                partition=tp.partition,
                offset=offset,
                start_ns=start,
                end_ns=self.recorder.now_ns(),
            )
        )

    def on_assign(self, tps: Sequence[TopicPartition]) -> None:
        for tp in tps:
            self.rewound.discard(tp)
            self._seek(tp, None)

    def run(self, stopping: threading.Event) -> None:
        consumer = self.consumer
        timeouts = self.workload.timeouts
        try:
            consumer.subscribe([self.workload.topic], on_assign=self.on_assign)
            while not stopping.is_set():
                start = self.recorder.now_ns()
                try:
                    records = consumer.poll(timeout_ms=timeouts.poll_timeout_ms)
                except LogTruncationError as error:
                    log.warning("%s: %s", self.name, error)
                    for tp, offset in error.divergent_offsets.items():
                        self._seek(tp, offset)
                    continue
                except OffsetOutOfRangeError as error:
                    log.warning("%s: %s", self.name, error)
                    for tp in sorted(consumer.assignment(), key=lambda t: t.partition):
                        self._seek(tp, None)
                    continue
                except TidelogError as error:
                    log.warning("%s: poll: %s", self.name, error)
                    stopping.wait(0.2)
                    continue
                end = self.recorder.now_ns()
                by_tp: dict[TopicPartition, list[tuple[int, str]]] = defaultdict(list)
                for record in records:
                    tp = TopicPartition(record.topic, record.partition)
                    by_tp[tp].append((record.offset, (record.value or b"").decode()))
                for tp, read in by_tp.items():
                    self.recorder.record(
                        Poll(
                            consumer=self.name,
                            topic=tp.topic,
                            partition=tp.partition,
                            records=tuple(read),
                            start_ns=start,
                            end_ns=end,
                        )
                    )
                if by_tp:
                    self._commit({tp: read[-1][0] + 1 for tp, read in by_tp.items()})
        finally:
            consumer.close(timeout_ms=5_000, autocommit=False)

    def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        start = self.recorder.now_ns()
        outcome = "ok"
        try:
            self.consumer.commit(offsets, timeout_ms=self.workload.timeouts.commit_timeout_ms)
        except TidelogError as error:
            log.info("%s: commit %s: %s", self.name, offsets, error)
            outcome = "unknown"
        end = self.recorder.now_ns()
        for tp, offset in offsets.items():
            self.recorder.record(
                Commit(
                    group=self.workload.group,
                    consumer=self.name,
                    topic=tp.topic,
                    partition=tp.partition,
                    offset=offset,
                    outcome=outcome,  # type: ignore[arg-type]
                    start_ns=start,
                    end_ns=end,
                    reset=tp in self.rewound,
                )
            )


class AppendWorkload:
    """One appender per partition of ``topic``, one record at a time (module docstring)."""

    def __init__(
        self,
        recorder: Recorder,
        bootstrap: str,
        topic: str,
        partitions: int,
        *,
        send_interval_s: float = 0.02,
        timeouts: ClientTimeouts | None = None,
    ) -> None:
        self.recorder = recorder
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.send_interval_s = send_interval_s
        self.timeouts = timeouts or ClientTimeouts()
        self._workers = _Workers()

    @property
    def errors(self) -> list[str]:
        return self._workers.errors

    def start(self) -> None:
        for partition in range(self.partitions):
            self._workers.spawn(
                f"append-{partition}", lambda partition=partition: self._append(partition)
            )

    def stop(self) -> list[str]:
        return self._workers.stop(self.timeouts.delivery_timeout_ms / 1000 + 20)

    def _append(self, partition: int) -> None:
        stopping = self._workers.stopping
        generation = 0
        wait_s = self.timeouts.delivery_timeout_ms / 1000 + 5
        while not stopping.is_set():
            producer_id = f"a{partition}.{generation}"
            sender = _Sender(self.recorder, producer_id, self.topic)
            producer = _producer(self.bootstrap, self.timeouts, producer_id)
            try:
                sequence = 0
                while not stopping.is_set():
                    value = f"{producer_id}-{sequence}"
                    sequence += 1
                    sender.begin(value, partition)
                    try:
                        future = producer.send(self.topic, value.encode(), partition=partition)
                    except BufferExhaustedError as error:
                        sender.end(value, None, error, raised=True)
                        continue
                    except TidelogError as error:
                        sender.end(value, None, error, raised=True)
                        log.warning("%s: %s; replacing the producer", producer_id, error)
                        break
                    try:
                        sender.end(value, future.result(timeout=wait_s), None)
                    except FutureTimeoutError as error:
                        sender.end(value, None, error)
                    except Exception as error:  # the delivery's error: unknown outcome
                        sender.end(value, None, error)
                    stopping.wait(self.send_interval_s)
            finally:
                _close_producer(producer, sender, self.timeouts)
            generation += 1
            stopping.wait(_REPLACE_BACKOFF_S)


def final_read(
    bootstrap: str, topic: str, partition: int, recorder: Recorder, *, timeout_s: float = 60.0
) -> FinalRead:
    """Read partition ``topic``-``partition`` whole (log start to end offset) and record it.

    Raises ``TimeoutError`` if it cannot be read whole within ``timeout_s`` (retried
    inside that time), with what stopped it.
    """
    tp = TopicPartition(topic, partition)
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        start = recorder.now_ns()
        try:
            with Consumer(
                bootstrap,
                client_id=f"final-{topic}-{partition}",
                auto_offset_reset="none",
                enable_auto_commit=False,
                request_timeout_ms=10_000,
            ) as consumer:
                consumer.assign([tp])
                log_start = consumer.beginning_offsets([tp], timeout_ms=10_000)[tp]
                log_end = consumer.end_offsets([tp], timeout_ms=10_000)[tp]
                consumer.seek(tp, log_start)
                records: list[tuple[int, str]] = []
                position = log_start
                while position < log_end and time.monotonic() < deadline:
                    for record in consumer.poll(timeout_ms=500):
                        if record.offset < log_end:
                            records.append((record.offset, (record.value or b"").decode()))
                    position = consumer.position(tp, timeout_ms=10_000)
                if position >= log_end:
                    read = FinalRead(
                        topic=topic,
                        partition=partition,
                        log_start_offset=log_start,
                        log_end_offset=log_end,
                        records=tuple(records),
                        start_ns=start,
                        end_ns=recorder.now_ns(),
                    )
                    recorder.record(read)
                    return read
                last_error = TimeoutError(f"read {position} of [{log_start}, {log_end})")
        except TidelogError as error:
            last_error = error
            log.warning("final read of %s: %s", tp, error)
            time.sleep(1.0)
    raise TimeoutError(f"final read of {topic}-{partition} incomplete: {last_error!r}")
