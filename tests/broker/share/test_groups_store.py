"""Share groups in ``__consumer_offsets``: the offset store's records of other group kinds
(written durably, reloaded, compacted, refused when they are not another kind's), and the
share groups over a replicated offsets partition (cluster mode): a write this broker may
not make changes nothing, a new leader rebuilds the groups, a former one forgets them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidelog.broker.core.partitions import PartitionRegistry
from tidelog.broker.groups.manager import GroupConfig, GroupManager
from tidelog.broker.groups.offset_records import OffsetValue, encode_group_key, encode_key
from tidelog.broker.groups.offset_store import OFFSETS_TOPIC, OffsetStore, OffsetStoreConfig
from tidelog.broker.share.groups import ShareGroupManager
from tidelog.broker.share.groups_coordinator import ShareHeartbeatRequest
from tidelog.broker.share.groups_records import (
    GROUP_METADATA_TYPE,
    MEMBER_METADATA_TYPE,
    RecordKey,
)
from tidelog.broker.share.groups_records import encode_key as share_key
from tidelog.storage.cleaner import LogCleaner
from tidelog.storage.clock import ManualClock
from tidelog.storage.errors import GroupIdNotFoundError, NotLeaderOrFollowerError
from tidelog.storage.log_manager import LogManager, LogManagerConfig
from tidelog.storage.types import TopicPartition

pytestmark = pytest.mark.timeout(60)

GROUP = "g"
JOBS = frozenset({"jobs"})


def _logs(path: Path, clock: ManualClock | None = None) -> LogManager:
    return LogManager.open(path, LogManagerConfig(cleaner_enabled=False), clock or ManualClock())


def _key(record_type: int, group_id: str = GROUP, member_id: str = "") -> bytes:
    return share_key(RecordKey(record_type, group_id, member_id))


def test_records_of_other_kinds_are_durable_and_reloaded(tmp_path: Path) -> None:
    group_key, member_key = _key(GROUP_METADATA_TYPE), _key(MEMBER_METADATA_TYPE, member_id="m")
    with _logs(tmp_path) as logs:
        store = OffsetStore.open(logs)
        store.commit(GROUP, {TopicPartition("t", 0): OffsetValue(3, "", 1)})
        store.write_records(GROUP, {group_key: b"v1", member_key: b"m1"})
        store.write_records(GROUP, {group_key: b"v2", member_key: None})
        store.write_records("other", {_key(MEMBER_METADATA_TYPE, "other", "x"): b"x"})
        assert store.records_of(GROUP) == {group_key: b"v2"}
        assert store.is_share_group(GROUP)
        assert not store.is_share_group("other")  # members only, no group record
        partition_log = logs.get_log(OFFSETS_TOPIC, store.partition_for(GROUP))
        assert partition_log.recovery_point == partition_log.log_end_offset  # fsynced
        for bad in (encode_key(GROUP, TopicPartition("t", 0)), encode_group_key(GROUP)):
            with pytest.raises(ValueError, match="not another kind's key"):
                store.write_records(GROUP, {bad: b""})
        with pytest.raises(ValueError, match="not another kind's key"):
            store.write_records("other", {group_key: b""})  # a key of another group
    with _logs(tmp_path) as logs:
        store = OffsetStore.open(logs)
        assert store.groups_with_records() == {
            GROUP: {group_key: b"v2"},
            "other": {_key(MEMBER_METADATA_TYPE, "other", "x"): b"x"},
        }
        assert store.offsets(GROUP) == {TopicPartition("t", 0): OffsetValue(3, "", 1)}
        assert store.group_ids() == [GROUP]  # records of other kinds are no offsets
        store.write_records(GROUP, {group_key: None})
        assert store.records_of(GROUP) == {}


def test_compaction_keeps_the_latest_share_records(tmp_path: Path) -> None:
    clock = ManualClock()
    with _logs(tmp_path / "data", clock) as logs:
        groups = GroupManager.open(
            logs, clock, GroupConfig(offsets=OffsetStoreConfig(num_partitions=1))
        )
        shares = ShareGroupManager.open(logs, clock, groups)
        logs.create_topic("jobs", 2)
        shares.heartbeat(ShareHeartbeatRequest(GROUP, "stays", 0, JOBS))
        for _ in range(4):  # members come and go: many rewrites of the same keys
            for member in ("a", "b"):
                shares.heartbeat(ShareHeartbeatRequest(GROUP, member, 0, JOBS))
            for member in ("a", "b"):
                shares.heartbeat(ShareHeartbeatRequest(GROUP, member, -1, None))
        before = shares.describe_group(GROUP)
        partition_log = logs.get_log(OFFSETS_TOPIC, 0)
        written = partition_log.log_end_offset
        partition_log.roll()
        result = LogCleaner(tmp_path, clock).clean_log(partition_log, force=True)
        assert result.cleaned
        assert result.records_retained < written
    with _logs(tmp_path / "data", clock) as logs:
        groups = GroupManager.open(logs, clock)
        assert ShareGroupManager.open(logs, clock, groups).describe_group(GROUP) == before


def test_a_coordinator_that_may_not_write_changes_nothing_and_a_new_leader_reloads(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    with _logs(tmp_path, clock) as logs:
        registry = PartitionRegistry(logs, 1, clock, replicated=True)
        config = GroupConfig(offsets=OffsetStoreConfig(num_partitions=1))
        groups = GroupManager.open(logs, clock, config, registry=registry)
        shares = ShareGroupManager.open(logs, clock, groups)
        logs.create_topic("jobs", 2)
        leadership = registry.get(OFFSETS_TOPIC, 0)
        with pytest.raises(NotLeaderOrFollowerError):
            shares.heartbeat(ShareHeartbeatRequest(GROUP, "a", 0, JOBS))
        with pytest.raises(GroupIdNotFoundError):  # the join was undone with its write
            shares.describe_group(GROUP)
        leadership.make_leader(3, (1,), (1,))
        groups.reload_partition(0)
        assert shares.load_partition(0) == 0
        first = shares.heartbeat(ShareHeartbeatRequest(GROUP, "a", 0, JOBS))
        shares.heartbeat(ShareHeartbeatRequest(GROUP, "b", 0, JOBS))
        before = shares.describe_group(GROUP)
        leadership.make_follower(2, 4)
        with pytest.raises(NotLeaderOrFollowerError):
            shares.heartbeat(ShareHeartbeatRequest(GROUP, "a", first.member_epoch, None))
        # The refused heartbeat moved "a" to epoch 2 in memory only: undone.
        assert shares.describe_group(GROUP) == before
        clock.advance(45_000)
        with pytest.raises(NotLeaderOrFollowerError):
            shares.expire()  # the sessions ended, but the removals cannot be stored
        assert shares.describe_group(GROUP) == before
        assert shares.unload_partition(0) == [GROUP]
        with pytest.raises(GroupIdNotFoundError):
            shares.describe_group(GROUP)
        leadership.make_leader(5, (1,), (1,))
        groups.reload_partition(0)
        assert shares.load_partition(0) == 1
        assert shares.describe_group(GROUP) == before
        assert (
            shares.heartbeat(
                ShareHeartbeatRequest(GROUP, "a", first.member_epoch, None)
            ).member_epoch
            == 2
        )
