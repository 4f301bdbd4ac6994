"""Leader epochs of share partitions over a real log manager (issue #32 step 2b): the
share coordinator's store fences a deposed leader's writes, a new leader's read fences
the old one durably, and a broker that loses and regains a topic partition's leadership
reloads the share partition instead of serving its stale memory."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidelog.broker.share.partition import ACCEPT, Acknowledgement, SharePartitionConfig
from tidelog.broker.share.partition_manager import SharePartitionManager
from tidelog.broker.share.records import ACKNOWLEDGED, ShareStateKey, StateBatch
from tidelog.broker.share.state_log import ShareStateLog, ShareStateLogConfig
from tidelog.storage.batch_builder import BatchBuilder
from tidelog.storage.clock import ManualClock
from tidelog.storage.errors import FencedLeaderEpochError
from tidelog.storage.log_manager import LogManager, LogManagerConfig

G, T = "workers", "jobs"
KEY = ShareStateKey(G, uuid.uuid5(uuid.NAMESPACE_URL, T), 0)
CONFIG = SharePartitionConfig(auto_offset_reset="earliest")


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


def _manager(logs: LogManager, store: ShareStateLog, epoch: list[int]) -> SharePartitionManager:
    return SharePartitionManager(
        logs,
        store,
        topic_id=lambda name: uuid.uuid5(uuid.NAMESPACE_URL, name),
        group_config=lambda _: CONFIG,
        leader_epoch=lambda topic, partition: epoch[0],
    )


def _offsets(manager: SharePartitionManager, member: str, max_records: int = 100) -> list[int]:
    ranges = manager.acquire(G, T, 0, member, max_records)
    return [o for r in ranges for o in range(r.first_offset, r.last_offset + 1)]


def test_an_older_leader_epoch_is_fenced_and_a_newer_read_fences_it_durably(
    logs: LogManager,
) -> None:
    store = _store(logs)
    store.initialize(KEY, 0, 2)
    accepted = (StateBatch(0, 1, ACKNOWLEDGED, 1),)
    store.write(KEY, 2, -1, accepted)
    with pytest.raises(FencedLeaderEpochError):
        store.write(KEY, 1, -1, (StateBatch(0, 1, 0, 2),))
    with pytest.raises(FencedLeaderEpochError):
        store.initialize(KEY, 5, 1)
    state = store.read(KEY)
    assert state is not None
    assert state.batches == accepted
    assert state.start_offset == 0

    # A new leader (epoch 4) loads the share partition: the old one (2) is fenced from
    # then on, also after the store is reloaded from its log.
    loaded = store.read_state(KEY, 4)
    assert loaded is not None
    assert loaded.leader_epoch == 4
    assert loaded.batches == accepted
    with pytest.raises(FencedLeaderEpochError):
        store.write(KEY, 2, -1, (StateBatch(2, 2, ACKNOWLEDGED, 1),))
    reloaded = _store(logs)
    with pytest.raises(FencedLeaderEpochError):
        reloaded.read_state(KEY, 3)
    again = reloaded.read(KEY)
    assert again is not None
    assert again.leader_epoch == 4
    assert again.batches == accepted


def test_a_leader_that_lost_and_regained_the_partition_reloads_its_share_partitions(
    logs: LogManager,
) -> None:
    store = _store(logs)
    here, there = [1], [2]
    this_broker = _manager(logs, store, here)
    assert _offsets(this_broker, "a", 3) == [0, 1, 2]

    # Another broker led at epoch 2 meanwhile: it loaded the state (the acquisition of
    # 0..2 came back Available), handed 0..2 out again and saw them accepted.
    other_broker = _manager(logs, store, there)
    assert _offsets(other_broker, "b") == [0, 1, 2, 3, 4, 5]
    other_broker.acknowledge(G, T, 0, "b", [Acknowledgement(0, 2, ACCEPT)])

    # This broker, not yet told, is fenced: its acknowledgement of 0..2 is refused.
    with pytest.raises(FencedLeaderEpochError):
        this_broker.acknowledge(G, T, 0, "a", [Acknowledgement(0, 2, ACCEPT)])

    # It leads again at epoch 3: it reloads, so nothing accepted is handed out again and
    # what "b" held (in flight at the change) comes back.
    here[0] = 3
    assert _offsets(this_broker, "c") == [3, 4, 5]
    described = this_broker.describe(G, T, 0)
    assert described.start_offset == 3


def test_the_next_epoch_led_by_the_same_broker_keeps_its_locks(logs: LogManager) -> None:
    # The controller takes a restarted follower out of the ISR by bumping the leader epoch
    # by one and leaving the leader as it was: no other broker led, so the records this
    # leader has under lock stay locked (reloading handed them to other members at once,
    # found by the fault harness's share workload), and its writes name the new epoch.
    store = _store(logs)
    epoch = [1]
    manager = _manager(logs, store, epoch)
    assert _offsets(manager, "a", 3) == [0, 1, 2]

    epoch[0] = 2
    assert _offsets(manager, "b") == [3, 4, 5]
    manager.acknowledge(G, T, 0, "a", [Acknowledgement(0, 2, ACCEPT)])
    state = store.read(KEY)
    assert state is not None
    assert state.leader_epoch == 2
    with pytest.raises(FencedLeaderEpochError):
        store.write(KEY, 1, -1, (StateBatch(3, 3, ACKNOWLEDGED, 1),))

    # Two epochs on, another broker may have led in between: reload.
    epoch[0] = 4
    assert _offsets(manager, "c") == [3, 4, 5]
