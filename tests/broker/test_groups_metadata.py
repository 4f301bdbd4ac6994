"""Classic group membership that survives a restart and a coordinator move (issue #27): the
group metadata record (Kafka's ``GroupMetadataKey`` v2 / ``GroupMetadataValue`` v0-4), its
store in ``__consumer_offsets`` (ordering, tombstones, reload), and the classic state
machine writing it before SyncGroup answers and rebuilding groups from it. Real logs in a
temporary directory and a manual clock; no sockets (the Kafka clients' view is in
``tests/kafka/test_group_persistence.py`` and the cluster test in
``tests/kafka/test_cluster_group_persistence.py``)."""

from __future__ import annotations

import concurrent.futures
import struct
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.broker.core.partitions import PartitionRegistry
from tidelog.broker.groups.assignor import TopicPartition
from tidelog.broker.groups.classic import (
    ClassicError,
    ClassicGroups,
    GroupState,
    JoinRequest,
    JoinResult,
)
from tidelog.broker.groups.manager import GroupConfig, GroupManager
from tidelog.broker.groups.offset_records import (
    GroupMemberMetadata,
    GroupMetadataValue,
    OffsetValue,
    decode_group_key,
    decode_group_value,
    decode_key,
    encode_group_key,
    encode_group_value,
    encode_key,
)
from tidelog.broker.groups.offset_store import OFFSETS_TOPIC, OffsetStore, OffsetStoreConfig
from tidelog.storage.cleaner import LogCleaner
from tidelog.storage.clock import ManualClock
from tidelog.storage.errors import NotLeaderOrFollowerError
from tidelog.storage.log_manager import LogManager, LogManagerConfig

pytestmark = pytest.mark.timeout(60)

GROUP = "g"
SESSION_MS = 10_000
NO_DELAY = GroupConfig(initial_rebalance_delay_ms=0)
_R = TypeVar("_R")

# --- the record format ------------------------------------------------------------------

_text = st.text(max_size=12)
_members = st.lists(
    st.builds(
        GroupMemberMetadata,
        member_id=_text,
        group_instance_id=st.none() | _text,
        client_id=_text,
        client_host=_text,
        rebalance_timeout_ms=st.integers(-(2**31), 2**31 - 1),
        session_timeout_ms=st.integers(-(2**31), 2**31 - 1),
        subscription=st.binary(max_size=20),
        assignment=st.binary(max_size=20),
    ),
    max_size=4,
)
_values = st.builds(
    GroupMetadataValue,
    protocol_type=_text,
    generation=st.integers(-(2**31), 2**31 - 1),
    protocol=st.none() | _text,
    leader=st.none() | _text,
    current_state_timestamp_ms=st.integers(-(2**63), 2**63 - 1),
    members=_members.map(tuple),
)


def _as_version(value: GroupMetadataValue, version: int) -> GroupMetadataValue:
    """What a version keeps of ``value`` (the fields it lacks read as Kafka's defaults)."""
    return GroupMetadataValue(
        value.protocol_type,
        value.generation,
        value.protocol,
        value.leader,
        value.current_state_timestamp_ms if version >= 2 else -1,
        tuple(
            GroupMemberMetadata(
                m.member_id,
                m.group_instance_id if version >= 3 else None,
                m.client_id,
                m.client_host,
                m.rebalance_timeout_ms if version >= 1 else m.session_timeout_ms,
                m.session_timeout_ms,
                m.subscription,
                m.assignment,
            )
            for m in value.members
        ),
    )


@given(_values, st.integers(0, 4))
def test_group_values_round_trip_in_every_version(value: GroupMetadataValue, version: int) -> None:
    assert decode_group_value(encode_group_value(value, version)) == _as_version(value, version)


@given(_text)
def test_group_keys_round_trip_and_are_never_offset_keys(group_id: str) -> None:
    key = encode_group_key(group_id)
    assert decode_group_key(key) == group_id
    assert decode_key(key) is None  # an offset reader skips it
    assert decode_group_key(encode_key(group_id, TopicPartition("t", 0))) is None


