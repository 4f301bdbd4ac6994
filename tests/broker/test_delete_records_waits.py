"""DeleteRecords' waits on one leader (``broker.core.delete_records``, ``broker.core.fetch``):
the leader's log start moving wakes a follower's parked fetch, whose answer carries the
new start at once; the answer waits in the purgatory (no thread) until the in-sync
followers report theirs, and is delivered at the follower's report, at the deadline
(``REQUEST_TIMED_OUT``), or when leadership moves (``NOT_LEADER_OR_FOLLOWER``).

Real logs in a temporary directory, a replicated registry wired to the purgatories as the
broker wires them (``open_partitions``), a manual clock; follower fetches are made by hand
as the replica fetcher makes them. ``tests/broker/cluster/test_delete_records_processes.py``
runs it across three brokers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.conftest import make_batch
from tidelog.broker.core.delayed import DelayedOperations
from tidelog.broker.core.delete_records import RecordDeletion, RecordsDeleted, RecordsToDelete
from tidelog.broker.core.fetch import FetchPath, FetchSpec, PartitionFetchSpec
from tidelog.broker.core.gate import OperationGate
from tidelog.broker.core.membership import Membership
from tidelog.broker.core.metrics import BrokerMetrics
from tidelog.broker.core.partition import Partition
from tidelog.broker.core.partitions import PartitionRegistry
from tidelog.broker.core.placement import LocalPlacement
from tidelog.broker.core.producer_ids import ProducerIdManager
from tidelog.storage.clock import ManualClock
from tidelog.storage.log_manager import LogManager, LogManagerConfig

TOPIC = "t"
ME, FOLLOWER = 1, 2


class Broker:
    """One leader's partition, purgatories, fetch path and DeleteRecords."""

    def __init__(self, logs: LogManager, clock: ManualClock) -> None:
        self.clock = clock
        self.delayed = DelayedOperations(clock)
        registry = PartitionRegistry(
            logs, ME, clock, replicated=True, listeners=(self.delayed.check_and_complete_all,)
        )
        self.partition: Partition = registry.get(TOPIC, 0)
        self.fetches = FetchPath(
            registry,
            self.delayed.fetch,
            BrokerMetrics(),
            clock,
            fetch_max_bytes=1 << 20,
            fetch_max_wait_ms=500,
        )
        membership = Membership.single_node(
            LocalPlacement(ME, "cluster", None),
            ProducerIdManager.open(logs.data_dir, clock, 60_000),
        )
        self.deletion = RecordDeletion(
            registry, membership, OperationGate(), self.delayed.delete_records, clock
        )


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    clock = ManualClock()
    with LogManager.open(tmp_path, LogManagerConfig(), clock) as logs:
        logs.create_topic(TOPIC, 1, {"min.insync.replicas": "1"})
        broker = Broker(logs, clock)
        broker.partition.make_leader(1, (ME, FOLLOWER), (ME, FOLLOWER))
        broker.partition.append_as_leader(make_batch([b"a", b"b", b"c", b"d"]), acks_all=False)
        broker.partition.on_follower_fetch(FOLLOWER, 4, log_start_offset=0)  # caught up
        assert broker.partition.log.high_watermark == 4
        yield broker


def _follower_fetch(log_start_offset: int) -> FetchSpec:
    """A caught-up follower's long poll, as the replica fetcher sends it."""
    return FetchSpec(
        [PartitionFetchSpec(TOPIC, 0, 4, log_start_offset=log_start_offset)],
        max_wait_ms=500,
        min_bytes=1,
        replica_id=FOLLOWER,
    )


def test_the_moved_log_start_wakes_the_followers_parked_fetch(broker: Broker) -> None:
    woken: list[bool] = []
    pending = broker.fetches.begin(_follower_fetch(0), lambda: woken.append(True))
    assert broker.fetches.step(pending) is None  # nothing new: parked
    assert broker.delayed.fetch.parked() == 1

    assert broker.partition.delete_records(3) == 3
    assert woken == [True]  # at once, not at the fetch's deadline
    assert broker.delayed.fetch.parked() == 0
    answers = broker.fetches.step(pending)  # read again: answered, without records
    assert answers is not None
    (answer,) = answers
    assert (answer.records, answer.log_start_offset) == (b"", 3)


def test_an_unmoved_log_start_keeps_the_fetch_parked(broker: Broker) -> None:
    woken: list[bool] = []
    pending = broker.fetches.begin(_follower_fetch(0), lambda: woken.append(True))
    assert broker.fetches.step(pending) is None
    assert broker.partition.delete_records(0) == 0  # at the log start already: no move
    broker.partition.maybe_advance_high_watermark()
    assert woken == []
    assert broker.delayed.fetch.parked() == 1


def test_the_answer_waits_without_a_thread_for_the_followers_report(broker: Broker) -> None:
    answered: list[list[RecordsDeleted]] = []
    broker.deletion.start([RecordsToDelete(TOPIC, 0, 3)], 30_000, answered.append)
    assert broker.partition.log.log_start_offset == 3  # moved and checkpointed at once
    assert answered == []  # parked: the follower has not reported 3 yet
    assert broker.delayed.delete_records.parked() == 1
    broker.partition.on_follower_fetch(FOLLOWER, 4, log_start_offset=2)  # not there yet
    assert answered == []
    broker.partition.on_follower_fetch(FOLLOWER, 4, log_start_offset=3)
    assert answered == [[RecordsDeleted(TOPIC, 0, 3)]]
    assert broker.delayed.delete_records.parked() == 0


def test_a_follower_that_does_not_follow_is_answered_at_the_deadline(broker: Broker) -> None:
    answered: list[list[RecordsDeleted]] = []
    broker.deletion.start(
        [RecordsToDelete(TOPIC, 0, 2), RecordsToDelete(TOPIC, 7, 1)], 1_000, answered.append
    )
    assert answered == []
    broker.clock.advance(999)
    assert broker.delayed.delete_records.expire_due() == 0
    broker.clock.advance(1)
    assert broker.delayed.delete_records.expire_due() == 1
    ((timed_out, unknown),) = answered
    assert (timed_out.error_code, timed_out.low_watermark) == ("REQUEST_TIMED_OUT", -1)
    assert unknown.error_code == "UNKNOWN_TOPIC_OR_PARTITION"
    assert broker.partition.log.log_start_offset == 2  # the leader's moved all the same
    # timeout 0: answered at once, as Kafka's purgatory expiring it at once.
    broker.deletion.start([RecordsToDelete(TOPIC, 0, 3)], 0, answered.append)
    assert answered[-1][0].error_code == "REQUEST_TIMED_OUT"


def test_losing_leadership_answers_at_once(broker: Broker) -> None:
    answered: list[list[RecordsDeleted]] = []
    broker.deletion.start([RecordsToDelete(TOPIC, 0, 3)], 30_000, answered.append)
    broker.partition.make_follower(FOLLOWER, 2)
    ((answer,),) = answered
    assert answer.error_code == "NOT_LEADER_OR_FOLLOWER"


def test_the_blocking_form_returns_the_same_answer(broker: Broker) -> None:
    broker.partition.on_follower_fetch(FOLLOWER, 4, log_start_offset=4)
    assert broker.deletion.wait([RecordsToDelete(TOPIC, 0, -1)], 30_000) == [
        RecordsDeleted(TOPIC, 0, 4)  # -1: the high watermark, which the follower has
    ]
