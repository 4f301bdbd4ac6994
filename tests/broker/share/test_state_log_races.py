"""``ShareStateLog`` under concurrent writes of one share partition: no change is lost
from the state it serves. A partition leader's operations on one share partition are
serialized by the share partition's lock, but a reload at a new leader epoch (the
store's ``read_state``, which writes the epoch) runs beside an operation still in flight
on the share partition it replaces; the cluster case of the fault harness
(``tests/faults/test_share_groups_under_kills.py``) saw acknowledged records come back
that way. Real log manager, temporary directory, real fsyncs: threads released together
each write their own offset; every write must show in the served state and in a reload
of the log."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

from tidelog.broker.share.records import ACKNOWLEDGED, ShareSnapshot, ShareStateKey, StateBatch
from tidelog.broker.share.state_log import ShareStateLog, ShareStateLogConfig
from tidelog.storage.clock import ManualClock
from tidelog.storage.errors import FencedLeaderEpochError
from tidelog.storage.log_manager import LogManager, LogManagerConfig

WRITERS = 6
ROUNDS = 5


def test_concurrent_writes_of_one_share_partition_lose_nothing(tmp_path: Path) -> None:
    logs = LogManager.open(tmp_path, LogManagerConfig(cleaner_enabled=False), ManualClock())
    try:
        store = ShareStateLog.open(logs, ShareStateLogConfig(num_partitions=1))
        key = ShareStateKey("g", uuid.uuid5(uuid.NAMESPACE_URL, "t"), 0)
        store.initialize(key, 0, 0)
        errors: list[BaseException] = []
        for round_ in range(ROUNDS):
            barrier = threading.Barrier(WRITERS)

            def write(
                offset: int, epoch: int, barrier: threading.Barrier = barrier, round_: int = round_
            ) -> None:
                try:
                    barrier.wait(10)
                    # One writer a round moves the leader epoch (a reload's read_state).
                    if epoch > round_:
                        store.read_state(key, epoch)
                    store.write(key, epoch, -1, (StateBatch(offset, offset, ACKNOWLEDGED, 1),))
                except BaseException as error:  # reported below, not lost on the thread
                    errors.append(error)

            threads = [
                threading.Thread(
                    target=write, args=(round_ * WRITERS + i, round_ + 1 if i == 0 else round_)
                )
                for i in range(WRITERS)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
        # Writes fenced by the epoch moving are refused (FencedLeaderEpochError) and
        # must then be absent; every other write must be present.
        assert all(isinstance(e, FencedLeaderEpochError) for e in errors), errors
        served = _offsets(store.read(key))
        store.reload_partition(0)
        assert _offsets(store.read(key)) == served
        assert len(served) == WRITERS * ROUNDS - len(errors), (sorted(served), errors)
    finally:
        logs.close()


def _offsets(state: ShareSnapshot | None) -> set[int]:
    assert state is not None
    return {
        o
        for b in state.batches
        if b.delivery_state == ACKNOWLEDGED
        for o in range(b.first_offset, b.last_offset + 1)
    }
