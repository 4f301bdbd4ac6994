"""The group coordinator in the broker: the pure state machine and the offset store behind
one thread-safe facade, plus the session-expiry timer.

``GroupManager`` is what ``BrokerCore`` calls for the group RPCs. It owns:

* a ``GroupCoordinator`` (membership, assignment, fencing; pure), guarded by one lock that
  is never held across I/O, except by the admin operations below;
* the ``OffsetStore`` (``__consumer_offsets`` and its cache);
* a daemon thread that removes members whose session (or rebalance) timeout passed. Real
  time only paces it; decisions read the injected clock, and every heartbeat also expires
  its own group's overdue members first, so tests with a manual clock need no thread.

Commits: a member's commit is validated under the coordinator lock (member known, epoch
current, every partition held), then written outside it, so heartbeats never wait for an
fsync. A partition can only move to another member after the committing member's next
heartbeat, which its client sends after the commit returned (on_revoke commits first), so
the new owner reads the committed offset. Commits without a member id, offset resets and
group deletion need an empty group, and hold the coordinator lock through the write so
that no member joins while the offsets change under it. Deleting some offsets
(OffsetDelete, KIP-496) needs no empty group, only that no live member subscribes to the
partition's topic (``GROUP_SUBSCRIBED_TO_TOPIC`` otherwise): a KIP-848 member can only
commit a partition it holds, hence of a topic it subscribes to, and a member's
subscription changes only through a heartbeat its client sends after its commits
returned, so a commit and the tombstones that delete it never cross.

Both group protocols live here: Kafka's classic protocol (JoinGroup/SyncGroup members,
``broker.groups.classic``) is ``classic``, a ``ClassicGroups`` beside the KIP-848
coordinator, with its own lock (never held together with the coordinator's). Its offsets
are in the same store; ``list_groups`` and ``describe_group`` show a classic group's
members and assignment beside its committed offsets and lag, as Kafka's
``kafka-consumer-groups --describe`` shows classic and consumer groups alike. The expiry
thread also expires classic members (at least every ``_CLASSIC_EXPIRY_WAIT_MS`` while
classic groups exist, the pace the Kafka listener's reaper had), and writes the classic
groups' queued metadata records (``ClassicGroups.flush_writes``).

Classic membership is durable (issue #27): ``ClassicGroups`` writes each group's metadata
record through ``OffsetStore.store_group``. On a single node ``open`` rebuilds the classic
groups from the records it loaded, so members of a broker restarted within their session
keep their ids and assignments; in cluster mode a broker becoming the leader of an offsets
partition calls ``reload_partition``, which reloads the offsets and rebuilds that
partition's classic groups before the partition counts as loaded. Deleting a group
tombstones its metadata with its offsets.

Resignation (cluster mode; Kafka's ``onResignation`` / ``removeGroupsForPartition``): a
broker that stops leading an offsets partition (a failover, a preferred election, a
reassignment, a controlled shutdown, a lost ZooKeeper session) forgets that partition's
classic and KIP-848 groups, their timers and its cached offsets (``unload_resigned``).
As in Kafka, the unload is asynchronous: the expiry thread runs it before each pass (at
least every second), and nothing waits for it, because what clients see does not depend
on it: every group call is refused ``NOT_COORDINATOR`` by the leadership check before it
reaches a group (``BrokerCore._check_coordinator``, the Kafka listener's
``_not_coordinator``), and the listings (``list_groups``, ``lag``) show only the groups of
partitions this broker leads and has loaded at its current epoch (``OffsetStore.serves``).
The role change itself is not signalled to the manager: the replica manager's only
callback is ``became_leader``, and polling the roles keeps the group layer free of the
replication layer's wiring. ``reload_partition`` forgets a partition's KIP-848 groups too
unless this broker led it without a break: members that lived on another coordinator
meanwhile must not meet the epochs they had here before.

Lag (``describe_group``, metrics): log end offset (the high watermark) minus the committed
offset; a partition without a committed offset lags by log end - log start.

Thread-safe.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence

from tidelog.broker.core.errors import partition_error
from tidelog.broker.core.internal_topic import unload_resigned
from tidelog.broker.core.partitions import PartitionRegistry
from tidelog.broker.groups.assignor import TopicPartition
from tidelog.broker.groups.classic import ClassicGroups
from tidelog.broker.groups.coordinator import (
    GroupCoordinator,
    GroupState,
    GroupView,
    HeartbeatAnswer,
    HeartbeatRequest,
    Removal,
    owner_of,
)
from tidelog.broker.groups.manager_types import (
    GroupConfig,
    GroupDescription,
    GroupLag,
    GroupListing,
    OffsetCommitEntry,
    OffsetResult,
    PartitionLag,
    ResetKind,
    ResetTarget,
    Selection,
)
from tidelog.broker.groups.offset_records import MAX_STRING_BYTES, NO_LEADER_EPOCH, OffsetValue
from tidelog.broker.groups.offset_store import OFFSETS_TOPIC, OffsetStore
from tidelog.storage.clock import Clock
from tidelog.storage.errors import (
    GroupIdNotFoundError,
    GroupNotEmptyError,
    GroupSubscribedToTopicError,
    InvalidRequestError,
    StaleMemberEpochError,
    UnknownTopicOrPartitionError,
)
from tidelog.storage.log_manager import LogManager

__all__ = [
    "GroupConfig",
    "GroupDescription",
    "GroupLag",
    "GroupListing",
    "GroupManager",
    "OffsetCommitEntry",
    "OffsetResult",
    "PartitionLag",
    "ResetKind",
    "ResetTarget",
    "Selection",
]

log = logging.getLogger(__name__)

_MAX_EXPIRY_WAIT_MS = 1_000
_MIN_EXPIRY_WAIT_MS = 10
# While classic groups exist: their expiry has no deadline index, so poll (as before).
_CLASSIC_EXPIRY_WAIT_MS = 200


class GroupManager:
    """The broker's group coordinator and offset store. Thread-safe.

    Build with ``open``; ``start`` the expiry timer; ``close`` once.
    """

    def __init__(
        self,
        config: GroupConfig,
        coordinator: GroupCoordinator,
        store: OffsetStore,
        logs: LogManager,
        clock: Clock,
    ) -> None:
        self.config = config
        self._coordinator = coordinator
        self._store = store
        self._logs = logs
        self._clock = clock
        self._lock = threading.Lock()
        # Serialises loading and unloading offsets partitions (unload_resigned).
        self._roles_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Kafka's classic-protocol groups (module docstring); their own lock.
        self.classic = ClassicGroups(
            clock,
            initial_rebalance_delay_ms=config.initial_rebalance_delay_ms,
            writer=store.store_group,
            foreign=store.is_share_group,
        )

    @classmethod
    def open(
        cls,
        logs: LogManager,
        clock: Clock,
        config: GroupConfig | None = None,
        *,
        on_append: Callable[[str, int], None] | None = None,
        registry: PartitionRegistry | None = None,
    ) -> GroupManager:
        """Create or load ``__consumer_offsets``; membership starts empty. ``registry``:
        the broker's partitions over ``logs`` (None: a single node's, ``OffsetStore.open``).

        Raises:
            StorageError: the offsets topic cannot be created or read.
        """
        config = config or GroupConfig()
        store = OffsetStore.open(logs, config.offsets, on_append=on_append, registry=registry)
        # Groups with committed offsets may have members from before this start that do
        # not know yet they were forgotten: hold their grants for a while.
        coordinator = GroupCoordinator(
            config.coordinator,
            held_groups=store.group_ids(),
            hold_until_ms=clock.monotonic_ms() + config.coordinator.startup_grant_delay_ms,
        )
        manager = cls(config, coordinator, store, logs, clock)
        if registry is None or not registry.replicated:
            # A single node coordinates every group; a cluster broker loads a partition's
            # classic groups when it becomes its leader (reload_partition).
            manager.classic.load(store.group_metadata())
        store.forget_unloaded()
        return manager

    @property
    def store(self) -> OffsetStore:
        """The offset store (tests, tools)."""
        return self._store

    def reload_partition(self, partition: int) -> int:
        """This broker became the leader of offsets partition ``partition``: reload its
        committed offsets and rebuild its classic groups from their metadata records
        (stale ones forgotten first). Returns records read. Raises ``StorageError``.

        A broker that led the partition at the previous epoch too (an ISR change bumped
        it) keeps its classic groups as they are: they are the partition's state, and a
        rebuild from the records would cut short every rebalance in progress."""
        store = self._store
        with self._roles_lock:
            if store.led_without_a_break(partition):
                return store.reload_partition(partition)
            floor = self._unload_groups(partition)
            return store.reload_partition(
                partition, sequence_floor=floor, on_groups=self.classic.load
            )

    def unload_resigned(self) -> list[int]:
        """Cluster mode: forget the groups of every loaded offsets partition this broker
        no longer leads (Kafka's ``onResignation``): classic groups (their parked
        JoinGroup and SyncGroup answered ``NOT_COORDINATOR``, their queued writes
        dropped), KIP-848 groups (members, deadlines), and the partition's cached offsets
        and group metadata. Returns the partitions unloaded. Run by the expiry thread
        before each pass, so no timer of a former coordinator fires on groups it no
        longer owns; every request for them is refused before that by the leadership
        check (``NOT_COORDINATOR``), whether or not the unload ran yet.

        Under ``_roles_lock`` with ``reload_partition``, and leadership read under it: a
        reload runs after its ``make_leader``, so an unload that saw "not leading" cannot
        land after the reload of a later leadership."""
        store = self._store

        def unload(partition: int) -> int:
            self._unload_groups(partition)
            return store.unload_partition(partition)

        unloaded = unload_resigned(store.loaded_partitions, store.leads, self._roles_lock, unload)
        for partition, forgotten in unloaded:
            log.info(
                "%s-%d: no longer its leader; %d group(s) with offsets or metadata unloaded",
                OFFSETS_TOPIC,
                partition,
                forgotten,
            )
        return [partition for partition, _ in unloaded]

    def _unload_groups(self, partition: int) -> int:
        """Forget the classic and KIP-848 groups stored in ``partition``; the sequence
        floor for ``OffsetStore.reload_partition`` (``ClassicGroups.unload``)."""

        def owns(group: str) -> bool:
            return self._store.partition_for(group) == partition

        floor = self.classic.unload(owns)
        with self._lock:
            gone = self._coordinator.unload(owns)
        if gone:
            log.info("%s-%d: KIP-848 group(s) %s forgotten", OFFSETS_TOPIC, partition, gone)
        return floor

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the session-expiry timer (a daemon thread). Idempotent."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._expiry_loop, name="tidelog-group-expiry", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop the timer and write the classic groups' queued records (the logs are
        still open). Idempotent. KIP-848 membership is not persisted (members rejoin);
        classic membership is (module docstring)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self.classic.flush_writes()
        except Exception:
            log.exception("writing the classic groups' last records failed")

    def _expiry_loop(self) -> None:
        # Real time on purpose: it only paces the checks; ``expire`` reads the clock.
        cap_ms = max(
            _MIN_EXPIRY_WAIT_MS,
            min(_MAX_EXPIRY_WAIT_MS, self.config.coordinator.min_session_timeout_ms // 4),
        )
        while not self._stop.is_set():
            try:
                self.unload_resigned()
                self.expire()
                self.classic.flush_writes()
            except Exception:
                log.exception("group session expiry failed")
            with self._lock:
                deadline = self._coordinator.next_deadline_ms()
            wait_ms = cap_ms
            if self.classic.has_groups():
                wait_ms = min(wait_ms, _CLASSIC_EXPIRY_WAIT_MS)
            if deadline is not None:
                wait_ms = min(
                    max(deadline - self._clock.monotonic_ms(), _MIN_EXPIRY_WAIT_MS), wait_ms
                )
            self._stop.wait(wait_ms / 1000.0)

    def expire(self) -> list[Removal]:
        """Remove every member whose session or rebalance timeout has passed (one pass),
        classic members too; returns the KIP-848 removals."""
        self.classic.expire()
        topics = self._topic_counts()
        with self._lock:
            return self._coordinator.expire(self._clock.monotonic_ms(), topics)

    # --- membership -------------------------------------------------------------------------

    def heartbeat(self, request: HeartbeatRequest) -> HeartbeatAnswer:
        """Join, heartbeat or leave (see ``GroupCoordinator.heartbeat`` for the errors; a
        share group's id is ``GroupIdNotFoundError``). The group's overdue members are
        expired first, so a heartbeat never waits for the timer to hand it the partitions
        of a dead member."""
        _check_group_id(request.group_id)
        if self._store.is_share_group(request.group_id):  # issue #32, as Kafka answers
            raise GroupIdNotFoundError(f"Group {request.group_id} is not a consumer group.")
        topics = self._topic_counts()
        with self._lock:
            now_ms = self._clock.monotonic_ms()
            self._coordinator.expire(now_ms, topics, request.group_id)
            return self._coordinator.heartbeat(request, now_ms, topics)

    def _topic_counts(self) -> dict[str, int]:
        return {t.name: t.partitions for t in self._logs.topics()}

    # --- offsets ----------------------------------------------------------------------------

    def commit_offsets(
        self,
        group_id: str,
        member_id: str,
        member_epoch: int,
        entries: Sequence[OffsetCommitEntry],
    ) -> list[OffsetResult]:
        """Commit offsets, as a member (``member_id``) or as an admin/simple commit ("").

        Partitions are answered in request order, each with its committed offset or its
        error: ``UNKNOWN_TOPIC_OR_PARTITION``, ``INVALID_REQUEST`` (negative offset,
        metadata over ``offset.metadata.max.bytes``), ``STALE_MEMBER_EPOCH`` (the member
        does not hold the partition). The valid ones are committed durably before this
        returns.

        Raises:
            InvalidRequestError: a bad group id.
            GroupNotEmptyError: no member id and the group has members.
            UnknownMemberIdError, StaleMemberEpochError: the member is unknown, or its epoch
                is not current (nothing is committed).
            StorageError: the write failed (nothing is committed).
        """
        _check_group_id(group_id)
        now_ms = self._clock.wall_ms()
        errors: dict[int, BaseException] = {}
        for i, entry in enumerate(entries):
            error = self._commit_error(entry)
            if error is not None:
                errors[i] = error
        checked = [e.tp for i, e in enumerate(entries) if i not in errors]
        with self._lock:
            refused = self._coordinator.check_commit(group_id, member_id, member_epoch, checked)
            for i, entry in enumerate(entries):
                if i not in errors and entry.tp in refused:
                    errors[i] = _not_held(group_id, member_id, entry.tp)
            values = {
                e.tp: OffsetValue(e.offset, e.metadata, now_ms, _epoch(e.leader_epoch))
                for i, e in enumerate(entries)
                if i not in errors
            }
            if not member_id:
                self._store.commit(group_id, values)
        if member_id:
            self._store.commit(group_id, values)
        return [
            _result(entry.tp, errors[i])
            if i in errors
            else OffsetResult(
                entry.tp, entry.offset, entry.metadata, leader_epoch=_epoch(entry.leader_epoch)
            )
            for i, entry in enumerate(entries)
        ]

    def check_member(self, group_id: str, member_id: str, member_epoch: int) -> None:
        """KIP-447 (gRPC's TxnOffsetCommit): ``UnknownMemberIdError`` or
        ``StaleMemberEpochError`` unless the KIP-848 member has that epoch."""
        _check_group_id(group_id)
        with self._lock:
            self._coordinator.check_commit(group_id, member_id, member_epoch, ())

    def commit_transactional_offsets(
        self,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        entries: Sequence[OffsetCommitEntry],
    ) -> list[OffsetResult]:
        """TxnOffsetCommit: the offsets, checked as a commit's, stored as records of the
        producer's transaction, pending until its marker (``broker.groups.txn_offsets``);
        the member (if any) was checked by the caller against its classic group."""
        _check_group_id(group_id)
        now_ms = self._clock.wall_ms()
        errors = {i: e for i, entry in enumerate(entries) if (e := self._commit_error(entry))}
        values = {
            e.tp: OffsetValue(e.offset, e.metadata, now_ms, _epoch(e.leader_epoch))
            for i, e in enumerate(entries)
            if i not in errors
        }
        if values:
            self._store.commit_transactional(group_id, producer_id, producer_epoch, values)
        return [
            _result(entry.tp, errors[i])
            if i in errors
            else OffsetResult(
                entry.tp, entry.offset, entry.metadata, leader_epoch=_epoch(entry.leader_epoch)
            )
            for i, entry in enumerate(entries)
        ]

    def _commit_error(self, entry: OffsetCommitEntry) -> BaseException | None:
        try:
            self._logs.get_log(entry.tp.topic, entry.tp.partition)
        except UnknownTopicOrPartitionError as exc:
            return exc
        if entry.offset < 0:
            return InvalidRequestError(f"{entry.tp}: a committed offset must be >= 0")
        limit = self.config.offset_metadata_max_bytes
        if len(entry.metadata.encode("utf-8")) > limit:
            return InvalidRequestError(f"{entry.tp}: metadata longer than {limit} bytes")
        return None

    def fetch_offsets(self, group_id: str, selection: Selection | None) -> list[OffsetResult]:
        """Committed offsets (-1 for none) of the selected partitions.

        ``selection`` empty or None: every committed partition; a topic with an empty
        partition list: every committed partition of that topic. An unknown group has no
        committed offsets (not an error).
        """
        _check_group_id(group_id)
        committed = self._store.offsets(group_id)
        if not selection:
            wanted = sorted(committed)
        else:
            wanted = []
            for topic, partitions in selection.items():
                if partitions:
                    wanted.extend(TopicPartition(topic, p) for p in partitions)
                else:
                    wanted.extend(sorted(tp for tp in committed if tp.topic == topic))
        results = []
        for tp in wanted:
            value = committed.get(tp)
            if value is None:
                results.append(OffsetResult(tp))
            else:
                results.append(
                    OffsetResult(tp, value.offset, value.metadata, leader_epoch=value.leader_epoch)
                )
        return results

    # --- admin ------------------------------------------------------------------------------

    def list_groups(self) -> list[GroupListing]:
        """Every group this broker coordinates (``OffsetStore.serves``: all on a single
        node) with members or committed offsets, sorted by id."""
        with self._lock:
            ids = set(self._coordinator.group_ids())
            views = {g: self._coordinator.view(g) for g in ids}
        ids.update(self._store.group_ids())
        classic = {g.group_id: g for g in self.classic.snapshot()}
        ids.update(classic)
        listings = []
        for group_id in sorted(filter(self._serves, ids)):
            view = views.get(group_id)
            other = classic.get(group_id)
            if view is not None and view.members:
                listings.append(GroupListing(group_id, view.state.value, len(view.members)))
            elif other is not None:
                listings.append(GroupListing(group_id, other.state, len(other.members)))
            elif view is None:
                listings.append(GroupListing(group_id, GroupState.EMPTY.value, 0))
            else:
                listings.append(GroupListing(group_id, view.state.value, 0))
        return listings

    def _serves(self, group_id: str) -> bool:
        """Whether this broker coordinates ``group_id`` now (a group whose partition it
        stopped leading is shown nowhere here, even before ``unload_resigned`` ran)."""
        return self._store.serves(self._store.partition_for(group_id))

    def describe_consumer_group(self, group_id: str) -> GroupView:
        """A KIP-848 group's membership as Kafka's ConsumerGroupDescribe shows it.

        Raises:
            GroupIdNotFoundError: no KIP-848 group of that id has members here (a classic
                group, a group known by its committed offsets only, or none), as Kafka
                answers for a group that is not a consumer group.
        """
        _check_group_id(group_id)
        with self._lock:
            if not self._coordinator.has_group(group_id):
                raise GroupIdNotFoundError(f"{group_id!r} is not a consumer group with members")
            return self._coordinator.view(group_id)

    def describe_group(self, group_id: str) -> GroupDescription:
        """Members, assignment, and per partition the committed offset, log end and lag.

        The partitions shown are those with a committed offset and those in a member's
        assignment or target.

        Raises:
            GroupIdNotFoundError: the group has neither members nor committed offsets.
        """
        _check_group_id(group_id)
        with self._lock:
            view = self._coordinator.view(group_id)
        state, epoch, members = view.state.value, view.group_epoch, view.members
        if not members:
            for other in self.classic.snapshot(group_id):
                state, epoch, members = other.state, other.generation, other.members
        committed = self._store.offsets(group_id)
        if not members and not committed:
            raise GroupIdNotFoundError(f"no group {group_id!r}")
        tps = set(committed)
        for member in members:
            tps.update(member.assigned, member.revoking, member.target)
        partitions = []
        for tp in sorted(tps):
            value = committed.get(tp)
            partitions.append(
                self._lag(tp, value.offset if value is not None else -1, owner_of(members, tp))
            )
        return GroupDescription(group_id, state, epoch, members, tuple(partitions))

    def _lag(self, tp: TopicPartition, committed: int, owner: str) -> PartitionLag:
        try:
            partition_log = self._logs.get_log(tp.topic, tp.partition)
        except UnknownTopicOrPartitionError:
            return PartitionLag(tp, committed, -1, -1, -1, owner)
        # Read the end before the start: retention moves the start up, never past the end.
        end = partition_log.high_watermark
        start = partition_log.log_start_offset
        lag = end - committed if committed >= 0 else end - start
        return PartitionLag(tp, committed, start, end, lag, owner)

    def reset_offsets(
        self, group_id: str, selection: Selection | None, target: ResetTarget
    ) -> list[OffsetResult]:
        """Move an empty group's committed offsets to ``target``.

        ``selection`` empty or None: every committed partition; a topic with an empty
        partition list: every partition of that topic. Targets: the log start offset
        (earliest), the log end offset (latest), an offset (clamped to [log start, log
        end], as Kafka's tool does), or the first offset with a timestamp at or after the
        one given (the log end if none). Unknown partitions get a per-partition error.

        Raises:
            InvalidRequestError: a bad group id, or a negative offset or timestamp.
            GroupNotEmptyError: the group has members.
            StorageError: the write failed (nothing changed).
        """
        _check_group_id(group_id)
        if target.kind in (ResetKind.OFFSET, ResetKind.TIMESTAMP) and target.value < 0:
            raise InvalidRequestError(f"reset to a negative {target.kind.value}: {target.value}")
        with self._lock:
            self._coordinator.require_empty(group_id)
            committed = self._store.offsets(group_id)
            results: list[OffsetResult] = []
            for tp in self._reset_partitions(committed, selection):
                try:
                    offset = self._reset_offset(tp, target)
                except UnknownTopicOrPartitionError as exc:
                    results.append(_result(tp, exc))
                    continue
                metadata = committed[tp].metadata if tp in committed else ""
                results.append(OffsetResult(tp, offset, metadata))
            now_ms = self._clock.wall_ms()
            self._store.commit(
                group_id,
                {
                    r.tp: OffsetValue(r.offset, r.metadata, now_ms)
                    for r in results
                    if not r.error_code
                },
            )
        log.info(
            "group %s: offsets reset to %s for %d partition(s)", group_id, target, len(results)
        )
        return results

    def _reset_partitions(
        self, committed: Mapping[TopicPartition, OffsetValue], selection: Selection | None
    ) -> list[TopicPartition]:
        if not selection:
            return sorted(committed)
        out: list[TopicPartition] = []
        for topic, partitions in selection.items():
            if partitions:
                out.extend(TopicPartition(topic, p) for p in partitions)
                continue
            try:
                count = self._logs.topic(topic).partitions
            except UnknownTopicOrPartitionError:
                count = 0
            # An unknown topic shows up as partition -1 with its error.
            out.extend(TopicPartition(topic, p) for p in range(count) or [-1])
        return out

    def _reset_offset(self, tp: TopicPartition, target: ResetTarget) -> int:
        partition_log = self._logs.get_log(tp.topic, tp.partition)
        end = partition_log.high_watermark
        start = partition_log.log_start_offset
        if target.kind is ResetKind.EARLIEST:
            return start
        if target.kind is ResetKind.LATEST:
            return end
        if target.kind is ResetKind.OFFSET:
            return min(max(target.value, start), end)
        found = partition_log.offset_for_timestamp(target.value)
        return found[0] if found is not None else end

    def delete_group(self, group_id: str) -> None:
        """Delete an empty group: its committed offsets (tombstones in the offsets topic)
        and an empty classic group's entry (Kafka's DeleteGroups).

        A group with members of either protocol is refused. A classic member that joins
        while the group is deleted finds it as if it had joined just after: its own
        commits are simple commits, written under the coordinator lock held here, so none
        is lost between the check and the tombstones.

        Raises:
            GroupNotEmptyError: the group has members (KIP-848 or classic).
            GroupIdNotFoundError: the group has no committed offsets, no members and no
                classic entry here.
            StorageError: the write failed (nothing changed).
        """
        _check_group_id(group_id)
        classic = self.classic.subscriptions(group_id)
        if classic is not None and classic.members:
            raise GroupNotEmptyError(
                f"group {group_id} has {classic.members} member(s); stop them first"
            )
        with self._lock:
            self._coordinator.require_empty(group_id)
            committed = self._store.offsets(group_id)
            stored = group_id in self._store.group_metadata(self._store.partition_for(group_id))
            if not committed and classic is None and not stored:
                raise GroupIdNotFoundError(f"no group {group_id!r}")
            # Ordered after any metadata record drawn before it (store_group).
            sequence = self.classic.draw_sequence()
            self._store.delete(group_id, committed, group_sequence=sequence)
        try:
            self.classic.delete(group_id)
        except GroupNotEmptyError:
            pass  # a member joined meanwhile: it keeps its (new) group, without offsets
        log.info("group %s deleted (%d committed offset(s))", group_id, len(committed))

    def delete_offsets(
        self, group_id: str, partitions: Sequence[TopicPartition]
    ) -> list[OffsetResult]:
        """Delete some of a group's committed offsets (Kafka's OffsetDelete, KIP-496).

        Each partition is answered in request order (a repeated one once): no error
        (deleted with a tombstone in the offsets topic, or nothing was committed),
        ``UNKNOWN_TOPIC_OR_PARTITION``, or ``GROUP_SUBSCRIBED_TO_TOPIC`` while a live
        member subscribes to its topic (a KIP-848 member's subscribed topic names; a
        classic member's from its protocol metadata, every topic when that does not
        parse). The tombstones are durable before this returns, so the deletion survives
        a restart and a coordinator move (``OffsetStore``).

        Raises:
            InvalidRequestError: a bad group id.
            GroupIdNotFoundError: the group has neither members nor committed offsets.
            GroupNotEmptyError: a classic group with members that is not a "consumer"
                group (Kafka cannot tell what it consumes).
            StorageError: the write failed (nothing was deleted).
        """
        _check_group_id(group_id)
        classic = self.classic.subscriptions(group_id)
        if classic is not None and classic.members and classic.protocol_type != "consumer":
            raise GroupNotEmptyError(
                f"group {group_id} has {classic.members} member(s) of protocol type "
                f"{classic.protocol_type!r}; stop them first"
            )
        results: list[OffsetResult] = []
        # Under the coordinator lock: no KIP-848 member subscribes, and no simple or
        # classic commit lands, between the check and the tombstones.
        with self._lock:
            view = self._coordinator.view(group_id)
            committed = self._store.offsets(group_id)
            if not view.members and classic is None and not committed:
                raise GroupIdNotFoundError(f"no group {group_id!r}")
            subscribed = frozenset().union(*(m.subscribed_topics for m in view.members))
            doomed: list[TopicPartition] = []
            for tp in dict.fromkeys(partitions):
                error = self._partition_error(tp)
                if error is None and (
                    tp.topic in subscribed
                    or (classic is not None and classic.subscribes_to(tp.topic))
                ):
                    error = GroupSubscribedToTopicError(
                        f"group {group_id} has a live member subscribed to {tp.topic}"
                    )
                if error is not None:
                    results.append(_result(tp, error))
                    continue
                if tp in committed:
                    doomed.append(tp)
                results.append(OffsetResult(tp))
            if doomed:
                self._store.delete(group_id, doomed)
        log.info("group %s: deleted %d committed offset(s)", group_id, len(doomed))
        return results

    def _partition_error(self, tp: TopicPartition) -> BaseException | None:
        """``UnknownTopicOrPartitionError`` unless ``tp`` is in the topic table."""
        try:
            count = self._logs.topic(tp.topic).partitions
        except UnknownTopicOrPartitionError as exc:
            return exc
        if not 0 <= tp.partition < count:
            return UnknownTopicOrPartitionError(
                f"topic {tp.topic!r} has no partition {tp.partition} (it has {count})"
            )
        return None

    def forget_topic(self, topic: str) -> None:
        """Delete every group's committed offsets of a deleted topic (as Kafka does), so a
        new topic of the same name starts without them."""
        for group_id, partitions in self._store.groups_with_topic(topic).items():
            self._store.delete(group_id, partitions)
            log.info("group %s: dropped offsets of deleted topic %s", group_id, topic)

    # --- metrics ----------------------------------------------------------------------------

    def lag(self) -> list[GroupLag]:
        """Lag of every committed or assigned partition of every group (scrape time)."""
        with self._lock:
            views = [
                self._coordinator.view(g) for g in self._coordinator.group_ids() if self._serves(g)
            ]
        out: list[GroupLag] = []
        seen: set[str] = set()
        for view in views:
            seen.add(view.group_id)
            committed = self._store.offsets(view.group_id)
            tps = set(committed)
            for member in view.members:
                tps.update(member.assigned, member.revoking)
            out.extend(self._group_lag(view.group_id, tps, committed))
        for group_id in filter(self._serves, self._store.group_ids()):
            if group_id not in seen:
                committed = self._store.offsets(group_id)
                out.extend(self._group_lag(group_id, set(committed), committed))
        return out

    def _group_lag(
        self,
        group_id: str,
        tps: set[TopicPartition],
        committed: Mapping[TopicPartition, OffsetValue],
    ) -> list[GroupLag]:
        out = []
        for tp in sorted(tps):
            value = committed.get(tp)
            lag = self._lag(tp, value.offset if value is not None else -1, "")
            if lag.log_end_offset >= 0:
                out.append(GroupLag(group_id, tp, lag.committed_offset, lag.lag))
        return out


def _check_group_id(group_id: str) -> None:
    if not group_id:
        raise InvalidRequestError("group_id must not be empty")
    if len(group_id.encode("utf-8")) > MAX_STRING_BYTES:
        raise InvalidRequestError(f"group_id longer than {MAX_STRING_BYTES} bytes")


def _epoch(leader_epoch: int) -> int:
    """A committed leader epoch as stored: Kafka treats any negative epoch as none."""
    return leader_epoch if 0 <= leader_epoch <= 0x7FFFFFFF else NO_LEADER_EPOCH


def _not_held(group_id: str, member_id: str, tp: TopicPartition) -> BaseException:
    return StaleMemberEpochError(
        f"member {member_id} of group {group_id} does not own {tp} (it was reassigned)"
    )


def _result(tp: TopicPartition, exc: BaseException) -> OffsetResult:
    code, message = partition_error(exc)
    return OffsetResult(tp, error_code=code, error_message=message)
