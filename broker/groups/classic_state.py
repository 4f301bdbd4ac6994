"""A classic group's mutable state, the views read from it, and its conversion to and
from the group metadata record that keeps it in ``__consumer_offsets``
(``offset_records.GroupMetadataValue``).

Views (``description_of``, ``snapshot_of``, ``subscriptions_of``) are what DescribeGroups,
``GroupManager.describe_group`` and OffsetDelete read; the caller holds the lock.

``ClassicMember`` and ``ClassicGroup`` are what ``broker.groups.classic`` changes under its
lock; they are not thread-safe on their own. The conversions are pure:

- ``record_of``: the group as Kafka's ``GroupMetadataValue`` writes it after a completed
  rebalance: generation, protocol type and chosen protocol, leader, and per member its ids,
  client, timeouts, its metadata for the chosen protocol (its "subscription") and the
  assignment the leader gave it. ``empty_record``: the same for a group that emptied (no
  protocol, no leader, no members; the generation kept).
- ``group_from_record``: a loaded record back into a group. A record with members is a
  ``Stable`` group at the stored generation; every member's session starts again at the load
  (``now_ms``), as Kafka's coordinator reschedules every loaded member's heartbeat, so a
  member that keeps heartbeating to the new coordinator stays and one that died is expired
  by its session timeout as usual. A member offers the chosen protocol only (the record
  keeps no other), which is all Kafka keeps too. A record without members is None: an empty
  group is not kept in memory here (``ClassicGroups`` drops an empty group it no longer
  needs), and its next join starts it again.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field

from tidelog.broker.groups.assignor import TopicPartition
from tidelog.broker.groups.classic_types import (
    ClassicGroupDescription,
    ClassicGroupSnapshot,
    ClassicMemberDescription,
    ClassicSubscriptions,
    GroupState,
    JoinResult,
    SyncResult,
)
from tidelog.broker.groups.consumer_protocol import (
    assigned_partitions,
    parse_subscribed_topics,
    subscribed_topics,
)
from tidelog.broker.groups.coordinator import MemberView
from tidelog.broker.groups.offset_records import GroupMemberMetadata, GroupMetadataValue

__all__ = [
    "ClassicGroup",
    "ClassicMember",
    "description_of",
    "empty_record",
    "group_from_record",
    "metadata_of",
    "record_of",
    "select_protocol",
    "snapshot_of",
    "subscriptions_of",
    "supports_a_common_protocol",
]


@dataclass(slots=True, eq=False)
class ClassicMember:
    """One member of a classic group (mutable; guarded by ``ClassicGroups``' lock)."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    last_heartbeat_ms: int
    assignment: bytes = b""
    join: concurrent.futures.Future[JoinResult] | None = None
    sync: concurrent.futures.Future[SyncResult] | None = None


@dataclass(slots=True, eq=False)
class ClassicGroup:
    """One classic group (mutable; guarded by ``ClassicGroups``' lock)."""

    group_id: str
    state: GroupState = GroupState.EMPTY
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: dict[str, ClassicMember] = field(default_factory=dict)
    # Ids handed out with MEMBER_ID_REQUIRED, not joined yet -> when (monotonic ms).
    pending: dict[str, int] = field(default_factory=dict)
    rebalance_deadline_ms: int = 0
    # Static members (KIP-345): group.instance.id -> its current member id.
    static_members: dict[str, str] = field(default_factory=dict)
    # group.initial.rebalance.delay.ms: the first rebalance of an empty group completes
    # no sooner than this (0: no delay), extended while members keep arriving, up to
    # the limit (``classic``'s module docstring).
    initial_delay_until_ms: int = 0
    initial_delay_limit_ms: int = 0
    member_added_in_delay: bool = False
    # The leader's SyncGroup is storing the group metadata (one write per generation).
    storing: bool = False


def metadata_of(member: ClassicMember, protocol_name: str | None) -> bytes:
    """The member's metadata for ``protocol_name`` (b"" if it offers no such protocol)."""
    for name, metadata in member.protocols:
        if name == protocol_name:
            return metadata
    return b""


def supports_a_common_protocol(
    group: ClassicGroup, member_id: str, protocols: tuple[tuple[str, bytes], ...]
) -> bool:
    names = {name for name, _ in protocols}
    for other in group.members.values():
        if other.member_id != member_id:
            names &= {name for name, _ in other.protocols}
    return bool(names)


def select_protocol(group: ClassicGroup) -> str | None:
    """The first of the leader's protocols (the first member's, before one is
    chosen) that every member supports."""
    if not group.members:
        return None
    leader = group.members.get(group.leader) or next(iter(group.members.values()))
    common = set.intersection(*({n for n, _ in m.protocols} for m in group.members.values()))
    return next((name for name, _ in leader.protocols if name in common), None)


def record_of(
    group: ClassicGroup, assignments: dict[str, bytes] | None, wall_ms: int
) -> GroupMetadataValue:
    """The group's metadata record: its members with ``assignments`` (member id ->
    assignment; None: each member's current one). ``wall_ms``: the state timestamp."""
    return GroupMetadataValue(
        protocol_type=group.protocol_type or "",
        generation=group.generation_id,
        protocol=group.protocol_name,
        leader=group.leader or None,
        current_state_timestamp_ms=wall_ms,
        members=tuple(
            GroupMemberMetadata(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                rebalance_timeout_ms=m.rebalance_timeout_ms,
                session_timeout_ms=m.session_timeout_ms,
                subscription=metadata_of(m, group.protocol_name),
                assignment=(
                    m.assignment if assignments is None else assignments.get(m.member_id, b"")
                ),
            )
            for m in group.members.values()
        ),
    )


def empty_record(protocol_type: str | None, generation: int, wall_ms: int) -> GroupMetadataValue:
    """The record of a group that emptied (Kafka writes it so that a reload does not bring
    the members back)."""
    return GroupMetadataValue(protocol_type or "", generation, None, None, wall_ms, ())


def group_from_record(group_id: str, value: GroupMetadataValue, now_ms: int) -> ClassicGroup | None:
    """The group a loaded record describes, ``Stable`` with every session restarted at
    ``now_ms`` (monotonic); None for a record without members (module docstring)."""
    if not value.members:
        return None
    group = ClassicGroup(
        group_id,
        state=GroupState.STABLE,
        generation_id=value.generation,
        protocol_type=value.protocol_type,
        protocol_name=value.protocol,
        leader=value.leader or "",
    )
    protocol = value.protocol or ""
    for stored in value.members:
        group.members[stored.member_id] = ClassicMember(
            member_id=stored.member_id,
            group_instance_id=stored.group_instance_id,
            client_id=stored.client_id,
            client_host=stored.client_host,
            session_timeout_ms=stored.session_timeout_ms,
            rebalance_timeout_ms=stored.rebalance_timeout_ms,
            protocol_type=value.protocol_type,
            protocols=((protocol, stored.subscription),),
            last_heartbeat_ms=now_ms,
            assignment=stored.assignment,
        )
        if stored.group_instance_id is not None:
            group.static_members[stored.group_instance_id] = stored.member_id
    if group.leader not in group.members:
        group.leader = next(iter(group.members))
    return group


# --- views --------------------------------------------------------------------------------


def description_of(group: ClassicGroup) -> ClassicGroupDescription:
    """The group as DescribeGroups shows it (each member's metadata of the chosen protocol)."""
    return ClassicGroupDescription(
        group.group_id,
        group.state.value,
        group.protocol_type or "",
        group.protocol_name or "",
        tuple(
            ClassicMemberDescription(
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                metadata_of(m, group.protocol_name),
                m.assignment,
            )
            for m in group.members.values()
        ),
    )


def snapshot_of(group: ClassicGroup) -> ClassicGroupSnapshot:
    """The group as ``GroupManager.describe_group`` shows it."""
    return ClassicGroupSnapshot(
        group.group_id,
        group.state.value,
        group.generation_id,
        tuple(member_view(group, m) for m in group.members.values()),
    )


def member_view(group: ClassicGroup, member: ClassicMember) -> MemberView:
    """One member as the core's group views show it (topics and partitions decoded for a
    "consumer" group; none for another protocol type)."""
    topics: frozenset[str] = frozenset()
    assigned: frozenset[TopicPartition] = frozenset()
    if group.protocol_type == "consumer":
        topics = subscribed_topics(metadata_of(member, group.protocol_name))
        assigned = assigned_partitions(member.assignment)
    return MemberView(
        member_id=member.member_id,
        client_id=member.client_id,
        member_epoch=group.generation_id,
        subscribed_topics=topics,
        assigned=assigned,
        revoking=frozenset(),
        target=assigned,
        instance_id=member.group_instance_id,
    )


def subscriptions_of(group: ClassicGroup) -> ClassicSubscriptions:
    """The group's live members and their subscribed topics (``ClassicSubscriptions``). A
    member's topics are read from the metadata of the chosen protocol, or of every
    protocol it offered while the first rebalance has chosen none."""
    topics: set[str] | None = set()
    if group.members and group.protocol_type != "consumer":
        topics = None
    for member in group.members.values():
        if topics is None:
            break
        offered = (
            [metadata_of(member, group.protocol_name)]
            if group.protocol_name is not None
            else [metadata for _, metadata in member.protocols]
        )
        for metadata in offered:
            parsed = parse_subscribed_topics(metadata)
            if parsed is None:
                topics = None
                break
            topics.update(parsed)
    return ClassicSubscriptions(
        len(group.members),
        group.protocol_type or "",
        None if topics is None else frozenset(topics),
    )
