"""The share-group workload of the fault harness (issue #32), recorded into a
``history.Recorder`` for ``tests.faults.share_checker``.

* ``members`` ``ShareConsumer``\\ s of one share group (Tidelog's client, gRPC), each a
  thread, explicit acknowledgement. Every poll's records are recorded (``ShareFetch``,
  with each record's delivery count), then each record is ACCEPTed, RELEASEd or REJECTed
  at random (``release_probability``, ``reject_probability``) and ``commit_sync`` sends
  them; each (partition, kind) is recorded as a ``ShareAck``: ``ok`` when its partition's
  outcome is success, ``failed`` for ``InvalidRecordStateError`` (the broker refused it
  whole, nothing applied: the member's lock had ended), ``unknown`` for anything else (a
  broker down or a timeout: it may have applied).
* Now and then a member **stalls** past its lock (``stall_probability``: it sleeps the
  lock duration and half a second more before acknowledging; its acknowledgements must
  then be refused and the records go to others by lock expiry), or **leaves**
  (``leave_probability``: it closes with the poll's records unacknowledged, recorded as
  ``ShareLeave``, and a new member takes its place under a new name ``s<i>.<generation>``).
* The records come from ``QueueWorkload``'s idempotent producers with no consumer
  (``Send``\\ s); start them once ``ready`` (every member has fetched once: a share group
  starts at the log end, so records produced before would never be delivered).
* ``drain``: after ``stop``, one more member polls and accepts until nothing came for
  two lock durations (every lock held by a member that died has expired by then).

Every value is unique (the producers'); a member is one thread. ``start``/``stop``/
``drain`` from the owning thread.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import defaultdict

from tests.faults.history import Recorder, ShareAck, ShareFetch, ShareKind, ShareLeave
from tests.faults.workloads import _Workers
from tidelog.client import ConsumerRecord, ShareConsumer, TidelogError
from tidelog.storage.errors import InvalidRecordStateError

__all__ = ["ShareWorkload"]

log = logging.getLogger(__name__)


class ShareWorkload:
    """Share consumers over ``topic`` (module docstring)."""

    def __init__(
        self,
        recorder: Recorder,
        address: str,
        topic: str,
        *,
        group: str = "share-workload",
        members: int = 3,
        lock_ms: int = 2_000,
        release_probability: float = 0.1,
        reject_probability: float = 0.03,
        stall_probability: float = 0.01,
        leave_probability: float = 0.01,
        max_poll_records: int = 20,
        request_timeout_ms: int = 5_000,
        fetch_ahead: bool = True,
        seed: int = 0,
    ) -> None:
        self.recorder = recorder
        self.address = address
        self.topic = topic
        self.group = group
        self.members = members
        self.lock_ms = lock_ms
        self.release_probability = release_probability
        self.reject_probability = reject_probability
        self.stall_probability = stall_probability
        self.leave_probability = leave_probability
        self.max_poll_records = max_poll_records
        self.request_timeout_ms = request_timeout_ms
        self.fetch_ahead = fetch_ahead
        self.seed = seed
        self._workers = _Workers()
        self._ready: set[int] = set()
        self._ready_lock = threading.Lock()
        # Per member name, when its last commit_sync began: that request may acquire the
        # next poll's records ahead (``ShareConsumer``'s prefetch), so a poll's records
        # were acquired no earlier than this (a delivery starts there, not at the poll).
        self._committed_at: dict[str, int] = {}

    @property
    def errors(self) -> list[str]:
        return self._workers.errors

    def ready(self) -> bool:
        """Every member has fetched once with an assignment."""
        with self._ready_lock:
            return len(self._ready) == self.members

    def start(self) -> None:
        for i in range(self.members):
            self._workers.spawn(f"share-member-{i}", lambda i=i: self._member(i))

    def stop(self) -> list[str]:
        """Stop and wait (each member closes); the names of threads that did not end."""
        return self._workers.stop(2 * self.request_timeout_ms / 1000 + self.lock_ms / 1000 + 10)

    def _consumer(self) -> ShareConsumer:
        consumer = ShareConsumer(
            self.address,
            self.group,
            acknowledgement_mode="explicit",
            max_poll_records=self.max_poll_records,
            request_timeout_ms=self.request_timeout_ms,
            fetch_max_wait_ms=200,
            fetch_ahead=self.fetch_ahead,
        )
        consumer.subscribe([self.topic])
        return consumer

    def _member(self, index: int) -> None:
        rng = random.Random(f"{self.seed}-share-{index}")
        stopping = self._workers.stopping
        generation = 0
        while not stopping.is_set():
            name = f"s{index}.{generation}"
            consumer = self._consumer()
            left = False
            try:
                while not stopping.is_set():
                    records = self.poll(consumer, name, 200)
                    if consumer.assignment():
                        with self._ready_lock:
                            self._ready.add(index)
                    if not records:
                        continue
                    if rng.random() < self.leave_probability:
                        left = True
                        break
                    if rng.random() < self.stall_probability:
                        stopping.wait(self.lock_ms / 1000 + 0.5)
                    kinds = {(r.partition, r.offset): self._kind(rng.random()) for r in records}
                    self.acknowledge(consumer, name, records, kinds)
            finally:
                started = self.recorder.now_ns()
                consumer.close(timeout_ms=self.request_timeout_ms)
                if left or stopping.is_set():
                    self.recorder.record(
                        ShareLeave(member=name, start_ns=started, end_ns=self.recorder.now_ns())
                    )
            generation += 1

    def _kind(self, draw: float) -> ShareKind:
        if draw < self.reject_probability:
            return "reject"
        if draw < self.reject_probability + self.release_probability:
            return "release"
        return "accept"

    def poll(self, consumer: ShareConsumer, name: str, timeout_ms: int) -> list[ConsumerRecord]:
        """One poll, its records recorded per partition."""
        started = self.recorder.now_ns()
        started = min(started, self._committed_at.pop(name, started))
        records = consumer.poll(timeout_ms=timeout_ms)
        ended = self.recorder.now_ns()
        by_partition: dict[int, list[ConsumerRecord]] = defaultdict(list)
        for record in records:
            by_partition[record.partition].append(record)
        for partition, got in sorted(by_partition.items()):
            self.recorder.record(
                ShareFetch(
                    member=name,
                    topic=self.topic,
                    partition=partition,
                    records=tuple((r.offset, (r.value or b"").decode()) for r in got),
                    delivery_counts=tuple(consumer.delivery_count(r) for r in got),
                    start_ns=started,
                    end_ns=ended,
                )
            )
        return records

    def acknowledge(
        self,
        consumer: ShareConsumer,
        name: str,
        records: list[ConsumerRecord],
        kinds: dict[tuple[int, int], ShareKind],
    ) -> None:
        """Acknowledge ``records`` as ``kinds`` says, commit, record the outcomes."""
        for record in records:
            consumer.acknowledge(record, kinds[(record.partition, record.offset)])
        started = self.recorder.now_ns()
        self._committed_at[name] = started
        try:
            outcomes = {tp.partition: error for tp, error in consumer.commit_sync().items()}
        except TidelogError as error:
            log.info("%s: commit: %s", name, error)
            outcomes = {}
        ended = self.recorder.now_ns()
        grouped: dict[tuple[int, ShareKind], list[int]] = defaultdict(list)
        for (partition, offset), kind in sorted(kinds.items()):
            grouped[(partition, kind)].append(offset)
        for (partition, kind), offsets in grouped.items():
            error = outcomes.get(partition, TimeoutError())
            outcome = (
                "ok"
                if partition in outcomes and error is None
                else "failed"
                if isinstance(error, InvalidRecordStateError)
                else "unknown"
            )
            self.recorder.record(
                ShareAck(
                    member=name,
                    topic=self.topic,
                    partition=partition,
                    offsets=tuple(offsets),
                    kind=kind,
                    outcome=outcome,
                    start_ns=started,
                    end_ns=ended,
                )
            )

    def drain(self, timeout_s: float = 30.0) -> int:
        """After ``stop``: accept everything still deliverable, until nothing came for two
        lock durations. Returns the records it accepted. Raises ``TimeoutError`` when
        records keep coming past ``timeout_s``."""
        name = "drain"
        consumer = self._consumer()
        accepted = 0
        deadline = time.monotonic() + timeout_s
        quiet_since = time.monotonic()
        try:
            while time.monotonic() - quiet_since < 2 * self.lock_ms / 1000:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the drain still receives records after {timeout_s} s")
                records = self.poll(consumer, name, 200)
                if records:
                    quiet_since = time.monotonic()
                    kinds: dict[tuple[int, int], ShareKind] = {
                        (r.partition, r.offset): "accept" for r in records
                    }
                    self.acknowledge(consumer, name, records, kinds)
                    accepted += len(records)
        finally:
            consumer.close(timeout_ms=self.request_timeout_ms)
        return accepted
