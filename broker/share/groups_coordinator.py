"""The share-group coordinator's state machine (KIP-932's ShareGroupHeartbeat). Pure: no
I/O, no threads, no clock; calls that need the time take ``now_ms``.

One ``ShareCoordinator`` holds every share group's membership. It follows the KIP-848
consumer protocol (``broker.groups.coordinator``) where KIP-932 does, and is simpler where
sharing allows:

* **member ids are the client's** (Kafka 4.x: the client makes a UUID and keeps it across
  rejoins); an empty one is ``INVALID_REQUEST``;
* **join** with epoch 0 and the subscribed topic names (required then); a later heartbeat
  may send None for "unchanged". A new member beyond ``group.share.max.size`` is
  ``GroupMaxSizeReachedError``; a join under a known member id (the client rejoining
  after ``FENCED_MEMBER_EPOCH``, or retrying a join whose answer was lost) takes the
  member over with its target and the current epoch;
* **epochs**: the group epoch goes up when a member joins, leaves, expires or changes its
  subscription, or the subscribed topics' partition counts change; the target assignment
  (``broker.share.assignor``) is recomputed in the same call (assignment epoch = group
  epoch). A member's next heartbeat gets its whole target at once and the assignment epoch
  as its member epoch: a partition is shared, so nothing is revoked first and nobody waits
  for anybody (KIP-932). The answer's ``assignment_changed`` says when the client must
  replace what it has (a join, a new epoch, a retry with the previous epoch);
* **fencing** as Kafka's ``throwIfShareGroupMemberEpochIsInvalid``: an epoch above the
  member's, or below it and not its previous one (a lost answer), is
  ``FencedMemberEpochError``; epoch > 0 from an unknown member ``UnknownMemberIdError``, for
  an unknown group ``GroupIdNotFoundError``;
* **leave** with epoch -1 (an unknown group ``GroupIdNotFoundError``, an unknown member
  ``UnknownMemberIdError``, as Kafka's ``shareGroupLeave``);
* **expiry**: a member whose last heartbeat is a session timeout old is removed as if it
  left (``expire``);
* **states**: Empty (no members), Stable (members: there is no reconciling state, since no
  member waits for another to let go), Dead (``delete``: the group is gone). A group whose
  last member left stays, Empty, with its epoch, as Kafka keeps it, until deleted;
* **one id, one kind**: a group id that a consumer group uses (``foreign``) cannot become a
  share group: ``GroupIdNotFoundError`` "Group X is not a share group.", Kafka's answer.

Persistence: the coordinator keeps, per group, the records of its state as last handed out
for writing (``broker.share.groups_records``: the group's epoch and topic counts, its
assignment epoch, and per member its metadata, target and current assignment). Every call
that changes state returns the records that changed (key -> value, None a tombstone), each
value complete; the caller stores them durably before it answers, and on a failed write
rebuilds the group from what is durable (``load``). ``load`` rebuilds a group from its
records after a restart or a coordinator move: epochs, subscriptions and assignments as they
were, every member's session starting again then (Kafka restarts the session timers on a
load too).

Not thread-safe: ``broker.share.groups`` serialises calls with a lock.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from tidelog.broker.share.assignor import Assignment, assign
from tidelog.broker.share.groups_records import (
    CURRENT_ASSIGNMENT_TYPE,
    GROUP_METADATA_TYPE,
    MEMBER_METADATA_TYPE,
    TARGET_MEMBER_TYPE,
    TARGET_METADATA_TYPE,
    CurrentAssignmentValue,
    GroupMetadataValue,
    MemberMetadataValue,
    RecordKey,
    decode_current,
    decode_group_metadata,
    decode_key,
    decode_member_metadata,
    decode_partitions,
    decode_target_epoch,
    encode_current,
    encode_group_metadata,
    encode_key,
    encode_member_metadata,
    encode_partitions,
    encode_target_epoch,
)
from tidelog.storage.errors import (
    FencedMemberEpochError,
    GroupIdNotFoundError,
    GroupMaxSizeReachedError,
    GroupNotEmptyError,
    InvalidRequestError,
    UnknownMemberIdError,
)

__all__ = [
    "ASSIGNOR_NAME",
    "JOIN_EPOCH",
    "LEAVE_EPOCH",
    "Changes",
    "ShareCoordinator",
    "ShareGroupState",
    "ShareGroupView",
    "ShareHeartbeatAnswer",
    "ShareHeartbeatRequest",
    "ShareMemberView",
    "ShareRemoval",
]

log = logging.getLogger(__name__)

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
ASSIGNOR_NAME = "simple"  # Kafka's share assignor's name, shown by ShareGroupDescribe
MAX_MEMBER_ID_CHARS = 255

# Records to write for one group: key bytes -> value bytes (None: a tombstone).
Changes = dict[bytes, bytes | None]


class ShareGroupState(enum.Enum):
    """A share group's state as ShareGroupDescribe and ListGroups show it."""

    EMPTY = "Empty"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True, slots=True)