def _s(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def _b(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


def test_decodes_kafkas_bytes_built_from_the_spec() -> None:
    """Bytes laid out by hand from GroupMetadataValue.json, not by the encoder: version 3
    (what Kafka writes), version 0 (no rebalance timeout: the session timeout's) and
    version 4 (flexible, with a tagged field the reader skips)."""
    v3 = (
        struct.pack(">h", 3)
        + _s("consumer")
        + struct.pack(">i", 7)
        + _s("range")
        + _s("m-1")
        + struct.pack(">q", 1_700_000_000_000)
        + struct.pack(">i", 1)
        + _s("m-1")
        + _s("static-1")
        + _s("client")
        + _s("/10.0.0.1")
        + struct.pack(">ii", 300_000, 45_000)
        + _b(b"\x00\x01sub")
        + _b(b"\x00\x01asg")
    )
    member = GroupMemberMetadata(
        "m-1", "static-1", "client", "/10.0.0.1", 300_000, 45_000, b"\x00\x01sub", b"\x00\x01asg"
    )
    expected = GroupMetadataValue("consumer", 7, "range", "m-1", 1_700_000_000_000, (member,))
    assert decode_group_value(v3) == expected
    assert encode_group_value(expected) == v3  # the broker writes exactly this

    v0 = (
        struct.pack(">h", 0)
        + _s("consumer")
        + struct.pack(">i", 2)
        + struct.pack(">h", -1)  # null protocol
        + struct.pack(">h", -1)  # null leader
        + struct.pack(">i", 1)
        + _s("m")
        + _s("c")
        + _s("h")
        + struct.pack(">i", 10_000)
        + _b(b"")
        + _b(b"")
    )
    (old,) = decode_group_value(v0).members
    assert (old.rebalance_timeout_ms, old.session_timeout_ms) == (10_000, 10_000)

    def compact(text: str) -> bytes:
        return bytes([len(text) + 1]) + text.encode()

    v4 = (
        struct.pack(">h", 4)
        + compact("consumer")
        + struct.pack(">i", 7)
        + compact("range")
        + b"\x00"  # null leader
        + struct.pack(">q", -1)
        + b"\x02"  # one member
        + compact("m-1")
        + b"\x00"  # null instance id
        + compact("client")
        + compact("/10.0.0.1")
        + struct.pack(">ii", 300_000, 45_000)
        + b"\x04sub"
        + b"\x01"  # empty assignment
        + b"\x00"  # the member's tagged fields: none
        + b"\x01\x05\x02hi"  # the value's: one unknown tag (5), two bytes
    )
    decoded = decode_group_value(v4)
    assert decoded.leader is None
    assert decoded.members == (
        GroupMemberMetadata("m-1", None, "client", "/10.0.0.1", 300_000, 45_000, b"sub", b""),
    )
    assert decode_group_key(b"\x00\x02" + _s("billing")) == "billing"


def test_bad_group_metadata_raises() -> None:
    value = encode_group_value(GroupMetadataValue("consumer", 1, "range", "m", 0, ()))
    for bad in (value[:3], value + b"x", b"\x00\x05" + value[2:], b"\x00"):
        with pytest.raises(ValueError, match="group metadata"):
            decode_group_value(bad)
    with pytest.raises(ValueError, match="group metadata"):
        decode_group_key(encode_group_key("g") + b"x")


# --- the store --------------------------------------------------------------------------


def _value(generation: int, members: int = 1) -> GroupMetadataValue:
    return GroupMetadataValue(
        "consumer",
        generation,
        "range",
        "m0" if members else None,
        1,
        tuple(
            GroupMemberMetadata(f"m{i}", None, "c", "h", 20_000, SESSION_MS, b"s", b"a")
            for i in range(members)
        ),
    )


def _logs(path: Path, clock: ManualClock | None = None) -> LogManager:
    return LogManager.open(path, LogManagerConfig(cleaner_enabled=False), clock or ManualClock())


def test_group_metadata_is_durable_ordered_and_deleted_with_the_offsets(tmp_path: Path) -> None:
    tp = TopicPartition("events", 0)
    with _logs(tmp_path) as logs:
        store = OffsetStore.open(logs)
        store.commit(GROUP, {tp: OffsetValue(5, "", 1)})
        assert store.store_group(GROUP, _value(1), sequence=1)
        assert store.store_group(GROUP, _value(3), sequence=3)
        # Built before the record of sequence 3 (stale state): never overwrites it.
        assert not store.store_group(GROUP, _value(2, members=0), sequence=2)
        assert store.store_group("other", _value(9), sequence=4)
        assert store.group_metadata()[GROUP] == _value(3)
        partition_log = logs.get_log(OFFSETS_TOPIC, store.partition_for(GROUP))
        assert partition_log.recovery_point == partition_log.log_end_offset  # fsynced
    with _logs(tmp_path) as logs:
        store = OffsetStore.open(logs)
        assert store.group_metadata() == {GROUP: _value(3), "other": _value(9)}
        assert store.offsets(GROUP) == {tp: OffsetValue(5, "", 1)}
        store.delete(GROUP, [tp], group_sequence=5)
        # A write drawn before the deletion stays deleted.
        assert not store.store_group(GROUP, _value(4), sequence=4)
    with _logs(tmp_path) as logs:
        store = OffsetStore.open(logs)
        assert store.group_metadata() == {"other": _value(9)}
        assert store.offsets(GROUP) == {}


def test_a_reload_loads_group_metadata_and_fences_older_writes(tmp_path: Path) -> None:
    with _logs(tmp_path) as logs:
        registry = PartitionRegistry(logs, 1, ManualClock(), replicated=True)
        store = OffsetStore.open(logs, OffsetStoreConfig(num_partitions=1), registry=registry)
        leadership = registry.get(OFFSETS_TOPIC, 0)
        with pytest.raises(NotLeaderOrFollowerError):
            store.store_group(GROUP, _value(1), sequence=1)  # not the coordinator
        leadership.make_leader(3, (1,), (1,))
        assert store.store_group(GROUP, _value(2), sequence=2)
        seen: list[dict[str, GroupMetadataValue]] = []
        store.reload_partition(0, sequence_floor=10, on_groups=seen.append)
        assert seen == [{GROUP: _value(2)}]
        assert not store.store_group(GROUP, _value(0, members=0), sequence=9)
        assert store.store_group(GROUP, _value(3), sequence=11)
        assert store.group_metadata(0) == {GROUP: _value(3)}


def test_compaction_keeps_the_latest_group_record_beside_the_offsets(tmp_path: Path) -> None:
    tp = TopicPartition("events", 0)
    clock = ManualClock()
    with _logs(tmp_path / "data", clock) as logs:
        store = OffsetStore.open(logs, OffsetStoreConfig(num_partitions=1))
        for generation in range(1, 6):
            store.commit(GROUP, {tp: OffsetValue(generation * 10, "", 1)})
            store.store_group(GROUP, _value(generation), sequence=generation)
        store.store_group("gone", _value(1), sequence=6)
        store.delete("gone", [], group_sequence=7)
        partition_log = logs.get_log(OFFSETS_TOPIC, 0)
        partition_log.roll()  # only rolled segments are cleaned
        result = LogCleaner(tmp_path, clock).clean_log(partition_log, force=True)
        assert result.cleaned
        # Of 5 commits, 5 group records, one group record and its tombstone: the latest
        # commit, the latest group record (the tombstone stays until delete.retention.ms).
        assert result.records_retained == 3
    with _logs(tmp_path / "data", clock) as logs:
        store = OffsetStore.open(logs)
        assert store.group_metadata() == {GROUP: _value(5)}
        assert store.offsets(GROUP) == {tp: OffsetValue(50, "", 1)}


# --- the classic state machine ------------------------------------------------------------


def _join(
    groups: ClassicGroups, member_id: str = "", instance_id: str | None = None
) -> concurrent.futures.Future[JoinResult]:
    return groups.join(
        JoinRequest(
            group_id=GROUP,
            member_id=member_id,
            group_instance_id=instance_id,
            client_id="c",
            client_host="h",
            session_timeout_ms=SESSION_MS,
            rebalance_timeout_ms=20_000,
            protocol_type="consumer",
            protocols=(("range", b"sub-" + (instance_id or "dynamic").encode()),),
            require_known_member_id=True,
        )
    )


def _done(future: concurrent.futures.Future[_R]) -> _R:
    assert future.done(), "still parked"
    return future.result()


def _stable_pair(groups: ClassicGroups) -> tuple[JoinResult, JoinResult]:
    """Static member "a" (the leader) and a dynamic member, synced."""
    a = _done(_join(groups, instance_id="a"))
    b_id = _done(_join(groups)).member_id
    b_join = _join(groups, b_id)
    a, b = _done(_join(groups, a.member_id, "a")), _done(b_join)
    assert a.leader == a.member_id
    follower_sync = groups.sync(GROUP, b.member_id, b.generation_id, {})
    assert not follower_sync.done()
    leader_sync = groups.sync(
        GROUP, a.member_id, a.generation_id, {a.member_id: b"pa", b.member_id: b"pb"}, "a"
    )
    assert _done(leader_sync).assignment == b"pa"
    assert _done(follower_sync).assignment == b"pb"
    return a, b


def test_membership_survives_a_restart_and_dead_members_expire(tmp_path: Path) -> None:
    clock = ManualClock()
    with _logs(tmp_path, clock) as logs:
        manager = GroupManager.open(logs, clock, NO_DELAY)
        written: list[int] = []

        def writer(group_id: str, value: GroupMetadataValue | None, sequence: int) -> bool:
            # The record is durable before any SyncGroup is answered.
            assert value is not None
            written.append(value.generation)
            return manager.store.store_group(group_id, value, sequence)

        groups = ClassicGroups(clock, initial_rebalance_delay_ms=0, writer=writer)
        a, b = _stable_pair(groups)
        assert written == [a.generation_id]
        stored = manager.store.group_metadata()[GROUP]
        assert {(m.member_id, m.group_instance_id, m.assignment) for m in stored.members} == {
            (a.member_id, "a", b"pa"),
            (b.member_id, None, b"pb"),
        }
        assert stored.members[0].subscription.startswith(b"sub-")

    clock.advance(SESSION_MS - 1)  # the restart takes most of a session
    with _logs(tmp_path, clock) as logs:
        manager = GroupManager.open(logs, clock, NO_DELAY)
        classic = manager.classic
        described = classic.describe(GROUP)
        assert described is not None
        assert described.group_state == GroupState.STABLE.value
        # Sessions restarted at the load: "a" keeps heartbeating, "b" died meanwhile.
        clock.advance(SESSION_MS - 1)
        generation = a.generation_id
        assert classic.heartbeat(GROUP, a.member_id, generation, "a") is ClassicError.NONE
        assert classic.check_commit(GROUP, a.member_id, generation, "a") is ClassicError.NONE
        assert _done(classic.sync(GROUP, a.member_id, generation, {}, "a")).assignment == b"pa"
        assert classic.heartbeat(GROUP, "stranger", generation) is (ClassicError.UNKNOWN_MEMBER_ID)
        clock.advance(2)
        manager.expire()  # "b" expires: its session passed since the load
        assert classic.heartbeat(GROUP, a.member_id, generation, "a") is (
            ClassicError.REBALANCE_IN_PROGRESS
        )
        # A second incarnation of static member "a" would be fenced as before the restart.
        assert classic.has_instance(GROUP, "a")


def test_an_emptied_group_comes_back_empty(tmp_path: Path) -> None:
    clock = ManualClock()
    with _logs(tmp_path, clock) as logs:
        manager = GroupManager.open(logs, clock, NO_DELAY)
        classic = manager.classic
        a = _done(_join(classic, instance_id="a"))
        leader_sync = classic.sync(GROUP, a.member_id, a.generation_id, {a.member_id: b"x"}, "a")
        assert _done(leader_sync).error is ClassicError.NONE
        assert manager.store.group_metadata()[GROUP].members
        assert classic.leave(GROUP, a.member_id, "a") is ClassicError.NONE
        assert classic.flush_writes() == 1  # the expiry thread's step
        emptied = manager.store.group_metadata()[GROUP]
        assert (emptied.members, emptied.protocol, emptied.leader) == ((), None, None)
        assert emptied.generation == a.generation_id
        manager.delete_group(GROUP)
        assert manager.store.group_metadata() == {}
    with _logs(tmp_path, clock) as logs:
        manager = GroupManager.open(logs, clock, NO_DELAY)
        assert manager.classic.describe(GROUP) is None
        assert manager.store.group_metadata() == {}


def test_a_failed_store_answers_every_sync_and_rebalances() -> None:
    clock = ManualClock()

    def refused(group_id: str, value: GroupMetadataValue | None, sequence: int) -> bool:
        raise NotLeaderOrFollowerError("the coordinator moved")

    groups = ClassicGroups(clock, initial_rebalance_delay_ms=0, writer=refused)
    a = _done(_join(groups, instance_id="a"))
    synced = groups.sync(GROUP, a.member_id, a.generation_id, {a.member_id: b"x"}, "a")
    assert _done(synced).error is ClassicError.NOT_COORDINATOR
    assert groups.heartbeat(GROUP, a.member_id, a.generation_id, "a") is (
        ClassicError.REBALANCE_IN_PROGRESS
    )


def test_a_new_leader_rebuilds_its_groups_and_a_continuing_one_keeps_them(
    tmp_path: Path,
) -> None:
    """Cluster mode: a broker becoming leader of the offsets partition (after another
    led it) rebuilds its classic groups from the records; one whose leader epoch was only
    bumped (it led the epoch before too) keeps its in-memory groups, rebalance included."""
    clock = ManualClock()
    with _logs(tmp_path, clock) as logs:
        registry = PartitionRegistry(logs, 1, clock, replicated=True)
        config = GroupConfig(
            offsets=OffsetStoreConfig(num_partitions=1), initial_rebalance_delay_ms=0
        )
        manager = GroupManager.open(logs, clock, config, registry=registry)
        leadership = registry.get(OFFSETS_TOPIC, 0)
        leadership.make_leader(3, (1,), (1,))
        manager.reload_partition(0)
        classic = manager.classic
        a, b = _stable_pair(classic)
        assert not manager.store.led_without_a_break(0)
        leadership.make_leader(4, (1,), (1,))  # an ISR change: the same leader, epoch + 1
        assert manager.store.led_without_a_break(0)
        waiting = _join(classic, b.member_id)  # a rebalance in progress
        manager.reload_partition(0)
        assert not waiting.done()  # not cut short
        assert classic.heartbeat(GROUP, a.member_id, a.generation_id, "a") is (
            ClassicError.REBALANCE_IN_PROGRESS
        )
        leadership.make_follower(2, 5)
        leadership.make_leader(6, (1,), (1,))  # led again after another broker did
        assert not manager.store.led_without_a_break(0)
        manager.reload_partition(0)
        assert _done(waiting).error is ClassicError.NOT_COORDINATOR
        # Back to the last record: Stable at the generation the leader's sync stored.
        assert classic.heartbeat(GROUP, b.member_id, b.generation_id) is ClassicError.NONE


def test_unload_forgets_stale_groups_and_answers_parked_requests() -> None:
    groups = ClassicGroups(ManualClock(), initial_rebalance_delay_ms=0)
    _done(_join(groups, instance_id="a"))
    b_id = _done(_join(groups)).member_id
    waiting = _join(groups, b_id)  # parked: "a" must rejoin
    assert not waiting.done()
    groups.unload(lambda group_id: group_id == GROUP)
    assert _done(waiting).error is ClassicError.NOT_COORDINATOR
    assert groups.describe(GROUP) is None
