"""The transaction coordinator over a real log manager and ``__transaction_state``.

The markers go through the coordinator's ``MarkerWriter`` seam; here a writer that keeps
what it was asked (and can refuse), so that these tests pin the coordinator's side: what
is written to ``__transaction_state`` and when, what survives a restart, what a producer
is answered. The partition side of markers has its own tests (storage)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path

import pytest

from tidelog.broker.core.partitions import PartitionRegistry
from tidelog.broker.core.producer_ids import ProducerIdManager
from tidelog.broker.transactions.coordinator import TransactionCoordinator, TxnCoordinatorConfig
from tidelog.broker.transactions.log_records import decode_key
from tidelog.broker.transactions.state import TxnMetadata, TxnState
from tidelog.broker.transactions.txn_log import TRANSACTION_STATE_TOPIC, TxnLog, TxnLogConfig
from tidelog.storage.clock import ManualClock
from tidelog.storage.errors import (
    ConcurrentTransactionsError,
    InvalidTransactionTimeoutError,
    ProducerFencedError,
    TransactionalIdNotFoundError,
)
from tidelog.storage.log_manager import LogManager, LogManagerConfig
from tidelog.storage.records import decode_batch, iter_batch_headers

A = ("out", 0)
B = ("out", 1)
Marker = tuple[int, int, bool, int, frozenset[tuple[str, int]]]


class Markers:
    """Keeps every marker request; ``refuse`` makes partitions answer an error."""

    def __init__(self) -> None:
        self.written: list[Marker] = []
        self.refuse: dict[tuple[str, int], str] = {}
        self._lock = threading.Lock()

    def write_markers(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        partitions: Collection[tuple[str, int]],
    ) -> Mapping[tuple[str, int], str]:
        with self._lock:
            done = frozenset(tp for tp in partitions if tp not in self.refuse)
            if done:
                self.written.append((producer_id, producer_epoch, commit, coordinator_epoch, done))
            return {tp: self.refuse.get(tp, "") for tp in partitions}


class Broker:
    """The pieces a broker builds for its coordinator, reopened on demand."""

    def __init__(self, path: Path, clock: ManualClock, markers: Markers) -> None:
        self.path = path
        self.clock = clock
        self.markers = markers
        self._open()

    def _open(self) -> None:
        path, clock, markers = self.path, self.clock, self.markers
        self.logs = LogManager.open(path, LogManagerConfig(cleaner_enabled=False), clock)
        self.txn_log = TxnLog.open(self.logs, TxnLogConfig(num_partitions=3))
        ids = ProducerIdManager.open(path, clock, 86_400_000)
        self.coordinator = TransactionCoordinator(
            self.txn_log,
            lambda: ids.init(-1, -1)[0],
            markers,
            PartitionRegistry(self.logs, 0, clock, replicated=False),
            clock,
            TxnCoordinatorConfig(abort_interval_ms=3_600_000, marker_retry_backoff_ms=10),
            group_partition=lambda group: ("__consumer_offsets", len(group) % 5),
        )
        self.coordinator.start()

    def close(self) -> None:
        self.coordinator.stop()
        self.logs.close()

    def restart(self) -> None:
        """Stop and open again on the same data directory (a coordinator restart)."""
        self.close()
        self._open()

    def state(self, tid: str) -> TxnMetadata | None:
        return self.txn_log.get(tid)

    def wait_state(self, tid: str, wanted: TxnState) -> TxnMetadata:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            found = self.state(tid)
            if found is not None and found.state is wanted:
                return found
            time.sleep(0.01)
        raise AssertionError(f"{tid} never reached {wanted.kafka_name}: {self.state(tid)}")

    def stored_states(self, tid: str) -> list[str]:
        """The states written for ``tid`` to ``__transaction_state``, in log order
        (None for a tombstone)."""
        partition_log = self.logs.get_log(TRANSACTION_STATE_TOPIC, self.txn_log.partition_for(tid))
        data = partition_log.read(0, 1 << 20).records
        out = []
        for position, _ in iter_batch_headers(data):
            for record in decode_batch(data, position)[1]:
                assert record.key is not None
                if decode_key(record.key) == tid:
                    out.append("Dead" if record.value is None else str(record.value[16]))
        return out


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    opened = Broker(tmp_path, ManualClock(), Markers())
    yield opened
    opened.close()


def retrying(call: Callable[[], tuple[int, int]]) -> tuple[int, int]:
    """What a client does with CONCURRENT_TRANSACTIONS: retry until answered."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return call()
        except ConcurrentTransactionsError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def test_each_init_fences_the_last_and_survives_a_restart(broker: Broker) -> None:
    pid, epoch = broker.coordinator.init_producer_id("app", 60_000)
    assert epoch == 0
    assert broker.coordinator.init_producer_id("app", 60_000) == (pid, 1)
    other, _ = broker.coordinator.init_producer_id("other", 60_000)
    assert other != pid
    broker.restart()
    assert broker.coordinator.init_producer_id("app", 60_000) == (pid, 2)