class ShareHeartbeatRequest:
    """One ShareGroupHeartbeat. ``subscribed_topics`` None means unchanged (required, and
    not empty, on a join)."""

    group_id: str
    member_id: str
    member_epoch: int
    subscribed_topics: frozenset[str] | None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""


@dataclass(frozen=True, slots=True)
class ShareHeartbeatAnswer:
    """The member's epoch, how often to heartbeat, and the partitions it may fetch now
    (all of them; ``assignment_changed``: the client must replace what it has)."""

    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    assignment: Assignment
    assignment_changed: bool


@dataclass(frozen=True, slots=True)
class ShareMemberView:
    """A member as ShareGroupDescribe shows it (``target``: what its next heartbeat gets)."""

    member_id: str
    client_id: str
    client_host: str
    rack_id: str | None
    member_epoch: int
    subscribed_topics: frozenset[str]
    assignment: Assignment
    target: Assignment


@dataclass(frozen=True, slots=True)
class ShareGroupView:
    """A share group as ShareGroupDescribe shows it."""

    group_id: str
    state: ShareGroupState
    group_epoch: int
    assignment_epoch: int
    members: tuple[ShareMemberView, ...]
    assignor_name: str = ASSIGNOR_NAME


@dataclass(frozen=True, slots=True)
class ShareRemoval:
    """A member removed because its session timed out."""

    group_id: str
    member_id: str


@dataclass(slots=True)
class _Member:
    member_id: str
    client_id: str
    client_host: str
    rack_id: str | None
    subscribed_topics: frozenset[str]
    session_deadline_ms: int
    member_epoch: int = 0
    previous_member_epoch: int = -1
    assigned: Assignment = frozenset()


@dataclass(slots=True)
class _Group:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    # Partition counts of the subscribed topics that the target was computed with.
    topic_counts: dict[str, int] = field(default_factory=dict)
    members: dict[str, _Member] = field(default_factory=dict)
    target: dict[str, Assignment] = field(default_factory=dict)
    # The records as last handed out for writing: key -> value (module docstring).
    written: dict[bytes, bytes] = field(default_factory=dict)


