"""Kafka's classic consumer group protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup).

Tidelog's own groups are KIP-848 groups (``broker.groups``: the broker assigns). Kafka
clients (kafka-python, aiokafka, kcat, confluent-kafka by default) speak the classic
protocol: the broker only gathers members and hands the leader everyone's subscription;
the leader computes the assignment (range, roundrobin, sticky: opaque bytes here) and
hands it back in SyncGroup, which the broker distributes.

State per group, as in Kafka's ``GroupMetadata``::

    Empty --join--> PreparingRebalance --all known members joined, or the rebalance
      ^                 ^       |            timeout removed the rest--> CompletingRebalance
      |                 |       |                                          | leader's Sync
      +--last leaves----+--join, leave, session expiry-- Stable <----------+

- A first JoinGroup without a member id gets a new id and ``MEMBER_ID_REQUIRED`` (v4+,
  KIP-394) and joins again with it; before v4 it joins at once.
- The rebalance completes once every member known when it began has joined again; a
  member that has not by the rebalance timeout (the largest any member gave) is removed.
  Completing bumps the generation and answers every waiting JoinGroup: the leader gets
  every member's metadata for the chosen protocol (the first of the leader's protocols
  that every member supports).
- Heartbeats while a rebalance is prepared answer ``REBALANCE_IN_PROGRESS``, so members
  rejoin; while it completes (between JoinGroup and SyncGroup) they answer NONE, as Kafka.
  A member whose session timeout passes without a heartbeat is removed.
- Committed offsets are the core's (``broker.kafka.offsets``): ``check_commit`` only
  validates the member and generation.

Membership lives in memory, as Tidelog's own group membership does: after a restart
members get ``UNKNOWN_MEMBER_ID`` and rejoin; committed offsets are in the log.

Not thread-safe: everything runs on the Kafka listener's event loop thread. Other threads
see the groups through ``ClassicGroupsOnLoop`` (``tidelog groups list/describe`` over
gRPC, the console), which asks the loop for a snapshot, bounded in time: members with
their client ids and, for ``protocol_type`` "consumer", the subscription and assignment
decoded from Kafka's ConsumerProtocol bytes (as Kafka's ``kafka-consumer-groups`` does).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import itertools
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from kio.schema.consumer_protocol_assignment.v0.data import ConsumerProtocolAssignment
from kio.schema.consumer_protocol_subscription.v0.data import ConsumerProtocolSubscription
from kio.serial import entity_reader

from broker.groups.assignor import TopicPartition
from broker.groups.coordinator import MemberView
from broker.groups.manager import ForeignGroup
from broker.kafka.errors import NONE, error_code_for

__all__ = [
    "ClassicGroups",
    "ClassicGroupsOnLoop",
    "GroupState",
    "JoinResult",
    "Member",
    "SyncResult",
]

log = logging.getLogger(__name__)

_UNKNOWN_MEMBER = error_code_for("UNKNOWN_MEMBER_ID")
_ILLEGAL_GENERATION = error_code_for("ILLEGAL_GENERATION")
_REBALANCING = error_code_for("REBALANCE_IN_PROGRESS")
_INCONSISTENT = error_code_for("INCONSISTENT_GROUP_PROTOCOL")
_MEMBER_ID_REQUIRED = error_code_for("MEMBER_ID_REQUIRED")
_INVALID_GROUP_ID = error_code_for("INVALID_GROUP_ID")
_INVALID_SESSION_TIMEOUT = error_code_for("INVALID_SESSION_TIMEOUT")

# Kafka's group.min/max.session.timeout.ms defaults.
MIN_SESSION_TIMEOUT_MS = 6_000
MAX_SESSION_TIMEOUT_MS = 1_800_000


class GroupState(enum.Enum):
    """Kafka's classic group states (the names DescribeGroups reports)."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"


@dataclass(frozen=True, slots=True)
class JoinResult:
    """What a JoinGroup is answered with."""

    error_code: int
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    members: tuple[tuple[str, str | None, bytes], ...] = ()  # leader only


