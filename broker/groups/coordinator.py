"""The group coordinator's state machine (KIP-848 consumer protocol). Pure: no I/O, no
threads, no clock; every call that needs the time takes ``now_ms``.

One ``GroupCoordinator`` holds every consumer group's membership. Members heartbeat with
their subscription and the partitions they own; the coordinator answers with a member
epoch and the partitions the member may own now. It follows Kafka's
``GroupMetadataManager.consumerGroupHeartbeat`` and ``CurrentAssignmentBuilder``
(``reference/kafka-internals.md`` 5.3), with three epochs:

* **group epoch**: bumped when a member joins, leaves, expires or changes its
  subscription, and when the partition counts of the subscribed topics change (a topic is
  created, deleted or grows);
* **target epoch**: the group epoch the target assignment was computed for. The target is
  recomputed (``broker.groups.assignor``) in the same call that bumps the group epoch, so
  the two are always equal after a call returns;
* **member epoch**: each member's own, which reaches the target epoch once the member has
  given up every partition that is no longer in its target.

Reconciliation of one member, on each of its heartbeats (``_reconcile``):

1. partitions it was told to give up (``revoking``) and no longer reports owning are
   released; revoked partitions that came back into its target are simply kept;
2. partitions of its assignment that are not in its target are moved to ``revoking``: the
   answer omits them (revocation by omission) and the member epoch stays put;
3. while anything is still revoking, nothing is granted;
4. otherwise the member gets the partitions of its target that no other member holds
   (assigned or still revoking), and its epoch moves to the target epoch. Partitions
   still held elsewhere are granted on a later heartbeat, once released.

After a broker restart (membership is in memory only), the members of the previous
incarnation still consume the partitions they held until their next heartbeat answers
``UNKNOWN_MEMBER_ID``. A group that existed before the start (it has committed offsets) is
therefore granted nothing until ``startup_grant_delay_ms`` after the start: by then every
live member of the old incarnation has heartbeated and dropped its partitions (Kafka
persists membership instead; its classic protocol has ``group.initial.rebalance.delay.ms``
for a similar wait). New groups are not held.

A revoked partition is released only by a *later* heartbeat that omits it, never by the
heartbeat that revokes it (Kafka's rule): the member must have seen the answer that takes
the partition away. Together with "a member consumes only partitions of its latest answer"
this keeps every partition with at most one member at a time; the invariant
(``assigned`` and ``revoking`` sets of all members pairwise disjoint) is checked by a
rule-based state machine test.

Fencing: a heartbeat with an epoch above the member's, or below it and not the member's
previous epoch with owned partitions all in its assignment (an answer was lost), is
``FencedMemberEpochError``; an unknown member id with an epoch above 0 is
``UnknownMemberIdError``. Either way the client drops its partitions and rejoins with
epoch 0.

Static members (``instance_id``, KIP-848's form of KIP-345): the group maps each instance
id to its member id. A static member leaving with epoch -2 (``LEAVE_STATIC_EPOCH``: a
restart) stays, partitions and epoch kept, until its session ends; a join (epoch 0) under
the same instance id then takes the member over with a new member id, its epoch and its
partitions, without a new group epoch, so nobody else moves. A join while the instance id's
member has not left is ``UnreleasedInstanceIdError``; a request naming an instance id from
another member id than the one it has now is ``FencedInstanceIdError`` (the older of two
consumers sharing an instance id); epoch -1 removes a static member at once.

Expiry (``expire``): a member whose last heartbeat is ``session_timeout_ms`` old, or that
has held partitions it was told to revoke for ``rebalance_timeout_ms``, is removed and its
partitions go to the others. Membership lives only in memory; a group without members is
forgotten (its committed offsets are the offset store's).

Not thread-safe: ``broker.groups.manager`` serialises calls with a lock.
"""

from __future__ import annotations

import enum
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tidelog.broker.groups.assignor import Assignment, TopicPartition, assign
from tidelog.storage.errors import (
    FencedInstanceIdError,
    FencedMemberEpochError,
    GroupNotEmptyError,
    InvalidRequestError,
    StaleMemberEpochError,
    UnknownMemberIdError,
    UnreleasedInstanceIdError,
)

__all__ = [
    "DEFAULT_REBALANCE_TIMEOUT_MS",
    "JOIN_EPOCH",
    "LEAVE_EPOCH",
    "LEAVE_STATIC_EPOCH",
    "CoordinatorConfig",
    "GroupCoordinator",
    "GroupState",
    "GroupView",
    "HeartbeatAnswer",
    "HeartbeatRequest",
    "MemberView",
    "Removal",
    "owner_of",
]