class ShareCoordinator:
    """Membership and assignment of every share group. Not thread-safe.

    Args:
        max_size: ``group.share.max.size``, the most members a group may have.
        foreign: whether a group id is another kind of group's (a consumer group), asked
            only when a share group of that id is about to be created.
    """

    def __init__(self, max_size: int, foreign: Callable[[str], bool] | None = None) -> None:
        if max_size < 1:
            raise ValueError("group.share.max.size must be at least 1")
        self._max_size = max_size
        self._foreign = foreign or (lambda group_id: False)
        self._groups: dict[str, _Group] = {}

    # --- heartbeat ------------------------------------------------------------------------

    def heartbeat(
        self,
        request: ShareHeartbeatRequest,
        now_ms: int,
        topics: Mapping[str, int],
        *,
        session_timeout_ms: int,
        heartbeat_interval_ms: int,
    ) -> tuple[ShareHeartbeatAnswer, Changes]:
        """Join (epoch 0), heartbeat (the member's epoch) or leave (epoch -1).

        Args:
            request: the heartbeat.
            now_ms: monotonic time; the member's session runs ``session_timeout_ms`` from it.
            topics: partition count of every existing topic.
            session_timeout_ms, heartbeat_interval_ms: the group's (its config, or the
                broker's ``group.share.*`` defaults).

        Returns:
            The answer, and the records to store before sending it.

        Raises:
            InvalidRequestError: no group or member id, a member id too long, an epoch
                below -1, a join without subscribed topics, an empty rack id.
            GroupIdNotFoundError: the id is a consumer group's; or epoch != 0 and no share
                group of that id exists.
            GroupMaxSizeReachedError: a new member in a full group.
            UnknownMemberIdError: epoch != 0 and the member is not in the group.
            FencedMemberEpochError: the epoch is neither the member's nor its previous one.
        """
        _validate(request)
        if request.member_epoch == LEAVE_EPOCH:
            return self._leave(request, topics, heartbeat_interval_ms)
        group = self._groups.get(request.group_id)
        if group is None:
            if request.member_epoch != JOIN_EPOCH:
                raise GroupIdNotFoundError(f"Share group {request.group_id} not found.")
            if self._foreign(request.group_id):
                raise GroupIdNotFoundError(f"Group {request.group_id} is not a share group.")
            group = _Group(request.group_id)
        member = group.members.get(request.member_id)
        if member is None:
            if request.member_epoch != JOIN_EPOCH:
                raise UnknownMemberIdError(
                    f"member {request.member_id} is not in share group {request.group_id}"
                )
            if len(group.members) >= self._max_size:
                raise GroupMaxSizeReachedError(
                    f"share group {request.group_id} has reached its maximum size of "
                    f"{self._max_size} members"
                )
            assert request.subscribed_topics is not None  # _validate
            member = _Member(
                request.member_id,
                request.client_id,
                request.client_host,
                request.rack_id,
                request.subscribed_topics,
                now_ms + session_timeout_ms,
            )
            self._groups[group.group_id] = group
            group.members[member.member_id] = member
            group.group_epoch += 1
            log.info(
                "share group %s: member %s joined (epoch %d), subscribing to %s",
                group.group_id,
                member.member_id,
                group.group_epoch,
                sorted(member.subscribed_topics),
            )
        else:
            if request.member_epoch != JOIN_EPOCH:
                _check_epoch(group, member, request.member_epoch)
            member.client_id = request.client_id or member.client_id
            member.client_host = request.client_host or member.client_host
            member.rack_id = request.rack_id if request.rack_id is not None else member.rack_id
            member.session_deadline_ms = now_ms + session_timeout_ms
            subscribed = request.subscribed_topics
            if subscribed is not None and subscribed != member.subscribed_topics:
                log.info(
                    "share group %s: member %s now subscribes to %s",
                    group.group_id,
                    member.member_id,
                    sorted(subscribed),
                )
                member.subscribed_topics = subscribed
                group.group_epoch += 1
        retargeted = self._refresh_target(group, topics)
        before = member.assigned
        if member.member_epoch != group.assignment_epoch:
            member.previous_member_epoch = member.member_epoch
            member.member_epoch = group.assignment_epoch
        member.assigned = group.target.get(member.member_id, frozenset())
        changed = (
            request.member_epoch != member.member_epoch
            or member.assigned != before
            or request.member_epoch == JOIN_EPOCH
        )
        touched = group.members if retargeted else (member.member_id,)
        answer = ShareHeartbeatAnswer(
            member.member_id,
            member.member_epoch,
            heartbeat_interval_ms,
            member.assigned,
            changed,
        )
        return answer, _flush(group, touched, ())

    def _leave(
        self, request: ShareHeartbeatRequest, topics: Mapping[str, int], heartbeat_interval_ms: int
    ) -> tuple[ShareHeartbeatAnswer, Changes]:
        group = self._groups.get(request.group_id)
        if group is None:
            raise GroupIdNotFoundError(f"Group {request.group_id} not found.")
        if request.member_id not in group.members:
            raise UnknownMemberIdError(
                f"member {request.member_id} is not in share group {request.group_id}"
            )
        changes = self._remove(group, request.member_id, topics)
        log.info("share group %s: member %s left", group.group_id, request.member_id)
        answer = ShareHeartbeatAnswer(
            request.member_id, LEAVE_EPOCH, heartbeat_interval_ms, frozenset(), True
        )
        return answer, changes

    def _remove(self, group: _Group, member_id: str, topics: Mapping[str, int]) -> Changes:
        del group.members[member_id]
        group.target.pop(member_id, None)
        group.group_epoch += 1
        self._refresh_target(group, topics)
        return _flush(group, group.members, (member_id,))

    def _refresh_target(self, group: _Group, topics: Mapping[str, int]) -> bool:
        """Recompute the target if the group epoch moved or the subscribed topics' counts
        changed; returns whether it was recomputed."""
        subscribed = set().union(*(m.subscribed_topics for m in group.members.values()))
        counts = {t: topics[t] for t in subscribed if t in topics}
        if counts != group.topic_counts and group.group_epoch == group.assignment_epoch:
            group.group_epoch += 1  # a topic appeared, grew or went away
        if group.group_epoch == group.assignment_epoch:
            return False
        group.target = assign(
            {m.member_id: m.subscribed_topics for m in group.members.values()},
            counts,
            group.target,
        )
        group.topic_counts = counts
        group.assignment_epoch = group.group_epoch
        log.debug(
            "share group %s: new target assignment at epoch %d", group.group_id, group.group_epoch
        )
        return True

    # --- expiry -----------------------------------------------------------------------------

    def expire(
        self, now_ms: int, topics: Mapping[str, int], group_id: str | None = None
    ) -> tuple[list[ShareRemoval], dict[str, Changes]]:
        """Remove the members whose session ended, in every group or only ``group_id``.
        Returns who was removed, and the records to store per group."""
        removed: list[ShareRemoval] = []
        changes: dict[str, Changes] = {}
        if group_id is None:
            groups = list(self._groups.values())
        else:
            groups = [self._groups[group_id]] if group_id in self._groups else []
        for group in groups:
            for member in list(group.members.values()):
                if now_ms < member.session_deadline_ms:
                    continue
                removed.append(ShareRemoval(group.group_id, member.member_id))
                changes.setdefault(group.group_id, {}).update(
                    self._remove(group, member.member_id, topics)
                )
                log.info(
                    "share group %s: member %s removed: session timeout",
                    group.group_id,
                    member.member_id,
                )
        return removed, changes

    def next_deadline_ms(self) -> int | None:
        """The earliest session deadline of any member; None without members."""
        return min(
            (m.session_deadline_ms for g in self._groups.values() for m in g.members.values()),
            default=None,
        )

    # --- views and admin --------------------------------------------------------------------

    def has_group(self, group_id: str) -> bool:
        """Whether a share group of that id exists here (members or not)."""
        return group_id in self._groups

    def group_ids(self) -> list[str]:
        """Ids of every share group here, sorted."""
        return sorted(self._groups)

    def view(self, group_id: str) -> ShareGroupView:
        """The group as ShareGroupDescribe shows it. Raises ``GroupIdNotFoundError``."""
        group = self._groups.get(group_id)
        if group is None:
            raise GroupIdNotFoundError(f"Group {group_id} not found.")
        members = tuple(
            ShareMemberView(
                m.member_id,
                m.client_id,
                m.client_host,
                m.rack_id,
                m.member_epoch,
                m.subscribed_topics,
                m.assigned,
                group.target.get(m.member_id, frozenset()),
            )
            for m in sorted(group.members.values(), key=lambda m: m.member_id)
        )
        state = ShareGroupState.STABLE if members else ShareGroupState.EMPTY
        return ShareGroupView(group_id, state, group.group_epoch, group.assignment_epoch, members)

    def delete(self, group_id: str) -> Changes:
        """Forget an empty share group; returns the tombstones of its records.

        Raises:
            GroupIdNotFoundError: no share group of that id.
            GroupNotEmptyError: it has members.
        """
        group = self._groups.get(group_id)
        if group is None:
            raise GroupIdNotFoundError(f"Group {group_id} not found.")
        if group.members:
            raise GroupNotEmptyError(
                f"share group {group_id} has {len(group.members)} member(s); stop them first"
            )
        del self._groups[group_id]
        return dict.fromkeys(group.written, None)

    def forget(self, owns: Callable[[str], bool]) -> list[str]:
        """Forget the groups ``owns`` selects (this broker stopped coordinating them).
        Returns the ids forgotten, sorted."""
        gone = sorted(g for g in self._groups if owns(g))
        for group_id in gone:
            del self._groups[group_id]
        return gone

    def load(
        self, group_id: str, records: Mapping[bytes, bytes], now_ms: int, session_timeout_ms: int
    ) -> bool:
        """Replace the group's state with what ``records`` (all of its records in the
        offsets topic; other kinds are ignored) hold. Every member's session starts at
        ``now_ms``. Returns whether a share group was loaded (none without its group
        metadata record: the group is then forgotten). Records that do not decode are
        logged and skipped."""
        self._groups.pop(group_id, None)
        decoded: dict[RecordKey, bytes] = {}
        for key, value in records.items():
            try:
                parsed = decode_key(key)
            except ValueError as exc:
                log.warning("share group %s: skipping a record key: %s", group_id, exc)
                continue
            if parsed is not None and parsed.group_id == group_id:
                decoded[parsed] = value
        group = _rebuild(group_id, decoded, now_ms + session_timeout_ms)
        if group is None:
            return False
        group.written = {encode_key(k): v for k, v in decoded.items()}
        self._groups[group_id] = group
        return True


