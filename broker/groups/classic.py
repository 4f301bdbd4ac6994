"""Kafka's classic consumer group protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup),
listener-neutral: the state machine behind ``GroupManager.classic``.

Tidelog's own groups are KIP-848 groups (``broker.groups.coordinator``: the broker
assigns). Kafka clients (kafka-python, aiokafka, kcat, confluent-kafka by default) speak
the classic protocol: the broker only gathers members and hands the leader everyone's
subscription; the leader computes the assignment (range, roundrobin, sticky: opaque bytes
here) and hands it back in SyncGroup, which the broker distributes. The Kafka adapter
(``broker.kafka.groups``) decodes the requests, calls ``ClassicGroups`` and encodes the
answers; nothing here knows the Kafka codec or a listener's event loop.

State per group, as in Kafka's ``GroupMetadata``::

    Empty --join--> PreparingRebalance --all known members joined, or the rebalance
      ^                 ^       |            timeout removed the rest--> CompletingRebalance
      |                 |       |                                          | leader's Sync
      +--last leaves----+--join, leave, session expiry-- Stable <----------+

- A first JoinGroup without a member id gets a new id and ``MEMBER_ID_REQUIRED`` (v4+,
  KIP-394) and joins again with it; before v4 it joins at once.
- The first rebalance of an empty group waits ``group.initial.rebalance.delay.ms``
  (Kafka's ``InitialDelayedJoin``), so that members starting together get one assignment,
  not one per arrival: once that delay has passed, the rebalance completes unless a new
  member joined during it, in which case it waits one delay more, never past the largest
  rebalance timeout (counted from the first join). The expiry pass ends the wait.
- The rebalance completes once every member known when it began has joined again; a
  member that has not by the rebalance timeout (the largest any member gave) is removed.
  Completing bumps the generation and answers every waiting JoinGroup: the leader gets
  every member's metadata for the chosen protocol (the first of the leader's protocols
  that every member supports).
- Heartbeats while a rebalance is prepared answer ``REBALANCE_IN_PROGRESS``, so members
  rejoin; while it completes (between JoinGroup and SyncGroup) they answer NONE, as Kafka.
  A member whose session timeout passes without a heartbeat is removed.
- Committed offsets are the offset store's: ``check_commit`` only validates the member
  and generation.

Parked requests: a JoinGroup waiting for the rebalance and a SyncGroup waiting for the
leader's assignment are parked as a ``concurrent.futures.Future`` per member, completed
here by whichever call moves the group on (another member's join, the leader's sync, a
leave, the expiry pass). The caller waits on it its own way (the Kafka adapter:
``asyncio.wrap_future``). A purgatory (``broker.core.delayed``) is not used: these waits are
keyed by member and completed by state changes of the group, never by a deadline of their
own (the rebalance timeout removes the late members instead, which completes the others).
A caller that gives up (its connection closed) cancels its future; a cancelled future
counts as "not waiting", exactly as before the move.

Static membership (KIP-345): a member with a ``group.instance.id`` joins without
``MEMBER_ID_REQUIRED``. The group maps each instance id to the member id it has now. A
JoinGroup without a member id for a known instance id is that member restarted: it gets a
new member id that replaces the old one (the same member object, assignment kept), and
every later request of the old id naming the instance is ``FENCED_INSTANCE_ID``, which is
how a second live consumer with the same instance id fences the first. In a stable group,
when neither the chosen protocol nor the member's metadata changed, the rejoin is answered
at once with the current generation and nobody rebalances (Kafka's
``updateStaticMemberAndRebalance``); otherwise the group rebalances. Heartbeat, SyncGroup,
OffsetCommit and LeaveGroup naming an instance id are checked as Kafka's
``validateMember`` does: unknown instance id, ``UNKNOWN_MEMBER_ID``; another member id,
``FENCED_INSTANCE_ID``. A static member leaves by LeaveGroup (by instance id alone in a
batch) or by its session timing out; Kafka's clients send no LeaveGroup when a static
member closes, which is what lets it come back within its session unnoticed.

Errors are ``ClassicError`` values named after Kafka's error names, which the Kafka
adapter maps to its numbers.

Persistence (issue #27, Kafka's ``GroupMetadataManager.storeGroup``): membership survives
a restart and a coordinator move. The leader's SyncGroup writes the group's metadata record
(``classic_state.record_of``: generation, protocol, leader, members with their metadata and
new assignments) through the injected ``writer`` (``OffsetStore.store_group``: appended,
fsynced and replicated like a commit) *before* anyone's SyncGroup is answered; the write
runs outside the lock (the caller is a worker thread, never the listener's loop), the group
staying in CompletingRebalance meanwhile. If the group moved on during the write (a rejoin,
a leave) that change has answered everyone; if the write failed, everyone parked gets
Kafka's mapping of the error (``NOT_COORDINATOR``, ``COORDINATOR_NOT_AVAILABLE``) and the
group rebalances. A group losing its last member, and a static member's new member id in a
stable group, queue a record that ``flush_writes`` (the expiry thread) writes: nobody waits
for those, as in Kafka. Every record carries a sequence number drawn under the lock, so the
store never lets an older record overwrite a newer one. ``load`` rebuilds groups from the
records of an offsets partition (``classic_state.group_from_record``: Stable, sessions
restarted at the load) after ``unload`` forgot the stale ones.

Thread-safe: one lock (``ClassicGroups._lock``) guards every classic group. It is held
only for in-memory steps, never across I/O or a wait, and never together with the
KIP-848 coordinator's lock (the manager takes them one after the other), so the two
cannot deadlock. Parked futures are completed under it: their callbacks only schedule
the waiter on its own loop (``call_soon_threadsafe``) and never call back in here. Callers
are the listener's loop (requests), the manager's expiry thread (``expire``) and admin
threads (``snapshot``, ``list_groups``, ``describe``). Time is the injected clock's.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import TypeVar

from tidelog.broker.groups.classic_state import (
    ClassicGroup,
    ClassicMember,
    description_of,
    empty_record,
    group_from_record,
    metadata_of,
    record_of,
    select_protocol,
    snapshot_of,
    subscriptions_of,
    supports_a_common_protocol,
)
from tidelog.broker.groups.classic_types import (
    DEFAULT_INITIAL_REBALANCE_DELAY_MS,
    MAX_SESSION_TIMEOUT_MS,
    MIN_SESSION_TIMEOUT_MS,
    ClassicError,
    ClassicGroupDescription,
    ClassicGroupSnapshot,
    ClassicMemberDescription,
    ClassicSubscriptions,
    GroupState,
    JoinRequest,
    JoinResult,
    SyncResult,
)
from tidelog.broker.groups.offset_records import GroupMetadataValue
from tidelog.storage.clock import Clock
from tidelog.storage.errors import (
    GroupNotEmptyError,
    KafkaTimeoutError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    StorageError,
    UnknownTopicOrPartitionError,
)

__all__ = [
    "DEFAULT_INITIAL_REBALANCE_DELAY_MS",
    "MAX_SESSION_TIMEOUT_MS",
    "MIN_SESSION_TIMEOUT_MS",
    "ClassicError",
    "ClassicGroupDescription",
    "ClassicGroupSnapshot",
    "ClassicGroups",
    "ClassicMemberDescription",
    "ClassicSubscriptions",
    "GroupState",
    "GroupWriter",
    "JoinRequest",
    "JoinResult",
    "SyncResult",
]

log = logging.getLogger(__name__)

# Stores a group's metadata record durably (None: a tombstone) unless superseded by a
# later sequence: ``OffsetStore.store_group``. Raises when the write failed.
GroupWriter = Callable[[str, GroupMetadataValue | None, int], object]

_NONE = ClassicError.NONE
_UNKNOWN_MEMBER = ClassicError.UNKNOWN_MEMBER_ID
_ILLEGAL_GENERATION = ClassicError.ILLEGAL_GENERATION
_REBALANCING = ClassicError.REBALANCE_IN_PROGRESS
_INCONSISTENT = ClassicError.INCONSISTENT_GROUP_PROTOCOL
_FENCED = ClassicError.FENCED_INSTANCE_ID

_T = TypeVar("_T")


def _done(value: _T) -> concurrent.futures.Future[_T]:
    future: concurrent.futures.Future[_T] = concurrent.futures.Future()
    future.set_result(value)
    return future


def _waiting(future: concurrent.futures.Future[_T] | None) -> bool:
    return future is not None and not future.done()


def _settle(future: concurrent.futures.Future[_T] | None, value: _T) -> None:
    """Complete a parked request unless it is done or its waiter gave up (cancelled,
    possibly from another thread between a check and this call)."""
    if future is None:
        return
    try:
        future.set_result(value)
    except concurrent.futures.InvalidStateError:
        pass


class ClassicGroups:
    """Every classic group of this broker (see the module docstring). Thread-safe."""

    def __init__(
        self,
        clock: Clock,
        *,
        initial_rebalance_delay_ms: int = DEFAULT_INITIAL_REBALANCE_DELAY_MS,
        writer: GroupWriter | None = None,
        foreign: Callable[[str], bool] | None = None,
    ) -> None:
        """``writer``: stores group metadata records (``OffsetStore.store_group``); None
        keeps membership in memory only (unit tests of the protocol). ``foreign``: whether
        a group id belongs to another kind of group (a share group, issue #32), which a
        JoinGroup is refused with ``INCONSISTENT_GROUP_PROTOCOL``, as Kafka refuses it."""
        if initial_rebalance_delay_ms < 0:
            raise ValueError("group.initial.rebalance.delay.ms must be >= 0")
        self._clock = clock
        self._initial_delay_ms = initial_rebalance_delay_ms
        self._writer = writer
        self._foreign = foreign
        self._lock = threading.Lock()
        self._groups: dict[str, ClassicGroup] = {}
        # Orders the group metadata writes (``OffsetStore.store_group``); under _lock.
        self._sequence = 0
        # Records to write that nobody waits for (an emptied group, a static member's
        # new id): (group id, record, sequence), written by ``flush_writes``; under _lock.
        self._queued: list[tuple[str, GroupMetadataValue, int]] = []

    # --- the protocol -------------------------------------------------------------------

    def join(self, request: JoinRequest) -> concurrent.futures.Future[JoinResult]:
        """JoinGroup: a future completed when the rebalance completes (module docstring),
        or at once with an error, or at once with the current assignment's generation for
        a static member rejoining a stable group unchanged."""
        if not request.group_id:
            return _done(JoinResult(ClassicError.INVALID_GROUP_ID))
        session_timeout_ms = request.session_timeout_ms
        if not MIN_SESSION_TIMEOUT_MS <= session_timeout_ms <= MAX_SESSION_TIMEOUT_MS:
            return _done(JoinResult(ClassicError.INVALID_SESSION_TIMEOUT))
        protocols = request.protocols
        instance_id = request.group_instance_id
        if self._foreign is not None and self._foreign(request.group_id):
            return _done(JoinResult(_INCONSISTENT))
        with self._lock:
            group = self._groups.setdefault(request.group_id, ClassicGroup(request.group_id))
            if not protocols or (
                group.members and group.protocol_type not in (None, request.protocol_type)
            ):
                return _done(JoinResult(_INCONSISTENT))
            member_id = request.member_id
            replaced = group.static_members.get(instance_id) if instance_id is not None else None
            # A static member coming back (new member id) is checked against the others,
            # not against the incarnation it replaces.
            if not supports_a_common_protocol(group, member_id or replaced or "", protocols):
                return _done(JoinResult(_INCONSISTENT))
            now_ms = self._clock.monotonic_ms()
            if not member_id:
                member_id = f"{request.client_id or 'member'}-{uuid.uuid4()}"
                if replaced is not None:
                    return self._replace_static_locked(group, replaced, member_id, request)
                if request.require_known_member_id and instance_id is None:
                    # KIP-394: the client joins again with this id. A static member
                    # skips it (KIP-345): its instance id already names it.
                    group.pending[member_id] = now_ms
                    return _done(JoinResult(ClassicError.MEMBER_ID_REQUIRED, member_id=member_id))
            elif replaced is not None and replaced != member_id:
                return _done(JoinResult(_FENCED))  # another incarnation took the instance id
            elif member_id not in group.members and group.pending.pop(member_id, None) is None:
                return _done(JoinResult(_UNKNOWN_MEMBER))
            member = group.members.get(member_id)
            if member is None:
                member = ClassicMember(
                    member_id,
                    instance_id,
                    request.client_id,
                    request.client_host,
                    session_timeout_ms,
                    request.rebalance_timeout_ms,
                    request.protocol_type,
                    protocols,
                    now_ms,
                )
                group.members[member_id] = member
                if instance_id is not None:
                    group.static_members[instance_id] = member_id
                group.member_added_in_delay = True
            else:
                member.protocols = protocols
                member.session_timeout_ms = session_timeout_ms
                member.rebalance_timeout_ms = request.rebalance_timeout_ms
                member.last_heartbeat_ms = now_ms
            if group.protocol_type is None:
                group.protocol_type = request.protocol_type
            if _waiting(member.join):
                _settle(member.join, JoinResult(_REBALANCING))  # superseded by this join
            joined: concurrent.futures.Future[JoinResult] = concurrent.futures.Future()
            member.join = joined
            self._prepare_rebalance_locked(group)
            self._maybe_complete_join_locked(group)
            return joined

    def _replace_static_locked(
        self, group: ClassicGroup, old_id: str, new_id: str, request: JoinRequest
    ) -> concurrent.futures.Future[JoinResult]:
        """A static member joining again without its member id (it restarted): its new
        id replaces the old one, which is fenced; the member keeps its assignment.

        As Kafka's ``updateStaticMemberAndRebalance``: in a stable group, when neither
        the protocol the group would choose nor this member's metadata for it changed,
        the join is answered at once with the current generation and the leader as it
        was (so a member that led before does not compute an assignment a stable group
        would never hand out), and its SyncGroup gets its assignment: nobody else
        rebalances. Otherwise the group rebalances as for any join."""
        member = group.members.pop(old_id)
        log.info(
            "group %s: static member %s rejoined as %s (was %s)",
            group.group_id,
            member.group_instance_id,
            new_id,
            old_id,
        )
        _settle(member.join, JoinResult(_FENCED))
        _settle(member.sync, SyncResult(_FENCED))
        leader_before = group.leader
        metadata_before = metadata_of(member, group.protocol_name)
        member.member_id = new_id
        member.client_id = request.client_id
        member.client_host = request.client_host
        member.session_timeout_ms = request.session_timeout_ms
        member.rebalance_timeout_ms = request.rebalance_timeout_ms
        member.protocols = request.protocols
        member.last_heartbeat_ms = self._clock.monotonic_ms()
        group.members[new_id] = member
        assert member.group_instance_id is not None
        group.static_members[member.group_instance_id] = new_id
        if group.leader == old_id:
            group.leader = new_id
        joined: concurrent.futures.Future[JoinResult] = concurrent.futures.Future()
        member.join = joined
        unchanged = (
            group.protocol_name == select_protocol(group)
            and metadata_of(member, group.protocol_name) == metadata_before
        )
        if group.state == GroupState.STABLE and unchanged:
            # The new member id must survive a coordinator move (Kafka stores the group
            # before answering; here the write is queued: a move before it lands makes
            # this member rejoin, nothing worse).
            self._queue_locked(group, record_of(group, None, self._clock.wall_ms()))
            _settle(
                joined,
                JoinResult(
                    _NONE,
                    group.generation_id,
                    group.protocol_type,
                    group.protocol_name,
                    leader_before,
                    new_id,
                ),
            )
            return joined
        self._prepare_rebalance_locked(group)
        self._maybe_complete_join_locked(group)
        return joined

    def sync(
        self,
        group_id: str,
        member_id: str,
        generation_id: int,
        assignments: dict[str, bytes],
        group_instance_id: str | None = None,
    ) -> concurrent.futures.Future[SyncResult]:
        """SyncGroup: the leader's assignments are stored and handed to every member; a
        future completed then (at once when the group is stable or on an error)."""
        with self._lock:
            group = self._groups.get(group_id)
            error = self._validate_member_locked(group, member_id, group_instance_id)
            if error is not _NONE or group is None:
                return _done(SyncResult(error))
            if generation_id != group.generation_id:
                return _done(SyncResult(_ILLEGAL_GENERATION))
            member = group.members[member_id]
            member.last_heartbeat_ms = self._clock.monotonic_ms()
            if group.state == GroupState.PREPARING_REBALANCE:
                return _done(SyncResult(_REBALANCING))
            if group.state == GroupState.STABLE:
                return _done(self._sync_result(group, member))
            # Completing the rebalance: the leader's answer completes everyone's, once
            # the group's metadata is stored (module docstring, "Persistence").
            synced: concurrent.futures.Future[SyncResult] = concurrent.futures.Future()
            member.sync = synced
            if member_id != group.leader or group.storing:
                return synced
            if self._writer is None:
                self._complete_sync_locked(group, assignments)
                return synced
            group.storing = True
            generation = group.generation_id
            record = record_of(group, assignments, self._clock.wall_ms())
            sequence = self._next_sequence_locked()
        error = self._store(group_id, record, sequence)  # outside the lock: I/O
        with self._lock:
            group.storing = False
            if (
                self._groups.get(group_id) is not group
                or group.state != GroupState.COMPLETING_REBALANCE
                or group.generation_id != generation
            ):
                return synced  # the group moved on meanwhile: that change answered it
            if error is _NONE:
                self._complete_sync_locked(group, assignments)
            else:
                # Kafka's storeGroup callback: everyone parked gets the error, and the
                # group rebalances (on a coordinator that moved: at the new one).
                for m in group.members.values():
                    if _waiting(m.sync):
                        _settle(m.sync, SyncResult(error))
                self._prepare_rebalance_locked(group)
            return synced

    def _complete_sync_locked(self, group: ClassicGroup, assignments: dict[str, bytes]) -> None:
        for m in group.members.values():
            m.assignment = assignments.get(m.member_id, b"")
        group.state = GroupState.STABLE
        for m in group.members.values():
            if _waiting(m.sync):
                _settle(m.sync, self._sync_result(group, m))

    def heartbeat(
        self,
        group_id: str,
        member_id: str,
        generation_id: int,
        group_instance_id: str | None = None,
    ) -> ClassicError:
        """Heartbeat: NONE, or the error telling the member to rejoin (or, for a static
        member another incarnation replaced, that it is fenced)."""
        with self._lock:
            group = self._groups.get(group_id)
            error = self._validate_member_locked(group, member_id, group_instance_id)
            if error is not _NONE or group is None:
                return error
            group.members[member_id].last_heartbeat_ms = self._clock.monotonic_ms()
            if group.state == GroupState.PREPARING_REBALANCE:
                return _REBALANCING
            if generation_id != group.generation_id:
                return _ILLEGAL_GENERATION
            # CompletingRebalance: the member got its JoinGroup answer and is about to
            # sync; as in Kafka, a heartbeat then is normal (answering
            # REBALANCE_IN_PROGRESS would send it back to JoinGroup and restart the
            # rebalance).
            return _NONE

    def leave(
        self, group_id: str, member_id: str, group_instance_id: str | None = None
    ) -> ClassicError:
        """LeaveGroup of one member: removed; the others rebalance. A static member may
        be named by its instance id alone (empty ``member_id``: KIP-345's batch leave,
        as ``kafka-consumer-groups --delete`` of static members does)."""
        with self._lock:
            group = self._groups.get(group_id)
            if group is not None and not member_id and group_instance_id is not None:
                member_id = group.static_members.get(group_instance_id, "")
                if not member_id:
                    return _UNKNOWN_MEMBER
            error = self._validate_member_locked(group, member_id, group_instance_id)
            if error is not _NONE or group is None:
                return error
            self._remove_locked(group, member_id)
            return _NONE

    def has_member(self, group_id: str, member_id: str) -> bool:
        """Whether ``member_id`` is a member of classic group ``group_id``."""
        with self._lock:
            group = self._groups.get(group_id)
            return group is not None and member_id in group.members

    def has_instance(self, group_id: str, group_instance_id: str) -> bool:
        """Whether classic group ``group_id`` has a static member ``group_instance_id``."""
        with self._lock:
            group = self._groups.get(group_id)
            return group is not None and group_instance_id in group.static_members

    def check_commit(
        self,
        group_id: str,
        member_id: str,
        generation_id: int,
        group_instance_id: str | None = None,
    ) -> ClassicError:
        """Whether a classic member may commit now: NONE or Kafka's error."""
        with self._lock:
            group = self._groups.get(group_id)
            error = self._validate_member_locked(group, member_id, group_instance_id)
            if error is not _NONE or group is None:
                return error
            if generation_id != group.generation_id:
                return _ILLEGAL_GENERATION
            # As Kafka: commits of the current generation are accepted while the group
            # prepares a rebalance (members commit before rejoining: on_revoke), refused
            # while it completes one (the assignment is being handed out).
            if group.state == GroupState.COMPLETING_REBALANCE:
                return _REBALANCING
            return _NONE

    @staticmethod
    def _validate_member_locked(
        group: ClassicGroup | None, member_id: str, group_instance_id: str | None
    ) -> ClassicError:
        """Kafka's ``validateMember``: a request naming an instance id must come from
        the member id that instance id has now (else ``FENCED_INSTANCE_ID``: a newer
        incarnation replaced it); one without must name a member."""
        if group is None:
            return _UNKNOWN_MEMBER
        if group_instance_id is not None:
            current = group.static_members.get(group_instance_id)
            if current is None:
                return _UNKNOWN_MEMBER
            if current != member_id:
                log.info(
                    "group %s: member %s fenced: instance %s is member %s now",
                    group.group_id,
                    member_id,
                    group_instance_id,
                    current,
                )
                return _FENCED
            return _NONE
        return _NONE if member_id in group.members else _UNKNOWN_MEMBER

    # --- persistence (module docstring) ----------------------------------------------------

    def _next_sequence_locked(self) -> int:
        self._sequence += 1
        return self._sequence

    def draw_sequence(self) -> int:
        """A sequence number later than every record built so far (a group deletion's
        tombstone is ordered with them: ``OffsetStore.delete``)."""
        with self._lock:
            return self._next_sequence_locked()

    def _queue_locked(self, group: ClassicGroup, record: GroupMetadataValue) -> None:
        if self._writer is not None:
            self._queued.append((group.group_id, record, self._next_sequence_locked()))

    def _queue_empty_locked(self, group: ClassicGroup) -> None:
        """The group just lost its last member: its record says so (queued)."""
        self._queue_locked(
            group, empty_record(group.protocol_type, group.generation_id, self._clock.wall_ms())
        )

    def _store(self, group_id: str, record: GroupMetadataValue, sequence: int) -> ClassicError:
        """Write ``record`` (caller does not hold the lock); NONE or the error a SyncGroup
        answers, as Kafka's ``storeGroup`` maps the append's errors."""
        assert self._writer is not None
        try:
            self._writer(group_id, record, sequence)
        except (NotLeaderOrFollowerError, StorageError) as exc:
            log.info("group %s: metadata not stored (%s)", group_id, exc)
            return ClassicError.NOT_COORDINATOR
        except (UnknownTopicOrPartitionError, NotEnoughReplicasError, KafkaTimeoutError) as exc:
            log.info("group %s: metadata not stored (%s)", group_id, exc)
            return ClassicError.COORDINATOR_NOT_AVAILABLE
        except Exception:
            log.exception("group %s: storing its metadata failed", group_id)
            return ClassicError.UNKNOWN_SERVER_ERROR
        return _NONE

    def flush_writes(self) -> int:
        """Write the queued records (an emptied group, a static member's new id), oldest
        first, outside the lock; returns how many were attempted. A failed one is logged
        and dropped: on a coordinator that moved it is refused (the new coordinator
        owns the group now), and a reload that brings back members which are gone only
        costs them a session timeout."""
        with self._lock:
            queued, self._queued = self._queued, []
        for group_id, record, sequence in queued:
            if self._store(group_id, record, sequence) is not _NONE:
                log.debug("group %s: queued metadata write %d dropped", group_id, sequence)
        return len(queued)

    def unload(self, owns: Callable[[str], bool]) -> int:
        """Forget the groups ``owns`` selects (their offsets partition is about to be
        reloaded) and their queued writes; parked requests are answered
        ``NOT_COORDINATOR``. Returns the sequence floor for ``OffsetStore.reload_partition``:
        any write drawn before now is from the state forgotten here."""
        with self._lock:
            for group_id in [g for g in self._groups if owns(g)]:
                group = self._groups.pop(group_id)
                for member in group.members.values():
                    _settle(member.join, JoinResult(ClassicError.NOT_COORDINATOR))
                    _settle(member.sync, SyncResult(ClassicError.NOT_COORDINATOR))
            self._queued = [q for q in self._queued if not owns(q[0])]
            return self._next_sequence_locked()

    def load(self, records: Mapping[str, GroupMetadataValue]) -> int:
        """Rebuild groups from their loaded metadata records (``classic_state``: Stable,
        every session restarted now), replacing any group of the same id. Returns how
        many groups with members were loaded."""
        now_ms = self._clock.monotonic_ms()
        loaded = 0
        with self._lock:
            for group_id, record in records.items():
                group = group_from_record(group_id, record, now_ms)
                self._groups.pop(group_id, None)
                if group is not None:
                    self._groups[group_id] = group
                    loaded += 1
                    log.info(
                        "group %s: loaded at generation %d with %d member(s)",
                        group_id,
                        group.generation_id,
                        len(group.members),
                    )
        return loaded

    # --- views ----------------------------------------------------------------------------

    def list_groups(self) -> list[tuple[str, str, str]]:
        """(group id, protocol type, state) of every classic group with members."""
        with self._lock:
            return [
                (g.group_id, g.protocol_type or "", g.state.value)
                for g in self._groups.values()
                if g.members
            ]

    def describe(self, group_id: str) -> ClassicGroupDescription | None:
        """A group as DescribeGroups shows it, or None if it has no members here."""
        with self._lock:
            group = self._groups.get(group_id)
            if group is None or not group.members:
                return None
            return description_of(group)

    def snapshot(self, group_id: str | None = None) -> list[ClassicGroupSnapshot]:
        """Groups with members (one, with ``group_id``) as ``describe_group`` shows them."""
        with self._lock:
            if group_id is not None:
                found = self._groups.get(group_id)
                groups = [] if found is None else [found]
            else:
                groups = list(self._groups.values())
            return [snapshot_of(g) for g in groups if g.members]

    def subscriptions(self, group_id: str) -> ClassicSubscriptions | None:
        """The group's live members and their subscribed topics (``ClassicSubscriptions``),
        or None if no classic group of that id is known here. A member's topics are read
        from the metadata of the chosen protocol, or of every protocol it offered while
        the first rebalance has chosen none."""
        with self._lock:
            group = self._groups.get(group_id)
            return None if group is None else subscriptions_of(group)

    def delete(self, group_id: str) -> bool:
        """Forget an empty classic group (DeleteGroups); True if one was known here.

        Raises:
            GroupNotEmptyError: the group has members (nothing changes).
        """
        with self._lock:
            group = self._groups.get(group_id)
            if group is None:
                return False
            if group.members:
                raise GroupNotEmptyError(
                    f"group {group_id} has {len(group.members)} member(s); stop them first"
                )
            del self._groups[group_id]
            return True

    def has_groups(self) -> bool:
        """Whether any classic group (or handed-out member id) is kept, so expiry matters."""
        with self._lock:
            return bool(self._groups) or bool(self._queued)

    # --- the state machine (callers hold the lock) -----------------------------------------

    def _prepare_rebalance_locked(self, group: ClassicGroup) -> None:
        if group.state == GroupState.PREPARING_REBALANCE:
            return
        if group.state == GroupState.COMPLETING_REBALANCE:
            for m in group.members.values():
                if _waiting(m.sync):
                    _settle(m.sync, SyncResult(_REBALANCING))
        now_ms = self._clock.monotonic_ms()
        if group.state == GroupState.EMPTY and self._initial_delay_ms > 0:
            # Kafka's InitialDelayedJoin: wait for the members starting together, one
            # delay at a time while more arrive, never past the rebalance timeout.
            delay_ms = self._initial_delay_ms
            longest_ms = max((m.rebalance_timeout_ms for m in group.members.values()), default=0)
            group.initial_delay_until_ms = now_ms + delay_ms
            group.initial_delay_limit_ms = now_ms + max(longest_ms, delay_ms)
            group.member_added_in_delay = False
        group.state = GroupState.PREPARING_REBALANCE
        timeout_ms = max((m.rebalance_timeout_ms for m in group.members.values()), default=0)
        group.rebalance_deadline_ms = now_ms + timeout_ms

    def _maybe_complete_join_locked(self, group: ClassicGroup) -> None:
        if group.state != GroupState.PREPARING_REBALANCE:
            return
        if any(not _waiting(m.join) for m in group.members.values()):
            return  # someone has not rejoined yet
        if not group.members:
            group.state = GroupState.EMPTY
            group.protocol_type = group.protocol_name = None
            group.leader = ""
            return
        if self._clock.monotonic_ms() < group.initial_delay_until_ms:
            return  # a new group's first rebalance waits (group.initial.rebalance.delay.ms)
        group.initial_delay_until_ms = 0
        group.generation_id += 1
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.protocol_name = select_protocol(group)
        group.state = GroupState.COMPLETING_REBALANCE
        everyone = tuple(
            (m.member_id, m.group_instance_id, metadata_of(m, group.protocol_name))
            for m in group.members.values()
        )
        now_ms = self._clock.monotonic_ms()
        for m in group.members.values():
            m.last_heartbeat_ms = now_ms
            _settle(
                m.join,
                JoinResult(
                    _NONE,
                    group.generation_id,
                    group.protocol_type,
                    group.protocol_name,
                    group.leader,
                    m.member_id,
                    everyone if m.member_id == group.leader else (),
                ),
            )

    @staticmethod
    def _sync_result(group: ClassicGroup, member: ClassicMember) -> SyncResult:
        return SyncResult(_NONE, group.protocol_type, group.protocol_name, member.assignment)

    def _remove_locked(self, group: ClassicGroup, member_id: str) -> None:
        member = group.members.pop(member_id)
        instance_id = member.group_instance_id
        if instance_id is not None and group.static_members.get(instance_id) == member_id:
            del group.static_members[instance_id]
        if _waiting(member.join):
            _settle(member.join, JoinResult(_UNKNOWN_MEMBER))
        if _waiting(member.sync):
            _settle(member.sync, SyncResult(_UNKNOWN_MEMBER))
        if group.leader == member_id:
            group.leader = ""
        if not group.members:
            self._queue_empty_locked(group)
            group.state = GroupState.EMPTY
            group.protocol_type = group.protocol_name = None
            group.initial_delay_until_ms = 0
            return
        self._prepare_rebalance_locked(group)
        self._maybe_complete_join_locked(group)

    # --- expiry ---------------------------------------------------------------------------

    def expire(self) -> None:
        """Remove members whose session passed, and members that did not rejoin before
        the rebalance timeout (one pass; the group manager's expiry thread paces it)."""
        with self._lock:
            now_ms = self._clock.monotonic_ms()
            for group in list(self._groups.values()):
                self._expire_locked(group, now_ms)

    def _expire_locked(self, group: ClassicGroup, now_ms: int) -> None:
        if group.initial_delay_until_ms and now_ms >= group.initial_delay_until_ms:
            if group.member_added_in_delay and group.initial_delay_until_ms < (
                group.initial_delay_limit_ms
            ):
                # Members kept arriving: wait once more for the rest of them.
                group.member_added_in_delay = False
                group.initial_delay_until_ms = min(
                    now_ms + self._initial_delay_ms, group.initial_delay_limit_ms
                )
            else:
                group.initial_delay_until_ms = 0
                self._maybe_complete_join_locked(group)
        for pending_id, since_ms in list(group.pending.items()):
            if now_ms - since_ms > MAX_SESSION_TIMEOUT_MS:
                del group.pending[pending_id]
        for member in list(group.members.values()):
            if _waiting(member.join) or _waiting(member.sync):
                continue  # in JoinGroup or SyncGroup: its connection is busy there
            late = (
                group.state == GroupState.PREPARING_REBALANCE
                and now_ms >= group.rebalance_deadline_ms
            )
            silent_ms = now_ms - member.last_heartbeat_ms
            if late or silent_ms > member.session_timeout_ms:
                log.info(
                    "group %s: member %s removed (%s)",
                    group.group_id,
                    member.member_id,
                    "did not rejoin in time" if late else f"no heartbeat for {silent_ms} ms",
                )
                self._remove_locked(group, member.member_id)
        if not group.members and not group.pending and group.state == GroupState.EMPTY:
            del self._groups[group.group_id]
