"""State epochs of share partitions over a real log manager (issue #32, the admin in a
cluster): an admin's reset at the share coordinator (InitializeShareGroupState with a
newer state epoch) or delete fences the leader's memory at its next write
(``FENCED_STATE_EPOCH``) and the leader reloads, as Kafka's; a leader's first use cannot
overwrite a state an admin wrote meanwhile; an open dead-letter write refuses a reset or
a delete (``CONCURRENT_TRANSACTIONS``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidelog.broker.share.partition import ACCEPT, Acknowledgement, SharePartitionConfig
from tidelog.broker.share.partition_manager import SharePartitionManager, ShareStateStore
from tidelog.broker.share.records import ARCHIVED, ShareSnapshot, ShareStateKey, StateBatch
from tidelog.broker.share.state_log import (
    SHARE_STATE_TOPIC,
    PendingWrite,
    ShareStateLog,
    ShareStateLogConfig,
)
from tidelog.storage.batch_builder import BatchBuilder
from tidelog.storage.clock import ManualClock
from tidelog.storage.errors import ConcurrentTransactionsError, FencedStateEpochError
from tidelog.storage.log_manager import LogManager, LogManagerConfig

G, T = "workers", "jobs"
KEY = ShareStateKey(G, uuid.uuid5(uuid.NAMESPACE_URL, T), 0)
CONFIG = SharePartitionConfig(auto_offset_reset="earliest")
PRODUCER = 9


@pytest.fixture
def logs(tmp_path: Path) -> Iterator[LogManager]:
    manager = LogManager.open(tmp_path, LogManagerConfig(cleaner_enabled=False), ManualClock())
    manager.create_topic(T, 1, {})
    builder = BatchBuilder()
    for i in range(6):
        builder.append(0, None, b"%d" % i)
    manager.get_log(T, 0).append(builder.build())
    yield manager
    manager.close()


def _store(logs: LogManager) -> ShareStateLog:
    return ShareStateLog.open(logs, ShareStateLogConfig(num_partitions=1))


def _manager(logs: LogManager, store: ShareStateStore) -> SharePartitionManager:
    return SharePartitionManager(
        logs,
        store,
        topic_id=lambda name: uuid.uuid5(uuid.NAMESPACE_URL, name),
        group_config=lambda _: CONFIG,
    )


def _offsets(manager: SharePartitionManager, member: str) -> list[int]:
    ranges = manager.acquire(G, T, 0, member, 100)
    return [o for r in ranges for o in range(r.first_offset, r.last_offset + 1)]


def test_the_store_fences_writes_from_an_older_state_epoch_and_after_a_delete(
    logs: LogManager,
) -> None:
    store = _store(logs)
    done = (StateBatch(0, 0, ARCHIVED, 1),)
    assert store.initialize(KEY, 0, 0, 0).state_epoch == 0
    with pytest.raises(FencedStateEpochError):  # a second first use: the state exists
        store.initialize(KEY, 0, 0, 0)
    assert store.write(KEY, 0, -1, done, state_epoch=0) is not None
    assert store.initialize(KEY, 3, 0, 1).state_epoch == 1  # an admin's reset
    with pytest.raises(FencedStateEpochError, match="state epoch 0"):
        store.write(KEY, 0, -1, done, state_epoch=0)
    with pytest.raises(FencedStateEpochError):  # another admin read the same epoch
        store.initialize(KEY, 5, 0, 1)
    state = store.read(KEY)
    assert state is not None
    assert (state.start_offset, state.state_epoch, state.batches) == (3, 1, ())
    store.delete(KEY)
    with pytest.raises(FencedStateEpochError, match="deleted"):
        store.write(KEY, 0, -1, done, state_epoch=1)
    assert store.read(KEY) is None


def test_a_leader_fenced_after_a_reset_reloads_and_delivers_from_the_new_start(
    logs: LogManager,
) -> None:
    store = _store(logs)
    leader = _manager(logs, store)
    assert _offsets(leader, "a") == [0, 1, 2, 3, 4, 5]
    leader.acknowledge(G, T, 0, "a", [Acknowledgement(0, 5, ACCEPT)])
    # An admin resets the share partition to offset 2 at the share coordinator; the
    # leader is not told (its memory: everything done, nothing to hand out).
    store.initialize(KEY, 2, 0, 1)
    # The next acquisition writes from stale memory: fenced, reloaded, retried.
    builder = BatchBuilder()
    builder.append(0, None, b"6")
    logs.get_log(T, 0).append(builder.build())
    assert _offsets(leader, "b") == [2, 3, 4, 5, 6]
    # An acknowledgement of records acquired before a reset is refused, not retried.
    store.initialize(KEY, 4, 0, 2)
    with pytest.raises(FencedStateEpochError):
        leader.acknowledge(G, T, 0, "b", [Acknowledgement(2, 6, ACCEPT)])
    assert _offsets(leader, "c") == [4, 5, 6]


def test_statistics_with_a_newer_state_epoch_reload_first(logs: LogManager) -> None:
    store = _store(logs)
    leader = _manager(logs, store)
    assert _offsets(leader, "a") == [0, 1, 2, 3, 4, 5]
    store.initialize(KEY, 1, 0, 1)
    assert leader.stats(G, T, 0).acquired == 6  # stale: nobody said otherwise
    stats = leader.stats(G, T, 0, state_epoch=1)
    assert (stats.start_offset, stats.end_offset, stats.acquired) == (1, 1, 0)
    leader.invalidate(G, T, 0, -1)  # a delete: whatever is held goes
    store.delete(KEY)
    assert leader.loaded() == []


class _AdminBetweenReadAndInitialize:
    """The real store, with an admin's reset landing between a leader's read (none) and
    its first-use initialize: the interleaving the fence is for."""

    def __init__(self, store: ShareStateLog) -> None:
        self.store = store
        self.raced = False

    def read_state(self, key: ShareStateKey, leader_epoch: int) -> ShareSnapshot | None:
        state = self.store.read_state(key, leader_epoch)
        if state is None and not self.raced:
            self.raced = True
            self.store.initialize(key, 4, leader_epoch, 0)  # the admin's alter
        return state

    def initialize(
        self,
        key: ShareStateKey,
        start_offset: int,
        leader_epoch: int,
        state_epoch: int | None = None,
    ) -> ShareSnapshot:
        return self.store.initialize(key, start_offset, leader_epoch, state_epoch)

    def write(
        self,
        key: ShareStateKey,
        leader_epoch: int,
        start_offset: int,
        batches: tuple[StateBatch, ...],
        state_epoch: int | None = None,
    ) -> ShareSnapshot:
        state = self.store.write(key, leader_epoch, start_offset, batches, state_epoch=state_epoch)
        assert state is not None
        return state

    def begin_write(
        self,
        key: ShareStateKey,
        leader_epoch: int,
        start_offset: int,
        batches: tuple[StateBatch, ...],
        state_epoch: int | None = None,
    ) -> PendingWrite:
        return self.store.begin_write(key, leader_epoch, start_offset, batches, state_epoch)

    def write_transactional(
        self,
        key: ShareStateKey,
        leader_epoch: int,
        start_offset: int,
        batches: tuple[StateBatch, ...],
        transaction: tuple[int, int],
        state_epoch: int | None = None,
    ) -> None:
        raise AssertionError("not used here")

    def state_partition(self, key: ShareStateKey) -> int:
        return self.store.partition_for(key)


def test_a_first_use_does_not_overwrite_an_admins_alter(logs: LogManager) -> None:
    racing = _AdminBetweenReadAndInitialize(_store(logs))
    leader = _manager(logs, racing)
    assert _offsets(leader, "a") == [4, 5]  # the admin's start, not earliest (0)
    assert racing.raced


def test_an_open_dead_letter_write_refuses_a_reset_and_a_delete(logs: LogManager) -> None:
    store = _store(logs)
    store.initialize(KEY, 0, 0, 0)
    store.write_transactional(KEY, 0, -1, (StateBatch(0, 0, ARCHIVED, 1),), (PRODUCER, 0), 0)
    with pytest.raises(ConcurrentTransactionsError):
        store.initialize(KEY, 3, 0, 1)
    with pytest.raises(ConcurrentTransactionsError):
        store.delete(KEY)
    logs.get_log(SHARE_STATE_TOPIC, 0).append_marker(PRODUCER, 0, True, 0)
    store.end_transaction(0, PRODUCER, commit=True)
    assert store.initialize(KEY, 3, 0, 1).start_offset == 3
    # A dead-letter transaction begun on memory from before the reset: its archiving is
    # fenced (it aborts; the leader reloads the reset state).
    with pytest.raises(FencedStateEpochError):
        store.write_transactional(KEY, 0, -1, (StateBatch(3, 3, ARCHIVED, 1),), (PRODUCER, 1), 0)
    assert not store.has_pending(KEY)
    store.delete(KEY)
    assert store.read(KEY) is None