def _validate(request: ShareHeartbeatRequest) -> None:
    if not request.group_id:
        raise InvalidRequestError("GroupId can't be empty.")
    if not request.member_id.strip():
        raise InvalidRequestError("MemberId can't be empty.")
    if len(request.member_id) > MAX_MEMBER_ID_CHARS:
        raise InvalidRequestError(f"member_id longer than {MAX_MEMBER_ID_CHARS} characters")
    if request.member_epoch < LEAVE_EPOCH:
        raise InvalidRequestError(
            f"member_epoch must be 0 (join), -1 (leave) or the member's epoch, got "
            f"{request.member_epoch}"
        )
    if request.rack_id is not None and not request.rack_id.strip():
        raise InvalidRequestError("RackId can't be empty.")
    if request.member_epoch == JOIN_EPOCH and not request.subscribed_topics:
        raise InvalidRequestError("SubscribedTopicNames must be set in first request.")


def _check_epoch(group: _Group, member: _Member, epoch: int) -> None:
    if epoch == member.member_epoch:
        return
    if epoch < member.member_epoch and epoch == member.previous_member_epoch:
        return  # the answer that moved the member on was lost: it gets it again
    raise FencedMemberEpochError(
        f"member {member.member_id} of share group {group.group_id} sent epoch {epoch}, "
        f"its epoch is {member.member_epoch}: rejoin with epoch 0"
    )