@dataclass(frozen=True, slots=True)
class SyncResult:
    """What a SyncGroup is answered with."""

    error_code: int
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(slots=True, eq=False)
class Member:
    """One member of a classic group."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    last_heartbeat_s: float
    assignment: bytes = b""
    join: asyncio.Future[JoinResult] | None = None
    sync: asyncio.Future[SyncResult] | None = None


@dataclass(slots=True, eq=False)
class _Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: dict[str, Member] = field(default_factory=dict)
    # Ids handed out with MEMBER_ID_REQUIRED, not joined yet -> when (monotonic s).
    pending: dict[str, float] = field(default_factory=dict)
    rebalance_deadline_s: float = 0.0


class ClassicGroups:
    """Every classic group of this broker (see the module docstring)."""

    def __init__(self) -> None:
        self._groups: dict[str, _Group] = {}
        self._ids = itertools.count(1)
        self._reaper: asyncio.Task[None] | None = None

    def start_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the session-expiry task on ``loop`` (the listener's, before it runs)."""
        self._reaper = loop.create_task(self._reap_forever())

    def stop(self) -> None:
        """Stop the session-expiry task."""
        if self._reaper is not None:
            self._reaper.cancel()

    # --- the protocol -------------------------------------------------------------------

    async def join(
        self,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        *,
        require_known_member_id: bool,
    ) -> JoinResult:
        """JoinGroup: waits until the rebalance completes (module docstring)."""
        if not group_id:
            return JoinResult(_INVALID_GROUP_ID)
        if not MIN_SESSION_TIMEOUT_MS <= session_timeout_ms <= MAX_SESSION_TIMEOUT_MS:
            return JoinResult(_INVALID_SESSION_TIMEOUT)
        group = self._groups.setdefault(group_id, _Group(group_id))
        if not protocols or (group.members and group.protocol_type not in (None, protocol_type)):
            return JoinResult(_INCONSISTENT)
        if not self._supports_a_common_protocol(group, member_id, protocols):
            return JoinResult(_INCONSISTENT)
        if not member_id:
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            if require_known_member_id:
                # KIP-394: the client joins again with this id.
                group.pending[member_id] = time.monotonic()
                return JoinResult(_MEMBER_ID_REQUIRED, member_id=member_id)
        elif member_id not in group.members and group.pending.pop(member_id, None) is None:
            return JoinResult(_UNKNOWN_MEMBER)
        now = time.monotonic()
        member = group.members.get(member_id)
        if member is None:
            member = Member(
                member_id,
                group_instance_id,
                client_id,
                client_host,
                session_timeout_ms,
                rebalance_timeout_ms,
                protocol_type,
                protocols,
                now,
            )
            group.members[member_id] = member
        else:
            member.protocols = protocols
            member.session_timeout_ms = session_timeout_ms
            member.rebalance_timeout_ms = rebalance_timeout_ms
            member.last_heartbeat_s = now
        if group.protocol_type is None:
            group.protocol_type = protocol_type
        if member.join is not None and not member.join.done():
            member.join.set_result(JoinResult(_REBALANCING))  # superseded by this join
        member.join = asyncio.get_running_loop().create_future()
        self._prepare_rebalance(group)
        self._maybe_complete_join(group)
        return await member.join

    async def sync(
        self,
        group_id: str,
        member_id: str,
        generation_id: int,
        assignments: dict[str, bytes],
    ) -> SyncResult:
        """SyncGroup: the leader's assignments are stored and handed to every member."""
        group = self._groups.get(group_id)
        if group is None or member_id not in group.members:
            return SyncResult(_UNKNOWN_MEMBER)
        if generation_id != group.generation_id:
            return SyncResult(_ILLEGAL_GENERATION)
        member = group.members[member_id]
        member.last_heartbeat_s = time.monotonic()
        if group.state == GroupState.PREPARING_REBALANCE:
            return SyncResult(_REBALANCING)
        if group.state == GroupState.STABLE:
            return self._sync_result(group, member)
        # Completing the rebalance: the leader's answer completes everyone's.
        member.sync = asyncio.get_running_loop().create_future()
        if member_id == group.leader:
            for m in group.members.values():
                m.assignment = assignments.get(m.member_id, b"")
            group.state = GroupState.STABLE
            for m in group.members.values():
                if m.sync is not None and not m.sync.done():
                    m.sync.set_result(self._sync_result(group, m))
        return await member.sync

    def heartbeat(self, group_id: str, member_id: str, generation_id: int) -> int:
        """Heartbeat: NONE, or the error telling the member to rejoin."""
        group = self._groups.get(group_id)
        if group is None or member_id not in group.members:
            return _UNKNOWN_MEMBER
        group.members[member_id].last_heartbeat_s = time.monotonic()
        if group.state == GroupState.PREPARING_REBALANCE:
            return _REBALANCING
        if generation_id != group.generation_id:
            return _ILLEGAL_GENERATION
        # CompletingRebalance: the member got its JoinGroup answer and is about to sync;
        # as in Kafka, a heartbeat then is normal (answering REBALANCE_IN_PROGRESS would
        # send it back to JoinGroup and restart the rebalance).
        return NONE

    def leave(self, group_id: str, member_id: str) -> int:
        """LeaveGroup of one member: removed; the others rebalance."""
        group = self._groups.get(group_id)
        if group is None or member_id not in group.members:
            return _UNKNOWN_MEMBER
        self._remove(group, member_id)
        return NONE

    def has_member(self, group_id: str, member_id: str) -> bool:
        """Whether ``member_id`` is a member of classic group ``group_id``."""
        group = self._groups.get(group_id)
        return group is not None and member_id in group.members

    def check_commit(self, group_id: str, member_id: str, generation_id: int) -> int:
        """Whether a classic member may commit now: NONE or Kafka's error."""
        group = self._groups.get(group_id)
        if group is None or member_id not in group.members:
            return _UNKNOWN_MEMBER
        if generation_id != group.generation_id:
            return _ILLEGAL_GENERATION
        # As Kafka: commits of the current generation are accepted while the group
        # prepares a rebalance (members commit before rejoining: on_revoke), refused
        # while it completes one (the assignment is being handed out).
        if group.state == GroupState.COMPLETING_REBALANCE:
            return _REBALANCING
        return NONE

    # --- admin ----------------------------------------------------------------------------

    def list_groups(self) -> list[tuple[str, str, str]]:
        """(group id, protocol type, state) of every classic group with members."""
        return [
            (g.group_id, g.protocol_type or "", g.state.value)
            for g in self._groups.values()
            if g.members
        ]

    def describe(self, group_id: str) -> dict[str, object] | None:
        """A group as DescribeGroups shows it, or None if unknown here."""
        group = self._groups.get(group_id)
        if group is None or not group.members:
            return None
        return {
            "group_id": group.group_id,
            "group_state": group.state.value,
            "protocol_type": group.protocol_type or "",
            "protocol_data": group.protocol_name or "",
            "members": [
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.group_instance_id,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    "member_metadata": self._metadata(m, group.protocol_name),
                    "member_assignment": m.assignment,
                }
                for m in group.members.values()
            ],
        }

    def snapshot(self, group_id: str | None = None) -> list[ForeignGroup]:
        """Groups with members (one, with ``group_id``) as ``describe_group`` shows them."""
        if group_id is not None:
            found = self._groups.get(group_id)
            groups = [] if found is None else [found]
        else:
            groups = list(self._groups.values())
        return [
            ForeignGroup(
                g.group_id,
                g.state.value,
                g.generation_id,
                tuple(self._member_view(g, m) for m in g.members.values()),
            )
            for g in groups
            if g.members
        ]

    def _member_view(self, group: _Group, member: Member) -> MemberView:
        topics: frozenset[str] = frozenset()
        assigned: frozenset[TopicPartition] = frozenset()
        if group.protocol_type == "consumer":
            topics = _subscribed_topics(self._metadata(member, group.protocol_name))
            assigned = _assigned_partitions(member.assignment)
        return MemberView(
            member_id=member.member_id,
            client_id=member.client_id,
            member_epoch=group.generation_id,
            subscribed_topics=topics,
            assigned=assigned,
            revoking=frozenset(),
            target=assigned,
        )

    # --- the state machine ----------------------------------------------------------------

    @staticmethod
    def _supports_a_common_protocol(
        group: _Group, member_id: str, protocols: list[tuple[str, bytes]]
    ) -> bool:
        names = {name for name, _ in protocols}
        for other in group.members.values():
            if other.member_id != member_id:
                names &= {name for name, _ in other.protocols}
        return bool(names)

    def _prepare_rebalance(self, group: _Group) -> None:
        if group.state == GroupState.PREPARING_REBALANCE:
            return
        if group.state == GroupState.COMPLETING_REBALANCE:
            for m in group.members.values():
                if m.sync is not None and not m.sync.done():
                    m.sync.set_result(SyncResult(_REBALANCING))
        group.state = GroupState.PREPARING_REBALANCE
        timeout_ms = max((m.rebalance_timeout_ms for m in group.members.values()), default=0)
        group.rebalance_deadline_s = time.monotonic() + timeout_ms / 1000

    def _maybe_complete_join(self, group: _Group) -> None:
        if group.state != GroupState.PREPARING_REBALANCE:
            return
        if any(m.join is None or m.join.done() for m in group.members.values()):
            return  # someone has not rejoined yet
        if not group.members:
            group.state = GroupState.EMPTY
            group.protocol_type = group.protocol_name = None
            group.leader = ""
            return
        group.generation_id += 1
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        leader = group.members[group.leader]
        common = set.intersection(*({n for n, _ in m.protocols} for m in group.members.values()))
        group.protocol_name = next(name for name, _ in leader.protocols if name in common)
        group.state = GroupState.COMPLETING_REBALANCE
        everyone = tuple(
            (m.member_id, m.group_instance_id, self._metadata(m, group.protocol_name))
            for m in group.members.values()
        )
        for m in group.members.values():
            assert m.join is not None
            m.last_heartbeat_s = time.monotonic()
            m.join.set_result(
                JoinResult(
                    NONE,
                    group.generation_id,
                    group.protocol_type,
                    group.protocol_name,
                    group.leader,
                    m.member_id,
                    everyone if m.member_id == group.leader else (),
                )
            )

    @staticmethod
    def _metadata(member: Member, protocol_name: str | None) -> bytes:
        for name, metadata in member.protocols:
            if name == protocol_name:
                return metadata
        return b""

    @staticmethod
    def _sync_result(group: _Group, member: Member) -> SyncResult:
        return SyncResult(NONE, group.protocol_type, group.protocol_name, member.assignment)

    def _remove(self, group: _Group, member_id: str) -> None:
        member = group.members.pop(member_id)
        if member.join is not None and not member.join.done():
            member.join.set_result(JoinResult(_UNKNOWN_MEMBER))
        if member.sync is not None and not member.sync.done():
            member.sync.set_result(SyncResult(_UNKNOWN_MEMBER))
        if group.leader == member_id:
            group.leader = ""
        if not group.members:
            group.state = GroupState.EMPTY
            group.protocol_type = group.protocol_name = None
            return
        self._prepare_rebalance(group)
        self._maybe_complete_join(group)

    def expire(self, now_s: float) -> None:
        """Remove members whose session passed, and members that did not rejoin before
        the rebalance timeout."""
        for group in list(self._groups.values()):
            for pending_id, since_s in list(group.pending.items()):
                if now_s - since_s > MAX_SESSION_TIMEOUT_MS / 1000:
                    del group.pending[pending_id]
            for member in list(group.members.values()):
                waiting = any(w is not None and not w.done() for w in (member.join, member.sync))
                if waiting:
                    continue  # in JoinGroup or SyncGroup: its connection is busy there
                late = (
                    group.state == GroupState.PREPARING_REBALANCE
                    and now_s >= group.rebalance_deadline_s
                )
                silent_s = now_s - member.last_heartbeat_s
                if late or silent_s > member.session_timeout_ms / 1000:
                    log.info(
                        "group %s: member %s removed (%s)",
                        group.group_id,
                        member.member_id,
                        "did not rejoin in time" if late else f"no heartbeat for {silent_s:.1f} s",
                    )
                    self._remove(group, member.member_id)
            if not group.members and not group.pending and group.state == GroupState.EMPTY:
                del self._groups[group.group_id]

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            self.expire(time.monotonic())