def test_a_commit_is_decided_then_marked_then_complete(broker: Broker) -> None:
    coordinator = broker.coordinator
    pid, epoch = coordinator.init_producer_id("app", 60_000)
    coordinator.add_partitions("app", pid, epoch, [A])
    coordinator.add_partitions("app", pid, epoch, [B])
    coordinator.add_offsets("app", pid, epoch, "readers")
    assert broker.state("app").state is TxnState.ONGOING  # type: ignore[union-attr]
    assert coordinator.end_transaction("app", pid, epoch, commit=True) == (pid, epoch)
    done = broker.wait_state("app", TxnState.COMPLETE_COMMIT)
    assert done.partitions == frozenset()
    groups = ("__consumer_offsets", len("readers") % 5)
    assert broker.markers.written == [(pid, epoch, True, 0, frozenset({A, B, groups}))]
    # Empty, Ongoing (twice more as partitions joined), PrepareCommit, CompleteCommit.
    assert broker.stored_states("app") == ["0", "1", "1", "1", "2", "4"]
    # A retried EndTxn of the finished transaction is answered as done.
    assert coordinator.end_transaction("app", pid, epoch, commit=True) == (pid, epoch)


def test_transactions_v2_continue_under_the_bumped_epoch(broker: Broker) -> None:
    coordinator = broker.coordinator
    pid, epoch = coordinator.init_producer_id("app", 60_000)
    coordinator.add_partitions("app", pid, epoch, [A])
    assert coordinator.end_transaction("app", pid, epoch, True, client_version=2) == (pid, 1)
    broker.wait_state("app", TxnState.COMPLETE_COMMIT)
    assert broker.markers.written[-1][:3] == (pid, 1, True)  # the markers carry epoch + 1
    with pytest.raises(ProducerFencedError):  # a late write of the finished transaction
        coordinator.add_partitions("app", pid, epoch, [B])
    coordinator.add_partitions("app", pid, 1, [B])


def test_a_new_instance_aborts_the_zombies_transaction_and_fences_it(broker: Broker) -> None:
    coordinator = broker.coordinator
    pid, zombie_epoch = coordinator.init_producer_id("app", 60_000)
    coordinator.add_partitions("app", pid, zombie_epoch, [A, B])
    with pytest.raises(ConcurrentTransactionsError):
        coordinator.init_producer_id("app", 60_000)
    # The abort went out under the bumped epoch, which fences the zombie's markers too.
    broker.wait_state("app", TxnState.COMPLETE_ABORT)
    assert broker.markers.written == [(pid, 1, False, 0, frozenset({A, B}))]
    assert retrying(lambda: coordinator.init_producer_id("app", 60_000)) == (pid, 2)
    for late in (
        lambda: coordinator.add_partitions("app", pid, zombie_epoch, [A]),
        lambda: coordinator.end_transaction("app", pid, zombie_epoch, True),
    ):
        with pytest.raises(ProducerFencedError):
            late()


def test_a_transaction_past_its_timeout_is_aborted(broker: Broker) -> None:
    coordinator = broker.coordinator
    pid, epoch = coordinator.init_producer_id("app", 1_000)
    coordinator.add_partitions("app", pid, epoch, [A])
    broker.clock.advance(1_000)
    assert coordinator.abort_timed_out() == 0
    broker.clock.advance(1)
    assert coordinator.abort_timed_out() == 1
    broker.wait_state("app", TxnState.COMPLETE_ABORT)
    assert broker.markers.written == [(pid, epoch + 1, False, 0, frozenset({A}))]
    with pytest.raises(ProducerFencedError):
        coordinator.end_transaction("app", pid, epoch, True)


def test_a_prepared_commit_is_finished_after_a_restart(broker: Broker) -> None:
    coordinator = broker.coordinator
    pid, epoch = coordinator.init_producer_id("app", 60_000)
    coordinator.add_partitions("app", pid, epoch, [A, B])
    broker.markers.refuse[B] = "NOT_LEADER_OR_FOLLOWER"  # B's leader is away
    coordinator.end_transaction("app", pid, epoch, True)
    time.sleep(0.1)  # the marker thread retries B meanwhile
    assert broker.state("app").state is TxnState.PREPARE_COMMIT  # type: ignore[union-attr]
    with pytest.raises(ConcurrentTransactionsError):  # the next init waits for it
        coordinator.init_producer_id("app", 60_000)
    broker.restart()  # the coordinator died between Prepare and Complete
    assert broker.state("app").state is TxnState.PREPARE_COMMIT  # type: ignore[union-attr]
    broker.markers.refuse.clear()
    broker.wait_state("app", TxnState.COMPLETE_COMMIT)
    assert (pid, epoch, True, 0, frozenset({B})) in broker.markers.written