def _member_records(group: _Group, member: _Member) -> dict[bytes, bytes]:
    group_id, member_id = group.group_id, member.member_id
    metadata = MemberMetadataValue(
        member.rack_id, member.client_id, member.client_host, member.subscribed_topics
    )
    current = CurrentAssignmentValue(
        member.member_epoch, member.previous_member_epoch, member.assigned
    )
    return {
        encode_key(RecordKey(MEMBER_METADATA_TYPE, group_id, member_id)): (
            encode_member_metadata(metadata)
        ),
        encode_key(RecordKey(TARGET_MEMBER_TYPE, group_id, member_id)): encode_partitions(
            group.target.get(member_id, frozenset())
        ),
        encode_key(RecordKey(CURRENT_ASSIGNMENT_TYPE, group_id, member_id)): encode_current(
            current
        ),
    }


def _flush(group: _Group, members: Iterable[str], removed: Iterable[str]) -> Changes:
    """The records of the group and of ``members`` that differ from what was last
    handed out, and tombstones for the records of the ``removed`` members; remembers them
    as handed out."""
    wanted = {
        encode_key(RecordKey(GROUP_METADATA_TYPE, group.group_id)): encode_group_metadata(
            GroupMetadataValue(group.group_epoch, group.topic_counts)
        ),
        encode_key(RecordKey(TARGET_METADATA_TYPE, group.group_id)): encode_target_epoch(
            group.assignment_epoch
        ),
    }
    for member_id in members:
        wanted.update(_member_records(group, group.members[member_id]))
    changes: Changes = {k: v for k, v in wanted.items() if group.written.get(k) != v}
    for member_id in removed:
        for record_type in (MEMBER_METADATA_TYPE, TARGET_MEMBER_TYPE, CURRENT_ASSIGNMENT_TYPE):
            key = encode_key(RecordKey(record_type, group.group_id, member_id))
            if key in group.written:
                changes[key] = None
    for key, value in changes.items():
        if value is None:
            group.written.pop(key, None)
        else:
            group.written[key] = value
    return changes