log = logging.getLogger(__name__)

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
# A static member leaving for now (a restart): it keeps its partitions for its session.
LEAVE_STATIC_EPOCH = -2
# Kafka's client sends max.poll.interval.ms (5 minutes) as the rebalance timeout.
DEFAULT_REBALANCE_TIMEOUT_MS = 300_000
MAX_MEMBER_ID_CHARS = 255


class GroupState(enum.Enum):
    """A group's state as ``ListGroups`` and ``DescribeGroup`` show it (derived)."""

    EMPTY = "Empty"
    STABLE = "Stable"
    RECONCILING = "Reconciling"


@dataclass(frozen=True, slots=True, kw_only=True)
class CoordinatorConfig:
    """Timing the broker dictates (Kafka's ``group.consumer.*`` settings)."""

    heartbeat_interval_ms: int = 5_000
    session_timeout_ms: int = 45_000
    min_session_timeout_ms: int = 45_000
    max_session_timeout_ms: int = 60_000

    def __post_init__(self) -> None:
        if not 1 <= self.min_session_timeout_ms <= self.max_session_timeout_ms:
            raise ValueError("group.consumer.min.session.timeout.ms must be >= 1 and <= max")
        if not self.min_session_timeout_ms <= self.session_timeout_ms:
            raise ValueError("group.consumer.session.timeout.ms is below the minimum")
        if not self.session_timeout_ms <= self.max_session_timeout_ms:
            raise ValueError("group.consumer.session.timeout.ms is above the maximum")
        if not 1 <= self.heartbeat_interval_ms < self.min_session_timeout_ms:
            raise ValueError(
                "group.consumer.heartbeat.interval.ms must be >= 1 and below "
                "group.consumer.min.session.timeout.ms"
            )

    @property
    def startup_grant_delay_ms(self) -> int:
        """How long, after a broker start, the groups that existed before get no grants.

        One heartbeat interval, plus as much again up to 1 s for a heartbeat in flight
        or delayed by the restart itself.
        """
        return self.heartbeat_interval_ms + min(self.heartbeat_interval_ms, 1_000)

    def session_timeout_for(self, requested_ms: int) -> int:
        """The session timeout a member gets: the default for 0 or less, else the request
        clamped to [min, max]."""
        if requested_ms <= 0:
            return self.session_timeout_ms
        return min(max(requested_ms, self.min_session_timeout_ms), self.max_session_timeout_ms)


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    """One ``ConsumerGroupHeartbeat``. Every heartbeat carries the full subscription and
    the full list of owned partitions (there is no "unchanged" encoding)."""

    group_id: str
    member_id: str
    member_epoch: int
    subscribed_topics: frozenset[str]
    owned: frozenset[TopicPartition]
    session_timeout_ms: int = 0
    rebalance_timeout_ms: int = 0
    client_id: str = ""
    instance_id: str | None = None  # a static member's group.instance.id (KIP-345)


@dataclass(frozen=True, slots=True)
class HeartbeatAnswer:
    """What the member learns: its id and epoch, how often to heartbeat, and the complete
    set of partitions it may own now (empty after leaving)."""

    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    assignment: Assignment


@dataclass(frozen=True, slots=True)
class MemberView:
    """A member as ``DescribeGroup`` shows it."""

    member_id: str
    client_id: str
    member_epoch: int
    subscribed_topics: frozenset[str]
    assigned: Assignment
    revoking: Assignment
    target: Assignment
    instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class GroupView:
    """A snapshot of one group's membership."""

    group_id: str
    state: GroupState
    group_epoch: int
    members: tuple[MemberView, ...]
    assignment_epoch: int = 0  # the epoch of the target assignment


def owner_of(members: Sequence[MemberView], tp: TopicPartition) -> str:
    """The member holding ``tp`` (assigned or still revoking), "" if none."""
    for member in members:
        if tp in member.assigned or tp in member.revoking:
            return member.member_id
    return ""


@dataclass(frozen=True, slots=True)
class Removal:
    """A member the coordinator removed on its own, and why ("session", "rebalance")."""

    group_id: str
    member_id: str
    reason: str


