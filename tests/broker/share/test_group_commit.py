"""Group commit of share-state writes (issue #32's throughput, docs/share-groups.md
"Group commit"): a write is appended under the locks and made durable after them, so
writers share fsyncs; nothing is answered before it is durable, one wait covers every
earlier append of the state partition, and members of one share partition working at
once lose nothing and are handed nothing twice. Real log manager, temporary directory,
real fsyncs."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidelog.broker.share.partition import ACCEPT, Acknowledgement, SharePartitionConfig
from tidelog.broker.share.partition_manager import SharePartitionManager
from tidelog.broker.share.records import ACKNOWLEDGED, ShareStateKey, StateBatch
from tidelog.broker.share.state_log import SHARE_STATE_TOPIC, ShareStateLog, ShareStateLogConfig
from tidelog.storage.batch_builder import BatchBuilder
from tidelog.storage.clock import ManualClock
from tidelog.storage.log_manager import LogManager, LogManagerConfig

G, T = "workers", "jobs"
RECORDS = 120
MEMBERS = 4


@pytest.fixture
def logs(tmp_path: Path) -> Iterator[LogManager]:
    manager = LogManager.open(tmp_path, LogManagerConfig(cleaner_enabled=False), ManualClock())
    manager.create_topic(T, 1, {})
    builder = BatchBuilder()
    for i in range(RECORDS):
        builder.append(0, None, b"%d" % i)
    manager.get_log(T, 0).append(builder.build())
    yield manager
    manager.close()


def _key(topic: str) -> ShareStateKey:
    return ShareStateKey(G, uuid.uuid5(uuid.NAMESPACE_URL, topic), 0)


def test_a_write_is_durable_after_its_wait_which_covers_every_earlier_append(
    logs: LogManager,
) -> None:
    store = ShareStateLog.open(logs, ShareStateLogConfig(num_partitions=1))
    a, b = _key("a"), _key("b")
    store.initialize(a, 0, 0)
    store.initialize(b, 0, 0)
    state_log = logs.get_log(SHARE_STATE_TOPIC, 0)
    first = store.begin_write(a, 0, -1, (StateBatch(0, 0, ACKNOWLEDGED, 1),))
    second = store.begin_write(b, 0, -1, (StateBatch(5, 5, ACKNOWLEDGED, 1),))
    end = state_log.log_end_offset
    assert state_log.recovery_point < end  # appended, not fsynced: nothing answered yet
    second.wait()  # one fsync for both writers
    assert state_log.recovery_point >= end
    first.wait()
    store.reload_partition(0)
    assert [_done(store, k) for k in (a, b)] == [{0}, {5}]


def test_members_of_one_share_partition_at_once_lose_nothing(logs: LogManager) -> None:
    store = ShareStateLog.open(logs, ShareStateLogConfig(num_partitions=1))
    manager = _manager(logs, store)
    handed: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def work(member: str) -> None:
        try:
            while True:
                ranges = manager.acquire(G, T, 0, member, 3)
                if not ranges:
                    return
                offsets = [o for r in ranges for o in range(r.first_offset, r.last_offset + 1)]
                with lock:
                    handed.extend(offsets)
                acks = [Acknowledgement(r.first_offset, r.last_offset, ACCEPT) for r in ranges]
                manager.acknowledge(G, T, 0, member, acks)
        except BaseException as error:  # reported below, not lost on the thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(f"m{i}",)) for i in range(MEMBERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert sorted(handed) == list(range(RECORDS))  # each record handed out once
    # What the store holds (and a reload of its log) says everything is done.
    store.reload_partition(0)
    reloaded = _manager(logs, store)
    assert reloaded.describe(G, T, 0).start_offset == RECORDS
    assert reloaded.acquire(G, T, 0, "late", 10) == ()


def _manager(logs: LogManager, store: ShareStateLog) -> SharePartitionManager:
    return SharePartitionManager(
        logs,
        store,
        topic_id=lambda name: uuid.uuid5(uuid.NAMESPACE_URL, name),
        group_config=lambda _: SharePartitionConfig(auto_offset_reset="earliest"),
    )


def _done(store: ShareStateLog, key: ShareStateKey) -> set[int]:
    state = store.read(key)
    assert state is not None
    return {
        o
        for b in state.batches
        if b.delivery_state == ACKNOWLEDGED
        for o in range(b.first_offset, b.last_offset + 1)
    }