def _rebuild(
    group_id: str, records: Mapping[RecordKey, bytes], session_deadline_ms: int
) -> _Group | None:
    """A group from its decoded record keys and value bytes (``ShareCoordinator.load``)."""
    metadata = records.get(RecordKey(GROUP_METADATA_TYPE, group_id))
    if metadata is None:
        return None
    try:
        value = decode_group_metadata(metadata)
    except ValueError as exc:
        log.warning("share group %s: its metadata record does not decode: %s", group_id, exc)
        return None
    group = _Group(group_id, value.epoch, value.epoch, dict(value.topic_counts))
    target_epoch = records.get(RecordKey(TARGET_METADATA_TYPE, group_id))
    member_ids = sorted(k.member_id for k in records if k.record_type == MEMBER_METADATA_TYPE)
    try:
        if target_epoch is not None:
            group.assignment_epoch = decode_target_epoch(target_epoch)
        for member_id in member_ids:
            meta = decode_member_metadata(
                records[RecordKey(MEMBER_METADATA_TYPE, group_id, member_id)]
            )
            member = _Member(
                member_id,
                meta.client_id,
                meta.client_host,
                meta.rack_id,
                meta.subscribed_topics,
                session_deadline_ms,
            )
            current = records.get(RecordKey(CURRENT_ASSIGNMENT_TYPE, group_id, member_id))
            if current is not None:
                state = decode_current(current)
                member.member_epoch = state.member_epoch
                member.previous_member_epoch = state.previous_member_epoch
                member.assigned = state.assigned
            target = records.get(RecordKey(TARGET_MEMBER_TYPE, group_id, member_id))
            group.target[member_id] = (
                decode_partitions(target) if target is not None else frozenset()
            )
            group.members[member_id] = member
    except ValueError as exc:
        # A record that does not decode was never written by this format; rather than
        # guess, the group starts again from its epoch: members rejoin (UNKNOWN_MEMBER_ID).
        log.warning("share group %s: a record does not decode (%s); members dropped", group_id, exc)
        group.members.clear()
        group.target.clear()
        group.group_epoch += 1
    return group