@dataclass(slots=True)
class _Member:
    member_id: str
    client_id: str
    subscribed_topics: frozenset[str]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    session_deadline_ms: int
    member_epoch: int = 0
    previous_member_epoch: int = -1
    assigned: Assignment = frozenset()
    revoking: Assignment = frozenset()
    revocation_deadline_ms: int | None = None
    instance_id: str | None = None
    # Left with LEAVE_STATIC_EPOCH: keeps its partitions until its session ends, for the
    # next incarnation of its instance id to take over.
    left_static: bool = False

    def holds(self) -> Assignment:
        return self.assigned | self.revoking


@dataclass(slots=True)
class _Group:
    group_id: str
    group_epoch: int = 0
    target_epoch: int = 0
    members: dict[str, _Member] = field(default_factory=dict)
    target: dict[str, Assignment] = field(default_factory=dict)
    # Partition counts of the subscribed topics the target was computed with.
    topic_counts: dict[str, int] = field(default_factory=dict)
    # Static members: instance id -> the member id it has now.
    static_members: dict[str, str] = field(default_factory=dict)


class GroupCoordinator:
    """Membership and assignment of every consumer group. Not thread-safe.

    Args:
        config: the broker's heartbeat and session settings.
        new_member_id: makes ids for joining members (uuid4 hex by default).
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        new_member_id: Callable[[], str] | None = None,
        *,
        held_groups: Iterable[str] = (),
        hold_until_ms: int = 0,
    ) -> None:
        self.config = config
        self._new_member_id = new_member_id or (lambda: uuid.uuid4().hex)
        self._groups: dict[str, _Group] = {}
        self._held_groups = frozenset(held_groups)
        self._hold_until_ms = hold_until_ms

    # --- heartbeat ------------------------------------------------------------------------

    def heartbeat(
        self, request: HeartbeatRequest, now_ms: int, topics: Mapping[str, int]
    ) -> HeartbeatAnswer:
        """Join (epoch 0), heartbeat (the member's epoch) or leave (epoch -1).

        Args:
            request: the heartbeat.
            now_ms: monotonic time; sets the member's session deadline.
            topics: partition count of every existing topic.

        Raises:
            InvalidRequestError: no group id, an epoch below -2, -2 without an instance id,
                a member id too long, or a heartbeat (epoch > 0) without a member id.
            UnknownMemberIdError: epoch > 0 and the member is not in the group.
            FencedMemberEpochError: the epoch does not match the member's (rejoin).
            FencedInstanceIdError: the instance id belongs to another member id now.
            UnreleasedInstanceIdError: a join with an instance id a live member uses.
        """
        if not request.group_id:
            raise InvalidRequestError("group_id must not be empty")
        if request.member_epoch < LEAVE_STATIC_EPOCH:
            raise InvalidRequestError(
                f"member_epoch must be 0 (join), -1 (leave), -2 (a static member leaving "
                f"for now) or the member's epoch, got {request.member_epoch}"
            )
        if request.member_epoch == LEAVE_STATIC_EPOCH and request.instance_id is None:
            raise InvalidRequestError("member_epoch -2 (leaving for now) needs an instance_id")
        if len(request.member_id) > MAX_MEMBER_ID_CHARS:
            raise InvalidRequestError(f"member_id longer than {MAX_MEMBER_ID_CHARS} characters")
        if request.member_epoch in (LEAVE_EPOCH, LEAVE_STATIC_EPOCH):
            return self._leave(request, topics)
        if request.member_epoch == JOIN_EPOCH:
            group, member = self._join(request, now_ms)
        else:
            group, member = self._existing(request)
            member.client_id = request.client_id or member.client_id
            member.session_timeout_ms = self.config.session_timeout_for(request.session_timeout_ms)
            member.rebalance_timeout_ms = _rebalance_timeout(request.rebalance_timeout_ms)
            member.session_deadline_ms = now_ms + member.session_timeout_ms
            if request.subscribed_topics != member.subscribed_topics:
                log.info(
                    "group %s: member %s now subscribes to %s",
                    group.group_id,
                    member.member_id,
                    sorted(request.subscribed_topics),
                )
                member.subscribed_topics = request.subscribed_topics
                group.group_epoch += 1
        self._refresh_target(group, topics)
        self._reconcile(group, member, request.owned, now_ms)
        return HeartbeatAnswer(
            member.member_id,
            member.member_epoch,
            self.config.heartbeat_interval_ms,
            member.assigned,
        )

    def _join(self, request: HeartbeatRequest, now_ms: int) -> tuple[_Group, _Member]:
        group = self._groups.get(request.group_id)
        if group is None:
            group = self._groups[request.group_id] = _Group(request.group_id)
        instance_id = request.instance_id
        previous = group.static_members.get(instance_id) if instance_id is not None else None
        if previous is not None and previous != request.member_id:
            return group, self._replace_static(group, previous, request, now_ms)
        member_id = request.member_id
        if member_id and member_id in group.members:
            # A known member rejoining (after being fenced, say) starts again from nothing:
            # the client dropped its partitions before rejoining.
            log.info("group %s: member %s rejoins", group.group_id, member_id)
            del group.members[member_id]
            group.target.pop(member_id, None)
        if not member_id:
            member_id = self._new_member_id()
            while member_id in group.members:
                member_id = self._new_member_id()
        session_timeout_ms = self.config.session_timeout_for(request.session_timeout_ms)
        group.members[member_id] = _Member(
            member_id=member_id,
            client_id=request.client_id,
            subscribed_topics=request.subscribed_topics,
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=_rebalance_timeout(request.rebalance_timeout_ms),
            session_deadline_ms=now_ms + session_timeout_ms,
            instance_id=instance_id,
        )
        if instance_id is not None:
            group.static_members[instance_id] = member_id
        group.group_epoch += 1
        log.info(
            "group %s: member %s joined (epoch %d), subscribing to %s",
            group.group_id,
            member_id,
            group.group_epoch,
            sorted(request.subscribed_topics),
        )
        return group, group.members[member_id]

    def _replace_static(
        self, group: _Group, previous_id: str, request: HeartbeatRequest, now_ms: int
    ) -> _Member:
        """A static member joining again under its instance id (KIP-848): if the previous
        incarnation left with ``LEAVE_STATIC_EPOCH``, the new member id takes over its
        epoch and partitions (no new group epoch: nobody else moves); if it is still
        live, ``UnreleasedInstanceIdError``."""
        member = group.members[previous_id]
        if not member.left_static:
            raise UnreleasedInstanceIdError(
                f"instance {request.instance_id} of group {group.group_id} is still used "
                f"by member {previous_id}"
            )
        member_id = request.member_id or self._new_member_id()
        while member_id in group.members:
            member_id = self._new_member_id()
        del group.members[previous_id]
        target = group.target.pop(previous_id, frozenset())
        member.member_id = member_id
        member.left_static = False
        member.client_id = request.client_id or member.client_id
        member.session_timeout_ms = self.config.session_timeout_for(request.session_timeout_ms)
        member.rebalance_timeout_ms = _rebalance_timeout(request.rebalance_timeout_ms)
        member.session_deadline_ms = now_ms + member.session_timeout_ms
        group.members[member_id] = member
        group.target[member_id] = target
        assert request.instance_id is not None
        group.static_members[request.instance_id] = member_id
        if request.subscribed_topics != member.subscribed_topics:
            member.subscribed_topics = request.subscribed_topics
            group.group_epoch += 1
        log.info(
            "group %s: static member %s rejoined as %s (was %s)",
            group.group_id,
            request.instance_id,
            member_id,
            previous_id,
        )
        return member

    def _existing(self, request: HeartbeatRequest) -> tuple[_Group, _Member]:
        if not request.member_id:
            raise InvalidRequestError("a heartbeat with member_epoch > 0 needs a member_id")
        group = self._groups.get(request.group_id)
        if group is not None:
            _check_instance(group, request)
        member = group.members.get(request.member_id) if group is not None else None
        if group is None or member is None:
            raise UnknownMemberIdError(
                f"member {request.member_id} is not in group {request.group_id}"
            )
        epoch = request.member_epoch
        if epoch == member.member_epoch:
            return group, member
        # The answer that moved the member on may have been lost: its previous epoch is
        # fine as long as it owns nothing it was not given.
        if (
            epoch < member.member_epoch
            and epoch == member.previous_member_epoch
            and request.owned <= member.assigned
        ):
            return group, member
        raise FencedMemberEpochError(
            f"member {member.member_id} of group {group.group_id} sent epoch {epoch}, "
            f"its epoch is {member.member_epoch}: rejoin with epoch 0"
        )

    def _leave(self, request: HeartbeatRequest, topics: Mapping[str, int]) -> HeartbeatAnswer:
        group = self._groups.get(request.group_id)
        epoch = request.member_epoch
        if group is not None and request.instance_id in group.static_members:
            _check_instance(group, request)
        member = group.members.get(request.member_id) if group is not None else None
        # Leaving is idempotent: a member the coordinator no longer knows is gone already.
        if group is not None and member is not None:
            if epoch == LEAVE_STATIC_EPOCH and member.instance_id is not None:
                # For now: its partitions wait for its next incarnation, or its session's end.
                member.left_static = True
                log.info(
                    "group %s: static member %s left for now", group.group_id, member.member_id
                )
            else:
                self._remove(group, request.member_id, topics)
                log.info("group %s: member %s left", group.group_id, request.member_id)
        return HeartbeatAnswer(
            request.member_id, epoch, self.config.heartbeat_interval_ms, frozenset()
        )

    # --- target and reconciliation ---------------------------------------------------------

    def _refresh_target(self, group: _Group, topics: Mapping[str, int]) -> None:
        """Recompute the target if the group epoch moved or the subscribed topics changed."""
        subscribed = set().union(*(m.subscribed_topics for m in group.members.values()))
        counts = {t: topics[t] for t in subscribed if t in topics}
        if counts != group.topic_counts and group.group_epoch == group.target_epoch:
            group.group_epoch += 1  # a topic appeared, grew or went away
        if group.group_epoch == group.target_epoch:
            return
        group.target = assign(
            {m.member_id: m.subscribed_topics for m in group.members.values()},
            counts,
            group.target,
        )
        group.topic_counts = counts
        group.target_epoch = group.group_epoch
        log.debug("group %s: new target assignment at epoch %d", group.group_id, group.group_epoch)

    def _reconcile(
        self, group: _Group, member: _Member, owned: frozenset[TopicPartition], now_ms: int
    ) -> None:
        target = group.target.get(member.member_id, frozenset())
        # 1. Revocations the member has finished; revoked partitions back in its target.
        revoking = member.revoking & owned
        back = revoking & target
        assigned = member.assigned | back
        revoking -= back
        # 2. Revoke what left the target.
        to_revoke = assigned - target
        assigned -= to_revoke
        revoking |= to_revoke
        member.assigned, member.revoking = assigned, revoking
        if revoking:
            # 3. Wait: nothing is granted and the epoch stays until the member lets go.
            if member.revocation_deadline_ms is None:
                member.revocation_deadline_ms = now_ms + member.rebalance_timeout_ms
            return
        member.revocation_deadline_ms = None
        # 4. Grant what nobody else holds; the rest follows once released. Right after a
        # restart, members of the old incarnation may still hold anything of a group
        # that existed before it (see the module docstring).
        if now_ms < self._hold_until_ms and group.group_id in self._held_groups:
            member.assigned = assigned
        else:
            held_elsewhere: set[TopicPartition] = set()
            for other in group.members.values():
                if other is not member:
                    held_elsewhere.update(other.assigned, other.revoking)
            member.assigned = assigned | (target - assigned - held_elsewhere)
        if member.member_epoch != group.target_epoch:
            member.previous_member_epoch = member.member_epoch
            member.member_epoch = group.target_epoch

    def _remove(self, group: _Group, member_id: str, topics: Mapping[str, int]) -> None:
        member = group.members.pop(member_id)
        if (
            member.instance_id is not None
            and group.static_members.get(member.instance_id) == member_id
        ):
            del group.static_members[member.instance_id]
        group.target.pop(member_id, None)
        if not group.members:
            del self._groups[group.group_id]
            log.info("group %s is empty", group.group_id)
            return
        group.group_epoch += 1
        self._refresh_target(group, topics)

    # --- expiry -----------------------------------------------------------------------------

    def expire(
        self, now_ms: int, topics: Mapping[str, int], group_id: str | None = None
    ) -> list[Removal]:
        """Remove members past their session deadline, or holding revoked partitions past
        their rebalance timeout, in every group or only ``group_id``. Returns who was
        removed and why."""
        removed: list[Removal] = []
        if group_id is None:
            groups = list(self._groups.values())
        else:
            groups = [self._groups[group_id]] if group_id in self._groups else []
        for group in groups:
            for member in list(group.members.values()):
                if now_ms >= member.session_deadline_ms:
                    reason = "session"
                elif (
                    member.revocation_deadline_ms is not None
                    and now_ms >= member.revocation_deadline_ms
                ):
                    reason = "rebalance"
                else:
                    continue
                removed.append(Removal(group.group_id, member.member_id, reason))
                self._remove(group, member.member_id, topics)
                log.info(
                    "group %s: member %s removed: %s timeout",
                    group.group_id,
                    member.member_id,
                    reason,
                )
        return removed

    def next_deadline_ms(self) -> int | None:
        """The earliest session or revocation deadline of any member; None if no members."""
        deadlines = [
            d
            for group in self._groups.values()
            for m in group.members.values()
            for d in (m.session_deadline_ms, m.revocation_deadline_ms)
            if d is not None
        ]
        return min(deadlines, default=None)

    # --- offsets and admin ------------------------------------------------------------------

    def check_commit(
        self, group_id: str, member_id: str, member_epoch: int, partitions: Iterable[TopicPartition]
    ) -> frozenset[TopicPartition]:
        """Validate an offset commit; return the partitions the member may not commit.

        A member may commit the partitions it holds (assigned or still revoking: it commits
        them before letting go), with its current epoch. An empty ``member_id`` is an
        admin or simple commit, allowed only while the group has no members.

        Raises:
            GroupNotEmptyError: no member id and the group has members.
            UnknownMemberIdError: the member is not in the group.
            StaleMemberEpochError: the epoch is not the member's current one.
        """
        group = self._groups.get(group_id)
        if not member_id:
            if group is not None and group.members:
                raise GroupNotEmptyError(
                    f"group {group_id} has members: commit as one of them (member_id)"
                )
            return frozenset()
        member = group.members.get(member_id) if group is not None else None
        if member is None:
            raise UnknownMemberIdError(f"member {member_id} is not in group {group_id}")
        if member_epoch != member.member_epoch:
            raise StaleMemberEpochError(
                f"member {member_id} of group {group_id} committed with epoch {member_epoch}, "
                f"its epoch is {member.member_epoch}"
            )
        holds = member.holds()
        return frozenset(tp for tp in partitions if tp not in holds)

    def require_empty(self, group_id: str) -> None:
        """Raise ``GroupNotEmptyError`` if the group has members."""
        group = self._groups.get(group_id)
        if group is not None and group.members:
            raise GroupNotEmptyError(
                f"group {group_id} has {len(group.members)} member(s); stop them first"
            )

    def group_ids(self) -> list[str]:
        """Ids of the groups with members."""
        return sorted(self._groups)

    def view(self, group_id: str) -> GroupView:
        """A snapshot of the group (an Empty group at epoch 0 if it has no members)."""
        group = self._groups.get(group_id)
        if group is None:
            return GroupView(group_id, GroupState.EMPTY, 0, ())
        members = tuple(
            MemberView(
                m.member_id,
                m.client_id,
                m.member_epoch,
                m.subscribed_topics,
                m.assigned,
                m.revoking,
                group.target.get(m.member_id, frozenset()),
                m.instance_id,
            )
            for m in sorted(group.members.values(), key=lambda m: m.member_id)
        )
        stable = all(
            m.member_epoch == group.target_epoch and not m.revoking and m.assigned == m.target
            for m in members
        )
        state = GroupState.STABLE if stable else GroupState.RECONCILING
        return GroupView(group_id, state, group.group_epoch, members, group.target_epoch)

    def has_group(self, group_id: str) -> bool:
        """Whether ``group_id`` is a group with members here."""
        return group_id in self._groups

    def unload(self, owns: Callable[[str], bool]) -> list[str]:
        """Forget the groups ``owns`` selects, members, targets and deadlines with them
        (this broker no longer coordinates them: Kafka's ``onResignation``). Their
        members' next heartbeats reach a coordinator that does not know them
        (``UNKNOWN_MEMBER_ID`` here, should it coordinate them again), and they rejoin.
        Returns the ids forgotten, sorted."""
        gone = sorted(g for g in self._groups if owns(g))
        for group_id in gone:
            del self._groups[group_id]
        return gone


def _check_instance(group: _Group, request: HeartbeatRequest) -> None:
    """A request naming an instance id must come from the member id it has now: unknown,
    ``UnknownMemberIdError``; another, ``FencedInstanceIdError`` (a newer incarnation)."""
    if request.instance_id is None:
        return
    current = group.static_members.get(request.instance_id)
    if current is None:
        raise UnknownMemberIdError(
            f"instance {request.instance_id} is not in group {group.group_id}"
        )
    if current != request.member_id:
        raise FencedInstanceIdError(
            f"instance {request.instance_id} of group {group.group_id} is member {current} "
            f"now, not {request.member_id}: another consumer with the same instance id joined"
        )


def _rebalance_timeout(requested_ms: int) -> int:
    return requested_ms if requested_ms > 0 else DEFAULT_REBALANCE_TIMEOUT_MS