def test_describe_list_and_refusals(broker: Broker) -> None:
    coordinator = broker.coordinator
    with pytest.raises(InvalidTransactionTimeoutError):
        coordinator.init_producer_id("app", 900_001)
    pid, epoch = coordinator.init_producer_id("app", 60_000)
    coordinator.init_producer_id("idle", 60_000)
    coordinator.add_partitions("app", pid, epoch, [A])
    described = coordinator.describe(["app", "nobody"])
    assert isinstance(described["nobody"], TransactionalIdNotFoundError)
    found = described["app"]
    assert isinstance(found, TxnMetadata)
    assert (found.state.kafka_name, found.partitions) == ("Ongoing", frozenset({A}))
    assert [m.transactional_id for m in coordinator.list_transactions()] == ["app", "idle"]
    assert [m.transactional_id for m in coordinator.list_transactions(["Ongoing"])] == ["app"]
    assert coordinator.list_transactions(producer_ids=[pid + 1000]) == []
    broker.clock.advance(5_000)
    assert len(coordinator.list_transactions(min_duration_ms=5_000)) == 1
    assert coordinator.list_transactions(min_duration_ms=5_001) == []


def test_an_idle_id_expires_and_is_gone_after_a_restart(broker: Broker) -> None:
    coordinator = broker.coordinator
    pid, _ = coordinator.init_producer_id("app", 60_000)
    broker.clock.advance(7 * 24 * 3600 * 1000)
    assert coordinator.expire_ids() == 1
    assert broker.state("app") is None
    assert broker.stored_states("app")[-1] == "Dead"
    broker.restart()
    assert broker.state("app") is None
    assert broker.coordinator.init_producer_id("app", 60_000)[0] != pid


class StuckMarkers(Markers):
    """Markers whose partition ``stuck`` does not answer until ``release`` is set (a
    leader that hangs); records which ids' markers were being written at once."""

    def __init__(self, stuck: tuple[str, int]) -> None:
        super().__init__()
        self.stuck = stuck
        self.release = threading.Event()
        self.entered = threading.Event()
        self.active: dict[int, int] = {}
        self.overlapped: set[int] = set()

    def write_markers(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        partitions: Collection[tuple[str, int]],
    ) -> Mapping[tuple[str, int], str]:
        with self._lock:
            if self.active.get(producer_id):
                self.overlapped.add(producer_id)
            self.active[producer_id] = self.active.get(producer_id, 0) + 1
        try:
            if self.stuck in partitions:
                self.entered.set()
                self.release.wait(10)
            return super().write_markers(
                producer_id, producer_epoch, commit, coordinator_epoch, partitions
            )
        finally:
            with self._lock:
                self.active[producer_id] -= 1


def test_a_hanging_leader_holds_up_only_its_own_transactions_markers(tmp_path: Path) -> None:
    stuck = ("slow", 0)
    markers = StuckMarkers(stuck)
    broker = Broker(tmp_path, ManualClock(), markers)
    try:
        coordinator = broker.coordinator
        slow_pid, slow_epoch = coordinator.init_producer_id("slow-app", 60_000)
        coordinator.add_partitions("slow-app", slow_pid, slow_epoch, [stuck])
        coordinator.end_transaction("slow-app", slow_pid, slow_epoch, commit=True)
        assert markers.entered.wait(10)
        # While that leader hangs, other transactions complete.
        for i in range(6):
            tid = f"app-{i}"
            pid, epoch = coordinator.init_producer_id(tid, 60_000)
            coordinator.add_partitions(tid, pid, epoch, [A, B])
            coordinator.end_transaction(tid, pid, epoch, commit=True)
            broker.wait_state(tid, TxnState.COMPLETE_COMMIT)
        assert broker.state("slow-app").state is TxnState.PREPARE_COMMIT  # type: ignore[union-attr]
        # Asked again for the stuck id meanwhile (a reload would): still one at a time.
        coordinator._completions.put("slow-app")
        coordinator._completions.put("slow-app")
        time.sleep(0.2)
        markers.release.set()
        broker.wait_state("slow-app", TxnState.COMPLETE_COMMIT)
        assert markers.overlapped == set()
    finally:
        markers.release.set()
        broker.close()
