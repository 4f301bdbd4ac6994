"""The ``__consumer_offsets`` record format and the offset store over a real log manager."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.broker.core.partitions import PartitionRegistry
from tidelog.broker.groups.assignor import TopicPartition
from tidelog.broker.groups.offset_records import (
    OffsetKey,
    OffsetValue,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    partition_for,
)
from tidelog.broker.groups.offset_store import OFFSETS_TOPIC, OffsetStore, OffsetStoreConfig
from tidelog.storage.clock import ManualClock
from tidelog.storage.errors import CoordinatorLoadInProgressError
from tidelog.storage.log_manager import LogManager, LogManagerConfig
from tidelog.storage.records import BatchBuilder

TP = TopicPartition("events", 3)


# --- the record format ------------------------------------------------------------------


@given(
    st.text(min_size=1, max_size=40),
    st.text(min_size=1, max_size=40),
    st.integers(0, 2**31 - 1),
    st.integers(0, 2**63 - 1),
    st.text(max_size=50),
    st.integers(-(2**63), 2**63 - 1),
)
def test_keys_and_values_round_trip(
    group: str, topic: str, partition: int, offset: int, metadata: str, timestamp_ms: int
) -> None:
    tp = TopicPartition(topic, partition)
    assert decode_key(encode_key(group, tp)) == OffsetKey(group, tp)
    value = OffsetValue(offset, metadata, timestamp_ms)
    assert decode_value(encode_value(value)) == value


def test_the_documented_layout() -> None:
    key = encode_key("g", TopicPartition("t", 7))
    assert key == b"\x00\x01" + b"\x00\x01g" + b"\x00\x01t" + b"\x00\x00\x00\x07"
    value = encode_value(OffsetValue(42, "m", 1_000))
    assert value == (
        b"\x00\x03"
        + (42).to_bytes(8, "big")
        + b"\xff\xff\xff\xff"
        + b"\x00\x01m"
        + (1_000).to_bytes(8, "big")
    )


def test_other_record_types_are_not_offset_commits_and_bad_bytes_raise() -> None:
    assert decode_key(b"\x00\x02" + b"\x00\x01g") is None  # Kafka's group metadata key
    key = encode_key("g", TP)
    for bad in (b"", b"\x00", key[:-1], key + b"x"):
        with pytest.raises(ValueError, match="offset record"):
            decode_key(bad)
    value = encode_value(OffsetValue(1, "", 0))
    for bad in (value[:5], value + b"x", b"\x00\x04" + value[2:]):
        with pytest.raises(ValueError, match="offset record"):
            decode_value(bad)
    with pytest.raises(ValueError, match="bytes"):
        encode_key("g" * 40_000, TP)


def test_partition_for_is_stable_and_in_range() -> None:
    assert partition_for("billing", 5) == partition_for("billing", 5)
    assert {partition_for(f"g{i}", 5) for i in range(100)} == set(range(5))
    assert partition_for("billing", 1) == 0


# --- the store ------------------------------------------------------------------------------


def open_logs(path: Path) -> LogManager:
    return LogManager.open(path, LogManagerConfig(cleaner_enabled=False), ManualClock())


def test_created_as_an_internal_compacted_topic(tmp_path: Path) -> None:
    with open_logs(tmp_path) as logs:
        store = OffsetStore.open(logs, OffsetStoreConfig(num_partitions=3))
        meta = logs.topic(OFFSETS_TOPIC)
        assert meta.internal
        assert meta.partitions == store.partitions == 3
        assert meta.config.cleanup_policy == "compact"


def test_commits_survive_a_reopen_and_tombstones_delete(tmp_path: Path) -> None:
    other = TopicPartition("events", 0)
    with open_logs(tmp_path) as logs:
        store = OffsetStore.open(logs)
        store.commit("g", {TP: OffsetValue(5, "a", 1)})
        store.commit("g", {TP: OffsetValue(7, "b", 2), other: OffsetValue(1, "", 2)})
        store.commit("h", {TP: OffsetValue(9, "", 3)})
        store.delete("h", [TP])
        assert store.offsets("g") == {TP: OffsetValue(7, "b", 2), other: OffsetValue(1, "", 2)}
        assert store.group_ids() == ["g"]
        written = logs.get_log(OFFSETS_TOPIC, store.partition_for("g")).log_end_offset
        assert written >= 3
    # The partition count in use wins over a changed setting.
    with open_logs(tmp_path) as logs:
        store = OffsetStore.open(logs, OffsetStoreConfig(num_partitions=9))
        assert store.partitions == 5
        assert store.offsets("g") == {TP: OffsetValue(7, "b", 2), other: OffsetValue(1, "", 2)}
        assert store.offsets("h") == {}
        assert store.groups_with_topic("events") == {"g": [other, TP]}


def test_every_commit_is_fsynced_before_it_is_visible(tmp_path: Path) -> None:
    with open_logs(tmp_path) as logs:
        store = OffsetStore.open(logs)
        store.commit("g", {TP: OffsetValue(5, "", 1)})
        partition_log = logs.get_log(OFFSETS_TOPIC, store.partition_for("g"))
        assert partition_log.recovery_point == partition_log.log_end_offset


def test_a_large_commit_becomes_several_batches(tmp_path: Path) -> None:
    offsets = {TopicPartition("t" * 200, p): OffsetValue(p, "x" * 500, 1) for p in range(2_000)}
    with open_logs(tmp_path) as logs:
        store = OffsetStore.open(logs)
        store.commit("g", offsets)
    with open_logs(tmp_path) as logs:
        assert OffsetStore.open(logs).offsets("g") == offsets


def test_loading_skips_records_that_are_not_offset_commits(tmp_path: Path) -> None:
    with open_logs(tmp_path) as logs:
        store = OffsetStore.open(logs, OffsetStoreConfig(num_partitions=1))
        log = logs.get_log(OFFSETS_TOPIC, 0)
        # A key-less record: a compacted topic refuses one from a producer now, so it
        # comes as a replica stores a leader's batch (an older log may hold one).
        keyless = BatchBuilder()
        keyless.append(1, None, b"no key")
        log.append_as_follower(keyless.build())
        builder = BatchBuilder()
        builder.append(1, b"\x00\x02junk", b"group metadata")
        builder.append(1, encode_key("g", TP), b"\x00\x09bad value")
        builder.append(1, b"\x00\x01\xff", b"truncated key")
        log.append(builder.build())
        store.commit("g", {TP: OffsetValue(3, "", 1)})
    with open_logs(tmp_path) as logs:
        assert OffsetStore.open(logs).offsets("g") == {TP: OffsetValue(3, "", 1)}


# --- cluster mode: what a new coordinator may show ---------------------------------------


def test_a_new_coordinator_shows_only_loaded_and_replicated_commits(tmp_path: Path) -> None:
    """A broker that becomes leader of an offsets partition answers
    COORDINATOR_LOAD_IN_PROGRESS until it reloaded the partition at its new epoch and the
    high watermark reached what it loaded: its cache from an earlier leadership is stale,
    and its log's unreplicated tail (the old leader's unacknowledged commits) could still
    be taken back by another failover.

    The leadership is a real replicated partition of the store's registry, alone in its
    ISR: a commit at its epoch is replicated (the high watermark passes it) at once."""
    with open_logs(tmp_path) as logs:
        registry = PartitionRegistry(logs, 1, ManualClock(), replicated=True)
        store = OffsetStore.open(logs, OffsetStoreConfig(num_partitions=1), registry=registry)
        leadership = registry.get(OFFSETS_TOPIC, 0)
        leadership.make_leader(3, (1, 2), (1,))
        store.commit("g", {TP: OffsetValue(5, "", 1)})  # when this broker led before
        partition_log = logs.get_log(OFFSETS_TOPIC, 0)
        replicated = partition_log.log_end_offset
        leadership.make_follower(2, 3)
        # Copied from the leader since, above the high watermark: commit 9, unacknowledged.
        builder = BatchBuilder()
        builder.append(2, encode_key("g", TP), encode_value(OffsetValue(9, "", 2)))
        partition_log.append(builder.build())
        partition_log.track_high_watermark(replicated)

        with pytest.raises(CoordinatorLoadInProgressError, match="still loading"):
            store.check_loaded(0)  # not leading (the replica manager has not caught up)
        leadership.make_leader(4, (1, 2), (1,))
        with pytest.raises(CoordinatorLoadInProgressError, match="still loading"):
            store.check_loaded(0)  # leading, but the cache is the old leadership's
        assert store.offsets("g")[TP].offset == 5

        store.reload_partition(0)
        assert store.offsets("g")[TP].offset == 9
        with pytest.raises(CoordinatorLoadInProgressError, match="high watermark"):
            store.check_loaded(0)  # commit 9 is loaded but not yet held by the ISR
        partition_log.set_high_watermark(partition_log.log_end_offset)
        store.check_loaded(0)

        # A commit at this epoch waits for its own replication; the partition stays open.
        store.commit("g", {TP: OffsetValue(12, "", 3)})
        store.check_loaded(0)
        # Another election: closed again until the reload at the new epoch.
        leadership.make_leader(5, (1, 2), (1,))
        with pytest.raises(CoordinatorLoadInProgressError, match="still loading"):
            store.check_loaded(0)
        store.reload_partition(0)
        store.check_loaded(0)
        assert store.offsets("g")[TP].offset == 12


def test_a_single_node_coordinator_is_always_loaded(tmp_path: Path) -> None:
    with open_logs(tmp_path) as logs:
        store = OffsetStore.open(logs, OffsetStoreConfig(num_partitions=1))
        store.check_loaded(0)


def test_transactional_offsets_wait_for_their_marker_across_reopens(tmp_path: Path) -> None:
    """TxnOffsetCommit's offsets (issue #28) are pending until the producer's marker on the
    group's partition: COMMIT makes them the group's, ABORT drops them; a reopen replays
    the same decisions, and an undecided transaction's offsets come back pending."""
    committed_tp, aborted_tp, open_tp = (TopicPartition("in", p) for p in range(3))
    with open_logs(tmp_path) as logs:
        store = OffsetStore.open(logs, OffsetStoreConfig(num_partitions=1))
        plog = logs.get_log(OFFSETS_TOPIC, 0)
        store.commit("g", {committed_tp: OffsetValue(1, "", 0)})
        store.commit_transactional("g", 10, 0, {committed_tp: OffsetValue(7, "", 0)})
        store.commit_transactional("g", 11, 0, {aborted_tp: OffsetValue(9, "", 0)})
        store.commit_transactional("g", 12, 0, {open_tp: OffsetValue(5, "", 0)})
        assert store.offsets("g") == {committed_tp: OffsetValue(1, "", 0)}
        assert store.pending_partitions("g") == {committed_tp, aborted_tp, open_tp}
        for producer_id, commit in ((10, True), (11, False)):
            plog.append_marker(producer_id, 0, commit, 0)
            store.end_transaction(0, producer_id, commit)
        assert store.offsets("g")[committed_tp].offset == 7
        assert aborted_tp not in store.offsets("g")
        assert store.pending_partitions("g") == {open_tp}
    with open_logs(tmp_path) as logs:
        store = OffsetStore.open(logs, OffsetStoreConfig(num_partitions=1))
        assert {tp: v.offset for tp, v in store.offsets("g").items()} == {committed_tp: 7}
        assert store.pending_partitions("g") == {open_tp}
        logs.get_log(OFFSETS_TOPIC, 0).append_marker(12, 0, True, 0)
        store.end_transaction(0, 12, True)
        assert store.offsets("g")[open_tp].offset == 5
        assert store.pending_partitions("g") == set()