_T = TypeVar("_T")

# How long another thread waits for the listener's loop to answer a snapshot.
_SNAPSHOT_TIMEOUT_S = 5.0
_read_subscription = entity_reader(ConsumerProtocolSubscription)
_read_assignment = entity_reader(ConsumerProtocolAssignment)


def _subscribed_topics(metadata: bytes) -> frozenset[str]:
    """The topics of a ConsumerProtocolSubscription (an int16 version, then v0's fields,
    which later versions only extend); empty if it does not parse."""
    try:
        subscription, _ = _read_subscription(metadata, 2)
        return frozenset(str(t) for t in subscription.topics)
    except Exception:
        return frozenset()


def _assigned_partitions(assignment: bytes) -> frozenset[TopicPartition]:
    """The partitions of a ConsumerProtocolAssignment; empty if it does not parse."""
    if len(assignment) < 2:
        return frozenset()
    try:
        decoded, _ = _read_assignment(assignment, 2)
        return frozenset(
            TopicPartition(str(t.topic), int(p))
            for t in decoded.assigned_partitions
            for p in t.partitions
        )
    except Exception:
        return frozenset()


class ClassicGroupsOnLoop:
    """``ClassicGroups`` for other threads (``broker.groups.manager.ForeignGroups``): each
    call runs on the listener's loop and waits at most ``_SNAPSHOT_TIMEOUT_S``.

    Raises ``TimeoutError`` when the loop does not answer in time and ``RuntimeError``
    once it is closed; the group manager then shows what it has without these groups.
    """

    def __init__(self, groups: ClassicGroups, loop: asyncio.AbstractEventLoop) -> None:
        self._groups = groups
        self._loop = loop

    def foreign_groups(self) -> list[ForeignGroup]:
        return self._on_loop(self._groups.snapshot)

    def foreign_group(self, group_id: str) -> ForeignGroup | None:
        found = self._on_loop(lambda: self._groups.snapshot(group_id))
        return found[0] if found else None

    def _on_loop(self, call: Callable[[], _T]) -> _T:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            return call()
        answer: concurrent.futures.Future[_T] = concurrent.futures.Future()

        def run() -> None:
            try:
                answer.set_result(call())
            except BaseException as exc:
                answer.set_exception(exc)

        self._loop.call_soon_threadsafe(run)
        try:
            return answer.result(_SNAPSHOT_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            raise TimeoutError("the Kafka listener's loop did not answer in time") from None
