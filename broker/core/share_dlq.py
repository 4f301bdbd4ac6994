"""The dead-letter transactions of share groups (``broker.share.dead_letter``), run on this
broker's own transaction coordinator and produce path, as a transactional producer would
run them over the wire (``CoreDeadLetters``, the ``DeadLetterSink`` the share-partition
manager is built with).

Per transaction: InitProducerId for the share partition's transactional id (a new epoch
every time: it fences and aborts anything an earlier attempt or leader left open, and
sequences start at 0), AddPartitionsToTxn of the dead-letter partition and the share
partition's ``__share_group_state`` partition, the copies appended as transactional
batches (about 256 KiB each) in one append through the produce path (the coordinator's
verification included, ``acks=all``), the archiving written by the caller's ``archive``
(a transactional state write), then EndTxn(commit). A failure before EndTxn answered
aborts (best effort: an abort that fails is left to the transaction timeout or the next
InitProducerId of the id) and raises.
InitProducerId and AddPartitionsToTxn answered ``CONCURRENT_TRANSACTIONS`` (the previous
transaction's markers still being written) are retried for up to
``_CONCURRENT_RETRY_MS``.

The dead-letter topic is created when missing (``Topics.create_topic``: one partition,
the broker's default replication factor), as Kafka Connect's dead-letter queue is.

Decided: **single node only for now.** In a cluster the transactional id's coordinator,
the dead-letter partition's leader and the share coordinator may each be another broker,
and the inter-broker calls for that (a transactional WriteShareGroupState, produce to
another leader) are not built: there the first step that is not local fails
(``NOT_COORDINATOR``, ``NOT_LEADER_OR_FOLLOWER``, ``COORDINATOR_NOT_AVAILABLE``), the
transaction aborts, and the records stay to be dead-lettered (retried, logged): nothing
is copied without its archiving.

Test hook (tests only; nothing happens unless set): ``TIDELOG_DLQ_TEST_STOP_AT=after_copy``
kills the broker process with SIGKILL once a transaction's copies and archiving are
written and before EndTxn, after writing ``DLQ test hook: killed at after_copy`` to
stderr; read where it is reached, as ``client.cdc.testhooks`` reads its own.

Thread-safe: holds nothing but its collaborators (one transaction per share partition
at a time is the caller's, under the share partition's lock).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from tidelog.broker.core.produce import Acks, PartitionRecords, ProducePath
from tidelog.broker.core.topics import Topics
from tidelog.broker.share.dead_letter import DeadLetterBatch, copy_batches
from tidelog.broker.share.state_log import SHARE_STATE_TOPIC
from tidelog.broker.transactions.coordinator import TransactionCoordinator
from tidelog.storage.errors import (
    ConcurrentTransactionsError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
    error_for_code,
)
from tidelog.storage.log_manager import LogManager

__all__ = ["STOP_ENV", "CoreDeadLetters"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

STOP_ENV = "TIDELOG_DLQ_TEST_STOP_AT"
_TRANSACTION_TIMEOUT_MS = 30_000
_CONCURRENT_RETRY_MS = 5_000
_CONCURRENT_PAUSE_S = 0.01


class CoreDeadLetters:
    """``DeadLetterSink`` over this broker's transaction coordinator and produce path."""

    def __init__(
        self,
        coordinator: TransactionCoordinator,
        produce: ProducePath,
        topics: Topics,
        logs: LogManager,
    ) -> None:
        self._coordinator = coordinator
        self._produce = produce
        self._topics = topics
        self._logs = logs

    def write(self, batch: DeadLetterBatch, archive: Callable[[tuple[int, int]], None]) -> None:
        tid = batch.transactional_id
        topic = batch.dead_letter_topic
        target = (topic, batch.partition % self._partitions(topic))
        producer_id, epoch = _retrying(
            lambda: self._coordinator.init_producer_id(tid, _TRANSACTION_TIMEOUT_MS)
        )
        try:
            _retrying(
                lambda: self._coordinator.add_partitions(
                    tid, producer_id, epoch, [target, (SHARE_STATE_TOPIC, batch.state_partition)]
                )
            )
            data = copy_batches(batch, producer_id, epoch, 0)
            if data:
                self._append(tid, target, data)
            archive((producer_id, epoch))
            _stop_point("after_copy")
            self._coordinator.end_transaction(tid, producer_id, epoch, True)
        except BaseException:
            try:
                self._coordinator.end_transaction(tid, producer_id, epoch, False)
            except Exception as exc:  # left to the timeout or the next InitProducerId
                log.info("dead-letter transaction %s: abort failed: %s", tid, exc)
            raise

    def fence(self, transactional_id: str) -> None:
        try:
            self._coordinator.init_producer_id(transactional_id, _TRANSACTION_TIMEOUT_MS)
        except Exception as exc:
            log.info("dead-letter transaction %s: fencing answered %s", transactional_id, exc)

    def _partitions(self, topic: str) -> int:
        try:
            return self._logs.topic(topic).partitions
        except UnknownTopicOrPartitionError:
            pass
        try:
            # As Kafka Connect's dead-letter queue: created when missing, one partition.
            self._topics.create_topic(topic, 1, {})
            log.info("created dead-letter topic %s", topic)
        except TopicAlreadyExistsError:
            pass
        return self._logs.topic(topic).partitions

    def _append(self, tid: str, target: tuple[str, int], data: bytes) -> None:
        part = PartitionRecords(target[0], target[1], data, acks_all=True, transactional_id=tid)
        appends = self._produce.append([part])
        [answer] = self._produce.complete_blocking(appends, Acks.ALL)
        if answer.error_code:
            raise error_for_code(answer.error_code, answer.error_message)


def _retrying(call: Callable[[], _T]) -> _T:
    """``call``, again while it answers ``CONCURRENT_TRANSACTIONS`` (the id's previous
    transaction is completing), for up to ``_CONCURRENT_RETRY_MS``."""
    deadline = time.monotonic() + _CONCURRENT_RETRY_MS / 1000
    while True:
        try:
            return call()
        except ConcurrentTransactionsError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(_CONCURRENT_PAUSE_S)


def _stop_point(point: str) -> None:
    if os.environ.get(STOP_ENV) != point:
        return
    sys.stderr.write(f"DLQ test hook: killed at {point}\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)
