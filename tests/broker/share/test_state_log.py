"""Share partitions over a real log manager (temporary data directory): the
``__share_group_state`` store's snapshots, updates and pruning, restarts, the auto offset
reset, read_committed, the in-flight bound and INVALID_RECORD_STATE."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidelog.broker.core.internal_topic import record_batches
from tidelog.broker.share.partition import (
    ACCEPT,
    ACQUIRED,
    REJECT,
    RELEASE,
    Acknowledgement,
    AcquiredRange,
    SharePartitionConfig,
)
from tidelog.broker.share.partition_manager import SharePartitionManager
from tidelog.broker.share.records import (
    ARCHIVED,
    AVAILABLE,
    SNAPSHOT,
    UPDATE,
    ShareStateKey,
    decode_key,
)
from tidelog.broker.share.state_log import SHARE_STATE_TOPIC, ShareStateLog, ShareStateLogConfig
from tidelog.storage.batch_builder import BatchBuilder
from tidelog.storage.clock import ManualClock
from tidelog.storage.errors import InvalidRecordStateError, InvalidRequestError
from tidelog.storage.log_manager import LogManager, LogManagerConfig
from tidelog.storage.records import decode_batch, iter_batch_headers

G, T = "workers", "jobs"


def topic_id(name: str) -> uuid.UUID:
    return uuid.uuid5(uuid.NAMESPACE_URL, name)


class Broker:
    def __init__(self, path: Path, config: SharePartitionConfig, per_snapshot: int = 500) -> None:
        self.path = path
        self.clock = ManualClock()
        self.config = config
        self.per_snapshot = per_snapshot
        self.open()

    def open(self) -> None:
        self.logs = LogManager.open(self.path, LogManagerConfig(cleaner_enabled=False), self.clock)
        self.store = ShareStateLog.open(
            self.logs,
            ShareStateLogConfig(
                num_partitions=1, snapshot_update_records_per_snapshot=self.per_snapshot
            ),
        )
        self.manager = SharePartitionManager(
            self.logs, self.store, topic_id=topic_id, group_config=lambda _: self.config
        )

    def restart(self) -> None:
        self.logs.close()
        self.open()

    def produce(self, count: int) -> None:
        builder = BatchBuilder()
        for i in range(count):
            builder.append(self.clock.wall_ms(), None, b"%d" % i)
        self.logs.get_log(T, 0).append(builder.build())

    def acquire(self, member: str, max_records: int = 100) -> list[int]:
        ranges = self.manager.acquire(G, T, 0, member, max_records)
        return [o for r in ranges for o in range(r.first_offset, r.last_offset + 1)]

    def ack(self, member: str, first: int, last: int, kind: int) -> None:
        self.manager.acknowledge(G, T, 0, member, [Acknowledgement(first, last, kind)])

    def state_record_types(self) -> list[int]:
        data = self.logs.get_log(SHARE_STATE_TOPIC, 0).read(0, 1 << 20).records
        types = []
        for position, _ in iter_batch_headers(data):
            for record in decode_batch(data, position)[1]:
                assert record.key is not None
                types.append(decode_key(record.key)[0])
        return types


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(tmp_path, SharePartitionConfig(auto_offset_reset="earliest"))
    b.logs.create_topic(T, 1, {})
    yield b
    b.logs.close()


def test_acknowledged_never_comes_back_and_acquired_comes_back_with_its_count(
    broker: Broker,
) -> None:
    broker.produce(6)
    assert broker.acquire("a", 3) == [0, 1, 2]
    assert broker.acquire("b", 10) == [3, 4, 5]
    broker.ack("a", 0, 1, ACCEPT)
    broker.ack("b", 3, 3, REJECT)
    broker.restart()
    state = broker.manager.describe(G, T, 0)
    assert state.start_offset == 2
    assert {o: (r.state, r.delivery_count) for o, r in state.records().items()} == {
        2: (AVAILABLE, 1),
        3: (ARCHIVED, 1),
        4: (AVAILABLE, 1),
        5: (AVAILABLE, 1),
    }
    ranges = broker.manager.acquire(G, T, 0, "c", 10)
    assert ranges == (AcquiredRange(2, 2, 2), AcquiredRange(4, 5, 2))


def test_an_acknowledgement_of_records_not_held_changes_nothing(broker: Broker) -> None:
    broker.produce(4)
    assert broker.acquire("a", 2) == [0, 1]
    assert broker.acquire("b", 2) == [2, 3]
    with pytest.raises(InvalidRecordStateError):
        broker.manager.acknowledge(
            G, T, 0, "a", [Acknowledgement(0, 0, ACCEPT), Acknowledgement(2, 2, ACCEPT)]
        )
    with pytest.raises(InvalidRequestError):
        broker.manager.acknowledge(
            G, T, 0, "a", [Acknowledgement(1, 1, ACCEPT), Acknowledgement(0, 0, ACCEPT)]
        )
    records = broker.manager.describe(G, T, 0).records()
    assert [records[o].state for o in range(4)] == [ACQUIRED] * 4
    broker.ack("a", 0, 1, ACCEPT)
    with pytest.raises(InvalidRecordStateError):
        broker.ack("a", 0, 0, ACCEPT)  # already acknowledged


def test_lock_expiry_and_release_count_deliveries_up_to_the_limit(tmp_path: Path) -> None:
    b = Broker(
        tmp_path,
        SharePartitionConfig(
            auto_offset_reset="earliest", delivery_count_limit=2, record_lock_duration_ms=100
        ),
    )
    b.logs.create_topic(T, 1, {})
    b.produce(1)
    assert b.manager.acquire(G, T, 0, "a", 1) == (AcquiredRange(0, 0, 1),)
    b.clock.advance(100)
    b.manager.expire_locks()
    with pytest.raises(InvalidRecordStateError):
        b.ack("a", 0, 0, ACCEPT)  # the lock is gone
    assert b.manager.acquire(G, T, 0, "b", 1) == (AcquiredRange(0, 0, 2),)
    b.ack("b", 0, 0, RELEASE)  # the second delivery was the last
    assert b.acquire("a") == []
    state = b.manager.describe(G, T, 0)
    assert (state.start_offset, state.records()) == (1, {})
    b.logs.close()


def test_auto_offset_reset_latest_is_fixed_once_chosen(tmp_path: Path) -> None:
    b = Broker(tmp_path, SharePartitionConfig())  # latest
    b.logs.create_topic(T, 1, {})
    b.produce(3)
    assert b.acquire("a") == []  # starts at the high watermark, 3
    b.produce(2)
    b.restart()
    assert b.acquire("a") == [3, 4]  # produced after the start: not skipped by the restart
    b.logs.close()


def test_the_in_flight_window_is_bounded(tmp_path: Path) -> None:
    b = Broker(tmp_path, SharePartitionConfig(auto_offset_reset="earliest", max_record_locks=3))
    b.logs.create_topic(T, 1, {})
    b.produce(5)
    assert b.acquire("a") == [0, 1, 2]
    assert b.acquire("b") == []
    b.ack("a", 1, 2, ACCEPT)  # the window still holds 0
    assert b.acquire("b") == []
    b.ack("a", 0, 0, ACCEPT)
    assert b.acquire("b") == [3, 4]
    b.logs.close()


def test_snapshots_every_n_updates_and_pruning_keeps_the_state(tmp_path: Path) -> None:
    b = Broker(tmp_path, SharePartitionConfig(auto_offset_reset="earliest"), per_snapshot=2)
    b.logs.create_topic(T, 1, {})
    b.produce(6)
    for offset in range(6):
        assert b.acquire("a", 1) == [offset]
        b.ack("a", offset, offset, ACCEPT if offset % 2 else REJECT)
    # Initialize (a snapshot), then acquire/ack pairs: updates, a snapshot after every two.
    types = b.state_record_types()
    assert types[0] == SNAPSHOT
    for i, record_type in enumerate(types[1:]):
        assert record_type == (SNAPSHOT if i % 3 == 2 else UPDATE)
    before = b.manager.describe(G, T, 0)
    start = b.store.prune(0)
    assert start == len(types) - 1 - types[::-1].index(SNAPSHOT)  # the latest snapshot
    b.restart()
    after = b.manager.describe(G, T, 0)
    assert (after.start_offset, after.records()) == (before.start_offset, before.records())
    b.logs.close()


def test_retention_moves_the_start_offset(broker: Broker) -> None:
    broker.produce(5)
    assert broker.acquire("a", 2) == [0, 1]
    broker.logs.get_log(T, 0).increase_log_start_offset(3)
    broker.manager.expire_locks()
    assert broker.manager.describe(G, T, 0).start_offset == 3
    with pytest.raises(InvalidRecordStateError):
        broker.ack("a", 0, 1, ACCEPT)  # gone with the log
    assert broker.acquire("b") == [3, 4]
    broker.restart()
    assert broker.manager.describe(G, T, 0).start_offset == 3


def test_an_admin_reset_starts_over(broker: Broker) -> None:
    broker.produce(5)
    assert broker.acquire("a", 2) == [0, 1]
    broker.manager.reset_start_offset(G, T, 0, 4)
    assert broker.acquire("b") == [4]
    broker.restart()
    state = broker.manager.describe(G, T, 0)
    assert state.start_offset == 4
    stored = broker.store.read(ShareStateKey(G, topic_id(T), 0))
    assert stored is not None
    assert stored.state_epoch == 1


def test_read_committed_skips_aborted_records_and_waits_for_the_decision(
    tmp_path: Path,
) -> None:
    b = Broker(
        tmp_path,
        SharePartitionConfig(auto_offset_reset="earliest", isolation_level="read_committed"),
    )
    b.logs.create_topic(T, 1, {})
    log = b.logs.get_log(T, 0)
    b.produce(1)  # 0
    log.append(record_batches([(b"k", b"x"), (b"k", b"y")], 0, transaction=(7, 0)))  # 1, 2
    b.produce(1)  # 3
    assert b.acquire("a") == [0]  # the last stable offset is 1: the transaction is open
    log.append_marker(7, 0, False, 0)  # 4: ABORT
    log.append(record_batches([(b"k", b"z")], 0, transaction=(8, 0)))  # 5
    log.append_marker(8, 0, True, 0)  # 6: COMMIT
    assert b.acquire("a") == [3, 5]  # aborted records and markers are gaps
    b.ack("a", 0, 5, ACCEPT)  # a range over gaps acknowledges the records in it
    assert b.manager.describe(G, T, 0).start_offset == 7
