"""An idempotent producer's batches against the broker's sequence check, step by step.

A hypothesis state machine plays the producer's sender loop with its pure parts (the
``RecordAccumulator`` and the ``SequenceTable``, exactly as ``client.sender`` drives them)
against real ``PartitionLog``s, over a simulated stream: requests in flight are delivered
in order, each batch stored, refused before the append (a retriable error), stored
with its answer lost, or stored and answered ``KAFKA_STORAGE_ERROR`` (a leader whose log
was deleted by a reassignment before its fsync); the stream may break, failing everything
in flight. Whatever the interleaving:

* the log never stores a producer's batch whose first sequence does not directly follow
  the last one it stored for that producer (the broker refuses it);
* each partition holds the records it stored in the order they were sent, each once.

* once the network heals, every record sent is stored: with only retriable errors and
  unbounded retries nothing fails.

Before issue 11's fix the last one failed: the first batch of a partition was refused
retriably while the next one, pipelined behind it, was stored under a producer id the log
had never seen (accepted at any sequence), so the first could never follow it and was
retried until its delivery timeout.

Before the storage-error outcome was added, that answer counted as "refused for good": the
partition started over under a new producer id and resent the batches behind it, which a
reassignment in CI caught storing a record twice.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import deque
from pathlib import Path
from typing import Literal

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tidelog.client.accumulator import ProducerBatch, RecordAccumulator
from tidelog.client.idempotence import Decision, SequenceTable
from tidelog.client.types import TopicPartition
from tidelog.storage.clock import ManualClock
from tidelog.storage.config import LogConfig
from tidelog.storage.errors import (
    BrokerUnavailableError,
    LogDirFullError,
    StorageError,
    TidelogError,
)
from tidelog.storage.partition_log import PartitionLog
from tidelog.storage.records import NO_PRODUCER_ID, decode_records, iter_batch_headers

TPS = [TopicPartition("t", 0), TopicPartition("t", 1)]
MAX_IN_FLIGHT = 5
RETRIES = 1_000  # the sender's default is effectively unbounded within delivery time

Outcome = Literal["stored", "refused", "answer_lost", "stored_storage_error"]
OUTCOMES: list[Outcome] = ["stored", "refused", "answer_lost", "stored_storage_error"]


class SenderAgainstLog(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="tidelog-seq-"))
        self.clock = ManualClock()
        self.logs = {
            tp: PartitionLog.open(
                self.directory / f"{tp.topic}-{tp.partition}",
                tp.topic,
                tp.partition,
                LogConfig(),
                self.clock,
            )
            for tp in TPS
        }
        self.accumulator: RecordAccumulator[int] = RecordAccumulator(
            batch_size=40, buffer_memory=1 << 20, linger_ms=0, max_in_flight=MAX_IN_FLIGHT
        )
        self.sequences = SequenceTable()
        self.sequences.set_producer_id(7, 0)
        self.next_producer_id = 8
        self.stream: deque[list[tuple[ProducerBatch[int], bytes]]] = (
            deque()
        )  # requests in flight, in order
        self.sent: dict[TopicPartition, list[int]] = {tp: [] for tp in TPS}
        self.failed: set[int] = set()
        self.now = 0
        self.counter = 0

    def teardown(self) -> None:
        for log in self.logs.values():
            log.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    # --- the application ---------------------------------------------------------------

    @rule(tp=st.sampled_from(TPS), count=st.integers(1, 4))
    def send(self, tp: TopicPartition, count: int) -> None:
        for _ in range(count):
            self.counter += 1
            value = b"%d" % self.counter
            self.accumulator.append(tp, self.now, None, value, (), 20, self.counter, self.now)
            self.sent[tp].append(self.counter)

    # --- the sender loop ---------------------------------------------------------------

    @rule()
    def drain_one_request(self) -> None:
        if self.sequences.needs_producer_id:
            self.sequences.set_producer_id(self.next_producer_id, 0)
            self.next_producer_id += 1
        self._finish_resets()
        if len(self.stream) >= MAX_IN_FLIGHT:
            return
        self.now += 1
        check = self.accumulator.ready(self.now, self.sequences.can_send)
        batches = self.accumulator.drain(check.partitions, 1 << 20, self.sequences.assign)
        if batches:
            self.stream.append([(b, self.accumulator.encode(b)) for b in batches])

    @precondition(lambda self: bool(self.stream))
    @rule(outcomes=st.lists(st.sampled_from(OUTCOMES), min_size=2))
    def deliver_oldest_request(self, outcomes: list[Outcome]) -> None:
        request = self.stream.popleft()
        for index, (batch, data) in enumerate(request):
            outcome = outcomes[index % len(outcomes)]
            if outcome == "refused":
                self._failed(batch, LogDirFullError("refused before the append"))
                continue
            try:
                result = self.logs[batch.tp].append(data)
            except TidelogError as exc:
                self._failed(batch, exc)
                continue
            if outcome == "answer_lost":
                self._failed(batch, BrokerUnavailableError("answer lost"))
                continue
            if outcome == "stored_storage_error":
                self._failed(batch, StorageError("the broker stopped before the fsync"))
                continue
            del result
            self.sequences.acked(batch.tp, batch.producer_id, batch.last_sequence)
            self.accumulator.complete(batch)

    @rule()
    def the_network_heals(self) -> None:
        """From now on every batch is stored and answered: everything sent gets stored.

        Every error above is retriable and retries are unbounded, so nothing may fail or
        stay pending; a batch refused forever (its sequence can no longer follow what the
        log stored) is a failure too.
        """
        for _ in range(200):
            self.drain_one_request()
            if self.stream:
                self.deliver_oldest_request(["stored"])
            elif not self.accumulator.has_incomplete():
                break
        assert not self.failed
        assert not self.accumulator.has_incomplete(), "batches the log refuses forever"
        for tp, log in self.logs.items():
            stored = [int(r.value or b"") for r in decode_records(log.read(0, 1 << 24).records)]
            assert stored == self.sent[tp], tp

    @rule()
    def break_the_stream(self) -> None:
        requests, self.stream = self.stream, deque()
        for request in requests:
            for batch, _ in request:
                self._failed(batch, BrokerUnavailableError("stream broke"))

    def _failed(self, batch: ProducerBatch[int], error: TidelogError) -> None:
        # As client.sender's _decide_locked, with unbounded retries and delivery time.
        decision = self.sequences.decide_error(
            batch.tp,
            batch.producer_id,
            batch.base_sequence,
            error,
            can_retry=True,
        )
        if decision is Decision.RETRY:
            self.accumulator.reenqueue(batch, self.now)
        elif decision is Decision.REQUEUE_FRESH:
            batch.clear_sequence()
            self.accumulator.reenqueue(batch, self.now)
        else:
            self.accumulator.complete(batch)
            self.failed.update(batch.handles)

    def _finish_resets(self) -> None:
        for tp in self.sequences.resetting():
            if self.accumulator.in_flight(tp):
                continue
            for batch in self.accumulator.queued(tp):
                batch.clear_sequence()
            self.sequences.finish_reset(tp)

    # --- what must hold ------------------------------------------------------------------

    @invariant()
    def stored_sequences_follow_each_other(self) -> None:
        for log in self.logs.values():
            data = log.read(0, 1 << 24).records
            last: dict[tuple[int, int], int] = {}
            for _, header in iter_batch_headers(data):
                if header.producer_id == NO_PRODUCER_ID:
                    continue
                key = (header.producer_id, header.producer_epoch)
                if key in last:
                    assert header.base_sequence == last[key] + 1, (key, header)
                last[key] = header.last_sequence

    @invariant()
    def each_partition_keeps_send_order_and_stores_once(self) -> None:
        for tp, log in self.logs.items():
            stored = [int(r.value or b"") for r in decode_records(log.read(0, 1 << 24).records)]
            assert stored == sorted(set(stored)), (tp, stored)
            assert set(stored) <= set(self.sent[tp])


def test_the_sender_never_stores_a_batch_out_of_sequence() -> None:
    SenderAgainstLog.TestCase.settings = settings(
        max_examples=200, stateful_step_count=30, deadline=None
    )
    SenderAgainstLog.TestCase().runTest()


def test_a_refused_first_batch_is_stored_before_the_batches_behind_it() -> None:
    """The case the machine found, fixed: the first batch refused, the second behind it."""
    machine = SenderAgainstLog()
    try:
        machine.send(TPS[0], 4)  # two batches
        machine.drain_one_request()
        machine.drain_one_request()  # the second waits for the first batch's answer
        assert len(machine.stream) == 1
        machine.deliver_oldest_request(["refused", "refused"])
        machine.the_network_heals()
    finally:
        machine.teardown()
